"""The TensorRT sidecar: its pure-Python decisions (config auto-complete from engine I/O,
profile choice, binding layout, buffer growth) on any machine; its refusal to start
without tensorrt or a GPU; and its GPU path, which skips where there is none."""

from __future__ import annotations

import importlib.util

import pytest
from google.protobuf import text_format

from protos import model_config_pb2 as mc
from protos.status import TurnoutError
from sidecars.tensorrt.engine import (
    EngineTensor,
    Profile,
    auto_complete,
    bindings,
    byte_size,
    choose_profile,
    grown_capacity,
)
from tests.sidecars.sidecar_harness import SidecarFailedToStart, launch

SMALL = Profile((1, 16), (4, 16), (8, 16))
LARGE = Profile((9, 16), (32, 16), (64, 16))
ENGINE = [
    EngineTensor("INPUT0", True, "FLOAT", (-1, 16), (SMALL, LARGE)),
    EngineTensor("INPUT1", True, "INT32", (-1, 16), (SMALL, LARGE)),
    EngineTensor("OUTPUT0", False, "HALF", (-1, 16)),
]
FIXED = [
    EngineTensor("X", True, "FLOAT", (3, 4), (Profile((3, 4), (3, 4), (3, 4)),)),
    EngineTensor("Y", False, "FLOAT", ()),
]


def config(text: str = "") -> mc.ModelConfig:
    parsed = mc.ModelConfig(name="plan")
    text_format.Parse(text, parsed)
    return parsed


def test_auto_complete_fills_io_and_batching_from_the_engine() -> None:
    completed = config()
    auto_complete(completed, ENGINE, default_max=4)
    assert completed.max_batch_size == 4 and completed.HasField("dynamic_batching")
    assert [(t.name, t.data_type, list(t.dims)) for t in completed.input] == [
        ("INPUT0", mc.TYPE_FP32, [16]),
        ("INPUT1", mc.TYPE_INT32, [16]),
    ]
    assert [(t.name, t.data_type, list(t.dims)) for t in completed.output] == [("OUTPUT0", mc.TYPE_FP16, [16])]


def test_auto_complete_keeps_a_fixed_shape_engine_unbatched() -> None:
    completed = config()
    auto_complete(completed, FIXED, default_max=4)
    assert completed.max_batch_size == 0
    assert list(completed.input[0].dims) == [3, 4]
    assert list(completed.output[0].dims) == [1] and completed.output[0].HasField("reshape")


def test_auto_complete_refuses_batching_an_engine_without_it() -> None:
    with pytest.raises(TurnoutError, match="model does not support batching while non-zero max_batch_size"):
        auto_complete(config("max_batch_size: 8"), FIXED, default_max=4)


def test_auto_complete_refuses_a_batch_no_profile_takes() -> None:
    with pytest.raises(TurnoutError, match="specified max-batch 128 but TensorRT engine only supports max-batch 64"):
        auto_complete(config("max_batch_size: 128"), ENGINE, default_max=4)


@pytest.mark.parametrize(("batch", "profile"), [(1, 0), (8, 0), (9, 1), (64, 1)])
def test_the_first_profile_that_fits_the_batch_is_chosen(batch: int, profile: int) -> None:
    shapes = {"INPUT0": (batch, 16), "INPUT1": (batch, 16)}
    assert choose_profile(ENGINE, shapes, "plan") == profile


def test_a_batch_no_profile_fits_is_refused() -> None:
    with pytest.raises(TurnoutError, match="no optimization profile of model 'plan' accepts"):
        choose_profile(ENGINE, {"INPUT0": (65, 16), "INPUT1": (65, 16)}, "plan")


def test_bindings_put_inputs_first_and_size_buffers() -> None:
    layout = bindings([ENGINE[2], ENGINE[0], ENGINE[1]], {"FLOAT": 4, "INT32": 4, "HALF": 2})
    assert [(b.name, b.is_input) for b in layout] == [("INPUT0", True), ("INPUT1", True), ("OUTPUT0", False)]
    assert byte_size(layout[2], (8, 16)) == 256


def test_device_buffers_only_grow() -> None:
    assert grown_capacity(0, 10) == 256
    assert grown_capacity(256, 200) == 256
    assert grown_capacity(256, 1000) == 1024


def test_sidecar_refuses_to_start_without_tensorrt_or_gpu(tmp_path) -> None:  # type: ignore[no-untyped-def]
    if importlib.util.find_spec("tensorrt") is not None:
        pytest.skip("tensorrt is installed here; the refusal needs a machine without it or without a GPU")
    with pytest.raises(SidecarFailedToStart) as caught:
        launch(tmp_path, framework="tensorrt")
    assert caught.value.returncode == 1
    errors = [line for line in caught.value.output.splitlines() if line.startswith("E") and "] " in line]
    assert len(errors) == 1
    assert "the tensorrt sidecar cannot start: the 'tensorrt' package is not installed" in errors[0]


@pytest.mark.gpu
def test_tensorrt_runtime_opens_on_a_gpu() -> None:
    if importlib.util.find_spec("tensorrt") is None:
        pytest.skip("tensorrt is not installed; scripts/gpu-check builds and serves an engine on a GPU machine")
    from sidecars.runtime import RuntimeUnavailable, runtime_for

    try:
        runtime = runtime_for("tensorrt")
    except RuntimeUnavailable as exc:
        pytest.skip(str(exc))
    assert runtime.gpu_count() >= 1
