"""Build the small ONNX models that model_repository/ ships and the tests generate, and
TorchScript / torch.export models for the PyTorch sidecar (torch imported only then).

`python scripts/make_models.py [REPO]` rewrites the example repository; tests and
benchmarks import the `write_*` functions to build repositories of their own.
Weights are seeded, so every run writes the same bytes.
"""

from __future__ import annotations

import functools
import itertools
import json
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8  # what every onnxruntime >= 1.15 reads

ONNX_TYPE = {
    "BOOL": TensorProto.BOOL,
    "UINT8": TensorProto.UINT8,
    "UINT16": TensorProto.UINT16,
    "UINT32": TensorProto.UINT32,
    "UINT64": TensorProto.UINT64,
    "INT8": TensorProto.INT8,
    "INT16": TensorProto.INT16,
    "INT32": TensorProto.INT32,
    "INT64": TensorProto.INT64,
    "FP16": TensorProto.FLOAT16,
    "FP32": TensorProto.FLOAT,
    "FP64": TensorProto.DOUBLE,
    "BYTES": TensorProto.STRING,
}
CONFIG_TYPE = {name: "TYPE_STRING" if name == "BYTES" else f"TYPE_{name}" for name in ONNX_TYPE}
# ONNX has no bfloat16 here; TorchScript models may take it.
CONFIG_TYPE["BF16"] = "TYPE_BF16"


def _save(graph: onnx.GraphProto, path: Path, opset: int = OPSET, ir_version: int = IR_VERSION) -> None:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="turnout")
    model.ir_version = ir_version
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def _tensor(name: str, datatype: str, dims: list[int | str]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, ONNX_TYPE[datatype], dims)


def _io(name: str, datatype: str, dims: list[int]) -> str:
    shape = ", ".join(str(d) for d in dims)
    return f'  {{\n    name: "{name}"\n    data_type: {CONFIG_TYPE[datatype]}\n    dims: [ {shape} ]\n  }}'


def _config(
    name: str,
    max_batch_size: int,
    inputs: list[tuple[str, str, list[int]]],
    outputs: list[tuple[str, str, list[int]]],
    extra: str = "",
    platform: str = "onnxruntime_onnx",
) -> str:
    lines = [f'name: "{name}"', f'platform: "{platform}"', f"max_batch_size: {max_batch_size}"]
    lines.append("input [\n" + ",\n".join(_io(*i) for i in inputs) + "\n]")
    lines.append("output [\n" + ",\n".join(_io(*o) for o in outputs) + "\n]")
    if extra:
        lines.append(extra.strip())
    return "\n".join(lines) + "\n"


def _dims(max_batch_size: int, dims: list[int]) -> list[int | str]:
    # Variable dims get names of their own ("n", "n1", ...): one name would tie them together.
    names = iter(["n"] + [f"n{i}" for i in range(1, len(dims))])
    return (["batch"] if max_batch_size > 0 else []) + [(next(names) if d == -1 else d) for d in dims]


def write_simple(
    repo: Path,
    name: str = "simple",
    datatype: str = "INT32",
    max_batch_size: int = 8,
    extra_config: str = "",
    versions: tuple[int, ...] = (1,),
) -> Path:
    """Triton's `simple`: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1, shape [16]."""
    model_dir = Path(repo) / name
    dims = _dims(max_batch_size, [16])
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
        ],
        name,
        [_tensor("INPUT0", datatype, dims), _tensor("INPUT1", datatype, dims)],
        [_tensor("OUTPUT0", datatype, dims), _tensor("OUTPUT1", datatype, dims)],
    )
    for version in versions:
        _save(graph, model_dir / str(version) / "model.onnx")
    io = [("INPUT0", datatype, [16]), ("INPUT1", datatype, [16])]
    out = [("OUTPUT0", datatype, [16]), ("OUTPUT1", datatype, [16])]
    (model_dir / "config.pbtxt").write_text(_config(name, max_batch_size, io, out, extra_config))
    return model_dir


