"""Fixtures for the gateway's own tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gateway.settings import SidecarAddress
from tests.gateway.gateway_harness import stub_sidecar


@pytest.fixture(scope="module")
def sidecars() -> Iterator[tuple[SidecarAddress, ...]]:
    """Two stand-in sidecars: onnxruntime serves simple and shared (later unloaded), pytorch torchy and shared."""
    with (
        stub_sidecar("onnxruntime", "simple", "shared", unloaded=("later",)) as onnx,
        stub_sidecar("pytorch", "torchy", "shared") as torch,
    ):
        yield onnx, torch
