"""The python sidecar on its own gRPC port, without an infer lane: a decoupled model's
responses on the sidecar's ModelStreamInfer, and through a gateway that reaches it over
gRPC only."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from gateway.settings import SidecarAddress
from protos import grpc_service_pb2 as pb
from protos import grpc_service_pb2_grpc as pb_grpc
from tests.e2e.python_models import ADD_SUB_CONFIG, ADD_SUB_MODEL, REPEAT_CONFIG, REPEAT_MODEL, stream_repeat
from tests.gateway.gateway_harness import gateway_settings, running_gateway
from tests.sidecars.sidecar_harness import Sidecar, running


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    repo = tmp_path_factory.mktemp("repo_python_no_lane")
    (repo / "repeat" / "1").mkdir(parents=True)
    (repo / "repeat" / "config.pbtxt").write_text(REPEAT_CONFIG)
    (repo / "repeat" / "1" / "model.py").write_text(REPEAT_MODEL)
    with running(Path(repo), "--lane=off", framework="python") as started:
        yield started


async def _stream(url: str, values: list[int], **options: Any) -> list[Any]:
    """A request to `repeat` on a tritonclient stream (the sync client: it can ask for the
    empty final response); every answer up to the final one."""
    return await asyncio.to_thread(partial(stream_repeat, url, values, **options))


def _summary(results: list[Any]) -> list[tuple[list[int] | str | None, bool]]:
    return [
        (f"error: {r.message()}", False)
        if isinstance(r, InferenceServerException)
        else (
            None if r.as_numpy("OUT") is None else r.as_numpy("OUT").tolist(),
            r.get_response().parameters["triton_final_response"].bool_param,
        )
        for r in results
    ]


async def test_the_sidecars_stream_carries_a_decoupled_models_responses(sidecar: Sidecar) -> None:
    got = await _stream(sidecar.url, [4, 5], enable_empty_final_response=True)
    assert _summary(got) == [([4], False), ([5], False), (None, True)]


async def test_a_gateway_without_the_lane_streams_them_over_grpc(sidecar: Sidecar) -> None:
    settings = gateway_settings((SidecarAddress("python", sidecar.url, ""),))
    async with running_gateway(settings) as gateway:
        got = await _stream(gateway.addresses["grpc"], [1, 2, 3], enable_empty_final_response=True)
        assert _summary(got) == [([1], False), ([2], False), ([3], False), (None, True)]
        together = await _stream(gateway.addresses["grpc"], [9], parameters={"final": "together"})
        assert _summary(together) == [([9], True)]


async def test_an_error_response_mid_stream_goes_in_band_and_the_stream_goes_on(sidecar: Sidecar) -> None:
    # As Triton: the error is not final and the responses after it follow, on the sidecar's
    # own stream and through a gateway that reaches it over gRPC only.
    expected = [([5], False), ("error: no answer for 6", False), ([7], False), (None, True)]
    options: dict[str, Any] = {"parameters": {"fail_at": 1}, "enable_empty_final_response": True}
    assert _summary(await _stream(sidecar.url, [5, 6, 7], errors_in_band=True, **options)) == expected
    settings = gateway_settings((SidecarAddress("python", sidecar.url, ""),))
    async with running_gateway(settings) as gateway:
        got = await _stream(gateway.addresses["grpc"], [5, 6, 7], errors_in_band=True, **options)
        assert _summary(got) == expected


def test_bls_tls_options_that_cannot_work_stop_the_sidecar(tmp_path: Path) -> None:
    for options, text in (
        (["gateway-cert=c.pem"], "gateway-cert and gateway-key go together"),
        (["gateway-cert=c.pem", "gateway-key=k.pem"], "need gateway-root-cert"),
        (["gateway-root-cert=missing.pem"], "gateway-root-cert: no file at missing.pem"),
    ):
        command = [sys.executable, "-m", "sidecars", "--framework=python", f"--model-repository={tmp_path}"]
        command += [f"--backend-config={option}" for option in options]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
        assert done.returncode == 1, done.stderr
        assert text in done.stderr


async def test_a_refused_stream_request_carries_its_id_alone(sidecar: Sidecar) -> None:
    # As Triton: a request refused before it ran is no response of the model's.
    request = pb.ModelInferRequest(model_name="repeat", id="r9")
    request.inputs.add(name="WRONG", datatype="INT32", shape=[1])
    request.raw_input_contents.append(b"\0\0\0\0")

    def call() -> list[pb.ModelStreamInferResponse]:
        with grpc.insecure_channel(sidecar.url) as channel:
            return list(pb_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(iter([request])))

    [refused] = await asyncio.to_thread(call)
    assert refused.error_message == "unexpected inference input 'WRONG' for model 'repeat'"
    assert refused.infer_response == pb.ModelInferResponse(id="r9")


def test_an_instance_count_change_keeps_the_instances_that_stay(tmp_path: Path) -> None:
    """As Triton's in-place update: growing a group starts only the new instances, and
    shrinking it finalizes only those past the new count."""
    config = tmp_path / "add_sub" / "config.pbtxt"
    (tmp_path / "add_sub" / "1").mkdir(parents=True)
    config.write_text(ADD_SUB_CONFIG)
    (tmp_path / "add_sub" / "1" / "model.py").write_text(ADD_SUB_MODEL)
    flags = ("--model-control-mode=explicit", "--load-model=add_sub")
    with running(tmp_path, *flags, framework="python") as sidecar:
        client = grpcclient.InferenceServerClient(sidecar.url)
        config.write_text(ADD_SUB_CONFIG.replace("count: 1", "count: 3"))
        client.load_model("add_sub")
        assert client.get_model_config("add_sub").config.instance_group[0].count == 3
        assert "add_sub finalized" not in sidecar.output()
        config.write_text(ADD_SUB_CONFIG)
        client.load_model("add_sub")
        assert client.get_model_config("add_sub").config.instance_group[0].count == 1
        deadline = time.monotonic() + 10
        while sidecar.output().count("add_sub finalized") < 2:
            assert time.monotonic() < deadline, sidecar.output()
            time.sleep(0.05)
        tensors = [grpcclient.InferInput(name, [1, 4], "FP32") for name in ("INPUT0", "INPUT1")]
        for tensor in tensors:
            tensor.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
        result = client.infer("add_sub", tensors)
        assert result.get_response().parameters["instance"].string_param == "add_sub_0_0"
    assert sidecar.output().count("add_sub finalized") == 3  # and the first one, at the stop
