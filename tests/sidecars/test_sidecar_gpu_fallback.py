"""ONNX Runtime on GPU where there is none: execution providers chosen from the config,
a KIND_GPU model that loads on CPU with a warning, and warm-up of ONNX models."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from google.protobuf import text_format

from protos import model_config_pb2 as mc
from sidecars.onnxruntime.providers import CPU, CUDA, TENSORRT, instance_devices, place
from tests.harness import make_models
from tests.sidecars.sidecar_harness import Sidecar, running, simple_inputs

GPU = "instance_group [ { kind: KIND_GPU count: 1 gpus: [ 0 ] } ]"
TENSORRT_EP = 'optimization { execution_accelerators { gpu_execution_accelerator: [ { name: "tensorrt" } ] } }'
WARMUP = """model_warmup [ { name: "ones" batch_size: 4 count: 3
  inputs { key: "INPUT0" value { data_type: TYPE_INT32 dims: [ 16 ] random_data: true } }
  inputs { key: "INPUT1" value { data_type: TYPE_INT32 dims: [ 16 ] zero_data: true } } } ]"""


def config(text: str) -> mc.ModelConfig:
    parsed = mc.ModelConfig()
    text_format.Parse(text, parsed)
    return parsed


def test_cpu_instances_run_on_the_cpu_provider() -> None:
    assert place(config(""), None, {CPU, CUDA}).providers == [CPU]


def test_kind_gpu_takes_the_cuda_provider_of_its_device() -> None:
    placement = place(config(GPU), 1, {CPU, CUDA})
    assert placement.providers == [(CUDA, {"device_id": "1"}), CPU]
    assert placement.device == "cuda:1" and not placement.warnings


def test_tensorrt_accelerator_goes_first_with_its_options() -> None:
    text = GPU + '\noptimization { execution_accelerators { gpu_execution_accelerator: [ { name: "tensorrt" '
    text += 'parameters { key: "precision_mode" value: "FP16" } } ] } }'
    placement = place(config(text), 0, {CPU, CUDA, TENSORRT})
    assert placement.providers[0] == (TENSORRT, {"device_id": "0", "trt_fp16_enable": "True"})
    assert placement.providers[1:] == [(CUDA, {"device_id": "0"}), CPU]


def test_missing_providers_fall_back_to_cpu_with_warnings() -> None:
    placement = place(config(GPU + "\n" + TENSORRT_EP), 0, {CPU})
    assert placement.providers == [CPU]
    assert any(TENSORRT in w for w in placement.warnings) and any(CUDA in w for w in placement.warnings)


def test_unknown_accelerator_is_refused_as_in_triton() -> None:
    text = GPU + '\noptimization { execution_accelerators { gpu_execution_accelerator: [ { name: "warp" } ] } }'
    with pytest.raises(Exception, match="unknown Execution Accelerator 'warp' is requested"):
        place(config(text), 0, {CPU, CUDA})


def test_gpu_groups_run_count_instances_per_listed_gpu() -> None:
    group = config("instance_group [ { kind: KIND_GPU count: 2 gpus: [ 0, 3 ] } ]").instance_group[0]
    assert instance_devices(group) == [0, 0, 3, 3]


@pytest.fixture(scope="module")
def gpu_sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    repo: Path = tmp_path_factory.mktemp("onnx_gpu_repo")
    models = make_models()
    models.write_simple(repo, name="simple_gpu", extra_config=GPU)
    models.write_simple(repo, name="simple_trt_ep", extra_config=GPU + "\n" + TENSORRT_EP)
    models.write_simple(repo, name="simple_auto", extra_config="instance_group [ { kind: KIND_AUTO } ]")
    models.write_simple(repo, name="simple_warm", extra_config=WARMUP)
    with running(repo) as sidecar:
        yield sidecar


@pytest.mark.parametrize("model", ["simple_gpu", "simple_trt_ep"])
def test_kind_gpu_model_loads_and_serves_on_cpu_with_a_warning(gpu_sidecar: Sidecar, model: str) -> None:
    client = grpcclient.InferenceServerClient(gpu_sidecar.url)
    assert client.is_model_ready(model)
    inputs, data = simple_inputs(grpcclient)
    np.testing.assert_array_equal(client.infer(model, inputs).as_numpy("OUTPUT0"), data + 1)
    # Triton's log lines: `W<date> <time> <pid> <logger>:<line>] <message>`.
    warnings = "\n".join(
        line.partition("] ")[2]
        for line in gpu_sidecar.output().splitlines()
        if line.startswith("W") and " sidecars.onnxruntime.runtime:" in line
    )
    warning = f"model '{model}' instance '{model}_0_0' (cuda:0): "
    assert f"{warning}{CUDA} is not available in this onnxruntime build" in warnings
    assert f"{warning}running on CPU instead" in warnings
    # The config still says what was asked for.
    assert client.get_model_config(model, as_json=True)["config"]["instance_group"][0]["kind"] == "KIND_GPU"


def test_kind_auto_is_cpu_without_a_usable_gpu(gpu_sidecar: Sidecar) -> None:
    client = grpcclient.InferenceServerClient(gpu_sidecar.url)
    group = client.get_model_config("simple_auto", as_json=True)["config"]["instance_group"][0]
    assert group["kind"] == "KIND_CPU" and group["count"] == 2


def test_onnx_models_warm_up_before_ready_too(gpu_sidecar: Sidecar) -> None:
    output = gpu_sidecar.output()
    warmed = output.index("model 'simple_warm' warmed up on 2 instance(s) with sample(s) 'ones' x3")
    assert warmed < output.index("TURNOUT_SIDECAR_READY")
