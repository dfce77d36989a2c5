"""The TensorRT sidecar process: its refusal to start without tensorrt or a GPU, and its
GPU path, which skips where there is none. Its pure-Python decisions (auto-complete,
load checks, profile choice, buffers) are tested in tests/unit/sidecars."""

from __future__ import annotations

import importlib.util

import pytest

from tests.sidecars.sidecar_harness import SidecarFailedToStart, launch


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
