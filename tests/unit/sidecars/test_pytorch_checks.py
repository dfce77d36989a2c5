"""The pytorch backend's load checks on small scripted modules, loaded by the real
TorchRuntime on the CPU: each refusal with Triton's status and exact text, and where
the tensors of models it accepts bind."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from google.protobuf import text_format
from torch import Tensor, nn

from protos import model_config_pb2 as mc
from protos.status import Status, TurnoutError
from sidecars.pytorch.checks import check_model
from sidecars.pytorch.naming import Argument, Convention
from sidecars.pytorch.runtime import TorchInstance, TorchRuntime

# torch calls TorchScript deprecated; it is still the format Triton's pytorch_libtorch serves.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.*is deprecated:DeprecationWarning")


class AddSub(nn.Module):
    def forward(self, a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
        return a + b, a - b


class TakesDict(nn.Module):
    def forward(self, inputs: dict[str, Tensor]) -> Tensor:
        return inputs["x"]


class TakesInt(nn.Module):
    def forward(self, x: Tensor, n: int) -> Tensor:
        return x * n


class RunningSum(nn.Module):
    def forward(self, value: Tensor, start: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        return value + start + state, state + value


def config(text: str) -> mc.ModelConfig:
    parsed = mc.ModelConfig(name="m", default_model_filename="model.pt")
    text_format.Parse(text, parsed)
    if not parsed.instance_group:
        parsed.instance_group.add(name="m", kind=mc.ModelInstanceGroup.KIND_CPU, count=1)
    return parsed


def scripted(tmp_path: Path, module: nn.Module) -> Path:
    """A version folder holding `module` as TorchScript model.pt."""
    version = tmp_path / "m" / "1"
    version.mkdir(parents=True)
    torch.jit.save(torch.jit.script(module), str(version / "model.pt"))
    return version


def load(text: str, version: Path) -> TorchInstance:
    [instance] = TorchRuntime({}).load(config(text), version)
    assert isinstance(instance, TorchInstance)
    return instance


def refusal(text: str, version: Path) -> tuple[Status, str]:
    with pytest.raises(TurnoutError) as caught:
        for instance in TorchRuntime({}).load(config(text), version):
            instance.close()
    return caught.value.status, caught.value.message


def io(inputs: list[tuple[str, str]], outputs: list[tuple[str, str]], extra: str = "") -> str:
    """max_batch_size 8, each tensor (name, datatype) with dims [ 4 ]."""
    entries = [f'{{ name: "{n}" data_type: {t} dims: [ 4 ] }}' for n, t in inputs]
    results = [f'{{ name: "{n}" data_type: {t} dims: [ 4 ] }}' for n, t in outputs]
    return f"max_batch_size: 8 input [ {', '.join(entries)} ] output [ {', '.join(results)} ] {extra}"


ADD_SUB = io([("a", "TYPE_INT32"), ("b", "TYPE_INT32")], [("SUM", "TYPE_INT32"), ("DIFF", "TYPE_INT32")])


@pytest.fixture
def add_sub(tmp_path: Path) -> Path:
    return scripted(tmp_path, AddSub())


def test_a_matching_model_loads_and_binds_by_forward_names(add_sub: Path) -> None:
    instance = load(ADD_SUB, add_sub)
    try:
        assert instance._layout.positions == {"a": 0, "b": 1}
    finally:
        instance.close()


def test_an_update_opens_only_the_instances_after_those_a_group_has(add_sub: Path) -> None:
    grown = config(ADD_SUB + ' instance_group [{ name: "g" kind: KIND_CPU count: 3 }]')
    instances = TorchRuntime({}).load(grown, add_sub, first=[1])
    try:
        assert [instance.name for instance in instances if isinstance(instance, TorchInstance)] == ["g_1", "g_2"]
    finally:
        for instance in instances:
            instance.close()


def test_the_input_count_must_be_forwards(add_sub: Path) -> None:
    text = io([("a", "TYPE_INT32"), ("b", "TYPE_INT32"), ("c", "TYPE_INT32")], [("SUM", "TYPE_INT32")])
    assert refusal(text, add_sub) == (
        Status.INVALID_ARG,
        "unable to load model 'm', configuration expects 3 inputs, model provides 2",
    )


def test_an_argument_that_is_not_a_tensor_is_internal(tmp_path: Path) -> None:
    text = io([("x", "TYPE_FP32"), ("n", "TYPE_INT64")], [("y", "TYPE_FP32")])
    assert refusal(text, scripted(tmp_path, TakesInt())) == (
        Status.INTERNAL,
        "An input of type 'int' was detected in the model. Only a single input of type Dict(str, Tensor) or "
        "input(s) of type Tensor are supported.",
    )


def test_a_config_without_inputs_or_outputs_is_internal(tmp_path: Path) -> None:
    version = scripted(tmp_path, TakesDict())
    assert refusal('output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]', version) == (
        Status.INTERNAL,
        "model configuration must contain at least one input, none were specified.",
    )
    assert refusal('input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]', version) == (
        Status.INTERNAL,
        "model configuration must contain at least one output, none were specified.",
    )


@pytest.mark.parametrize("datatype", ["TYPE_UINT16", "TYPE_UINT32", "TYPE_UINT64", "TYPE_BF16"])
def test_datatypes_triton_has_no_torch_type_for(add_sub: Path, datatype: str) -> None:
    text = io([("a", datatype), ("b", "TYPE_INT32")], [("SUM", "TYPE_INT32")])
    assert refusal(text, add_sub) == (Status.INTERNAL, f"unsupported datatype {datatype} for input 'a' for model 'm'")
    text = io([("a", "TYPE_INT32"), ("b", "TYPE_INT32")], [("SUM", datatype)])
    assert refusal(text, add_sub) == (
        Status.INTERNAL,
        f"unsupported datatype {datatype} for output 'SUM' for model 'm'",
    )


def test_strings_are_one_dimensional_lists(add_sub: Path) -> None:
    text = io([("a", "TYPE_STRING"), ("b", "TYPE_INT32")], [("SUM", "TYPE_INT32")])
    assert refusal(text, add_sub) == (
        Status.INTERNAL,
        "Triton only supports 1 dimensional List of String as input for 'a' for model 'm'",
    )
    text = io([("a", "TYPE_INT32"), ("b", "TYPE_INT32")], [("SUM", "TYPE_STRING")])
    assert refusal(text, add_sub) == (
        Status.INTERNAL,
        "Triton only supports 1 dimensional List of String as output for 'SUM' for model 'm'",
    )
    unbatched = io([("a", "TYPE_STRING"), ("b", "TYPE_INT32")], [("SUM", "TYPE_INT32")]).replace(
        "max_batch_size: 8", ""
    )
    check_model(config(unbatched), [Argument("a", "ListType"), Argument("b", "TensorType")])


def test_optional_inputs_are_refused(add_sub: Path) -> None:
    text = ADD_SUB.replace(
        'name: "b" data_type: TYPE_INT32 dims: [ 4 ]', 'name: "b" data_type: TYPE_INT32 dims: [ 4 ] optional: true'
    )
    assert refusal(text, add_sub) == (
        Status.INVALID_ARG,
        "'optional' is set to true for input 'b' while the backend model doesn't support optional input",
    )


def test_a_missing_model_file_is_unavailable_with_its_full_path(tmp_path: Path) -> None:
    version = tmp_path / "m" / "1"
    version.mkdir(parents=True)
    assert refusal(ADD_SUB, version) == (
        Status.UNAVAILABLE,
        f"unable to find '{version / 'model.pt'}' for model instance 'm'",
    )


SEQUENCE = """
sequence_batching {
  control_input [ { name: "START__1" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ]
  state [ { input_name: "STATE_IN__2" output_name: "STATE_OUT__1" data_type: TYPE_INT32 dims: [ 4 ] } ]
}
"""


@pytest.fixture
def running_sum(tmp_path: Path) -> Path:
    return scripted(tmp_path, RunningSum())


def test_a_sequence_model_binds_everything_by_index(running_sum: Path) -> None:
    instance = load(io([("VALUE__0", "TYPE_INT32")], [("TOTAL__0", "TYPE_INT32")], SEQUENCE), running_sum)
    try:
        assert instance._layout.positions == {"VALUE__0": 0, "START__1": 1, "STATE_IN__2": 2}
        assert instance._indices == {"TOTAL__0": 0, "STATE_OUT__1": 1}
    finally:
        instance.close()


def test_sequence_controls_need_an_index(running_sum: Path) -> None:
    text = io([("VALUE__0", "TYPE_INT32")], [("TOTAL__0", "TYPE_INT32")], SEQUENCE.replace("START__1", "START"))
    assert refusal(text, running_sum) == (
        Status.INTERNAL,
        "input 'START' does not follow <name>__<index> naming convention.",
    )


def test_a_corrid_control_needs_a_torch_datatype(running_sum: Path) -> None:
    corrid = SEQUENCE.replace(
        "kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ]",
        "kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64",
    )
    text = io([("VALUE__0", "TYPE_INT32")], [("TOTAL__0", "TYPE_INT32")], corrid)
    assert refusal(text, running_sum) == (
        Status.INTERNAL,
        "input 'START__1' type 'TYPE_UINT64' is not supported by PyTorch.",
    )


def test_a_sequence_model_needs_indexed_input_and_output_names(running_sum: Path) -> None:
    for text in (
        io([("value", "TYPE_INT32")], [("TOTAL__0", "TYPE_INT32")], SEQUENCE),
        io([("VALUE__0", "TYPE_INT32")], [("TOTAL", "TYPE_INT32")], SEQUENCE),
    ):
        assert refusal(text, running_sum) == (
            Status.INVALID_ARG,
            "PyTorch model 'm' is using sequence batching with state but not all inputs and outputs follow the "
            "<name>__<index> naming convention. ",
        )
    text = io([("VALUE__0", "TYPE_INT32")], [("TOTAL__0", "TYPE_INT32")], SEQUENCE.replace("STATE_IN__2", "STATE_IN"))
    assert refusal(text, running_sum) == (
        Status.INVALID_ARG,
        "PyTorch model 'm' is using sequence batching with state but state 'STATE_IN' does not follow the "
        "<name>__<index> naming convention. ",
    )


def test_state_datatypes_need_a_torch_type(running_sum: Path) -> None:
    text = io(
        [("VALUE__0", "TYPE_INT32")],
        [("TOTAL__0", "TYPE_INT32")],
        SEQUENCE.replace("TYPE_INT32 dims", "TYPE_BF16 dims"),
    )
    assert refusal(text, running_sum) == (
        Status.INTERNAL,
        "unsupported datatype TYPE_BF16 for input state 'STATE_IN__2' for model 'm'",
    )


def test_a_dict_input_takes_its_convention_from_the_outputs() -> None:
    # Triton reads the output names when forward() has no named tensor arguments.
    text = 'input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ] '
    text += 'output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]'
    bindings = check_model(config(text), [Argument("inputs", "DictType")])
    assert bindings.inputs.dict_input and bindings.output_convention is Convention.CONFIG_ORDER
    with pytest.raises(TurnoutError, match="not all inputs and outputs follow"):
        check_model(config(text + "sequence_batching { }"), [Argument("inputs", "DictType")])