def write_simple_string(repo: Path, name: str = "simple_string", max_batch_size: int = 8) -> Path:
    """Triton's `simple_string`: the same sums and differences on numbers carried as strings."""
    model_dir = Path(repo) / name
    dims = _dims(max_batch_size, [16])
    nodes = [
        helper.make_node("Cast", ["INPUT0"], ["a"], to=TensorProto.INT32),
        helper.make_node("Cast", ["INPUT1"], ["b"], to=TensorProto.INT32),
        helper.make_node("Add", ["a", "b"], ["sum"]),
        helper.make_node("Sub", ["a", "b"], ["diff"]),
        helper.make_node("Cast", ["sum"], ["OUTPUT0"], to=TensorProto.STRING),
        helper.make_node("Cast", ["diff"], ["OUTPUT1"], to=TensorProto.STRING),
    ]
    graph = helper.make_graph(
        nodes,
        name,
        [_tensor("INPUT0", "BYTES", dims), _tensor("INPUT1", "BYTES", dims)],
        [_tensor("OUTPUT0", "BYTES", dims), _tensor("OUTPUT1", "BYTES", dims)],
    )
    _save(graph, model_dir / "1" / "model.onnx")
    io = [("INPUT0", "BYTES", [16]), ("INPUT1", "BYTES", [16])]
    out = [("OUTPUT0", "BYTES", [16]), ("OUTPUT1", "BYTES", [16])]
    (model_dir / "config.pbtxt").write_text(_config(name, max_batch_size, io, out))
    return model_dir


def write_identity(
    repo: Path,
    name: str = "simple_identity",
    datatype: str = "BYTES",
    max_batch_size: int = 8,
    with_config: bool = True,
    dims: tuple[int, ...] = (-1,),
) -> Path:
    """OUTPUT0 = INPUT0 of any datatype; by default a variable-length vector."""
    model_dir = Path(repo) / name
    onnx_dims = _dims(max_batch_size, list(dims))
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
        name,
        [_tensor("INPUT0", datatype, onnx_dims)],
        [_tensor("OUTPUT0", datatype, onnx_dims)],
    )
    _save(graph, model_dir / "1" / "model.onnx")
    if with_config:
        shape = list(dims)
        config = _config(name, max_batch_size, [("INPUT0", datatype, shape)], [("OUTPUT0", datatype, shape)])
        (model_dir / "config.pbtxt").write_text(config)
    return model_dir


def write_bytes_equal(repo: Path, name: str, expected: list[bytes]) -> Path:
    """OUTPUT0[i] = (INPUT0[i] == expected[i]) for a BYTES vector of len(expected): a model
    that answers whether each element reached it as exactly those bytes."""
    model_dir = Path(repo) / name
    count = len(expected)
    # Built by hand: make_tensor passes strings through numpy, whose "S" arrays drop trailing NULs.
    constant = TensorProto(name="EXPECTED", data_type=TensorProto.STRING, dims=[count], string_data=expected)
    graph = helper.make_graph(
        [helper.make_node("Equal", ["INPUT0", "EXPECTED"], ["OUTPUT0"])],
        name,
        [_tensor("INPUT0", "BYTES", [count])],
        [_tensor("OUTPUT0", "BOOL", [count])],
        initializer=[constant],
    )
    _save(graph, model_dir / "1" / "model.onnx", opset=19, ir_version=9)  # Equal takes strings from opset 19
    config = _config(name, 0, [("INPUT0", "BYTES", [count])], [("OUTPUT0", "BOOL", [count])])
    (model_dir / "config.pbtxt").write_text(config)
    return model_dir


def write_linear(repo: Path, name: str = "linear", versions: dict[int, float] | None = None) -> Path:
    """An FP32 model with one version per scale: OUTPUT0 = INPUT0 * scale, shape [4].

    Versions differ in their answers, so a client can tell which one served it.
    """
    versions = versions or {1: 1.0, 2: 2.0}
    model_dir = Path(repo) / name
    dims = _dims(8, [4])
    for version, scale in versions.items():
        weight = numpy_helper.from_array(np.array(scale, dtype=np.float32), "scale")
        graph = helper.make_graph(
            [helper.make_node("Mul", ["INPUT0", "scale"], ["OUTPUT0"])],
            name,
            [_tensor("INPUT0", "FP32", dims)],
            [_tensor("OUTPUT0", "FP32", dims)],
            initializer=[weight],
        )
        _save(graph, model_dir / str(version) / "model.onnx")
    extra = "version_policy: { all { } }\ndynamic_batching { }"
    config = _config(name, 8, [("INPUT0", "FP32", [4])], [("OUTPUT0", "FP32", [4])], extra)
    (model_dir / "config.pbtxt").write_text(config)
    return model_dir


