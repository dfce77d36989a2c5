"""turnout's own check of torch.export programs (model.pt2) against their config, on real
exported programs loaded by the TorchRuntime: names, datatypes and dims in the
onnxruntime backend's words, after Triton's PyTorch checks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from google.protobuf import text_format
from torch import Tensor, nn

from protos import model_config_pb2 as mc
from protos.status import Status, TurnoutError
from sidecars.pytorch.runtime import TorchRuntime


class AddSub(nn.Module):
    def forward(self, INPUT0: Tensor, INPUT1: Tensor) -> tuple[Tensor, Tensor]:
        return INPUT0 + INPUT1, INPUT0 - INPUT1


def exported(tmp_path: Path, batch: torch.export.Dim | None = None) -> Path:
    """AddSub over int32 [2, 16] examples, dim 0 dynamic when `batch` is given."""
    version = tmp_path / "m" / "1"
    version.mkdir(parents=True)
    example = (torch.ones(2, 16, dtype=torch.int32), torch.ones(2, 16, dtype=torch.int32))
    shapes = ({0: batch}, {0: batch}) if batch is not None else None
    torch.export.save(torch.export.export(AddSub(), example, dynamic_shapes=shapes), str(version / "model.pt2"))
    return version


@pytest.fixture(scope="module")
def batched(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return exported(tmp_path_factory.mktemp("batched"), torch.export.Dim("batch", min=1, max=8))


def config(inputs: tuple[str, str] = ("INPUT0", "INPUT1"), datatype: str = "TYPE_INT32", extra: str = "") -> str:
    entries = [f'{{ name: "{name}" data_type: {datatype} dims: [ 16 ] }}' for name in inputs]
    outputs = (
        '{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] }'
    )
    return f"max_batch_size: 8 input [ {', '.join(entries)} ] output [ {outputs} ] {extra}"


def load(text: str, version: Path) -> None:
    parsed = mc.ModelConfig(name="m", platform="torch_aoti", default_model_filename="model.pt2")
    text_format.Parse(text, parsed)
    parsed.instance_group.add(name="m", kind=mc.ModelInstanceGroup.KIND_CPU, count=1)
    for instance in TorchRuntime({}).load(parsed, version):
        instance.close()


def refusal(text: str, version: Path) -> tuple[Status, str]:
    with pytest.raises(TurnoutError) as caught:
        load(text, version)
    return caught.value.status, caught.value.message


def test_a_matching_config_loads(batched: Path) -> None:
    load(config(), batched)
    load(config(("INPUT__0", "INPUT__1")), batched)


def test_inputs_name_forward_arguments(batched: Path) -> None:
    assert refusal(config(("INPUT0", "X")), batched) == (
        Status.INVALID_ARG,
        "unexpected inference input 'X', allowed inputs are: INPUT0, INPUT1",
    )


def test_datatypes_are_the_programs(batched: Path) -> None:
    assert refusal(config(datatype="TYPE_FP32"), batched) == (
        Status.INVALID_ARG,
        "unable to load model 'm', configuration expects datatype TYPE_FP32 for input 'INPUT0', model provides "
        "TYPE_INT32",
    )
    text = config().replace('"OUTPUT1" data_type: TYPE_INT32', '"OUTPUT1" data_type: TYPE_INT64')
    assert refusal(text, batched) == (
        Status.INVALID_ARG,
        "unable to load model 'm', configuration expects datatype TYPE_INT64 for output 'OUTPUT1', model provides "
        "TYPE_INT32",
    )


def test_dims_are_the_programs(batched: Path) -> None:
    text = config().replace(
        '"OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ]', '"OUTPUT0" data_type: TYPE_INT32 dims: [ 8 ]'
    )
    assert refusal(text, batched) == (
        Status.INVALID_ARG,
        "model 'm', tensor 'OUTPUT0': the model expects 2 dimensions (shape [-1,16]) but the model configuration "
        "specifies 2 dimensions (an initial batch dimension because max_batch_size > 0 followed by the explicit "
        "tensor shape, making complete shape [-1,8])",
    )


def test_batching_needs_a_program_exported_with_a_dynamic_batch(tmp_path: Path) -> None:
    assert refusal(config(), exported(tmp_path)) == (
        Status.INVALID_ARG,
        "model 'm', tensor 'INPUT0': for the model to support batching the shape should have at least 1 dimension "
        "and the first dimension must be -1; but shape expected by the model is [2,16]",
    )
