"""The HTTP infer translation: request bodies -> ModelInferRequest, ModelInferResponse -> bodies."""

from __future__ import annotations

import gzip
import json
import struct
import zlib

import numpy as np
import pytest

from gateway.http import messages
from gateway.http.encoding import compress, decompress, parse_json, response_encoding
from gateway.http.parsing import OutputRendering, header_length, parse_infer_request, raw_binary_request
from gateway.http.rendering import render_infer_response
from protos.grpc_service_pb2 import (
    ModelInferResponse,
    ModelStatisticsResponse,
    RepositoryIndexResponse,
    TraceSettingResponse,
)
from protos.model_config_pb2 import ModelConfig
from protos.status import Status, TurnoutError


def body_of(document: dict, *tensors: bytes) -> tuple[bytes, int | None]:
    header = json.dumps(document).encode()
    if not tensors:
        return header, None
    return header + b"".join(tensors), len(header)


def error_of(call, *args) -> TurnoutError:
    with pytest.raises(TurnoutError) as info:
        call(*args)
    return info.value


def binary_input(name: str, array: np.ndarray, datatype: str) -> dict:
    return {
        "name": name,
        "datatype": datatype,
        "shape": list(array.shape),
        "parameters": {"binary_data_size": array.nbytes},
    }


# --- request ---


def test_binary_inputs_become_raw_contents_in_order():
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.int32)
    document = {
        "inputs": [binary_input("INPUT0", a, "INT32"), binary_input("INPUT1", b, "INT32")],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}, {"name": "OUTPUT1"}],
        "id": "7",
    }
    body, length = body_of(document, a.tobytes(), b.tobytes())
    request, rendering = parse_infer_request(body, length, "simple", "1")
    assert request.model_name == "simple" and request.model_version == "1" and request.id == "7"
    assert [i.name for i in request.inputs] == ["INPUT0", "INPUT1"]
    assert list(request.inputs[0].shape) == [1, 16]
    assert request.raw_input_contents[0] == a.tobytes()
    assert request.raw_input_contents[1] == b.tobytes()
    assert not request.inputs[0].HasField("contents")
    assert [o.name for o in request.outputs] == ["OUTPUT0", "OUTPUT1"]
    assert len(request.outputs[0].parameters) == 0  # binary_data stays in the front end
    assert rendering.is_binary("OUTPUT0") and not rendering.is_binary("OUTPUT1")


def test_json_data_becomes_raw_contents_in_input_order():
    document = {
        "inputs": [
            {"name": "A", "datatype": "INT32", "shape": [2, 2], "data": [[1, 2], [3, 4]]},
            {"name": "B", "datatype": "FP32", "shape": [2], "data": [1.5, 2]},
            {"name": "C", "datatype": "BOOL", "shape": [2], "data": [True, False]},
            {"name": "D", "datatype": "BYTES", "shape": [2], "data": ["ab", "é"]},
            {"name": "E", "datatype": "UINT64", "shape": [1], "data": [2**64 - 1]},
            {"name": "F", "datatype": "INT64", "shape": [1], "data": [-5]},
        ]
    }
    body, length = body_of(document)
    request, rendering = parse_infer_request(body, length, "m", "")
    raw = list(request.raw_input_contents)
    assert not any(i.HasField("contents") for i in request.inputs)
    assert raw[0] == np.array([1, 2, 3, 4], dtype=np.int32).tobytes()
    assert raw[1] == np.array([1.5, 2.0], dtype=np.float32).tobytes()
    assert raw[2] == b"\x01\x00"
    assert raw[3] == struct.pack("<I", 2) + b"ab" + struct.pack("<I", 2) + "é".encode()
    assert raw[4] == np.array([2**64 - 1], dtype=np.uint64).tobytes()
    assert raw[5] == np.array([-5], dtype=np.int64).tobytes()
    assert not rendering.default_binary


def test_json_and_binary_inputs_mix_in_one_request():
    a = np.arange(16, dtype=np.int32)
    document = {
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "parameters": {"binary_data_size": 64}},
            {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))},
        ]
    }
    header = json.dumps(document).encode()
    request, _ = parse_infer_request(header + a.tobytes(), len(header), "simple", "")
    assert list(request.raw_input_contents) == [a.tobytes(), a.tobytes()]