def write_affine(repo: Path, name: str, scale: float, offset: float) -> Path:
    """OUTPUT0 = INPUT0 * scale + offset on FP32 [4]: the pre- and post-processing
    steps of the example ensemble."""
    model_dir = Path(repo) / name
    dims = _dims(8, [4])
    weights = [
        numpy_helper.from_array(np.array(scale, dtype=np.float32), "scale"),
        numpy_helper.from_array(np.array(offset, dtype=np.float32), "offset"),
    ]
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["INPUT0", "scale"], ["scaled"]),
            helper.make_node("Add", ["scaled", "offset"], ["OUTPUT0"]),
        ],
        name,
        [_tensor("INPUT0", "FP32", dims)],
        [_tensor("OUTPUT0", "FP32", dims)],
        initializer=weights,
    )
    _save(graph, model_dir / "1" / "model.onnx")
    config = _config(name, 8, [("INPUT0", "FP32", [4])], [("OUTPUT0", "FP32", [4])], "dynamic_batching { }")
    (model_dir / "config.pbtxt").write_text(config)
    return model_dir


def write_ensemble(
    repo: Path,
    name: str,
    inputs: list[tuple[str, str, list[int]]],
    outputs: list[tuple[str, str, list[int]]],
    steps: list[tuple[str, int, dict[str, str], dict[str, str]]],
    max_batch_size: int = 8,
    versions: tuple[int, ...] = (1,),
    extra_config: str = "",
) -> Path:
    """An ensemble config; each step is (model, version (-1: latest), input_map, output_map),
    the maps from the step model's tensor names to the ensemble's."""
    model_dir = Path(repo) / name
    for version in versions:
        (model_dir / str(version)).mkdir(parents=True, exist_ok=True)
        (model_dir / str(version) / ".gitkeep").touch()  # an ensemble's version folder is empty; git keeps none
    blocks = []
    for model, version, input_map, output_map in steps:
        lines = [f'      model_name: "{model}"', f"      model_version: {version}"]
        lines += [f'      input_map {{ key: "{k}" value: "{v}" }}' for k, v in input_map.items()]
        lines += [f'      output_map {{ key: "{k}" value: "{v}" }}' for k, v in output_map.items()]
        blocks.append("    {\n" + "\n".join(lines) + "\n    }")
    scheduling = "ensemble_scheduling {\n  step [\n" + ",\n".join(blocks) + "\n  ]\n}"
    config = _config(name, max_batch_size, inputs, outputs, f"{scheduling}\n{extra_config}")
    config = config.replace('platform: "onnxruntime_onnx"', 'platform: "ensemble"')
    (model_dir / "config.pbtxt").write_text(config)
    return model_dir


_CONTROL_KINDS = {"START": "CONTROL_SEQUENCE_START", "END": "CONTROL_SEQUENCE_END", "READY": "CONTROL_SEQUENCE_READY"}
_FALSE_TRUE = {
    "INT32": "int32_false_true: [ 0, 1 ]",
    "FP32": "fp32_false_true: [ 0, 1 ]",
    "BOOL": "bool_false_true: [ false, true ]",
}


