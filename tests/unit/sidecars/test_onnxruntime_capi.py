"""ONNX Runtime's C API through ctypes (sidecars.onnxruntime.capi) against its Python API,
on real sessions: every element type crosses as the Python API gives it, strings cross as
their bytes, errors read as the Python API words them; and which instances run on it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from protos.status import TurnoutError
from sidecars.onnxruntime import capi
from sidecars.onnxruntime.runtime import OnnxInstance, OnnxRuntime
from tests.unit.sidecars.onnx_models import config

NUMERIC = {
    "f32": (TensorProto.FLOAT, np.float32),
    "f16": (TensorProto.FLOAT16, np.float16),
    "f64": (TensorProto.DOUBLE, np.float64),
    "i8": (TensorProto.INT8, np.int8),
    "i16": (TensorProto.INT16, np.int16),
    "i32": (TensorProto.INT32, np.int32),
    "i64": (TensorProto.INT64, np.int64),
    "u8": (TensorProto.UINT8, np.uint8),
    "u16": (TensorProto.UINT16, np.uint16),
    "u32": (TensorProto.UINT32, np.uint32),
    "u64": (TensorProto.UINT64, np.uint64),
    "b": (TensorProto.BOOL, np.bool_),
}
ANY_BYTES = [bytes(range(256)), b"\x00", b"a\x00b\x00", b"\xff\xfe", b"\xed\xa0\x80", b"", "h\u00e9".encode()]


def identity_model(path: Path, tensors: dict[str, int], dims: list[str] | None = None) -> Path:
    """OUT_<name> = Identity(<name>) for each (name, element type); `dims` symbolic, or
    None for any rank."""
    nodes = [helper.make_node("Identity", [name], [f"OUT_{name}"]) for name in tensors]
    inputs = [helper.make_tensor_value_info(name, kind, dims) for name, kind in tensors.items()]
    outputs = [helper.make_tensor_value_info(f"OUT_{name}", kind, dims) for name, kind in tensors.items()]
    model = helper.make_model(
        helper.make_graph(nodes, "identity", inputs, outputs), opset_imports=[helper.make_opsetid("", 17)]
    )
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def strings(values: list[bytes], shape: tuple[int, ...] | None = None) -> np.ndarray:
    array = np.empty(len(values), dtype=np.object_)
    array[:] = values
    return array.reshape(shape if shape is not None else (len(values),))


@pytest.fixture(scope="module")
def api() -> capi.Api:
    loaded = capi.api()
    assert loaded is not None, "the onnxruntime wheel ships libonnxruntime beside its binding"
    return loaded


@pytest.fixture(scope="module")
def every_type(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tensors = {name: kind for name, (kind, _) in NUMERIC.items()} | {"s": TensorProto.STRING}
    return identity_model(tmp_path_factory.mktemp("capi") / "model.onnx", tensors)


@pytest.mark.parametrize("shape", [(2, 3), (0, 4), ()])
def test_every_type_comes_back_as_the_python_api_gives_it(api: capi.Api, every_type: Path, shape: tuple) -> None:
    rng = np.random.default_rng(0)
    feed = {name: np.asarray(rng.random(shape) * 100).astype(dtype) for name, (_, dtype) in NUMERIC.items()}
    session = capi.Session(api, every_type, intra_op=1, inter_op=1, config={})
    python = ort.InferenceSession(str(every_type), providers=["CPUExecutionProvider"])
    names = [f"OUT_{name}" for name in NUMERIC]
    text = strings(["x"] * int(np.prod(shape, dtype=int)), shape)
    ours = session.run([*names, "OUT_s"], {**feed, "s": text})
    theirs = python.run(names, {**feed, "s": text.astype(str)})
    for name, mine, reference in zip(names, ours, theirs, strict=False):
        assert mine.dtype == reference.dtype and mine.shape == reference.shape, name
        assert np.array_equal(mine, reference), name
    assert ours[-1].shape == shape and all(element == b"x" for element in ours[-1].reshape(-1))
    session.close()


def test_strings_cross_as_their_bytes(api: capi.Api, tmp_path: Path) -> None:
    path = identity_model(tmp_path / "model.onnx", {"s": TensorProto.STRING})
    session = capi.Session(api, path, intra_op=1, inter_op=1, config={})
    (echoed,) = session.run(["OUT_s"], {"s": strings(ANY_BYTES, (1, len(ANY_BYTES)))})
    assert echoed.shape == (1, len(ANY_BYTES)) and echoed.tolist() == [ANY_BYTES]
    (from_text,) = session.run(["OUT_s"], {"s": np.array(["h\u00e9", "\u4e2d"], dtype=np.object_)})
    assert from_text.tolist() == ["h\u00e9".encode(), "\u4e2d".encode()]
    # Many elements (filled from one buffer when none holds a NUL), with and without a NUL.
    many = [bytes([byte]) * (byte % 7) for byte in range(1, 256)]
    for values in (many, [*many, b"\x00"]):
        (echoed,) = session.run(["OUT_s"], {"s": strings(values)})
        assert echoed.tolist() == values
    session.close()


def test_errors_read_as_the_python_apis(api: capi.Api, tmp_path: Path) -> None:
    path = identity_model(tmp_path / "model.onnx", {"x": TensorProto.FLOAT})
    model = onnx.load(str(path))
    model.graph.input[0].type.tensor_type.shape.dim.add().dim_value = 2
    model.graph.output[0].type.tensor_type.shape.dim.add().dim_value = 2
    onnx.save(model, str(path))
    session = capi.Session(api, path, intra_op=1, inter_op=1, config={})
    wrong = {"x": np.zeros(3, np.float32)}
    with pytest.raises(capi.OrtError) as ours:
        session.run(["OUT_x"], wrong)
    with pytest.raises(Exception) as theirs:
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(["OUT_x"], wrong)
    assert str(ours.value) == str(theirs.value)
    assert session.run(["OUT_x"], {"x": np.ones(2, np.float32)})[0].tolist() == [1.0, 1.0]  # still serving
    session.close()
    with pytest.raises(capi.OrtError, match=r"^\[ONNXRuntimeError\] : 3 : NO_SUCHFILE : "):
        capi.Session(api, tmp_path / "missing.onnx", intra_op=1, inter_op=1, config={})


STRING_CONFIG = """
backend: "onnxruntime" max_batch_size: 0
input [ { name: "s" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "OUT_s" data_type: TYPE_STRING dims: [ -1 ] } ]
instance_group [ { name: "m" kind: KIND_CPU count: 1 } ]
"""


def load_one(tmp_path: Path, tensors: dict[str, int], text: str) -> OnnxInstance:
    identity_model(tmp_path / "1" / "model.onnx", tensors, ["n"])
    (instance,) = OnnxRuntime({}).load(config(text), tmp_path / "1")
    assert isinstance(instance, OnnxInstance)
    return instance


def test_a_cpu_model_with_strings_runs_on_the_c_api(tmp_path: Path) -> None:
    instance = load_one(tmp_path, {"s": TensorProto.STRING}, STRING_CONFIG)
    assert instance._c_session is not None
    assert instance.run({"s": strings(ANY_BYTES)})["OUT_s"].tolist() == ANY_BYTES
    instance.close()


def test_a_model_without_strings_stays_on_the_python_api(tmp_path: Path) -> None:
    text = STRING_CONFIG.replace("TYPE_STRING", "TYPE_FP32")
    instance = load_one(tmp_path, {"s": TensorProto.FLOAT}, text)
    assert instance._c_session is None
    assert instance.run({"s": np.ones(3, np.float32)})["OUT_s"].tolist() == [1.0, 1.0, 1.0]
    instance.close()


def test_on_the_python_api_an_output_that_is_not_utf8_is_refused_clearly(tmp_path: Path) -> None:
    """Where the C API cannot serve (a GPU instance, a wheel without its library), the
    Python API runs string models and says what it cannot return."""
    path = identity_model(tmp_path / "model.onnx", {"s": TensorProto.STRING}, ["n"])
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    instance = OnnxInstance("m", session, config(STRING_CONFIG))
    assert instance.run({"s": strings([b"text"])})["OUT_s"].tolist() == ["text"]
    with pytest.raises(TurnoutError) as caught:
        instance.run({"s": strings([b"\xff"])})
    assert caught.value.message == (
        "onnx runtime error: a string output holds bytes that are not valid UTF-8, which ONNX Runtime's Python API "
        "cannot return"
    )
    instance.close()
