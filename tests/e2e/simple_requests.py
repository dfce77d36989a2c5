"""Requests to the `simple`-family models built through each tritonclient flavour.

Returns the inputs together with the sums and differences the model must answer,
so tests compare exact arrays.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

SIMPLE_SHAPE = [1, 16]


def simple_arrays(batch: int = 1, seed: int = 7) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.integers(-1000, 1000, size=(batch, 16), dtype=np.int32)
    b = rng.integers(-1000, 1000, size=(batch, 16), dtype=np.int32)
    return a, b


def http_inputs(a: np.ndarray, b: np.ndarray, binary: bool = True, module: Any = httpclient) -> list[Any]:
    inputs = [module.InferInput("INPUT0", list(a.shape), "INT32"), module.InferInput("INPUT1", list(b.shape), "INT32")]
    inputs[0].set_data_from_numpy(a, binary_data=binary)
    inputs[1].set_data_from_numpy(b, binary_data=binary)
    return inputs


def grpc_inputs(a: np.ndarray, b: np.ndarray, module: Any = grpcclient) -> list[Any]:
    inputs = [module.InferInput("INPUT0", list(a.shape), "INT32"), module.InferInput("INPUT1", list(b.shape), "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def check_simple(result: Any, a: np.ndarray, b: np.ndarray) -> None:
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def string_arrays() -> tuple[np.ndarray, np.ndarray]:
    a = np.array([[str(i).encode() for i in range(16)]], dtype=np.object_)
    b = np.array([[b"1"] * 16], dtype=np.object_)
    return a, b


def assert_http_serves(url: str) -> None:
    """After an error: the server still answers a good request correctly."""
    a, b = simple_arrays(seed=99)
    with httpclient.InferenceServerClient(url) as client:
        check_simple(client.infer("simple", http_inputs(a, b)), a, b)


def assert_grpc_serves(url: str) -> None:
    a, b = simple_arrays(seed=98)
    with grpcclient.InferenceServerClient(url) as client:
        check_simple(client.infer("simple", grpc_inputs(a, b)), a, b)


def error_of(call: Any, *args: Any, **kwargs: Any) -> InferenceServerException:
    """The InferenceServerException `call` raises; fails the test if it returns."""
    try:
        call(*args, **kwargs)
    except InferenceServerException as exc:
        return exc
    raise AssertionError(f"{getattr(call, '__name__', call)} succeeded; expected an error")
