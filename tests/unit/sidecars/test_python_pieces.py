"""The python framework's in-process pieces: the config JSON models read, the
auto-complete helpers' checks in Triton's words, and the custom metrics store."""

from __future__ import annotations

import json

import grpc
import pytest
from google.protobuf import text_format

from protos import model_config_pb2 as mc
from protos.status import CAUSE_METADATA, Cause
from protos.triton_metrics import Exposition
from sidecars.python import backend_utils as pb_utils
from sidecars.python.bls import _call_failed
from sidecars.python.channel import MetricOp
from sidecars.python.custom_metrics import CustomMetrics
from sidecars.python.model_json import config_json, merge_completion, read_config_json


def _config(text: str) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())


def test_config_json_writes_every_field_and_64_bit_integers_as_numbers() -> None:
    config = _config(
        'name: "m" backend: "python" max_batch_size: 4 '
        'input { name: "X" data_type: TYPE_FP32 dims: [ 2, -1 ] reshape { shape: [ 2 ] } } '
        "dynamic_batching { max_queue_delay_microseconds: 100 }"
    )
    document = json.loads(config_json(config))
    assert document["input"][0]["dims"] == [2, -1]
    assert document["input"][0]["reshape"]["shape"] == [2]
    assert document["dynamic_batching"]["max_queue_delay_microseconds"] == 100
    assert document["output"] == []  # present though empty, as models index it
    assert document["max_batch_size"] == 4


def test_auto_complete_takes_only_what_it_may_change() -> None:
    config = _config('name: "m" backend: "python" parameters { key: "k" value { string_value: "v" } }')
    completed = pb_utils.ModelConfig(config_json(config))
    completed.add_input({"name": "X", "data_type": "TYPE_INT64", "dims": [2]})
    completed.add_output({"name": "Y", "data_type": "TYPE_INT64", "dims": [2]})
    completed.set_max_batch_size(8)
    completed.set_dynamic_batching()
    completed.set_model_transaction_policy({"decoupled": True})
    completed.as_dict()["parameters"] = {}  # not taken back
    merge_completion(config, read_config_json(json.dumps(completed.as_dict()), "m"))
    assert [t.name for t in config.input] == ["X"]
    assert list(config.input[0].dims) == [2]
    assert config.max_batch_size == 8
    assert config.HasField("dynamic_batching")
    assert config.model_transaction_policy.decoupled
    assert config.parameters["k"].string_value == "v"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda c: c.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [2]}),
            "unable to load model 'm', configuration expects datatype TYPE_INT64 for input 'X', "
            "model provides TYPE_FP32",
        ),
        (
            lambda c: c.add_input({"name": "X", "data_type": "TYPE_INT64", "dims": [3]}),
            "model 'm', tensor 'X': the model expects dims [3] but the model configuration specifies dims [2]",
        ),
        (
            lambda c: c.add_output({"name": "Y", "dims": [1]}),
            "output 'Y' in auto-complete-config function for model 'm' is missing 'data_type' property.",
        ),
        (
            lambda c: c.add_input({"name": "Z", "data_type": "TYPE_FP32", "dims": [1], "shape": [1]}),
            "input 'Z' in auto-complete-config function for model 'm' contains property other than "
            "'name', 'data_type', 'dims' and 'optional'.",
        ),
        (
            lambda c: c.set_max_batch_size(2),
            "configuration specified max_batch_size 4, but in auto-complete-config function for model 'm' "
            "specified max_batch_size 2",
        ),
    ],
)
def test_auto_complete_helpers_refuse_contradictions_in_tritons_words(call, message: str) -> None:
    config = pb_utils.ModelConfig(
        config_json(
            _config('name: "m" backend: "python" max_batch_size: 4 input { name: "X" data_type: TYPE_INT64 dims: 2 }')
        )
    )
    with pytest.raises(ValueError) as caught:
        call(config)
    assert str(caught.value) == message