def test_request_parameters():
    document = {
        "inputs": [],
        "parameters": {
            "sequence_id": 42,
            "sequence_start": True,
            "sequence_end": False,
            "priority": 1,
            "timeout": 100,
            "binary_data_output": True,
            "custom_s": "x",
            "custom_i": -3,
            "custom_b": True,
            "custom_d": 0.5,
        },
    }
    request, rendering = parse_infer_request(*body_of(document), "m", "")
    p = request.parameters
    assert p["sequence_id"].int64_param == 42
    assert p["sequence_start"].bool_param is True
    assert p["sequence_end"].WhichOneof("parameter_choice") == "bool_param"
    assert p["priority"].uint64_param == 1
    assert p["timeout"].int64_param == 100
    assert "binary_data_output" not in p
    assert p["custom_s"].string_param == "x"
    assert p["custom_i"].int64_param == -3
    assert p["custom_b"].bool_param is True
    assert p["custom_d"].double_param == 0.5
    assert rendering.default_binary


def test_string_sequence_id():
    request, _ = parse_infer_request(*body_of({"inputs": [], "parameters": {"sequence_id": "abc"}}), "m", "")
    assert request.parameters["sequence_id"].string_param == "abc"


def test_reserved_parameter_is_rejected():
    err = error_of(parse_infer_request, *body_of({"inputs": [], "parameters": {"triton_x": 1}}), "m", "")
    assert err.status is Status.INVALID_ARG and err.http_status == 400
    assert err.message == (
        "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified."
    )


def test_shared_memory_parameters_are_kept():
    document = {
        "inputs": [
            {
                "name": "I",
                "datatype": "INT32",
                "shape": [1, 16],
                "parameters": {"shared_memory_region": "in", "shared_memory_byte_size": 64, "shared_memory_offset": 8},
            }
        ],
        "outputs": [
            {"name": "O", "parameters": {"shared_memory_region": "out", "shared_memory_byte_size": 64}},
            {"name": "C", "parameters": {"classification": 3, "binary_data": False}},
        ],
    }
    request, rendering = parse_infer_request(*body_of(document), "m", "")
    params = request.inputs[0].parameters
    assert params["shared_memory_region"].string_param == "in"
    assert params["shared_memory_byte_size"].int64_param == 64
    assert params["shared_memory_offset"].int64_param == 8
    assert request.outputs[0].parameters["shared_memory_region"].string_param == "out"
    assert "shared_memory_offset" not in request.outputs[0].parameters
    assert request.outputs[1].parameters["classification"].int64_param == 3
    assert not rendering.is_binary("C")
    assert len(request.raw_input_contents) == 0


def test_zero_size_binary_input_gets_an_empty_raw_entry():
    document = {"inputs": [{"name": "I", "datatype": "INT32", "shape": [0], "parameters": {"binary_data_size": 0}}]}
    header = json.dumps(document).encode()
    request, _ = parse_infer_request(header, len(header), "m", "")
    assert list(request.raw_input_contents) == [b""]


@pytest.mark.parametrize(
    ("entry", "suffix"),
    [
        ({"name": "I", "datatype": "INT32", "shape": [1]}, " no field is set"),
        (
            {"name": "I", "datatype": "INT32", "shape": [1], "data": [1], "parameters": {"binary_data_size": 4}},
            " set 'data' 'binary_data_size'",
        ),
    ],
)
def test_exactly_one_data_source(entry, suffix):
    err = error_of(parse_infer_request, *body_of({"inputs": [entry]}), "m", "")
    assert err.http_status == 400
    assert err.message == (
        "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', "
        "'shared_memory_region' in 'parameters'. But" + suffix
    )


def test_leftover_and_short_binary_data():
    a = np.arange(4, dtype=np.int32)
    document = {"inputs": [binary_input("I", a, "INT32")]}
    body, length = body_of(document, a.tobytes() + b"xx")
    err = error_of(parse_infer_request, body, length, "m", "")
    assert (err.http_status, err.message) == (400, "unexpected additional input data for model 'm'")
    body, length = body_of(document, a.tobytes()[:10])
    err = error_of(parse_infer_request, body, length, "m", "")
    assert err.http_status == 400
    assert err.message == "unexpected size for input 'I', expecting 6 additional bytes for model 'm'"


