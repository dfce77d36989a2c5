"""The PyTorch sidecar through tritonclient against a real process: Triton's naming
rules, dynamic batching, datatypes, warm-up, thread settings, torch.export models,
and Triton's error texts for models it cannot load or run."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.utils import InferenceServerException

from tests.harness import make_models
from tests.sidecars.sidecar_harness import Sidecar, running

pytest.importorskip("torch", reason="the PyTorch sidecar needs torch (pip install -c constraints.txt -e '.[pytorch]')")

# The datatypes Triton's PyTorch backend takes; it refuses UINT16, UINT32, UINT64 and BF16.
TORCH_DATATYPES = ["BOOL", "INT8", "INT16", "INT32", "INT64", "UINT8", "FP16", "FP32", "FP64"]
WARMUP = """
model_warmup [
  { name: "zeros" batch_size: 2 count: 2
    inputs { key: "INPUT0" value { data_type: TYPE_INT32 dims: [ 16 ] zero_data: true } }
    inputs { key: "INPUT1" value { data_type: TYPE_INT32 dims: [ 16 ] random_data: true } } },
  { name: "from_file" batch_size: 1
    inputs { key: "INPUT0" value { data_type: TYPE_INT32 dims: [ 16 ] input_data_file: "ones" } }
    inputs { key: "INPUT1" value { data_type: TYPE_INT32 dims: [ 16 ] zero_data: true } } }
]
"""


def build_repository(repo: Path) -> Path:
    models = make_models()
    for naming in models.TORCH_NAMING:
        models.write_torch_simple(repo, name=f"torch_{naming}", naming=naming)
    models.write_torch_simple(
        repo, name="torch_dyn", extra_config="dynamic_batching { max_queue_delay_microseconds: 20000 }"
    )
    for datatype in TORCH_DATATYPES:
        models.write_torch_identity(repo, f"torch_identity_{datatype.lower()}", datatype)
    models.write_torch_identity(repo, "torch_identity_bytes", "BYTES", max_batch_size=0)
    warm = models.write_torch_simple(repo, name="torch_warm", extra_config=WARMUP)
    (warm / "warmup").mkdir()
    (warm / "warmup" / "ones").write_bytes(np.ones(16, dtype=np.int32).tobytes())
    threads = 'parameters { key: "INTRA_OP_THREAD_COUNT" value { string_value: "1" } }\n'
    threads += 'parameters { key: "INTER_OP_THREAD_COUNT" value { string_value: "1" } }'
    models.write_torch_simple(repo, name="torch_threads", extra_config=threads)
    models.write_torch_simple(repo, name="torch_auto", extra_config="instance_group [ { kind: KIND_AUTO count: 2 } ]")
    models.write_torch_export(repo, name="torch_export")
    variable = models.write_torch_simple(repo, name="torch_variable")
    config = variable / "config.pbtxt"
    config.write_text(config.read_text().replace("dims: [ 16 ]", "dims: [ -1 ]"))
    # Models that must not load, each for one of Triton's reasons.
    extra_input = models.write_torch_simple(repo, name="bad_input_count")
    config = extra_input / "config.pbtxt"
    text = config.read_text()
    config.write_text(text.replace("input [\n", 'input [\n  { name: "INPUT2" data_type: TYPE_INT32 dims: [ 16 ] },\n'))
    models.write_torch_simple(repo, name="bad_gpu", extra_config="instance_group [ { kind: KIND_GPU } ]")
    bad_threads = 'parameters { key: "INTRA_OP_THREAD_COUNT" value { string_value: "many" } }'
    models.write_torch_simple(repo, name="bad_threads", extra_config=bad_threads)
    bad_warm = models.write_torch_simple(repo, name="bad_warmup", extra_config=WARMUP)
    (bad_warm / "warmup").mkdir()
    (bad_warm / "warmup" / "ones").write_bytes(b"\0" * 10)
    for datatype in ("UINT16", "BF16"):
        models.write_torch_identity(repo, f"bad_{datatype.lower()}", datatype)
    optional = models.write_torch_simple(repo, name="bad_optional")
    config = optional / "config.pbtxt"
    config.write_text(config.read_text().replace("dims: [ 16 ]\n", "dims: [ 16 ]\n    optional: true\n", 1))
    models.write_torch_sequence(repo, "torch_sequence")
    unindexed = models.write_torch_sequence(repo, "bad_sequence_names")
    config = unindexed / "config.pbtxt"
    config.write_text(config.read_text().replace('"START__1"', '"START"'))
    export_type = models.write_torch_export(repo, name="bad_export_type")
    config = export_type / "config.pbtxt"
    config.write_text(config.read_text().replace("TYPE_INT32", "TYPE_INT64", 1))
    wrong_output = models.write_torch_simple(repo, name="bad_output_type")
    config = wrong_output / "config.pbtxt"
    text = config.read_text()
    config.write_text(text.replace('"OUTPUT0"\n    data_type: TYPE_INT32', '"OUTPUT0"\n    data_type: TYPE_FP32'))
    return repo


@pytest.fixture(scope="module")
def torch_sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    repo = build_repository(tmp_path_factory.mktemp("torch_repo"))
    with running(repo, "--exit-on-error=false", framework="pytorch") as sidecar:
        yield sidecar


def add_sub_inputs(names: list[str], batch: int = 1) -> tuple[list[grpcclient.InferInput], np.ndarray, np.ndarray]:
    a = np.tile(np.arange(16, dtype=np.int32), (batch, 1))
    b = np.full((batch, 16), 3, dtype=np.int32)
    inputs = [
        grpcclient.InferInput(names[0], [batch, 16], "INT32"),
        grpcclient.InferInput(names[1], [batch, 16], "INT32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs, a, b


@pytest.mark.parametrize(
    ("model", "inputs", "outputs"),
    [
        ("torch_index", ["INPUT__0", "INPUT__1"], ["OUTPUT__0", "OUTPUT__1"]),
        ("torch_forward", ["INPUT0", "INPUT1"], ["OUTPUT0", "OUTPUT1"]),
        ("torch_dict", ["INPUT0", "INPUT1"], ["OUTPUT0", "OUTPUT1"]),
        ("torch_config", ["first", "second"], ["SUM", "DIFF"]),
        ("torch_export", ["INPUT0", "INPUT1"], ["OUTPUT0", "OUTPUT1"]),
    ],
)
def test_naming_rules_bind_inputs_and_outputs(torch_sidecar: Sidecar, model: str, inputs: list, outputs: list) -> None:
    client = grpcclient.InferenceServerClient(torch_sidecar.url)
    tensors, a, b = add_sub_inputs(inputs, batch=2)
    result = client.infer(model, tensors)
    np.testing.assert_array_equal(result.as_numpy(outputs[0]), a + b)
    np.testing.assert_array_equal(result.as_numpy(outputs[1]), a - b)


async def test_concurrent_requests_run_as_fewer_executions(torch_sidecar: Sidecar) -> None:
    client = aioclient.InferenceServerClient(torch_sidecar.url)
    try:
        tensors, a, b = add_sub_inputs(["INPUT0", "INPUT1"])
        aio_inputs = []
        for tensor, data in zip(tensors, (a, b), strict=True):
            aio_tensor = aioclient.InferInput(tensor.name(), [1, 16], "INT32")
            aio_tensor.set_data_from_numpy(data)
            aio_inputs.append(aio_tensor)
        results = await asyncio.gather(*(client.infer("torch_dyn", aio_inputs) for _ in range(16)))
        for result in results:
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        stats = (await client.get_inference_statistics("torch_dyn")).model_stats[0]
    finally:
        await client.close()
    assert stats.inference_count == 16
    assert stats.execution_count < stats.inference_count
    assert any(batch.batch_size > 1 for batch in stats.batch_stats)


@pytest.mark.parametrize("datatype", TORCH_DATATYPES)
def test_every_torch_datatype_round_trips(torch_sidecar: Sidecar, datatype: str) -> None:
    grpc = grpcclient.InferenceServerClient(torch_sidecar.url)
    if datatype == "BOOL":
        data = np.array([[True, False, True]])
    else:
        numpy_type = {"FP16": np.float16, "FP32": np.float32, "FP64": np.float64}.get(datatype, datatype.lower())
        data = np.array([[1, 2, 7]]).astype(numpy_type)
    tensor = grpcclient.InferInput("INPUT0", list(data.shape), datatype)
    tensor.set_data_from_numpy(data)
    result = grpc.infer(f"torch_identity_{datatype.lower()}", [tensor])
    output = result.as_numpy("OUTPUT0")
    assert result.get_output("OUTPUT0").datatype == datatype
    np.testing.assert_array_equal(output.astype(np.float64), data.astype(np.float64))


def test_strings_travel_as_a_list_of_str(torch_sidecar: Sidecar) -> None:
    client = grpcclient.InferenceServerClient(torch_sidecar.url)
    data = np.array([b"turnout", b"", "caf\u00e9".encode()], dtype=np.object_)
    tensor = grpcclient.InferInput("INPUT0", [3], "BYTES")
    tensor.set_data_from_numpy(data)
    output = client.infer("torch_identity_bytes", [tensor]).as_numpy("OUTPUT0")
    assert list(output) == list(data)


def test_warm_up_runs_before_the_model_is_ready(torch_sidecar: Sidecar) -> None:
    output = torch_sidecar.output()
    warmed = output.index("model 'torch_warm' warmed up on 1 instance(s) with sample(s) 'zeros' x2, 'from_file' x1")
    assert warmed < output.index("TURNOUT_SIDECAR_READY")
    client = grpcclient.InferenceServerClient(torch_sidecar.url)
    assert client.is_model_ready("torch_warm")
    stats = client.get_inference_statistics("torch_warm").model_stats[0]
    assert stats.inference_count == 0  # warm-up runs are not requests


def test_thread_counts_come_from_config_parameters(torch_sidecar: Sidecar) -> None:
    output = torch_sidecar.output()
    assert "Intra op thread count is set to 1 for model instance 'torch_threads_0'" in output
    assert "Inter op thread count" in output


def test_kind_auto_resolves_to_cpu_without_a_gpu(torch_sidecar: Sidecar) -> None:
    client = grpcclient.InferenceServerClient(torch_sidecar.url)
    config = client.get_model_config("torch_auto", as_json=True)["config"]
    assert config["instance_group"][0]["kind"] == "KIND_CPU"
    assert config["instance_group"][0]["count"] == 2


def test_a_sequence_model_named_by_index_loads(torch_sidecar: Sidecar) -> None:
    assert grpcclient.InferenceServerClient(torch_sidecar.url).is_model_ready("torch_sequence")


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        ("bad_input_count", "unable to load model 'bad_input_count', configuration expects 3 inputs, model provides 2"),
        ("bad_gpu", "instance group bad_gpu_0 of model bad_gpu has kind KIND_GPU but no GPUs are available"),
        ("bad_threads", "failed to parse parameter 'INTRA_OP_THREAD_COUNT' of model 'bad_threads'"),
        ("bad_warmup", "failed to warm up model 'bad_warmup' with sample 'from_file': 'ones' holds 10 bytes"),
        ("bad_uint16", "unsupported datatype TYPE_UINT16 for input 'INPUT0' for model 'bad_uint16'"),
        ("bad_bf16", "unsupported datatype TYPE_BF16 for input 'INPUT0' for model 'bad_bf16'"),
        (
            "bad_optional",
            "'optional' is set to true for input 'INPUT1' while the backend model doesn't support optional input",
        ),
        ("bad_sequence_names", "input 'START' does not follow <name>__<index> naming convention."),
        (
            "bad_export_type",
            "unable to load model 'bad_export_type', configuration expects datatype TYPE_INT64 for input 'INPUT0', "
            "model provides TYPE_INT32",
        ),
    ],
)
def test_models_that_cannot_load_say_why_in_the_index(torch_sidecar: Sidecar, model: str, reason: str) -> None:
    client = grpcclient.InferenceServerClient(torch_sidecar.url)
    index = {entry.name: entry for entry in client.get_model_repository_index().models}
    assert index[model].state == "UNAVAILABLE"
    assert reason in index[model].reason
    assert not client.is_model_ready(model)


def test_wrong_output_datatype_is_triton_error(torch_sidecar: Sidecar) -> None:
    client = grpcclient.InferenceServerClient(torch_sidecar.url)
    tensors, _, _ = add_sub_inputs(["INPUT0", "INPUT1"])
    with pytest.raises(InferenceServerException) as caught:
        client.infer("bad_output_type", tensors)
    assert "configuration expects datatype TYPE_FP32 for output 'OUTPUT0', model provides TYPE_INT32" in str(
        caught.value
    )


def test_framework_failure_is_pytorch_execute_failure(torch_sidecar: Sidecar) -> None:
    client = grpcclient.InferenceServerClient(torch_sidecar.url)
    a = grpcclient.InferInput("INPUT0", [1, 3], "INT32")
    b = grpcclient.InferInput("INPUT1", [1, 4], "INT32")
    a.set_data_from_numpy(np.zeros((1, 3), dtype=np.int32))
    b.set_data_from_numpy(np.zeros((1, 4), dtype=np.int32))
    with pytest.raises(InferenceServerException) as caught:
        client.infer("torch_variable", [a, b])
    assert caught.value.status() == "StatusCode.INTERNAL"
    assert "PyTorch execute failure: " in str(caught.value)


def test_request_errors_use_triton_texts(torch_sidecar: Sidecar) -> None:
    client = grpcclient.InferenceServerClient(torch_sidecar.url)
    tensor = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 16), dtype=np.float32))
    other = grpcclient.InferInput("INPUT1", [1, 16], "INT32")
    other.set_data_from_numpy(np.zeros((1, 16), dtype=np.int32))
    with pytest.raises(InferenceServerException) as caught:
        client.infer("torch_forward", [tensor, other])
    assert "inference input 'INPUT0' data-type is 'FP32', but model 'torch_forward' expects 'INT32'" in str(
        caught.value
    )
