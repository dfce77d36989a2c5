"""A repository of models Triton refuses, served by `turnout up`: each is refused in
Triton's words (ONNX, TorchScript and ensembles; the configuration on its own, its
versions, its files, the framework's checks, the step models), in the log, in the
index and in the answer to a load over HTTP and gRPC; the start fails under
--exit-on-error, and without it the rest of the repository serves."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.harness import Server, ServerFailedToStart, make_models, turnout_up

pytest.importorskip("torch", reason="the PyTorch sidecar needs torch (pip install -c constraints.txt -e '.[pytorch]')")

# Where a refusal happens, which decides how a load answers and how the index lists it:
POLL = "poll"  # the configuration on its own: 500 "failed to poll", the index names no version
MODEL = "model"  # before any version (versions, dependencies): 400 "load failed", no version
VERSION = "version"  # a version's files or the framework's checks: 400, the version UNAVAILABLE
GATEWAY = "gateway"  # an ensemble whose steps contradict the step models as loaded

INT16 = [("INPUT0", "INT32", [16]), ("INPUT1", "INT32", [16])]
SUM_DIFF = [("OUTPUT0", "INT32", [16]), ("OUTPUT1", "INT32", [16])]
PAIR = {"INPUT0": "INPUT0", "INPUT1": "INPUT1"}


@dataclass(frozen=True)
class Case:
    name: str
    write: Callable[[Path, str], None]
    text: str  # Triton's text, or the part of it without paths
    stage: str
    code: str = "Invalid argument"  # the version reason's code (VERSION only)


def edit(model_dir: Path, extra: str, replace: tuple[str, str]) -> None:
    """Edit a config written on one line (so `replace` reads as the config does)."""
    config = " ".join((model_dir / "config.pbtxt").read_text().split())
    if replace[0]:
        assert replace[0] in config, (replace, config)
        config = config.replace(*replace)
    (model_dir / "config.pbtxt").write_text(f"{config}\n{extra}\n")


def simple(extra: str = "", replace: tuple[str, str] = ("", "")) -> Callable[[Path, str], None]:
    """`simple` (ONNX) under the case's name, its config edited."""

    def write(repo: Path, name: str) -> None:
        edit(make_models().write_simple(repo, name=name), extra, replace)

    return write


def simple_config(text: str) -> Callable[[Path, str], None]:
    """`simple`'s ONNX file with a config of its own ({name} is the case's name)."""

    def write(repo: Path, name: str) -> None:
        model_dir = make_models().write_simple(repo, name=name)
        (model_dir / "config.pbtxt").write_text(text.replace("{name}", name))

    return write


def folder(files: dict[str, str | None]) -> Callable[[Path, str], None]:
    """A folder of files; None is `simple`'s ONNX model."""

    def write(repo: Path, name: str) -> None:
        model_dir = repo / name
        model_dir.mkdir(parents=True)
        onnx = None
        for relative, text in files.items():
            path = model_dir / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            if text is None:
                if onnx is None:
                    scratch = repo.parent / f"scratch_{name}"
                    onnx = (make_models().write_simple(scratch, name="s") / "1" / "model.onnx").read_bytes()
                    shutil.rmtree(scratch)
                path.write_bytes(onnx)
            else:
                path.write_text(text.replace("{name}", name))

    return write


def torch(extra: str = "", replace: tuple[str, str] = ("", "")) -> Callable[[Path, str], None]:
    def write(repo: Path, name: str) -> None:
        edit(make_models().write_torch_simple(repo, name=name, naming="forward"), extra, replace)

    return write


def ensemble(
    steps: list[tuple[str, dict[str, str], dict[str, str]]],
    inputs: list[tuple[str, str, list[int]]] = INT16,
    outputs: list[tuple[str, str, list[int]]] = SUM_DIFF,
    max_batch_size: int = 8,
    extra: str = "",
) -> Callable[[Path, str], None]:
    def write(repo: Path, name: str) -> None:
        resolved = [(model.replace("{name}", name), -1, i, o) for model, i, o in steps]
        make_models().write_ensemble(repo, name, inputs, outputs, resolved, max_batch_size, extra_config=extra)

    return write


def write_identity_ensemble_steps(repo: Path) -> None:
    """The step models the ensembles use: `simple` (a whole config) and `auto_simple`
    (ONNX with no config: only its sidecar knows its inputs), `torch_simple`."""
    models = make_models()
    models.write_simple(repo)
    auto = models.write_simple(repo, name="auto_simple")
    (auto / "config.pbtxt").unlink()
    models.write_torch_simple(repo, name="torch_simple", naming="forward")
    models.write_simple(repo, name=".hidden_simple")  # served: Triton skips no folder


