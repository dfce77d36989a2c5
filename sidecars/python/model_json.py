"""A model configuration as the JSON python models read: protobuf's JSON with the field
names of config.pbtxt, every field present, and 64-bit integers as numbers (as Triton
writes them, so `dims` compare equal to a model's own lists); and back."""

from __future__ import annotations

import json
from typing import Any

from google.protobuf import descriptor, json_format

from protos import model_config_pb2 as mc
from protos.status import internal

_INT64 = frozenset(
    {
        descriptor.FieldDescriptor.TYPE_INT64,
        descriptor.FieldDescriptor.TYPE_UINT64,
        descriptor.FieldDescriptor.TYPE_SINT64,
        descriptor.FieldDescriptor.TYPE_FIXED64,
        descriptor.FieldDescriptor.TYPE_SFIXED64,
    }
)


def config_json(config: mc.ModelConfig) -> str:
    as_dict = json_format.MessageToDict(
        config, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return json.dumps(_numbers(config.DESCRIPTOR, as_dict))


def _numbers(message: descriptor.Descriptor, value: dict[str, Any]) -> dict[str, Any]:
    """protobuf's JSON writes 64-bit integers as strings; Triton's as numbers."""
    for field in message.fields:
        if field.name not in value:
            continue
        item = value[field.name]
        if field.type in _INT64:
            value[field.name] = [int(v) for v in item] if isinstance(item, list) else int(item)
        elif field.message_type is not None:
            if field.message_type.GetOptions().map_entry:
                entry_value = field.message_type.fields_by_name["value"]
                if entry_value.message_type is not None:
                    for key in item:
                        _numbers(entry_value.message_type, item[key])
                elif entry_value.type in _INT64:
                    value[field.name] = {key: int(v) for key, v in item.items()}
            elif isinstance(item, list):
                for element in item:
                    _numbers(field.message_type, element)
            elif isinstance(item, dict):
                _numbers(field.message_type, item)
    return value


def read_config_json(text: str, model: str) -> mc.ModelConfig:
    """The config an `auto_complete_config` returned; TurnoutError where it does not parse."""
    config = mc.ModelConfig()
    try:
        json_format.Parse(text, config)
    except json_format.ParseError as exc:
        raise internal(f"auto_complete_config function in model '{model}' returned an invalid config: {exc}") from exc
    return config


def merge_completion(config: mc.ModelConfig, completed: mc.ModelConfig) -> None:
    """Take what auto-complete may change: max_batch_size, inputs, outputs, dynamic
    batching and the transaction policy; the rest stays as the repository says."""
    config.max_batch_size = completed.max_batch_size
    del config.input[:]
    config.input.extend(completed.input)
    del config.output[:]
    config.output.extend(completed.output)
    if completed.HasField("dynamic_batching") and not config.HasField("dynamic_batching"):
        config.dynamic_batching.CopyFrom(completed.dynamic_batching)
    if completed.HasField("model_transaction_policy"):
        config.model_transaction_policy.CopyFrom(completed.model_transaction_policy)