def test_binary_input_without_header():
    a = np.arange(4, dtype=np.int32)
    err = error_of(parse_infer_request, *body_of({"inputs": [binary_input("I", a, "INT32")]}), "m", "")
    assert err.http_status == 400
    assert err.message.startswith("must specify valid 'Infer-Header-Content-Length' in request header")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "failed to parse the request JSON buffer: The document is empty. at 0"),
        (b"{x", "failed to parse the request JSON buffer: Missing a name for object member. at 1"),
        (b"nope", "failed to parse the request JSON buffer: Invalid value. at 0"),
        (b"{}", "Unable to parse 'inputs': attempt to access non-existing object member 'inputs'"),
        (
            b'{"inputs":[{"name":"I","datatype":"INT32","shape":[-1],"data":[1]}]}',
            "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer",
        ),
        (
            b'{"inputs":[{"name":"I","datatype":"INT32","shape":[3],"data":[1,2]}]}',
            "Unable to parse 'data': Shape does not match true shape of 'data' field",
        ),
        (
            b'{"inputs":[{"name":"I","datatype":"INT32","shape":[1],"data":[1,2]}]}',
            "Unable to parse 'data': Shape does not match true shape of 'data' field",
        ),
        (
            b'{"inputs":[{"data":[1],"datatype":"INT32","shape":[1]}]}',
            "Unable to parse 'name': attempt to access non-existing object member 'name'",
        ),
    ],
)
def test_malformed_requests_are_internal_errors(body, message):
    err = error_of(parse_infer_request, body, None, "m", "")
    assert err.http_status == 500
    if message is not None:
        assert err.message == message


def test_fp16_json_input_is_rejected():
    document = {"inputs": [{"name": "X", "datatype": "FP16", "shape": [1], "data": [1.0]}]}
    err = error_of(parse_infer_request, *body_of(document), "m", "")
    assert err.http_status == 400
    assert err.message == (
        "receiving FP16 data via JSON is not supported. Please use the binary data format for input X"
    )


def test_output_cannot_combine_shm_and_binary():
    document = {
        "inputs": [],
        "outputs": [{"name": "O", "parameters": {"shared_memory_region": "r", "binary_data": True}}],
    }
    err = error_of(parse_infer_request, *body_of(document), "m", "")
    assert (err.http_status, err.message) == (400, "Output can't set both 'shared_memory_region' and 'binary_data'")


def test_header_length_range():
    assert header_length(None, 10) is None
    assert header_length("4", 10) == 4
    err = error_of(header_length, "11", 10)
    assert (err.http_status, err.message) == (400, "inference header size should be in range (0, 10), got: 11")


def test_decompress_and_size_limit():
    raw = b'{"inputs":[]}'
    assert decompress(gzip.compress(raw), "gzip", 100) == raw
    assert decompress(zlib.compress(raw), "deflate", 100) == raw
    err = error_of(decompress, raw, "br", 100)
    assert (err.status, err.message) == (Status.UNSUPPORTED, "Unsupported compression type")
    assert err.http_status == 501
    err = error_of(decompress, raw, None, 5)
    assert err.message == (
        "request JSON size of 13 bytes exceeds the maximum allowed input size of 5 bytes. "
        "Use --http-max-input-size to increase the limit."
    )


def test_raw_binary_request_fills_the_only_input():
    data = np.arange(16, dtype=np.int32).tobytes()
    request, rendering = raw_binary_request(data, "m", "", "INPUT0", "INT32", [-1, 16])
    assert list(request.inputs[0].shape) == [1, 16]
    assert request.raw_input_contents[0] == data
    assert rendering.default_binary


# --- response ---


def make_response() -> ModelInferResponse:
    response = ModelInferResponse(model_name="simple", model_version="1", id="r1")
    response.outputs.add(name="OUTPUT0", datatype="INT32", shape=[1, 4])
    response.outputs.add(name="OUTPUT1", datatype="BYTES", shape=[2])
    response.outputs.add(name="EMPTY", datatype="INT32", shape=[0])
    response.raw_output_contents.append(np.arange(4, dtype=np.int32).tobytes())
    response.raw_output_contents.append(struct.pack("<I", 2) + b"hi" + struct.pack("<I", 1) + b"x")
    response.raw_output_contents.append(b"")
    return response


def test_render_binary_outputs():
    response = make_response()
    body, length = render_infer_response(response, OutputRendering(default_binary=True))
    assert length is not None
    document = json.loads(body[:length])
    assert document["id"] == "r1" and document["model_version"] == "1"
    sizes = [o["parameters"]["binary_data_size"] for o in document["outputs"]]
    assert sizes == [16, 11, 0]
    assert body[length:] == response.raw_output_contents[0] + response.raw_output_contents[1]


def test_render_json_outputs():
    body, length = render_infer_response(make_response(), OutputRendering())
    assert length is None
    document = json.loads(body)
    assert b" " not in body  # compact
    assert document["outputs"][0] == {"name": "OUTPUT0", "datatype": "INT32", "shape": [1, 4], "data": [0, 1, 2, 3]}
    assert document["outputs"][1]["data"] == ["hi", "x"]
    assert document["outputs"][2]["data"] == []


