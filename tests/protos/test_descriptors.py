"""Our .proto files describe the same wire protocol as tritonclient's generated modules:
every message, nested message, enum, field and RPC, compared in both directions.

Ours are compiled by protoc into a descriptor set in a child process and read back as
plain FileDescriptorProtos, so this process never imports protos.*_pb2 (tritonclient
registers the same `inference.*` symbols).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor_pb2
from tritonclient.grpc import model_config_pb2, service_pb2

ROOT = Path(__file__).resolve().parents[2]
PROTOS = ("protos/model_config.proto", "protos/grpc_service.proto")
FieldProto = descriptor_pb2.FieldDescriptorProto


@pytest.fixture(scope="module")
def ours(tmp_path_factory: pytest.TempPathFactory) -> dict[str, descriptor_pb2.FileDescriptorProto]:
    out = tmp_path_factory.mktemp("descriptors") / "set.pb"
    code = (
        "import sys; from pathlib import Path; from grpc_tools import protoc; "
        "include = Path(protoc.__file__).parent / '_proto'; "
        "sys.exit(protoc.main(['protoc', '-I.', f'-I{include}', '--include_imports', "
        "f'--descriptor_set_out={sys.argv[1]}', *sys.argv[2:]]))"
    )
    completed = subprocess.run(
        [sys.executable, "-c", code, str(out), *PROTOS], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert completed.returncode == 0, completed.stderr
    files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file
    return {Path(f.name).name: f for f in files}


def _theirs(module: Any) -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto()
    module.DESCRIPTOR.CopyToProto(proto)
    return proto


def _type_name(name: str) -> str:
    # Both sides live in package `inference`; compare names relative to it.
    return name.removeprefix(".inference.")


def _field(field: FieldProto, message: descriptor_pb2.DescriptorProto) -> tuple[Any, ...]:
    oneof = ""
    if field.HasField("oneof_index") and not field.proto3_optional:
        oneof = message.oneof_decl[field.oneof_index].name
    return (
        field.number,
        FieldProto.Type.Name(field.type),
        FieldProto.Label.Name(field.label),
        _type_name(field.type_name),
        oneof,
        field.proto3_optional,
        field.options.packed if field.options.HasField("packed") else None,
    )


def _enum(enum: descriptor_pb2.EnumDescriptorProto) -> dict[str, int]:
    return {value.name: value.number for value in enum.value}


def _flatten(file: descriptor_pb2.FileDescriptorProto) -> dict[str, Any]:
    """Every message, enum and field of a file, keyed by its dotted path."""
    table: dict[str, Any] = {}

    def visit_message(prefix: str, message: descriptor_pb2.DescriptorProto) -> None:
        path = f"{prefix}{message.name}"
        table[f"message {path}"] = (message.options.map_entry, sorted(o.name for o in message.oneof_decl))
        for field in message.field:
            table[f"field {path}.{field.name}"] = _field(field, message)
        for enum in message.enum_type:
            table[f"enum {path}.{enum.name}"] = _enum(enum)
        for nested in message.nested_type:
            visit_message(f"{path}.", nested)

    for message in file.message_type:
        visit_message("", message)
    for enum in file.enum_type:
        table[f"enum {enum.name}"] = _enum(enum)
    for service in file.service:
        for method in service.method:
            table[f"rpc {service.name}.{method.name}"] = (
                _type_name(method.input_type),
                _type_name(method.output_type),
                method.client_streaming,
                method.server_streaming,
            )
    return table


def _compare(ours: descriptor_pb2.FileDescriptorProto, theirs: descriptor_pb2.FileDescriptorProto) -> None:
    mine, reference = _flatten(ours), _flatten(theirs)
    missing = sorted(reference.keys() - mine.keys())
    extra = sorted(mine.keys() - reference.keys())
    different = {k: (mine[k], reference[k]) for k in sorted(mine.keys() & reference.keys()) if mine[k] != reference[k]}
    assert not missing, f"missing from our protos: {missing}"
    assert not extra, f"not in tritonclient's protos: {extra}"
    assert not different, f"differ (ours, tritonclient's): {different}"


def test_model_config_matches_tritonclient(ours: dict[str, descriptor_pb2.FileDescriptorProto]) -> None:
    assert ours["model_config.proto"].package == "inference"
    _compare(ours["model_config.proto"], _theirs(model_config_pb2))


def test_grpc_service_matches_tritonclient(ours: dict[str, descriptor_pb2.FileDescriptorProto]) -> None:
    assert ours["grpc_service.proto"].package == "inference"
    _compare(ours["grpc_service.proto"], _theirs(service_pb2))


def test_service_name_and_every_rpc(ours: dict[str, descriptor_pb2.FileDescriptorProto]) -> None:
    theirs = _theirs(service_pb2)
    assert [s.name for s in ours["grpc_service.proto"].service] == [s.name for s in theirs.service]
    assert [m.name for m in ours["grpc_service.proto"].service[0].method] == [m.name for m in theirs.service[0].method]


def test_the_comparison_can_fail(ours: dict[str, descriptor_pb2.FileDescriptorProto]) -> None:
    """A dropped field and a renumbered one are both caught."""
    altered = descriptor_pb2.FileDescriptorProto()
    altered.CopyFrom(ours["grpc_service.proto"])
    message = next(m for m in altered.message_type if m.name == "ModelInferRequest")
    del message.field[-1]
    with pytest.raises(AssertionError, match="missing from our protos"):
        _compare(altered, _theirs(service_pb2))
    altered.CopyFrom(ours["grpc_service.proto"])
    message = next(m for m in altered.message_type if m.name == "ModelInferRequest")
    message.field[0].number += 100
    with pytest.raises(AssertionError, match="differ"):
        _compare(altered, _theirs(service_pb2))