SIMPLE_STEP = ("simple", PAIR, {"OUTPUT0": "OUTPUT0", "OUTPUT1": "OUTPUT1"})
DYNAMIC = "dynamic_batching { %s }"
CONTROL = 'sequence_batching { control_input [ { name: "%s" control [ { kind: CONTROL_SEQUENCE_START %s } ] } ] }'

CASES = [
    # -- the configuration on its own (Triton's repository poll) --------------------------
    Case("unparseable", simple("output [ {"), "failed to read text proto from ", POLL),
    Case("unknown_field", simple("no_such_field: 3"), "failed to read text proto from ", POLL),
    Case("bad_enum", simple(replace=("TYPE_INT32", "TYPE_FLOAT3")), "failed to read text proto from ", POLL),
    Case(
        "negative_max_batch",
        simple(replace=("max_batch_size: 8", "max_batch_size: -1")),
        "'max_batch_size' must be non-negative value for negative_max_batch",
        POLL,
    ),
    Case(
        "name_mismatch",
        simple(replace=('name: "name_mismatch"', 'name: "other"')),
        "unexpected directory name 'name_mismatch' for model 'other', directory name must equal model name",
        POLL,
    ),
    Case(
        "platform_typo",
        simple(replace=('platform: "onnxruntime_onnx"', 'platform: "onnxruntim"')),
        "unexpected platform type 'onnxruntim' for platform_typo",
        POLL,
    ),
    Case(
        "platform_backend_pair",
        simple('backend: "pytorch"'),
        "unexpected 'platform' and 'backend' pair, got:onnxruntime_onnx, pytorch",
        POLL,
    ),
    Case(
        "preferred_above_max",
        simple(DYNAMIC % "preferred_batch_size: [ 16 ]"),
        "dynamic batching preferred size must be <= max batch size for preferred_above_max",
        POLL,
    ),
    Case(
        "preferred_zero",
        simple(DYNAMIC % "preferred_batch_size: [ 0 ]"),
        "dynamic batching preferred size must be positive for preferred_zero",
        POLL,
    ),
    Case(
        "default_priority_out_of_range",
        simple(DYNAMIC % "priority_levels: 2 default_priority_level: 3"),
        "default priority level must be in range [1, 2] for default_priority_out_of_range",
        POLL,
    ),
    Case(
        "priority_policy_out_of_range",
        simple(
            DYNAMIC % "priority_levels: 2 default_priority_level: 1 "
            "priority_queue_policy { key: 3 value { max_queue_size: 1 } }"
        ),
        "priority queue policy must have priority level in range [1, 2] for priority_policy_out_of_range",
        POLL,
    ),
    Case(
        "ordering_with_priorities",
        simple(DYNAMIC % "priority_levels: 2 default_priority_level: 1 preserve_ordering: true"),
        "Only one priority level is allowed when 'preserve_ordering' is true for ordering_with_priorities",
        POLL,
    ),
    Case(
        "ordering_with_delay",
        simple(
            DYNAMIC % "preserve_ordering: true default_queue_policy "
            "{ timeout_action: DELAY default_timeout_microseconds: 1000 }"
        ),
        "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true for ordering_with_delay",
        POLL,
    ),
    Case(
        "control_without_name",
        simple(CONTROL % ("", "int32_false_true: [ 0, 1 ]")),
        "sequence batching control tensor must have a name for control_without_name",
        POLL,
    ),
    Case(
        "control_without_values",
        simple(CONTROL % ("START", "")),
        "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or 'bool_false_true' for "
        "CONTROL_SEQUENCE_START for control_without_values",
        POLL,
    ),
    Case(
        "sequence_with_cache",
        simple("sequence_batching { }\nresponse_cache { enable: true }"),
        "Response Cache does not currently support model sequence_with_cache with sequence batching scheduler. "
        "Please disable the response cache.",
        POLL,
    ),
    Case(
        "steps_on_onnx",
        simple('ensemble_scheduling { step [ { model_name: "simple" } ] }'),
        "ensemble scheduling cannot be set for model 'steps_on_onnx' whose platform is not ensemble",
        POLL,
    ),
    Case(
        "no_backend_no_file",
        folder({"1/README.txt": "nothing to serve"}),
        "Invalid model name: Could not determine backend for model 'no_backend_no_file' with no backend in model "
        "configuration. Expected model name of the form 'model.<backend_name>'.",
        POLL,
    ),
    Case(
        "file_outside_version",
        folder({"model.onnx": None}),
        "Invalid model name: Could not determine backend for model 'file_outside_version'",
        POLL,
    ),
    # -- versions -------------------------------------------------------------------------
    Case(
        ".git",  # hidden folders are models to Triton too; this one has no version
        folder({"HEAD": "ref: refs/heads/main", "objects/info/packs": ""}),
        "at least one version must be available under the version policy of model '.git'",
        MODEL,
    ),
    Case(
        "no_version_folder",
        folder({"config.pbtxt": 'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n'}),
        "at least one version must be available under the version policy of model 'no_version_folder'",
        MODEL,
    ),
    Case(
        "policy_names_absent_version",
        simple("version_policy: { specific { versions: [ 3 ] } }"),
        "at least one version must be available under the version policy of model 'policy_names_absent_version'",
        MODEL,
    ),
    # -- each version: the whole configuration, its files, the framework ------------------
    Case(
        "input_without_type",
        simple(replace=("data_type: TYPE_INT32", "")),
        "model input 'INPUT0' must specify 'data_type' for input_without_type",
        VERSION,
    ),
    Case(
        "input_without_dims",
        simple(replace=("dims: [ 16 ]", "")),
        "model input 'INPUT0' must specify 'dims' for input_without_dims",
        VERSION,
    ),
    Case(
        "zero_dim",
        simple(replace=("dims: [ 16 ]", "dims: [ 0 ]")),
        "model input 'INPUT0' dimension must be integer >= 1, or -1 to indicate a variable-size dimension for zero_dim",
        VERSION,
    ),
    Case(
        "reshape_size",
        simple(replace=("dims: [ 16 ]", "dims: [ 16 ] reshape: { shape: [ 4, 5 ] }")),
        "model input 'INPUT0' has different size for dims and reshape for reshape_size",
        VERSION,
    ),
    Case(
        "cpu_group_with_gpus",
        simple("instance_group [ { kind: KIND_CPU gpus: [ 0 ] } ]"),
        "instance group cpu_group_with_gpus_0 of model cpu_group_with_gpus has kind KIND_CPU but specifies one or "
        "more GPUs",
        VERSION,
    ),
    Case(
        "negative_gpu_id",
        simple("instance_group [ { kind: KIND_GPU gpus: [ -1 ] } ]"),
        "instance group negative_gpu_id_0 of model negative_gpu_id specifies invalid or unsupported gpu id -1. GPUs "
        "with at least the minimum required CUDA compute compatibility of 6.000000 are: ",
        VERSION,
    ),
    Case(
        "profile_on_onnx",
        simple('instance_group [ { kind: KIND_CPU profile: [ "0" ] } ]'),
        "instance group profile_on_onnx_0 of model profile_on_onnx and platform onnxruntime_onnxspecifies profile "
        "field which is only supported for TensorRT models",
        VERSION,
    ),
    Case(
        "shape_tensor_on_onnx",
        simple(replace=("dims: [ 16 ]", "dims: [ 16 ] is_shape_tensor: true")),
        "shape tensors are only supported for TensorRT platform for shape_tensor_on_onnx",
        VERSION,
    ),
    Case(
        "batch_input_source",
        simple(
            'batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "COUNT" data_type: TYPE_FP32 '
            'source_input: "NOPE" } ]'
        ),
        "unknown source input name 'NOPE' for batch_input_source",
        VERSION,
    ),
    Case(
        "missing_label_file",
        simple(replace=('name: "OUTPUT0"', 'name: "OUTPUT0" label_filename: "labels.txt"')),
        "failed to open text file for read ",
        VERSION,
        code="Internal",
    ),
    Case(
        "missing_model_file",
        folder({"config.pbtxt": 'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n', "1/notes.txt": "empty"}),
        "/missing_model_file/1/model.onnx' for model instance 'missing_model_file'",
        VERSION,
        code="Unavailable",
    ),
    Case(
        "missing_named_file",
        simple('default_model_filename: "other.onnx"'),
        "/missing_named_file/1/other.onnx' for model instance 'missing_named_file'",
        VERSION,
        code="Unavailable",
    ),
    Case(
        "python_env_path",
        folder(
            {
                "config.pbtxt": 'backend: "python"\n'
                'parameters { key: "EXECUTION_ENV_PATH" value { string_value: "env.tar.gz" } }\n',
                "1/model.py": "class TritonPythonModel: pass\n",
            }
        ),
        "model 'python_env_path' sets the EXECUTION_ENV_PATH parameter: turnout's python sidecar runs",
        VERSION,
        code="Unsupported",
    ),
    Case(
        "python_without_model_class",
        folder({"config.pbtxt": 'backend: "python"\n', "1/model.py": "class SomethingElse: pass\n"}),
        "python_without_model_class/1/model.py' defines no class TritonPythonModel",
        VERSION,
        code="Internal",
    ),
    Case(
        "identity_backend",
        folder({"config.pbtxt": 'backend: "identity"\n', "1/.keep": ""}),
        "unable to find backend library for backend 'identity'",
        VERSION,
    ),
    Case(
        "decoupled",
        simple("model_transaction_policy { decoupled: true }"),
        "model 'decoupled' sets model_transaction_policy { decoupled: true }, which turnout does not implement",
        VERSION,
        code="Unsupported",
    ),
    Case(
        "iterative_sequence",
        simple("sequence_batching { iterative_sequence: true }"),
        "model 'iterative_sequence' sets sequence_batching { iterative_sequence: true }, which turnout does not "
        "implement",
        VERSION,
        code="Unsupported",
    ),
    # -- ONNX Runtime: the configuration against the graph ---------------------------------
    Case(
        "onnx_unknown_input",
        simple(replace=('name: "INPUT1"', 'name: "NOPE"')),
        "unexpected inference input 'NOPE', allowed inputs are: INPUT0, INPUT1",
        VERSION,
    ),
    Case(
        "onnx_input_type",
        simple_config(
            'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
            'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, '
            '{ name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]\n'
            'output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] } ]\n'
        ),
        "unable to load model 'onnx_input_type', configuration expects datatype TYPE_FP32 for input 'INPUT0', "
        "model provides TYPE_INT32",
        VERSION,
    ),
    Case(
        "onnx_input_dims",
        simple(replace=("dims: [ 16 ]", "dims: [ 4, 4 ]")),
        "model 'onnx_input_dims', tensor 'INPUT0': the model expects 2 dimensions (shape [-1,16]) but the model "
        "configuration specifies 3 dimensions (an initial batch dimension because max_batch_size > 0 followed by "
        "the explicit tensor shape, making complete shape [-1,4,4])",
        VERSION,
    ),
    Case(
        "onnx_too_few_inputs",
        simple_config(
            'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
            'input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] } ]\n'
            'output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] } ]\n'
        ),
        "unable to load model 'onnx_too_few_inputs', configuration expects 1 inputs, model provides 2",
        VERSION,
    ),
    Case(
        "onnx_unknown_output",
        simple(replace=('name: "OUTPUT1"', 'name: "NOPE"')),
        "unexpected inference output 'NOPE', allowed outputs are: OUTPUT0, OUTPUT1",
        VERSION,
    ),
    Case(
        "onnx_output_type",
        simple(replace=('name: "OUTPUT1" data_type: TYPE_INT32', 'name: "OUTPUT1" data_type: TYPE_INT64')),
        "unable to load model 'onnx_output_type', configuration expects datatype TYPE_INT64 for output 'OUTPUT1', "
        "model provides TYPE_INT32",
        VERSION,
    ),
    Case(
        "onnx_config_without_batch_dim",
        simple(replace=("max_batch_size: 8", "max_batch_size: 0")),
        "model 'onnx_config_without_batch_dim', tensor 'INPUT0': the model expects 2 dimensions (shape [-1,16]) but "
        "the model configuration specifies 1 dimensions (shape [16])",
        VERSION,
    ),
    # -- TorchScript ----------------------------------------------------------------------
    Case(
        "torch_too_few_inputs",
        torch(replace=('{ name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] },', "")),
        "unable to load model 'torch_too_few_inputs', configuration expects 1 inputs, model provides 2",
        VERSION,
    ),
    Case(
        "torch_optional_input",
        torch(replace=('name: "INPUT0" data_type: TYPE_INT32', 'name: "INPUT0" data_type: TYPE_INT32 optional: true')),
        "'optional' is set to true for input 'INPUT0' while the backend model doesn't support optional input",
        VERSION,
    ),
    Case(
        "torch_unsigned_input",
        torch(replace=('name: "INPUT0" data_type: TYPE_INT32', 'name: "INPUT0" data_type: TYPE_UINT32')),
        "unsupported datatype TYPE_UINT32 for input 'INPUT0' for model 'torch_unsigned_input'",
        VERSION,
        code="Internal",
    ),
    # -- ensembles ------------------------------------------------------------------------
    Case(
        "ensemble_missing_step",
        ensemble([("no_such_model", PAIR, {"OUTPUT0": "OUTPUT0", "OUTPUT1": "OUTPUT1"})]),
        "ensemble ensemble_missing_step contains models that are not available or ambiguous: no_such_model",
        MODEL,
    ),
    Case(
        "ensemble_self_cycle",
        ensemble([("{name}", PAIR, {"OUTPUT0": "OUTPUT0", "OUTPUT1": "OUTPUT1"})]),
        "circular dependency between ensembles: ensemble_self_cycle -> ... -> ensemble_self_cycle -> "
        "ensemble_self_cycle",
        MODEL,
    ),
    Case(
        "ensemble_unknown_step_input",
        ensemble([("simple", {"INPUT0": "INPUT0", "NOPE": "INPUT1"}, {"OUTPUT0": "OUTPUT0", "OUTPUT1": "OUTPUT1"})]),
        "in ensemble ensemble_unknown_step_input, ensemble tensor INPUT1 is mapping to non-existing input NOPE in "
        "model simple",
        MODEL,
    ),
    Case(
        "ensemble_type",
        ensemble([SIMPLE_STEP], inputs=[("INPUT0", "FP32", [16]), ("INPUT1", "INT32", [16])]),
        "in ensemble ensemble_type, ensemble tensor INPUT0: inconsistent data type: TYPE_FP32 is inferred from model "
        "ensemble_type while TYPE_INT32 is inferred from model simple",
        MODEL,
    ),
    Case(
        "ensemble_shape",
        ensemble([SIMPLE_STEP], inputs=[("INPUT0", "INT32", [8]), ("INPUT1", "INT32", [16])]),
        "in ensemble ensemble_shape, ensemble tensor INPUT0: inconsistent shape: [-1,8] is inferred from model "
        "ensemble_shape while [-1,16] is inferred from model simple",
        MODEL,
    ),
    Case(
        "ensemble_batch_above_step",
        ensemble([SIMPLE_STEP], max_batch_size=16),
        "ensemble ensemble_batch_above_step allows maximum batch size 16, but it contains model simple which only "
        "allows maximum batch size to be 8",
        MODEL,
    ),
    Case(
        "ensemble_unwritten_output",
        ensemble([("simple", PAIR, {"OUTPUT0": "OUTPUT0", "OUTPUT1": "OTHER"})]),
        "ensemble output 'OUTPUT1' for ensemble ensemble_unwritten_output' is not used",
        POLL,
    ),
    Case(
        "ensemble_instance_group",
        ensemble([SIMPLE_STEP], extra="instance_group [ { kind: KIND_CPU } ]"),
        "instance group should not be specified for ensemble 'ensemble_instance_group'",
        POLL,
    ),
    Case(
        "ensemble_auto_step_type",
        ensemble(
            [("auto_simple", PAIR, {"OUTPUT0": "OUTPUT0", "OUTPUT1": "OUTPUT1"})],
            inputs=[("INPUT0", "FP32", [16]), ("INPUT1", "FP32", [16])],
            outputs=[("OUTPUT0", "FP32", [16]), ("OUTPUT1", "FP32", [16])],
            max_batch_size=4,  # what auto-complete gives auto_simple
        ),
        "in ensemble ensemble_auto_step_type, ensemble tensor INPUT0: inconsistent data type: TYPE_FP32 is inferred "
        "from model ensemble_auto_step_type while TYPE_INT32 is inferred from model auto_simple",
        GATEWAY,
    ),
]
ONNX_CASES = [c for c in CASES if not c.name.startswith(("torch_", "ensemble_", "python_"))]