def test_render_mixed_and_zero_bytes_binary_is_json_typed():
    rendering = OutputRendering(default_binary=False, binary={"EMPTY": True})
    body, length = render_infer_response(make_response(), rendering)
    assert length is None  # nothing appended -> application/json, no header
    assert json.loads(body)["outputs"][2]["parameters"] == {"binary_data_size": 0}


def test_render_shm_output_has_no_data():
    response = ModelInferResponse(model_name="m", model_version="1")
    response.outputs.add(name="O", datatype="INT32", shape=[1])
    response.raw_output_contents.append(b"")  # the gateway wrote the output into the region
    rendering = OutputRendering(default_binary=True, shared_memory={"O"})
    body, length = render_infer_response(response, rendering)
    assert length is None
    assert json.loads(body)["outputs"] == [{"name": "O", "datatype": "INT32", "shape": [1]}]
    assert "id" not in json.loads(body)


def test_render_fp16_as_json_is_rejected():
    response = ModelInferResponse(model_name="m", model_version="1")
    response.outputs.add(name="O", datatype="FP16", shape=[1])
    response.raw_output_contents.append(b"\x00\x3c")
    err = error_of(render_infer_response, response, OutputRendering())
    assert err.http_status == 400
    assert err.message.startswith("sending FP16 data via JSON is not supported.")


def test_response_encoding_q_values():
    assert response_encoding(None) is None
    assert response_encoding("gzip") == "gzip"
    assert response_encoding("deflate;q=0.5, gzip;q=0.8") == "gzip"
    assert response_encoding("identity, gzip;q=0.5") is None
    assert gzip.decompress(compress(b"abc", "gzip")) == b"abc"
    assert zlib.decompress(compress(b"abc", "deflate")) == b"abc"


def test_parse_json_reports_offset():
    err = error_of(parse_json, b'{"a":1}x')
    assert err.message == (
        "failed to parse the request JSON buffer: The document root must not be followed by other values. at 7"
    )


# --- other JSON shapes ---


def test_model_config_prints_defaults_and_int64_numbers():
    config = ModelConfig(name="simple", max_batch_size=16)
    inp = config.input.add(name="INPUT0", dims=[16])
    inp.data_type = 8  # TYPE_INT32
    config.dynamic_batching.max_queue_delay_microseconds = 100
    document = messages.model_config(config)
    assert document["max_batch_size"] == 16
    assert document["input"][0]["dims"] == [16]
    assert document["input"][0]["data_type"] == "TYPE_INT32"
    assert document["dynamic_batching"]["max_queue_delay_microseconds"] == 100
    assert document["platform"] == "" and document["output"] == []


def test_statistics_numbers():
    response = ModelStatisticsResponse()
    stats = response.model_stats.add(name="simple", version="1", inference_count=3)
    stats.inference_stats.success.count = 3
    document = messages.statistics(response)
    entry = document["model_stats"][0]
    assert entry["inference_count"] == 3 and entry["version"] == "1"
    assert entry["inference_stats"]["success"] == {"count": 3, "ns": 0}
    assert entry["batch_stats"] == []


def test_repository_index_entries():
    response = RepositoryIndexResponse()
    response.models.add(name="a", version="1", state="READY", reason="")
    response.models.add(name="a", version="2", state="UNAVAILABLE", reason="unloaded")
    response.models.add(name="b")
    assert messages.repository_index(response) == [
        {"name": "a", "version": "1", "state": "READY"},  # Triton leaves an empty reason out
        {"name": "a", "version": "2", "state": "UNAVAILABLE", "reason": "unloaded"},
        {"name": "b"},
    ]


def test_load_request_parameters():
    doc = {"parameters": {"config": '{"max_batch_size":"16"}', "file:1/model.onnx": "AAEC", "other": True}}
    request = messages.load_request("m", doc)
    assert request.parameters["config"].string_param == '{"max_batch_size":"16"}'
    assert request.parameters["file:1/model.onnx"].bytes_param == b"\x00\x01\x02"
    assert "other" in request.parameters
    unload = messages.unload_request("m", {"parameters": {"unload_dependents": True}})
    assert unload.parameters["unload_dependents"].bool_param is True


def test_trace_settings_shapes():
    response = TraceSettingResponse()
    response.settings["trace_level"].value.append("OFF")
    response.settings["trace_rate"].value.append("1000")
    assert messages.trace_settings(response) == {"trace_level": ["OFF"], "trace_rate": "1000"}
    request = messages.trace_request("m", {"trace_rate": "5", "trace_level": ["TIMESTAMPS"], "trace_count": None})
    assert list(request.settings["trace_rate"].value) == ["5"]
    assert list(request.settings["trace_count"].value) == []