def write_sequence(
    repo: Path,
    name: str,
    controls: tuple[str, ...] = ("START", "READY"),
    control_type: str = "INT32",
    corrid: str = "",
    state: bool = False,
    strategy: str = "",
    max_batch_size: int = 8,
    instances: int = 0,
    echo_controls: bool = False,
) -> Path:
    """A stateful model on INT32 [1]: OUTPUT = READY * (INPUT [+ START] [+ END * CORRID] [+ STATE]).

    `controls` are the START/END/READY tensors the sequence batcher sets (of `control_type`),
    `corrid` the datatype of a CORRID control ("" for none), `state` an implicit running sum
    of INPUT (STATE_IN -> STATE_OUT, zero at START), `strategy` further sequence_batching
    lines (strategy, idle time), `instances` the CPU instance count (0: Triton's default).
    With `echo_controls` each control also comes back as <NAME>_OUT, as the model got it.
    """
    model_dir = Path(repo) / name
    dims = _dims(max_batch_size, [1])
    nodes = []
    inputs = [_tensor("INPUT", "INT32", dims)]
    outputs = [_tensor("OUTPUT", "INT32", dims)]
    as_int = {}
    for control in controls:
        inputs.append(_tensor(control, control_type, dims))
        as_int[control] = control if control_type == "INT32" else f"{control}_int"
        if control_type != "INT32":
            nodes.append(helper.make_node("Cast", [control], [as_int[control]], to=TensorProto.INT32))
    if corrid:
        inputs.append(_tensor("CORRID", corrid, dims))
        nodes.append(helper.make_node("Cast", ["CORRID"], ["corrid_int"], to=TensorProto.INT32))
    terms = ["INPUT"]
    if "START" in controls:
        terms.append(as_int["START"])
    if corrid and "END" in controls:
        nodes.append(helper.make_node("Mul", [as_int["END"], "corrid_int"], ["end_corrid"]))
        terms.append("end_corrid")
    if state:
        inputs.append(_tensor("STATE_IN", "INT32", dims))
        outputs.append(_tensor("STATE_OUT", "INT32", dims))
        nodes.append(helper.make_node("Add", ["STATE_IN", "INPUT"], ["STATE_OUT"]))
        terms.append("STATE_IN")
    total = terms[0]
    for index, term in enumerate(terms[1:]):
        nodes.append(helper.make_node("Add", [total, term], [f"sum{index}"]))
        total = f"sum{index}"
    ready = as_int.get("READY")
    if ready:
        nodes.append(helper.make_node("Mul", [ready, total], ["OUTPUT"]))
    else:
        nodes.append(helper.make_node("Identity", [total], ["OUTPUT"]))
    echoed = [(f"{c}_OUT", control_type) for c in controls] + ([("CORRID_OUT", corrid)] if corrid else [])
    if echo_controls:
        for echo, datatype in echoed:
            nodes.append(helper.make_node("Identity", [echo.removesuffix("_OUT")], [echo]))
            outputs.append(_tensor(echo, datatype, dims))
    _save(helper.make_graph(nodes, name, inputs, outputs), model_dir / "1" / "model.onnx")

    kinds = {c: f"kind: {_CONTROL_KINDS[c]} {_FALSE_TRUE[control_type]}" for c in controls}
    if corrid:
        kinds["CORRID"] = f"kind: CONTROL_SEQUENCE_CORRID data_type: {CONFIG_TYPE[corrid]}"
    blocks = [f'    {{\n      name: "{n}"\n      control [ {{ {kind} }} ]\n    }}' for n, kind in kinds.items()]
    lines = [f"  {line.strip()}" for line in strategy.strip().splitlines()]
    lines.append("  control_input [\n" + ",\n".join(blocks) + "\n  ]")
    if state:
        initial = 'initial_state: { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "zero" }'
        state_io = 'input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_INT32 dims: [ 1 ]'
        lines.append(f"  state [ {{ {state_io} {initial} }} ]")
    count = f"count: {instances} " if instances else ""
    extra = "sequence_batching {\n" + "\n".join(lines) + "\n}\n" + f"instance_group [ {{ {count}kind: KIND_CPU }} ]"
    config_outputs = [("OUTPUT", "INT32", [1])] + ([(e, t, [1]) for e, t in echoed] if echo_controls else [])
    config = _config(name, max_batch_size, [("INPUT", "INT32", [1])], config_outputs, extra)
    (model_dir / "config.pbtxt").write_text(config)
    return model_dir


# Triton's example strategy for its dynamic sequence models: oldest first, 10 s idle.
DYNA_STRATEGY = (
    "max_sequence_idle_microseconds: 10000000\n"
    "oldest { max_candidate_sequences: 1024 max_queue_delay_microseconds: 10000 }"
)