def test_custom_metrics_share_a_family_and_render_each_kind() -> None:
    metrics = CustomMetrics()
    labels = (("model", "m"),)
    counter = MetricOp("increment", "m_requests", "counter", "Requests", labels, 2.0)
    assert metrics.apply(counter) == 2.0
    assert metrics.apply(counter) == 4.0  # a second instance's metric of the same family and labels
    metrics.apply(MetricOp("set", "m_depth", "gauge", "Depth", labels, 7.0))
    for value in (0.5, 3.0):
        metrics.apply(MetricOp("observe", "m_latency", "histogram", "Latency", labels, value, (1.0, 5.0)))
    # The same name as another kind is ignored, not merged.
    assert metrics.apply(MetricOp("set", "m_requests", "gauge", "Requests", labels, 1.0)) == 0.0
    exposition = Exposition()
    metrics.add_to(exposition)
    text = exposition.render()
    assert "# TYPE m_requests counter" in text
    assert 'm_requests{model="m"} 4' in text
    assert 'm_depth{model="m"} 7' in text
    assert 'm_latency_bucket{model="m",le="1.0"} 1' in text
    assert 'm_latency_bucket{model="m",le="5.0"} 2' in text
    assert 'm_latency_bucket{model="m",le="+Inf"} 2' in text
    assert 'm_latency_sum{model="m"} 3.5' in text


def test_a_deleted_family_leaves_with_its_metrics() -> None:
    metrics = CustomMetrics()
    labels = (("model", "m"),)
    metrics.apply(MetricOp("increment", "m_requests", "counter", "Requests", labels, 2.0))
    metrics.apply(MetricOp("observe", "m_latency", "histogram", "Latency", labels, 0.5, (1.0,)))
    metrics.apply(MetricOp("delete", "m_latency", "histogram", "Latency", (), 0.0))
    metrics.apply(MetricOp("delete", "m_requests", "gauge", "Requests", (), 0.0))  # another kind's: kept
    exposition = Exposition()
    metrics.add_to(exposition)
    text = exposition.render()
    assert "m_latency" not in text
    assert 'm_requests{model="m"} 2' in text
    # Empty families are left out, as Triton's exposition leaves them out.
    assert "nv_gpu_utilization" not in text


def test_error_codes_are_tritons_enum() -> None:
    # As the python backend's pybind11 enum: its name, its C value, and how it prints.
    error = pb_utils.TritonError("x", pb_utils.TritonError.CANCELLED)
    assert error.code() == pb_utils.TritonError.CANCELLED and int(error.code()) == 7
    assert str(pb_utils.TritonError("x").code()) == "__ErrorCode.INTERNAL"
    assert repr(pb_utils.TritonError.NOT_FOUND) == "<__ErrorCode.NOT_FOUND: 2>"


def test_tensors_cross_dlpack_both_ways() -> None:
    torch = pytest.importorskip("torch")
    from torch.utils import dlpack as torch_dlpack

    source = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    from_producer = pb_utils.Tensor.from_dlpack("X", source)
    from_capsule = pb_utils.Tensor.from_dlpack("Y", torch_dlpack.to_dlpack(source))
    for tensor in (from_producer, from_capsule):
        assert tensor.shape() == [2, 3]
        assert tensor.as_numpy().tolist() == source.tolist()
    back = torch_dlpack.from_dlpack(from_producer.to_dlpack())
    assert back.tolist() == source.tolist()
    assert torch.from_dlpack(from_producer).tolist() == source.tolist()  # the producer protocol


class _CallError(grpc.RpcError):
    """What grpc raises for a failed call: its code, its text and its trailing metadata."""

    def __init__(self, code: grpc.StatusCode, details: str, cause: str = "") -> None:
        self._code, self._details = code, details
        self._trailers = ((CAUSE_METADATA, cause),) if cause else ()

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._trailers


def test_bls_words_a_refusal_and_passes_a_models_error_response() -> None:
    def failed(error: _CallError) -> tuple[str, str]:
        response = _call_failed("m", error)
        return response.error().message(), response.error().code().name

    prefix = "Model m - Error when running inference: "
    response = _CallError(grpc.StatusCode.INVALID_ARGUMENT, "bad input on purpose", Cause.RESPONSE.value)
    assert failed(response) == ("bad input on purpose", "INVALID_ARG")  # the model's own, as it is
    # A refusal is INTERNAL whatever its status, as the python backend gives it.
    refused = _CallError(grpc.StatusCode.INVALID_ARGUMENT, "unexpected inference output 'X' for model 'm'")
    assert failed(refused) == (prefix + "unexpected inference output 'X' for model 'm'", "INTERNAL")
    unknown = _CallError(grpc.StatusCode.NOT_FOUND, "Request for unknown model: 'm' is not found")
    not_ready = prefix + "Failed for execute the inference request. Model 'm' is not ready."
    assert failed(unknown) == (not_ready, "INTERNAL")
    decoupled = _CallError(grpc.StatusCode.UNIMPLEMENTED, "ModelInfer RPC doesn't ...", Cause.DECOUPLED.value)
    assert failed(decoupled)[0].startswith(prefix + "Model m is using the decoupled.")
