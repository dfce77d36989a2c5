"""Fixtures for the sidecar tests: tiny ONNX repositories and real sidecar processes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import make_models
from tests.sidecars.sidecar_harness import DATATYPES, LABELS, Sidecar, running


def write_scalar(repo: Path, name: str) -> None:
    """A model whose input and output are rank 0, with no config (auto-complete reshapes)."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["X"], ["Y"])],
        name,
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (repo / name / "1").mkdir(parents=True)
    onnx.save(model, str(repo / name / "1" / "model.onnx"))


def build_main_repository(repo: Path) -> Path:
    models = make_models()
    models.write_simple(repo)
    models.write_simple_string(repo)
    models.write_simple(repo, name="simple_nobatch", max_batch_size=0)
    models.write_linear(repo)
    for datatype in DATATYPES:
        models.write_identity(repo, name=f"identity_{datatype.lower()}", datatype=datatype)
    models.write_simple(
        repo, name="simple_dyn", extra_config="dynamic_batching { max_queue_delay_microseconds: 20000 }"
    )
    models.write_simple(
        repo,
        name="simple_queue",
        extra_config="dynamic_batching { max_queue_delay_microseconds: 1000000 "
        "default_queue_policy { max_queue_size: 1 } }",
    )
    models.write_simple(
        repo,
        name="simple_timeout",
        extra_config="dynamic_batching { max_queue_delay_microseconds: 3000000 "
        "default_queue_policy { default_timeout_microseconds: 100000 timeout_action: REJECT } }",
    )
    models.write_simple(
        repo,
        name="simple_override",
        extra_config="dynamic_batching { max_queue_delay_microseconds: 3000000 "
        "default_queue_policy { default_timeout_microseconds: 10000000 allow_timeout_override: true } }",
    )
    models.write_simple(
        repo,
        name="simple_delay",
        extra_config="dynamic_batching { max_queue_delay_microseconds: 300000 "
        "default_queue_policy { default_timeout_microseconds: 50000 timeout_action: DELAY } }",
    )
    models.write_simple(
        repo,
        name="simple_priority",
        extra_config="dynamic_batching { priority_levels: 2 default_priority_level: 2 }",
    )
    models.write_identity(repo, name="auto_identity", datatype="FP32", with_config=False)
    models.write_identity(repo, name="auto_partial", datatype="FP32", with_config=False)
    (repo / "auto_partial" / "config.pbtxt").write_text(
        'max_batch_size: 2\ninput [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
    )
    write_scalar(repo, "auto_scalar")
    models.write_identity(repo, name="classifier", datatype="FP32")
    config = (repo / "classifier" / "config.pbtxt").read_text()
    config = config.replace('name: "OUTPUT0"', 'name: "OUTPUT0"\n    label_filename: "labels.txt"')
    (repo / "classifier" / "config.pbtxt").write_text(config)
    (repo / "classifier" / "labels.txt").write_text("\n".join(LABELS) + "\n")
    # Neither a directory nor this framework's: both must be ignored.
    (repo / "README.txt").write_text("not a model")
    (repo / "torch_model" / "1").mkdir(parents=True)
    (repo / "torch_model" / "config.pbtxt").write_text('name: "torch_model"\nplatform: "pytorch_libtorch"\n')
    return repo


@pytest.fixture(scope="module")
def main_sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    repo = build_main_repository(tmp_path_factory.mktemp("repo"))
    with running(repo) as sidecar:
        yield sidecar


@pytest.fixture(scope="module")
def explicit_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("explicit")
    models = make_models()
    models.write_simple(repo)
    models.write_linear(repo, versions={1: 1.0, 2: 2.0, 3: 3.0})
    models.write_simple(repo, name="reloadable")
    models.write_simple(repo, name="unbatched", max_batch_size=0)
    (repo / "unbatched" / "config.pbtxt").write_text("max_batch_size: 4\n")
    return repo


@pytest.fixture(scope="module")
def explicit_sidecar(explicit_repo: Path) -> Iterator[Sidecar]:
    with running(explicit_repo, "--model-control-mode=explicit", "--load-model=simple") as sidecar:
        yield sidecar