def write_bad_repository(repo: Path, cases: list[Case]) -> Path:
    write_identity_ensemble_steps(repo)
    for case in cases:
        case.write(repo, case.name)
    # Triton skips files at the repository's top level.
    (repo / "README.md").write_text("models Triton refuses\n")
    return repo


@pytest.fixture(scope="module")
def bad_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_bad_repository(tmp_path_factory.mktemp("bad") / "models", CASES)


@pytest.fixture(scope="module")
def serving(bad_repository: Path) -> Iterator[Server]:
    with turnout_up(bad_repository, "--exit-on-error=false") as server:
        yield server


@pytest.fixture(scope="module")
def explicit(bad_repository: Path) -> Iterator[Server]:
    with turnout_up(bad_repository, "--model-control-mode=explicit", "--exit-on-error=false") as server:
        yield server


def test_the_table_is_a_real_one() -> None:
    assert len(CASES) >= 40
    assert len({case.name for case in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_each_refusal_is_in_the_index_with_tritons_text(serving: Server, case: Case) -> None:
    index = httpclient.InferenceServerClient(serving.http).get_model_repository_index()
    entries = [entry for entry in index if entry["name"] == case.name]
    assert len(entries) == 1, entries
    [entry] = entries
    assert entry["state"] == "UNAVAILABLE"
    if case.stage == VERSION:
        assert entry["version"] == "1"
        assert entry["reason"].startswith(f"{case.code}: "), entry
    elif case.stage == GATEWAY:
        assert entry["version"] == "1"
    else:
        assert "version" not in entry
    assert case.text in entry["reason"]
    assert not httpclient.InferenceServerClient(serving.http).is_model_ready(case.name)


@pytest.mark.parametrize("case", [c for c in CASES if c.stage != GATEWAY], ids=lambda c: c.name)
def test_each_refusal_is_logged_as_an_error_naming_the_model(serving: Server, case: Case) -> None:
    lines = [line for line in serving.output().splitlines() if line.startswith("E") and f"'{case.name}'" in line]
    assert any(case.text in line for line in lines), lines


def test_a_refused_ensemble_is_logged_by_the_gateway(serving: Server) -> None:
    [line] = [line for line in serving.output().splitlines() if "ensemble 'ensemble_auto_step_type'" in line]
    assert line.startswith("E") and "inconsistent data type" in line


def test_the_rest_of_the_repository_serves(serving: Server) -> None:
    client = grpcclient.InferenceServerClient(serving.grpc)
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [grpcclient.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(a)
    for model in ("simple", "auto_simple", "torch_simple", ".hidden_simple"):
        np.testing.assert_array_equal(client.infer(model, inputs).as_numpy("OUTPUT0"), 2 * a)
    # Versions that failed make the server unready, as Triton's strict readiness does.
    assert client.is_server_live() and not client.is_server_ready()


def test_files_at_the_top_level_are_not_models(serving: Server) -> None:
    names = {entry["name"] for entry in httpclient.InferenceServerClient(serving.http).get_model_repository_index()}
    assert "README.md" not in names


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_loading_each_refused_model_answers_tritons_text(explicit: Server, protocol: str) -> None:
    client: httpclient.InferenceServerClient | grpcclient.InferenceServerClient
    if protocol == "http":
        client = httpclient.InferenceServerClient(explicit.http)
    else:
        client = grpcclient.InferenceServerClient(explicit.grpc)
    for case in CASES:
        with pytest.raises(InferenceServerException) as caught:
            client.load_model(case.name)
        message, status = caught.value.message(), caught.value.status()
        if case.stage == POLL:
            assert message.startswith(f"failed to load '{case.name}', failed to poll from model repository: "), message
            assert status == ("500" if protocol == "http" else "StatusCode.INTERNAL")
        else:
            assert message.startswith(f"load failed for model '{case.name}': "), message
            assert status == ("400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT")
        if case.stage == VERSION:
            assert f"version 1 is at UNAVAILABLE state: {case.code}: " in message
        assert case.text in message, (case.name, message)
        assert not client.is_model_ready(case.name)
    client.load_model("simple")  # and the server keeps serving
    assert client.is_model_ready("simple")


def test_the_start_fails_under_exit_on_error_with_each_text(tmp_path: Path) -> None:
    # One framework's cases: the first sidecar to fail ends the start.
    repo = write_bad_repository(tmp_path / "models", ONNX_CASES)
    with pytest.raises(ServerFailedToStart) as failed, turnout_up(repo):
        pass
    output = str(failed.value)
    for case in ONNX_CASES:
        assert case.text in output, case.name


def test_a_repository_that_is_one_model_folder_says_so(tmp_path: Path) -> None:
    model_dir = make_models().write_simple(tmp_path / "models")
    with pytest.raises(ServerFailedToStart) as failed, turnout_up(model_dir):
        pass
    assert f"model repository '{model_dir}' looks like a model folder" in str(failed.value)