def write_sequence_examples(repo: Path) -> None:
    """The stateful models Triton's sequence client examples drive: `simple_sequence`
    (each value, plus one at START), `simple_dyna_sequence` (the same, plus the
    correlation id at END) and, for their --dyna string ids, `simple_string_dyna_sequence`
    (a running sum in implicit state, plus the numeric string id at END)."""
    write_sequence(repo, "simple_sequence")
    write_sequence(
        repo, "simple_dyna_sequence", ("START", "END", "READY"), corrid="UINT64", strategy=DYNA_STRATEGY, instances=2
    )
    write_sequence(
        repo,
        "simple_string_dyna_sequence",
        ("END", "READY"),
        corrid="BYTES",
        state=True,
        strategy=DYNA_STRATEGY,
        instances=2,
    )


def linear_override(versions: list[int], warm: bool) -> str:
    """A load request's config override for write_linear's model: `linear` limited to `versions`; with `warm`, a
    `model_warmup` sample that must run before the version is READY."""
    config: dict[str, object] = {
        "name": "linear",
        "platform": "onnxruntime_onnx",
        "max_batch_size": 8,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
        "version_policy": {"specific": {"versions": versions}},
        "dynamic_batching": {},
    }
    if warm:
        sample = {"INPUT0": {"data_type": "TYPE_FP32", "dims": [4], "zero_data": True}}
        config["model_warmup"] = [{"name": "zeros", "batch_size": 1, "inputs": sample, "count": 2}]
    return json.dumps(config)


def write_mlp(
    repo: Path,
    name: str = "mlp",
    sizes: tuple[int, ...] = (512, 2048, 2048, 10),
    max_batch_size: int = 64,
    extra_config: str = "dynamic_batching { }",
    seed: int = 0,
) -> Path:
    """An FP32 multi-layer perceptron (Gemm + Relu, no activation on the last layer)."""
    model_dir = Path(repo) / name
    nodes, weights = [], []
    previous = "INPUT0"
    for layer, (w, b) in enumerate(mlp_weights(sizes, seed)):
        weights += [numpy_helper.from_array(w, f"w{layer}"), numpy_helper.from_array(b, f"b{layer}")]
        last = layer == len(sizes) - 2
        out = "OUTPUT0" if last else f"h{layer}"
        gemm_out = out if last else f"g{layer}"
        nodes.append(helper.make_node("Gemm", [previous, f"w{layer}", f"b{layer}"], [gemm_out]))
        if not last:
            nodes.append(helper.make_node("Relu", [gemm_out], [out]))
        previous = out
    graph = helper.make_graph(
        nodes,
        name,
        [_tensor("INPUT0", "FP32", ["batch", sizes[0]])],
        [_tensor("OUTPUT0", "FP32", ["batch", sizes[-1]])],
        initializer=weights,
    )
    _save(graph, model_dir / "1" / "model.onnx")
    io = [("INPUT0", "FP32", [sizes[0]])]
    config = _config(name, max_batch_size, io, [("OUTPUT0", "FP32", [sizes[-1]])], extra_config)
    (model_dir / "config.pbtxt").write_text(config)
    return model_dir


# -- PyTorch (torch is imported only here, so the ONNX-only paths never need it) ------


