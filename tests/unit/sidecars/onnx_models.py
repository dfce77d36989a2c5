"""Tiny ONNX models for the onnxruntime checks: inputs and outputs as a test lists them,
each output a Cast of one input (so it has that input's shape), opened in a real session."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from google.protobuf import text_format
from onnx import TensorProto, helper, numpy_helper

from protos import model_config_pb2 as mc

FLOAT, INT32, INT64, BOOL = TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64, TensorProto.BOOL
STRING, BFLOAT16, UINT64 = TensorProto.STRING, TensorProto.BFLOAT16, TensorProto.UINT64

Dims = Sequence[int | str]  # a str is a symbolic (dynamic) dim


def write_model(
    path: Path,
    inputs: Sequence[tuple[str, int, Dims]],
    outputs: Sequence[tuple[str, int, str]],
    initializers: Sequence[tuple[str, Dims]] = (),
) -> Path:
    """`inputs` (name, element type, dims); `outputs` (name, element type, the input it
    casts); `initializers` FLOAT graph inputs with a default value (overridable)."""
    shapes = {name: dims for name, _, dims in inputs}
    graph_inputs = [helper.make_tensor_value_info(n, t, list(d)) for n, t, d in inputs]
    graph_inputs += [helper.make_tensor_value_info(n, FLOAT, list(d)) for n, d in initializers]
    defaults = [numpy_helper.from_array(np.zeros([int(x) for x in d], np.float32), n) for n, d in initializers]
    nodes = [helper.make_node("Cast", [source], [name], to=element) for name, element, source in outputs]
    graph_outputs = [helper.make_tensor_value_info(n, t, list(shapes[s])) for n, t, s in outputs]
    graph = helper.make_graph(nodes, "checks", graph_inputs, graph_outputs, initializer=defaults)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def open_session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def config(text: str, name: str = "m") -> mc.ModelConfig:
    parsed = mc.ModelConfig(name=name)
    text_format.Parse(text, parsed)
    return parsed
