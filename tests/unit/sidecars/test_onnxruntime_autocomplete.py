"""The onnxruntime backend's auto-complete on real sessions of tiny models: when it reads
the model at all, the tensors it writes and in what order, and how it fills batching."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from protos import model_config_pb2 as mc
from protos.status import Status, TurnoutError
from sidecars.onnxruntime.autocomplete import SignatureReader, auto_complete
from sidecars.onnxruntime.runtime import OnnxRuntime
from tests.unit.sidecars.onnx_models import BFLOAT16, FLOAT, INT64, config, open_session, write_model


def signature(path: Path) -> SignatureReader:
    session = open_session(path)
    return lambda: (session.get_inputs(), session.get_outputs())


def never_read() -> tuple[Sequence[Any], Sequence[Any]]:
    raise AssertionError("auto-complete read a model it had no need of")


def tensors(entries: Any) -> list[tuple[str, str, list[int], list[int] | None]]:
    """(name, datatype, dims, reshape or None) of each config input or output."""
    return [
        (t.name, mc.DataType.Name(t.data_type), list(t.dims), list(t.reshape.shape) if t.HasField("reshape") else None)
        for t in entries
    ]


@pytest.mark.parametrize(
    "text",
    [
        'input [ { name: "X" } ] output [ { name: "Y" } ]',
        'batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "N" source_input: "X" } ] output [ { name: "Y" } ]',
    ],
)
def test_a_config_naming_both_sides_is_left_alone(text: str) -> None:
    given = config(text)
    completed = config(text)
    auto_complete(completed, never_read, default_max=4)
    assert completed == given


def test_tensors_come_in_name_order(tmp_path: Path) -> None:
    path = write_model(
        tmp_path / "model.onnx",
        [("b", FLOAT, ["batch", 2]), ("a", INT64, ["batch", 3])],
        [("z", FLOAT, "b"), ("y", INT64, "a")],
    )
    completed = config("")
    auto_complete(completed, signature(path), default_max=4)
    assert tensors(completed.input) == [("a", "TYPE_INT64", [3], None), ("b", "TYPE_FP32", [2], None)]
    assert tensors(completed.output) == [("y", "TYPE_INT64", [3], None), ("z", "TYPE_FP32", [2], None)]


def test_a_batching_model_gets_the_default_max_batch_size_and_a_dynamic_batcher(tmp_path: Path) -> None:
    path = write_model(tmp_path / "model.onnx", [("X", FLOAT, ["batch", 2])], [("Y", FLOAT, "X")])
    completed = config("")
    auto_complete(completed, signature(path), default_max=4)
    assert completed.max_batch_size == 4 and completed.HasField("dynamic_batching")
    one = config("")
    auto_complete(one, signature(path), default_max=1)
    assert one.max_batch_size == 1 and not one.HasField("dynamic_batching")


def test_a_configured_max_batch_size_still_gets_a_dynamic_batcher(tmp_path: Path) -> None:
    path = write_model(tmp_path / "model.onnx", [("X", FLOAT, ["batch", 2])], [("Y", FLOAT, "X")])
    completed = config('max_batch_size: 8 input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]')
    auto_complete(completed, signature(path), default_max=4)
    assert completed.max_batch_size == 8 and completed.HasField("dynamic_batching")
    assert tensors(completed.output) == [("Y", "TYPE_FP32", [2], None)]
    sequence = config("max_batch_size: 8 sequence_batching { }")
    auto_complete(sequence, signature(path), default_max=4)
    assert not sequence.HasField("dynamic_batching")


def test_batching_needs_every_output_batched_too(tmp_path: Path) -> None:
    path = write_model(
        tmp_path / "model.onnx",
        [("X", FLOAT, ["batch", 2]), ("F", FLOAT, [3])],
        [("Y", FLOAT, "X"), ("G", FLOAT, "F")],
    )
    completed = config("")
    auto_complete(completed, signature(path), default_max=4)
    assert completed.max_batch_size == 0
    assert tensors(completed.input) == [("F", "TYPE_FP32", [3], None), ("X", "TYPE_FP32", [-1, 2], None)]
    with pytest.raises(TurnoutError) as caught:
        auto_complete(config("max_batch_size: 2"), signature(path), default_max=4)
    assert (caught.value.status, caught.value.message) == (
        Status.INVALID_ARG,
        "autofill failed for model 'm': model does not support batching while non-zero max_batch_size is specified",
    )


def test_a_scalar_becomes_one_reshaped_to_a_scalar_only_when_batching(tmp_path: Path) -> None:
    batched = write_model(tmp_path / "batched.onnx", [("X", FLOAT, ["batch"])], [("Y", FLOAT, "X")])
    completed = config("")
    auto_complete(completed, signature(batched), default_max=4)
    assert tensors(completed.input) == [("X", "TYPE_FP32", [1], [])]
    scalar = write_model(tmp_path / "scalar.onnx", [("X", FLOAT, [])], [("Y", FLOAT, "X")])
    completed = config("")
    auto_complete(completed, signature(scalar), default_max=4)
    assert completed.max_batch_size == 0
    assert tensors(completed.input) == [("X", "TYPE_FP32", [1], None)]


def test_a_type_triton_has_no_config_datatype_for_is_left_invalid(tmp_path: Path) -> None:
    path = write_model(tmp_path / "model.onnx", [("X", BFLOAT16, [2])], [("Y", BFLOAT16, "X")])
    completed = config("")
    auto_complete(completed, signature(path), default_max=4)
    assert tensors(completed.input) == [("X", "TYPE_INVALID", [2], None)]


def test_a_missing_model_file_is_unavailable(tmp_path: Path) -> None:
    version = tmp_path / "m" / "1"
    version.mkdir(parents=True)
    with pytest.raises(TurnoutError) as caught:
        OnnxRuntime({}).auto_complete(config('default_model_filename: "model.onnx"'), version, 4)
    assert (caught.value.status, caught.value.message) == (
        Status.UNAVAILABLE,
        f"unable to find '{version / 'model.onnx'}' for model instance 'm'",
    )
