"""`pb_utils.ModelConfig`: the configuration a model's `auto_complete_config` gets and
returns, with Triton's helpers and their refusals in Triton's words."""

from __future__ import annotations

import json
from typing import Any


class ModelConfig:
    """The configuration `auto_complete_config` gets and returns; only max_batch_size,
    inputs, outputs, dynamic batching and the transaction policy may change."""

    def __init__(self, model_config: str) -> None:
        self._model_config = json.loads(model_config)

    def as_dict(self) -> dict[str, Any]:
        config: dict[str, Any] = self._model_config
        return config

    def _name(self) -> str:
        return str(self._model_config.get("name", ""))

    def set_max_batch_size(self, max_batch_size: int) -> None:
        current = self._model_config.get("max_batch_size", 0)
        if current > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {current}, but in auto-complete-config function for "
                f"model '{self._name()}' specified max_batch_size {max_batch_size}"
            )
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        for scheduler in ("sequence_batching", "ensemble_scheduling"):
            if scheduler in self._model_config:
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{scheduler}', but auto-complete-config "
                    f"function for model '{self._name()}' tries to set scheduling_choice as 'dynamic_batching'"
                )
        self._model_config.setdefault("dynamic_batching", {})

    def add_input(self, input: dict[str, Any]) -> None:
        self._add("input", input, ("name", "data_type", "dims", "optional"))

    def add_output(self, output: dict[str, Any]) -> None:
        self._add("output", output, ("name", "data_type", "dims"))

    def _add(self, kind: str, tensor: dict[str, Any], allowed: tuple[str, ...]) -> None:
        name = self._name()
        listed = "'" + "', '".join(allowed[:-1]) + f"' and '{allowed[-1]}'"
        for key in tensor:
            if key not in allowed:
                raise ValueError(
                    f"{kind} '{tensor.get('name')}' in auto-complete-config function for model '{name}' "
                    f"contains property other than {listed}."
                )
        if "name" not in tensor:
            raise ValueError(f"{kind} in auto-complete-config function for model '{name}' is missing 'name' property.")
        for required in ("data_type", "dims"):
            if required not in tensor:
                raise ValueError(
                    f"{kind} '{tensor['name']}' in auto-complete-config function for model '{name}' "
                    f"is missing '{required}' property."
                )
        tensors = self._model_config.setdefault(kind, [])
        for current in tensors:
            if current["name"] != tensor["name"]:
                continue
            if current.get("data_type", "TYPE_INVALID") not in ("TYPE_INVALID", tensor["data_type"]):
                raise ValueError(
                    f"unable to load model '{name}', configuration expects datatype {current['data_type']} for "
                    f"{kind} '{tensor['name']}', model provides {tensor['data_type']}"
                )
            if current.get("dims") and list(current["dims"]) != list(tensor["dims"]):
                raise ValueError(
                    f"model '{name}', tensor '{tensor['name']}': the model expects dims {tensor['dims']} "
                    f"but the model configuration specifies dims {current['dims']}"
                )
            if "optional" in current and "optional" in tensor and current["optional"] != tensor["optional"]:
                raise ValueError(
                    f"model '{name}', tensor '{tensor['name']}': the model expects optional {tensor['optional']} "
                    f"but the model configuration specifies optional {current['optional']}"
                )
            current.update(tensor)
            return
        tensors.append(dict(tensor))

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        name = self._name()
        for key in transaction_policy_dict:
            if key != "decoupled":
                raise ValueError(
                    "model transaction property in auto-complete-config function for model "
                    f"'{name}' contains property other than 'decoupled'."
                )
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            wanted = transaction_policy_dict["decoupled"]
            if "decoupled" in policy and policy["decoupled"] != wanted:
                raise ValueError(
                    f"trying to change decoupled property in auto-complete-config for model '{name}', "
                    f"which is already set to '{policy['decoupled']}'."
                )
            policy["decoupled"] = wanted
