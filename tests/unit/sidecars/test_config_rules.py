"""Triton core's configuration rules, one at a time and in its order: the backend fields
derived from a model folder, the configuration's own checks, its inputs and outputs, its
instance groups, the fields turnout does not implement, and an ensemble's dependencies."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from google.protobuf import text_format

from protos import model_config_pb2 as mc
from protos.status import Status, TurnoutError
from sidecars.config import poll_config
from sidecars.config_rules import (
    check_unimplemented,
    complete_backend_fields,
    normalize_instance_groups,
    validate_instance_groups,
    validate_io_config,
    validate_model_config,
)
from sidecars.ensemble.dependencies import check_dependencies
from sidecars.repository import Repository


def config_of(text: str, name: str = "m") -> mc.ModelConfig:
    config = mc.ModelConfig()
    text_format.Parse(text, config)
    if not config.name:
        config.name = name
    return config


def refusal(check: object, *arguments: object) -> str:
    with pytest.raises(TurnoutError) as caught:
        check(*arguments)  # type: ignore[operator]
    return caught.value.message


def model_folder(tmp_path: Path, files: dict[str, str], name: str = "m") -> Path:
    folder = tmp_path / name
    folder.mkdir()
    for relative, text in files.items():
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        (folder / relative).write_text(text)
    return folder


# -- backend fields ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"1/model.onnx": ""}, ("onnxruntime", "onnxruntime_onnx", "model.onnx")),
        ({"1/model.onnx/model.onnx": ""}, ("onnxruntime", "onnxruntime_onnx", "model.onnx")),
        ({"1/model.pt": ""}, ("pytorch", "pytorch_libtorch", "model.pt")),
        ({"1/model.pt2": ""}, ("pytorch", "torch_aoti", "model.pt2")),
        ({"1/model.plan": ""}, ("tensorrt", "tensorrt_plan", "model.plan")),
        ({"1/model.py": ""}, ("python", "", "model.py")),
        ({"1/model.graphdef": ""}, ("tensorflow", "tensorflow_graphdef", "model.graphdef")),
        # Only the first subfolder by name counts, not the newest version.
        ({"1/model.onnx": "", "2/model.pt": ""}, ("onnxruntime", "onnxruntime_onnx", "model.onnx")),
        ({"10/model.pt": "", "9/model.onnx": ""}, ("pytorch", "pytorch_libtorch", "model.pt")),
    ],
)
def test_backend_fields_from_the_first_subfolder(
    tmp_path: Path, files: dict[str, str], expected: tuple[str, str, str]
) -> None:
    config = mc.ModelConfig()
    complete_backend_fields(config, model_folder(tmp_path, files))
    assert (config.backend, config.platform, config.default_model_filename) == expected
    assert config.name == "m"


def test_a_platform_names_its_backend_and_file(tmp_path: Path) -> None:
    config = config_of('platform: "tensorrt_plan"')
    complete_backend_fields(config, model_folder(tmp_path, {"1/model.onnx": ""}))
    assert (config.backend, config.default_model_filename) == ("tensorrt", "model.plan")


def test_an_unknown_platform_leaves_the_backend_empty(tmp_path: Path) -> None:
    config = config_of('platform: "onnxruntim"')
    complete_backend_fields(config, model_folder(tmp_path, {"1/model.onnx": ""}))
    assert config.backend == ""
    assert refusal(validate_model_config, config) == "unexpected platform type 'onnxruntim' for m"


def test_no_backend_and_no_file(tmp_path: Path) -> None:
    assert refusal(complete_backend_fields, mc.ModelConfig(), model_folder(tmp_path, {"1/notes.txt": ""})) == (
        "Invalid model name: Could not determine backend for model 'm' with no backend in model configuration. "
        "Expected model name of the form 'model.<backend_name>'."
    )


def test_a_dotted_folder_names_a_custom_backend(tmp_path: Path) -> None:
    config = mc.ModelConfig()
    complete_backend_fields(config, model_folder(tmp_path, {}, name="m.custom"))
    assert (config.backend, config.default_model_filename) == ("custom", "model.custom")


# -- the configuration on its own ------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            'backend: "pytorch" platform: "onnxruntime_onnx"',
            "unexpected 'platform' and 'backend' pair, got:onnxruntime_onnx, pytorch",
        ),
        (
            'backend: "onnxruntime" platform: "ensemble"',
            "Ensemble model 'm' must have platform type 'ensemble' and empty backend type",
        ),
        (
            'backend: "onnxruntime" platform: "onnxruntime_onnx" max_batch_size: -2',
            "'max_batch_size' must be non-negative value for m",
        ),
        (
            'backend: "onnxruntime" platform: "onnxruntime_onnx" max_batch_size: 4 '
            "dynamic_batching { preferred_batch_size: [ 8 ] }",
            "dynamic batching preferred size must be <= max batch size for m",
        ),
        (
            'backend: "onnxruntime" platform: "onnxruntime_onnx" dynamic_batching { priority_levels: 3 }',
            "default priority level must be in range [1, 3] for m",
        ),
        (
            'backend: "python" model_transaction_policy { decoupled: true } response_cache { enable: true }',
            "Response Cache does not currently support model m with 'decoupled' transaction policy. "
            "Please disable the response cache.",
        ),
    ],
)
def test_the_configuration_on_its_own(text: str, message: str) -> None:
    assert refusal(validate_model_config, config_of(text)) == message


def test_any_platform_goes_with_a_backend_triton_does_not_know() -> None:
    validate_model_config(config_of('backend: "python" platform: "whatever"'))


# -- inputs and outputs ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tensor", "message"),
    [
        ('name: "x" dims: [ 1 ]', "model input 'x' must specify 'data_type' for m"),
        ('name: "x" data_type: TYPE_FP32', "model input 'x' must specify 'dims' for m"),
        (
            'name: "x" data_type: TYPE_FP32 dims: [ -2 ]',
            "model input 'x' dimension must be integer >= 1, or -1 to indicate a variable-size dimension for m",
        ),
        (
            'name: "x" data_type: TYPE_FP32 dims: [ 6 ] reshape { shape: [ 4 ] }',
            "model input 'x' has different size for dims and reshape for m",
        ),
        (
            'name: "x" data_type: TYPE_FP32 dims: [ -1, 2 ] reshape { shape: [ 2, -1, 1, -1 ] }',
            "model input 'x' has different number of variable-size dimensions for dims and reshape for m",
        ),
        (
            'name: "x" data_type: TYPE_FP32 dims: [ 3 ] format: FORMAT_NCHW',
            "model input NHWC/NCHW require 3 dims for m",
        ),
        (
            'name: "x" data_type: TYPE_FP32 dims: [ 3 ] is_shape_tensor: true',
            "shape tensors are only supported for TensorRT platform for m",
        ),
    ],
)
def test_inputs(tensor: str, message: str) -> None:
    config = config_of(f'platform: "onnxruntime_onnx" input [ {{ {tensor} }} ]')
    assert refusal(validate_io_config, config) == message


def test_a_scalar_reshape_needs_a_batching_model() -> None:
    text = 'output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] reshape { } } ]'
    assert refusal(validate_io_config, config_of(text)) == (
        "model output 'y' cannot have empty reshape for non-batching model as scalar tensors are not supported for m"
    )
    validate_io_config(config_of("max_batch_size: 2 " + text))


def test_batch_inputs_and_outputs() -> None:
    base = (
        'input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ] '
        'output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ] '
    )
    bad_type = (
        base + 'batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "n" data_type: TYPE_INT64 source_input: "x" } ]'
    )
    assert (
        refusal(validate_io_config, config_of(bad_type))
        == "batch input data type must be TYPE_INT32 or TYPE_FP32 for m"
    )
    two_sources = (
        base
        + 'batch_input [ { kind: BATCH_ITEM_SHAPE target_name: "n" data_type: TYPE_INT32 source_input: [ "x", "x" ] } ]'
    )
    assert (
        refusal(validate_io_config, config_of(two_sources))
        == "batch input kind 'BATCH_ITEM_SHAPE' expects 1 source input, got 2 for m"
    )
    twice = (
        base + 'batch_output [ { target_name: [ "y", "y" ] kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "x" } ]'
    )
    assert refusal(validate_io_config, config_of(twice)) == "target output name 'y' can only be specified once for m"


# -- instance groups -------------------------------------------------------------------------


def test_instance_groups_are_named_and_counted_as_in_triton() -> None:
    config = config_of('backend: "onnxruntime"')
    normalize_instance_groups(config, [])
    [group] = config.instance_group
    assert (group.name, group.kind, group.count) == ("m", mc.ModelInstanceGroup.KIND_CPU, 2)
    config = config_of('backend: "pytorch" instance_group [ { count: -3 }, { kind: KIND_GPU } ]')
    normalize_instance_groups(config, [0, 1])
    assert [(g.name, g.kind, g.count, list(g.gpus)) for g in config.instance_group] == [
        ("m_0", mc.ModelInstanceGroup.KIND_GPU, 1, [0, 1]),
        ("m_1", mc.ModelInstanceGroup.KIND_GPU, 1, [0, 1]),
    ]


@pytest.mark.parametrize(
    ("groups", "gpus", "message"),
    [
        (
            "{ kind: KIND_CPU gpus: [ 0 ] }",
            [],
            "instance group m_0 of model m has kind KIND_CPU but specifies one or more GPUs",
        ),
        (
            "{ kind: KIND_MODEL gpus: [ 0 ] }",
            [],
            "instance group m_0 of model m has kind KIND_MODEL but specifies one or more GPUs",
        ),
        (
            "{ kind: KIND_GPU gpus: [ 3 ] }",
            [0, 1],
            "instance group m_0 of model m specifies invalid or unsupported gpu id 3. GPUs with at least the minimum "
            "required CUDA compute compatibility of 6.000000 are: 0, 1",
        ),
        (
            "{ kind: KIND_GPU gpus: [ -1 ] }",
            [],
            "instance group m_0 of model m specifies invalid or unsupported gpu id -1. GPUs with at least the minimum "
            "required CUDA compute compatibility of 6.000000 are: ",
        ),
    ],
)
def test_instance_groups(groups: str, gpus: list[int], message: str) -> None:
    config = config_of(f'platform: "onnxruntime_onnx" instance_group [ {groups} ]')
    normalize_instance_groups(config, gpus)
    assert refusal(validate_instance_groups, config, gpus) == message


# -- what turnout does not implement ---------------------------------------------------------


def test_fields_that_change_results_are_refused() -> None:
    with pytest.raises(TurnoutError) as caught:
        check_unimplemented(config_of("sequence_batching { iterative_sequence: true }"))
    assert caught.value.status is Status.UNSUPPORTED
    assert caught.value.message.startswith(
        "model 'm' sets sequence_batching { iterative_sequence: true }, which turnout does not implement: "
    )


def test_fields_that_change_only_speed_are_warned_about() -> None:
    warnings = check_unimplemented(
        config_of("response_cache { enable: true } instance_group [ { rate_limiter { priority: 2 } } ]")
    )
    assert [w.split(",")[0] for w in warnings] == [
        "model 'm' sets response_cache { enable: true }",
        "model 'm' sets instance_group { rate_limiter }",
    ]
    assert check_unimplemented(config_of("optimization { input_pinned_memory { enable: true } }")) == []


# -- the first stage, in order ---------------------------------------------------------------


def test_poll_checks_the_name_after_the_configuration(tmp_path: Path) -> None:
    folder = model_folder(tmp_path, {"config.pbtxt": 'name: "other" max_batch_size: -1', "1/model.onnx": ""})
    assert refusal(poll_config, folder, "m", None, True) == "'max_batch_size' must be non-negative value for other"
    (folder / "config.pbtxt").write_text('name: "other"')
    assert refusal(poll_config, folder, "m", None, True) == (
        "unexpected directory name 'm' for model 'other', directory name must equal model name"
    )


def test_without_auto_complete_a_config_is_required_and_checked_whole(tmp_path: Path) -> None:
    folder = model_folder(tmp_path, {"1/model.onnx": ""})
    assert refusal(poll_config, folder, "m", None, False) == (
        f"failed to open text file for read {folder / 'config.pbtxt'}: No such file or directory"
    )
    (folder / "config.pbtxt").write_text('input [ { name: "x" dims: [ 1 ] } ]')
    assert refusal(poll_config, folder, "m", None, False) == "model input 'x' must specify 'data_type' for m"
    assert poll_config(folder, "m", None, True).backend == "onnxruntime"


# -- ensembles -------------------------------------------------------------------------------

ENSEMBLE = """
platform: "ensemble"
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [ {
  model_name: "%s" input_map { key: "x" value: "IN" } output_map { key: "y" value: "OUT" }
} ] }
"""
STEP = (
    'platform: "onnxruntime_onnx" input [ { name: "x" data_type: TYPE_%s dims: [ 4 ] } ] '
    'output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]'
)


def test_ensemble_dependencies(tmp_path: Path) -> None:
    texts = {
        "a": ENSEMBLE % "b",
        "b": ENSEMBLE % "c",
        "c": ENSEMBLE % "a",
        "step": STEP % "FP32",
        "int": STEP % "INT32",
    }

    def lookup(name: str) -> str | None:
        return texts.get(name)

    assert refusal(check_dependencies, config_of(ENSEMBLE % "ghost", "e"), lookup) == (
        "ensemble e contains models that are not available or ambiguous: ghost"
    )
    assert refusal(check_dependencies, config_of(texts["a"], "a"), lookup) == (
        "circular dependency between ensembles: a -> ... -> c -> a"
    )
    assert refusal(check_dependencies, config_of(ENSEMBLE % "int", "e"), lookup) == (
        "in ensemble e, ensemble tensor IN: inconsistent data type: TYPE_FP32 is inferred from model e while "
        "TYPE_INT32 is inferred from model int"
    )
    check_dependencies(config_of(ENSEMBLE % "step", "e"), lookup)
    texts["auto"] = 'platform: "onnxruntime_onnx"'  # completed by its sidecar: the gateway checks it
    check_dependencies(config_of(ENSEMBLE % "auto", "e"), lookup)


def test_a_repository_that_is_a_model_folder(tmp_path: Path) -> None:
    model = model_folder(tmp_path, {"config.pbtxt": "", "1/model.onnx": ""})
    empty = tmp_path / "empty"
    empty.mkdir()
    assert Repository([str(model), str(empty)], "onnxruntime").misplaced() == [
        (
            logging.ERROR,
            f"model repository '{model}' looks like a model folder (it holds config.pbtxt or version folders); "
            "--model-repository takes the folder that holds the model folders",
        ),
        (logging.WARNING, f"model repository '{empty}' holds no model folders"),
    ]
    assert Repository([str(tmp_path)], "onnxruntime").misplaced() == []