@functools.cache
def _torch_modules() -> SimpleNamespace:
    """The nn.Module classes the torch builders script, defined once torch is imported."""
    import torch
    from torch import Tensor, nn

    class AddSub(nn.Module):
        def forward(self, a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
            return a + b, a - b

    class AddSubNamed(nn.Module):
        def forward(self, INPUT0: Tensor, INPUT1: Tensor) -> tuple[Tensor, Tensor]:
            return INPUT0 + INPUT1, INPUT0 - INPUT1

    class AddSubDict(nn.Module):
        def forward(self, inputs: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
            return inputs["INPUT0"] + inputs["INPUT1"], inputs["INPUT0"] - inputs["INPUT1"]

    class Identity(nn.Module):
        def forward(self, INPUT0: Tensor) -> Tensor:
            return INPUT0

    class StringIdentity(nn.Module):
        def forward(self, INPUT0: list[str]) -> list[str]:
            return INPUT0

    class RunningSum(nn.Module):
        def forward(self, INPUT: Tensor, START: Tensor, READY: Tensor, STATE_IN: Tensor) -> tuple[Tensor, Tensor]:
            total = STATE_IN + INPUT
            return READY * (total + START), total

    class Mlp(nn.Module):
        def __init__(self, weights: list[tuple[np.ndarray, np.ndarray]]) -> None:
            super().__init__()
            self.layers = nn.ModuleList()
            for w, b in weights:
                layer = nn.Linear(w.shape[0], w.shape[1])
                with torch.no_grad():
                    layer.weight.copy_(torch.from_numpy(w.T.copy()))
                    layer.bias.copy_(torch.from_numpy(b))
                self.layers.append(layer)

        def forward(self, INPUT0: Tensor) -> Tensor:
            x = INPUT0
            last = len(self.layers) - 1
            for index, layer in enumerate(self.layers):
                x = layer(x)
                if index != last:
                    x = torch.relu(x)
            return x

    classes = (AddSub, AddSubNamed, AddSubDict, Identity, StringIdentity, RunningSum, Mlp)
    return SimpleNamespace(**{c.__name__: c for c in classes})


def _torch_config(
    name: str,
    max_batch_size: int,
    inputs: list[tuple[str, str, list[int]]],
    outputs: list[tuple[str, str, list[int]]],
    extra: str = "",
    platform: str = "pytorch_libtorch",
) -> str:
    return _config(name, max_batch_size, inputs, outputs, extra, platform)


def _save_script(module: object, path: Path) -> None:
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        # torch calls TorchScript deprecated; it is still the format Triton's pytorch_libtorch serves.
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.save(torch.jit.script(module), str(path))


# naming -> (module class, config input names, config output names [sum, diff]).
# Inputs and outputs are listed in the config in an order that differs from the
# model's, so only the naming rule can bind them right.
TORCH_NAMING = {
    "index": ("AddSub", ["INPUT__1", "INPUT__0"], ["OUTPUT__1", "OUTPUT__0"]),
    "forward": ("AddSubNamed", ["INPUT1", "INPUT0"], ["OUTPUT0", "OUTPUT1"]),
    "dict": ("AddSubDict", ["INPUT1", "INPUT0"], ["OUTPUT0", "OUTPUT1"]),
    "config": ("AddSub", ["first", "second"], ["SUM", "DIFF"]),
}


def write_torch_simple(
    repo: Path,
    name: str = "simple_torch",
    datatype: str = "INT32",
    max_batch_size: int = 8,
    naming: str = "forward",
    extra_config: str = "",
) -> Path:
    """Triton's `simple` as TorchScript: sum = a + b, diff = a - b on [16] tensors, with
    its inputs and outputs named by one of the PyTorch naming rules (TORCH_NAMING)."""
    module_name, inputs, outputs = TORCH_NAMING[naming]
    model_dir = Path(repo) / name
    _save_script(getattr(_torch_modules(), module_name)(), model_dir / "1" / "model.pt")
    io = [(n, datatype, [16]) for n in inputs]
    out = [(n, datatype, [16]) for n in outputs]
    (model_dir / "config.pbtxt").write_text(_torch_config(name, max_batch_size, io, out, extra_config))
    return model_dir


def write_torch_identity(repo: Path, name: str, datatype: str, max_batch_size: int = 8, extra_config: str = "") -> Path:
    """OUTPUT0 = INPUT0 as TorchScript, a [-1] vector (strings: a 1-D list, no batching)."""
    model_dir = Path(repo) / name
    module = _torch_modules().StringIdentity() if datatype == "BYTES" else _torch_modules().Identity()
    _save_script(module, model_dir / "1" / "model.pt")
    config = _torch_config(name, max_batch_size, [("INPUT0", datatype, [-1])], [("OUTPUT0", datatype, [-1])])
    (model_dir / "config.pbtxt").write_text(config + extra_config)
    return model_dir


def write_torch_sequence(repo: Path, name: str = "running_sum_torch") -> Path:
    """A stateful TorchScript model: OUTPUT__0 = READY * (running sum of INPUT__0 + START),
    the sum kept in implicit state (STATE_IN__3 -> STATE_OUT__1), START and READY INT32
    controls. Triton's PyTorch backend binds a sequence model's tensors by their
    `<name>__<index>` names only, controls and state included."""
    model_dir = Path(repo) / name
    _save_script(_torch_modules().RunningSum(), model_dir / "1" / "model.pt")
    controls = [
        f'{{ name: "{n}__{i}" control [ {{ kind: CONTROL_SEQUENCE_{n} int32_false_true: [ 0, 1 ] }} ] }}'
        for i, n in ((1, "START"), (2, "READY"))
    ]
    state = 'input_name: "STATE_IN__3" output_name: "STATE_OUT__1" data_type: TYPE_INT32 dims: [ 1 ]'
    extra = f"sequence_batching {{\n  control_input [ {', '.join(controls)} ]\n  state [ {{ {state} }} ]\n}}"
    io, out = [("INPUT__0", "INT32", [1])], [("OUTPUT__0", "INT32", [1])]
    (model_dir / "config.pbtxt").write_text(_torch_config(name, 8, io, out, extra))
    return model_dir


def write_torch_export(repo: Path, name: str = "simple_export", max_batch_size: int = 8) -> Path:
    """`simple` exported with torch.export (model.pt2, platform torch_aoti), batch dim dynamic."""
    import torch

    model_dir = Path(repo) / name
    batch = torch.export.Dim("batch", min=1, max=max_batch_size)
    example = (torch.ones(2, 16, dtype=torch.int32), torch.ones(2, 16, dtype=torch.int32))
    program = torch.export.export(_torch_modules().AddSubNamed(), example, dynamic_shapes=({0: batch}, {0: batch}))
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    torch.export.save(program, str(model_dir / "1" / "model.pt2"))
    io = [("INPUT0", "INT32", [16]), ("INPUT1", "INT32", [16])]
    out = [("OUTPUT0", "INT32", [16]), ("OUTPUT1", "INT32", [16])]
    (model_dir / "config.pbtxt").write_text(_torch_config(name, max_batch_size, io, out, platform="torch_aoti"))
    return model_dir


def mlp_weights(sizes: tuple[int, ...], seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """The seeded (weight [in, out], bias) pairs that write_mlp and write_torch_mlp share."""
    rng = np.random.default_rng(seed)
    weights = []
    for fan_in, fan_out in itertools.pairwise(sizes):
        w = (rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in)).astype(np.float32)
        weights.append((w, np.zeros(fan_out, dtype=np.float32)))
    return weights


def write_torch_mlp(
    repo: Path,
    name: str = "mlp_torch",
    sizes: tuple[int, ...] = (512, 2048, 2048, 10),
    max_batch_size: int = 64,
    extra_config: str = "dynamic_batching { }",
    seed: int = 0,
) -> Path:
    """write_mlp's network, same weights, as TorchScript (Linear + ReLU)."""
    model_dir = Path(repo) / name
    _save_script(_torch_modules().Mlp(mlp_weights(sizes, seed)), model_dir / "1" / "model.pt")
    io = [("INPUT0", "FP32", [sizes[0]])]
    config = _torch_config(name, max_batch_size, io, [("OUTPUT0", "FP32", [sizes[-1]])], extra_config)
    (model_dir / "config.pbtxt").write_text(config)
    return model_dir


def write_example_repository(repo: Path) -> None:
    """The repository `make run` serves and the README uses."""
    write_simple(repo)
    write_simple_string(repo)
    write_identity(repo)
    write_linear(repo)
    write_sequence_examples(repo)
    write_affine(repo, "preprocess", scale=0.5, offset=-1.0)
    write_affine(repo, "postprocess", scale=10.0, offset=1.0)
    io = [("INPUT0", "FP32", [4])]
    steps = [
        ("preprocess", -1, {"INPUT0": "INPUT0"}, {"OUTPUT0": "prepared"}),
        ("linear", -1, {"INPUT0": "prepared"}, {"OUTPUT0": "scaled"}),
        ("postprocess", -1, {"INPUT0": "scaled"}, {"OUTPUT0": "OUTPUT0"}),
    ]
    write_ensemble(repo, "linear_pipeline", io, [("OUTPUT0", "FP32", [4])], steps)


if __name__ == "__main__":
    write_example_repository(Path(sys.argv[1] if len(sys.argv) > 1 else "model_repository"))
