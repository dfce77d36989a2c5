"""The HTTP infer translation: request bodies -> ModelInferRequest, ModelInferResponse -> bodies."""

from __future__ import annotations

import base64
import gzip
import json
import struct
import time
import zlib
from functools import partial

import numpy as np
import pytest
from google.protobuf.message import DecodeError

from gateway.http import messages, nesting, parsing
from gateway.http import rendering as rendering_module
from gateway.http.encoding import compress, decompress, parse_json, refuse_too_big_number, response_encoding
from gateway.http.parsing import OutputRendering, header_length, parse_infer_request, raw_binary_request
from gateway.http.rendering import render_encoded, render_infer_response
from protos import codec
from protos.grpc_service_pb2 import (
    ModelInferRequest,
    ModelInferResponse,
    ModelStatisticsResponse,
    RepositoryIndexResponse,
    RepositoryModelLoadRequest,
    RepositoryModelUnloadRequest,
    TraceSettingResponse,
)
from protos.model_config_pb2 import TYPE_FP32, TYPE_STRING, ModelConfig
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


def test_a_header_seen_before_cuts_each_body_as_a_full_parse_would():
    document = {
        "id": "again",
        "parameters": {"priority": 2},
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [1, 4], "parameters": {"binary_data_size": 16}},
            {"name": "EMPTY", "datatype": "INT32", "shape": [0, 4], "parameters": {"binary_data_size": 0}},
            {"name": "INPUT1", "datatype": "INT32", "shape": [1, 4], "parameters": {"binary_data_size": 16}},
        ],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}, {"name": "OUTPUT1"}],
    }
    for round_ in range(3):
        a, b = np.full(4, round_, dtype=np.int32), np.arange(4, dtype=np.int32) * (round_ + 1)
        request, rendering = parse_infer_request(*body_of(document, a.tobytes(), b.tobytes()), "simple", "")
        assert list(request.raw_input_contents) == [a.tobytes(), b"", b.tobytes()]
        assert (request.id, request.parameters["priority"].uint64_param) == ("again", 2)
        assert [(i.name, list(i.shape)) for i in request.inputs] == [
            ("INPUT0", [1, 4]),
            ("EMPTY", [0, 4]),
            ("INPUT1", [1, 4]),
        ]
        assert rendering.is_binary("OUTPUT0") and not rendering.is_binary("OUTPUT1")
        # What the gateway changes in a request or its rendering is that request's alone.
        request.model_name = "changed"
        request.parameters["added"].bool_param = True
        rendering.binary["OUTPUT1"] = True
        assert request.model_name == "changed"
    body, length = body_of(document, bytes(16), bytes(16))
    short = error_of(parse_infer_request, body[:-1], length, "simple", "")
    assert short.message == "unexpected size for input 'INPUT1', expecting 1 additional bytes for model 'simple'"
    longer = error_of(parse_infer_request, body + b"!", length, "simple", "")
    assert longer.message == "unexpected additional input data for model 'simple'"
    assert parse_infer_request(body, length, "other", "3")[0].model_name == "other"  # the model is part of it


def test_a_header_with_json_data_is_read_whole_every_time():
    document = {
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [1, 2], "parameters": {"binary_data_size": 8}},
            {"name": "INPUT1", "datatype": "INT32", "shape": [1, 2], "data": [5, 6]},
        ]
    }
    for round_ in range(2):
        binary = np.full(2, round_, dtype=np.int32).tobytes()
        request, _ = parse_infer_request(*body_of(document, binary), "simple", "")
        assert list(request.raw_input_contents) == [binary, np.array([5, 6], dtype=np.int32).tobytes()]


def test_headers_remembered_are_bounded():
    for number in range(3 * parsing._KNOWN_HEADERS):
        document = {"id": str(number), "inputs": [binary_input("INPUT0", np.zeros(1, np.int32), "INT32")]}
        parse_infer_request(*body_of(document, bytes(4)), "simple", "")
        assert 1 <= len(parsing._known) <= parsing._KNOWN_HEADERS


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
    assert request.outputs[0].parameters["shared_memory_offset"].int64_param == 0  # absent: 0, as Triton reads it
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
    # The whole body is JSON then, so the input's bytes are missing (as Triton 2.51 answers).
    a = np.arange(4, dtype=np.int32)
    err = error_of(parse_infer_request, *body_of({"inputs": [binary_input("I", a, "INT32")]}), "m", "")
    assert (err.http_status, err.message) == (
        400,
        "unexpected size for input 'I', expecting 16 additional bytes for model 'm'",
    )


def test_shared_memory_regions_are_looked_up_in_tritons_order():
    # Each tensor's region as it is read: a missing region answers before a later input's
    # error, and an absent byte size is 0.
    looked: list[tuple[str, int, int]] = []

    def locate(name: str, offset: int, byte_size: int) -> None:
        looked.append((name, offset, byte_size))
        if name == "nope":
            raise TurnoutError(Status.NOT_FOUND, f"Unable to find shared memory region: '{name}'")

    document = {
        "inputs": [
            {"name": "A", "datatype": "INT32", "shape": [1], "parameters": {"shared_memory_region": "r"}},
            {"name": "B", "datatype": "INT32", "shape": [1], "parameters": {"shared_memory_region": "nope"}},
            {"name": "C"},
        ]
    }
    err = error_of(partial(parse_infer_request, locate=locate), *body_of(document), "m", "")
    assert (err.http_status, err.message) == (404, "Unable to find shared memory region: 'nope'")
    assert looked == [("r", 0, 0), ("nope", 0, 0)]


def test_an_empty_shape_carries_no_data():
    # Triton's element count of [] is 0: its `data` is never read (an invalid datatype there
    # is no error), and the input arrives empty for validation to judge.
    document = {"inputs": [{"name": "I", "datatype": "int32", "shape": [], "data": [1]}]}
    request, _ = parse_infer_request(*body_of(document), "m", "")
    assert list(request.inputs[0].shape) == [] and request.raw_input_contents == [b""]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "failed to parse the request JSON buffer: The document is empty. at 0"),
        (b"{x", "failed to parse the request JSON buffer: Missing a name for object member. at 1"),
        (b"nope", "failed to parse the request JSON buffer: Invalid value. at 1"),  # past the n, as rapidjson
        (b"{}", "Unable to parse 'inputs': attempt to access non-existing object member 'inputs'"),
        # TritonJson finds no member in a document that is not an object
        (b"[]", "Unable to parse 'inputs': attempt to access non-existing object member 'inputs'"),
        (b"null", "Unable to parse 'inputs': attempt to access non-existing object member 'inputs'"),
        (
            b'{"parameters":[],"inputs":[]}',
            "failed to get request params.: attempt to get members for non-object",
        ),
        (
            b'{"inputs":[{"name":"I","datatype":"INT32","shape":[-1],"data":[1]}]}',
            "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer",
        ),
        (
            b'{"inputs":[{"name":"I","datatype":"INT32","shape":[3],"data":[1,2]}]}',
            "Failed to parse 'data' field: shape does not match true shape",  # 2.51: the text of too many
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


def raw_config(dims: list[int], data_type: int = 0, max_batch_size: int = 8, inputs: int = 1) -> ModelConfig:
    config = ModelConfig(name="m", max_batch_size=max_batch_size)
    for index in range(inputs):
        config.input.add(name=f"INPUT{index}", data_type=data_type or TYPE_FP32, dims=dims)
    return config


def deduced(body: bytes, config: ModelConfig) -> ModelInferRequest:
    request, rendering = raw_binary_request(body, "m", "")
    assert rendering.default_binary
    assert codec.is_raw_binary(request)
    codec.deduce_raw_input(request, config)
    assert not codec.is_raw_binary(request)
    return request


@pytest.mark.parametrize(
    ("dims", "max_batch_size", "size", "shape"),
    [
        ([-1], 8, 12, [1, 3]),  # Triton's [1, N], not [N, 1]
        ([-1], 0, 12, [3]),
        ([2, -1], 0, 24, [2, 3]),
        ([4], 8, 16, [1, 4]),
        ([-1], 8, 0, [1, 0]),
    ],
)
def test_raw_binary_shape_is_deduced_from_the_config(dims, max_batch_size, size, shape):
    request = deduced(bytes(size), raw_config(dims, max_batch_size=max_batch_size))
    tensor = request.inputs[0]
    assert (tensor.name, tensor.datatype, list(tensor.shape)) == ("INPUT0", "FP32", shape)
    assert dict(tensor.parameters) == {}
    assert request.raw_input_contents[0] == bytes(size)


@pytest.mark.parametrize(("max_batch_size", "shape"), [(8, [1, 1]), (0, [1])])
def test_raw_bytes_body_is_the_one_element(max_batch_size, shape):
    body = b"he\x00llo\xff"
    request = deduced(body, raw_config([1], TYPE_STRING, max_batch_size))
    assert (request.inputs[0].datatype, list(request.inputs[0].shape)) == ("BYTES", shape)
    assert request.raw_input_contents[0] == struct.pack("<I", len(body)) + body


@pytest.mark.parametrize(
    ("config", "size", "message"),
    [
        (
            raw_config([-1], TYPE_STRING),
            5,
            "For BYTE datatype raw input 'INPUT0', the model must have input shape [1]",
        ),
        (
            raw_config([2], TYPE_STRING, 0),
            5,
            "For BYTE datatype raw input 'INPUT0', the model must have input shape [1]",
        ),
        (
            raw_config([-1, -1]),
            12,
            "The shape of the raw input 'INPUT0' can not be deduced because there are more than one "
            "variable-sized dimension",
        ),
        (
            raw_config([16], inputs=2),
            64,
            "Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in 'm' model configuration",
        ),
        (raw_config([-1]), 10, "input byte size mismatch for input 'raw_input' for model 'm'. Expected 8, got 10"),
        (raw_config([16]), 60, "input byte size mismatch for input 'raw_input' for model 'm'. Expected 64, got 60"),
    ],
)
def test_raw_binary_refusals(config, size, message):
    request, _ = raw_binary_request(bytes(size), "m", "")
    err = error_of(codec.deduce_raw_input, request, config)
    assert (err.status, err.message) == (Status.INVALID_ARG, "[request id: <id_unknown>] " + message)


def infer_body(inputs: list, **extra) -> bytes:
    return json.dumps({"inputs": inputs, **extra}).encode()


INT_ROW = {"name": "INPUT0", "datatype": "INT32", "shape": [1, 2], "data": [1, 2]}


@pytest.mark.parametrize("request_id", [None, "r7"])
def test_repeated_names_are_refused(request_id):
    extra = {} if request_id is None else {"id": request_id}
    prefix = f"[request id: {request_id or '<id_unknown>'}] "
    err = error_of(parse_infer_request, infer_body([INT_ROW, INT_ROW], **extra), None, "m", "")
    assert (err.status, err.message) == (Status.INVALID_ARG, prefix + "input 'INPUT0' already exists in request")
    # Outputs are added before any is checked against the model, so the repeat wins.
    outputs = [{"name": "NOPE"}, {"name": "OUTPUT0"}, {"name": "NOPE"}]
    err = error_of(parse_infer_request, infer_body([INT_ROW], outputs=outputs, **extra), None, "m", "")
    assert (err.status, err.message) == (Status.INVALID_ARG, prefix + "output 'NOPE' already exists in request")


def nested(depth: int, value: object) -> str:
    """JSON text of `value` inside `depth` arrays (json.dumps itself recurses)."""
    return "[" * depth + json.dumps(value) + "]" * depth


def data_body(datatype: str, data: str, shape: tuple[int, ...] = (1, 1)) -> bytes:
    entry = json.dumps({"name": "INPUT0", "datatype": datatype, "shape": list(shape)})
    return ('{"inputs":[' + entry[:-1] + ',"data":' + data + "}]}").encode()


NESTING = "JSON nesting depth exceeds maximum allowed limit (100)"


@pytest.mark.parametrize(("datatype", "value"), [("INT64", 123), ("BYTES", "hi"), ("FP32", 1.5), ("BOOL", True)])
def test_data_nesting_limit(datatype, value):
    """Triton walks `data` and refuses a value 100 arrays below it (`data` itself is 0)."""
    request, _ = parse_infer_request(data_body(datatype, nested(99, value)), None, "m", "")
    assert request.raw_input_contents[0]
    for depth in (100, 101, 5000):
        err = error_of(parse_infer_request, data_body(datatype, nested(depth, value)), None, "m", "")
        assert (err.status, err.message) == (Status.INVALID_ARG, NESTING)


@pytest.mark.parametrize(
    ("datatype", "values", "expected"),
    [
        ("INT32", [2**40, 2**31, -1], [0, -(2**31), -1]),
        ("INT8", [300, -129], [44, 127]),
        ("UINT8", [256, 2**64 - 1], [0, 255]),
        ("UINT32", [2**32 + 7], [7]),
        ("INT64", [-(2**63), 2**63 - 1], [-(2**63), 2**63 - 1]),
    ],
)
def test_json_integers_wrap_to_their_datatype_as_triton_casts_them(datatype, values, expected):
    """Triton reads each JSON integer as 64 bits and casts it to the tensor's type."""
    request, _ = parse_infer_request(data_body(datatype, json.dumps(values), (len(values),)), None, "m", "")
    dtype = codec.datatype(datatype)
    assert codec.from_raw(request.raw_input_contents[0], dtype, [len(values)]).tolist() == expected


@pytest.mark.parametrize(("datatype", "value"), [("INT64", 2**63), ("INT32", -(2**63) - 1), ("UINT64", 2**64)])
def test_json_integers_past_64_bits_are_refused(datatype, value):
    err = error_of(parse_infer_request, data_body(datatype, f"[{value}]"), None, "m", "")
    kind = "unsigned-integer" if datatype.startswith("U") else "signed-integer"
    assert (err.status, err.message) == (
        Status.INTERNAL,
        f"Unable to parse 'data': attempt to access JSON non-{kind} as {kind}",
    )


def test_json_doubles_past_fp32_become_infinities():
    request, _ = parse_infer_request(data_body("FP32", "[1e300, -1e300]", (2,)), None, "m", "")
    assert codec.from_raw(request.raw_input_contents[0], codec.datatype("FP32"), [2]).tolist() == [np.inf, -np.inf]


def test_an_empty_body_without_a_header_is_the_raw_binary_form():
    assert header_length(None, 0) == 0
    assert header_length(None, 10) is None


def test_data_errors_come_in_walk_order():
    # Each value is checked as the walk reaches it: depth first, then count, then type.
    err = error_of(parse_infer_request, data_body("INT64", "[1," + nested(150, 2) + "]"), None, "m", "")
    assert (err.status, err.message) == (Status.INVALID_ARG, NESTING)
    err = error_of(parse_infer_request, data_body("INT64", "[1,2," + nested(150, 3) + "]"), None, "m", "")
    assert (err.status, err.message) == (
        Status.INTERNAL,
        "Unable to parse 'data': Shape does not match true shape of 'data' field",
    )
    err = error_of(parse_infer_request, data_body("INT64", '[["x"],' + nested(150, 2) + "]"), None, "m", "")
    assert err.message == "Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer"
    err = error_of(parse_infer_request, data_body("BYTES", '["a",3]', (1, 2)), None, "m", "")
    assert (err.status, err.message) == (
        Status.INTERNAL,
        "Unable to parse JSON bytes array: attempt to access JSON non-string as string",
    )


def test_documents_deeper_than_python_recursion_parse():
    deep = "[" * 20000 + "]" * 20000
    body = ('{"zzz":' + deep + ',"inputs":[{"name":"INPUT0","datatype":"INT32","shape":[1],"data":[5]}]}').encode()
    request, _ = parse_infer_request(body, None, "m", "")
    assert request.raw_input_contents[0] == np.int32(5).tobytes()
    body = ('{"inputs":[{"name":"INPUT0","datatype":"INT32","shape":[1],"data":' + deep + "}]}").encode()
    err = error_of(parse_infer_request, body, None, "m", "")
    assert (err.status, err.message) == (Status.INVALID_ARG, NESTING)
    body = ('{"parameters":{"p":' + deep + '},"inputs":[]}').encode()
    err = error_of(parse_infer_request, body, None, "m", "")
    assert err.message == "parameter 'p' has invalid type. It should be either 'int', 'bool', or 'string'."


def test_pieces_keep_strings_and_cut_each_band_of_containers() -> None:
    document = b'{"s":"[[{\\"}]]\\\\","a":' + b"[" * 10 + b'{"k":[1]}' + b"]" * 10 + b"}"
    cut = nesting.pieces(document, depth=4)
    # The document with its containers 5 levels down written empty, then each band of 4.
    assert [piece.text for piece in cut] == [
        b'{"s":"[[{\\"}]]\\\\","a":[[[[]]]]}',
        b"[[[[[]]]]]",
        b'[[[{"k":[]}]]]',
        b"[1]",
    ]
    assert all(piece.open_at is None for piece in cut)
    # Each byte maps back to where it is in the document.
    for piece in cut:
        assert bytes(document[piece.origin(at)] for at in range(len(piece.text))) == piece.text
    assert json.loads(nesting.pieces(document, depth=100)[0].text) == json.loads(document)
    # A container left open runs to the end: its piece holds the fault, not the one above.
    first, inner = nesting.pieces(b"[[[[1,", depth=2)
    assert (first.text, first.open_at, inner.text, inner.origin(3)) == (b"[[[", 3, b"[[1,", 5)


# Deep documents, each Triton 2.51's answer to the same body (/v2/repository/index).
DEEP_FAULTS = [
    (b"[" * 100_000, "Invalid value.", 100_000),
    (b"[" * 300 + b"1 2" + b"]" * 300, "Missing a comma or ']' after an array element.", 302),
    (b"[" * 300 + b"1,2" + b"]" * 300 + b"x", "The document root must not be followed by other values.", 603),
    (b"[" * 300 + b"1" + b"]" * 299, "Missing a comma or ']' after an array element.", 600),
    (b'{"a":' * 300 + b"1" + b"}" * 299 + b",}", "Missing a name for object member.", 1801),
    (b"[" * 250 + b'"\\q"' + b"]" * 250, "Invalid escape character in string.", 251),
    (b'{"x":' + b"[" * 1000 + b"1e999" + b"]" * 1000 + b"}", "Number too big to be stored in double.", 1005),
    (b'{"x":' + b"[" * 1000 + b'"\\ud800"' + b"]" * 1000 + b"}", "The surrogate pair in string is invalid.", 1006),
    (
        b'{"x":' + b"[" * 450 + b"[1 2]" + b"]" * 450 + b',"y":[1 2]}',
        "Missing a comma or ']' after an array element.",
        458,
    ),
    (
        b'{"x":' + b"[" * 450 + b"[1,2]" + b"]" * 450 + b',"y":[1 2]}',
        "Missing a comma or ']' after an array element.",
        918,
    ),
    (b'{"x":' + b"[" * 450 + b'{"a" 1}' + b"]" * 450 + b"}", "Missing a colon after a name of object member.", 460),
    (b"[" * 100_000 + b"1," + b"]" * 100_000, "Invalid value.", 100_002),
    (b"[" * 100_000 + b'{"a":[1,2', "Missing a comma or ']' after an array element.", 100_009),
]


@pytest.mark.parametrize(("body", "text", "offset"), DEEP_FAULTS)
def test_a_deep_document_s_fault_is_reported_where_rapidjson_meets_it(body: bytes, text: str, offset: int) -> None:
    # Each band parsed alone, the first fault in the document reported (before, a fault
    # below 200 levels went unseen, and one after a cut was reported at the wrong offset).
    # Read as the front reads any JSON body: parsed, then asked for numbers too big.
    err = error_of(lambda: (parse_json(body), refuse_too_big_number(body)))
    assert err.message == f"failed to parse the request JSON buffer: {text} at {offset}"


def test_a_deep_document_that_parses_is_read_to_200_levels() -> None:
    assert parse_json(b"[" * 100_000 + b"]" * 100_000) is not None
    value = parse_json(b'{"ready":true,"x":' + b"[" * 5000 + b"]" * 5000 + b"}")
    assert value["ready"] is True
    depth, level = 0, value["x"]
    while level:
        depth, level = depth + 1, level[0]
    assert depth == nesting.PRUNE_DEPTH - 1  # its containers past 200 levels written empty


@pytest.mark.parametrize(
    ("shape", "datatype", "status", "message"),
    [
        (
            [2**62, 4],
            "INT32",
            Status.INVALID_ARG,
            "invalid shape for input 'INPUT0': shape [4611686018427387904,4] causes total element count to exceed "
            "maximum size of 9223372036854775807",
        ),
        (
            [2**61],
            "INT64",
            Status.INVALID_ARG,
            "byte size overflow for input 'INPUT0': element count (2305843009213693952) * data type size (8) exceeds "
            "maximum allowed size (9223372036854775807)",
        ),
        (
            [2**63],
            "INT32",
            Status.INVALID_ARG,
            "invalid shape for input 'INPUT0': shape [-9223372036854775808] contains one or more invalid dimensions",
        ),
        (
            [10**9],
            "INT32",
            Status.INVALID_ARG,
            "JSON input 'INPUT0' has a byte_size (4000000000 bytes) that exceeds the maximum allowed value of "
            "67108864 bytes. Use --http-max-input-size to increase the limit.",
        ),
        (
            [2**64 - 1],
            "INT32",
            Status.INVALID_ARG,
            "JSON input 'INPUT0' has a byte_size (18446744073709551612 bytes) that exceeds the maximum allowed value "
            "of 67108864 bytes. Use --http-max-input-size to increase the limit.",
        ),
    ],
)
def test_element_count_past_the_byte_size(shape, datatype, status, message):
    body = infer_body([{"name": "INPUT0", "datatype": datatype, "shape": shape, "data": [1]}])
    err = error_of(parse_infer_request, body, None, "m", "")
    assert (err.status, err.message) == (status, message)


def test_json_byte_size_limit_is_the_configured_one():
    body = infer_body([{"name": "INPUT0", "datatype": "BYTES", "shape": [1, 1], "data": ["abcdef"]}])
    err = error_of(parse_infer_request, body, None, "m", "", 9)
    assert err.message == (
        "JSON input 'INPUT0' has a byte_size (10 bytes) that exceeds the maximum allowed value of 9 bytes. "
        "Use --http-max-input-size to increase the limit."
    )
    request, _ = parse_infer_request(body, None, "m", "", 10)
    assert request.raw_input_contents[0] == struct.pack("<I", 6) + b"abcdef"


def test_huge_dims_of_binary_inputs_stay_int64():
    header = {"name": "INPUT0", "datatype": "INT32", "shape": [2**64 - 1], "parameters": {"binary_data_size": 4}}
    body, length = body_of({"inputs": [header]}, bytes(4))
    request, _ = parse_infer_request(body, length, "m", "")
    assert list(request.inputs[0].shape) == [-1]


def test_cuda_handle_must_be_64_bytes():
    for handle in (b"", bytes(63), bytes(66)):
        document = {"raw_handle": {"b64": base64.b64encode(handle).decode()}, "device_id": 0, "byte_size": 16}
        err = error_of(messages.cuda_shm_register, "r", document)
        assert (err.status, err.message) == (
            Status.INVALID_ARG,
            "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t",
        )
    document = {"raw_handle": {"b64": base64.b64encode(bytes(64)).decode()}, "device_id": 1, "byte_size": 16}
    assert messages.cuda_shm_register("r", document).raw_handle == bytes(64)


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


def test_render_bytes_into_json_strings_as_they_are():
    """Triton writes BYTES into JSON strings unchanged, UTF-8 or not (JSON escapes aside)."""
    elements = [b"a\xffb", b"\xc3(", "\u00e9".encode(), b'\x00"\\', bytes(range(0x80, 0x100))]
    response = ModelInferResponse(model_name="m", model_version="1")
    response.outputs.add(name="OUTPUT0", datatype="BYTES", shape=[len(elements)])
    response.raw_output_contents.append(codec.serialize_bytes(elements))
    body, _ = render_infer_response(response, OutputRendering())
    assert body.startswith(b'{"model_name":"m","model_version":"1","outputs":[{"name":"OUTPUT0",')
    data = b'"data":["a\xffb","\xc3(","\xc3\xa9","\\u0000\\"\\\\","' + bytes(range(0x80, 0x100)) + b'"]'
    assert data in body
    decoded = json.loads(body.decode("utf-8", "surrogateescape"))["outputs"][0]["data"]
    assert [s.encode("utf-8", "surrogateescape") for s in decoded] == elements


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


def _renderings() -> list[OutputRendering]:
    return [
        OutputRendering(default_binary=True),
        OutputRendering(),
        OutputRendering(default_binary=False, binary={"EMPTY": True}),
        OutputRendering(default_binary=False, binary={"OUTPUT0": True, "OUTPUT1": True, "EMPTY": True}),
        OutputRendering(default_binary=True, binary={"OUTPUT1": False}),
        OutputRendering(default_binary=True, shared_memory={"OUTPUT0"}),
    ]


def _responses() -> list[ModelInferResponse]:
    responses = [make_response()]
    with_parameters = make_response()
    with_parameters.parameters["sequence_end"].bool_param = True
    responses.append(with_parameters)
    other_id = make_response()
    other_id.id = "r2"
    responses.append(other_id)
    no_bytes = ModelInferResponse(model_name="m", model_version="2")  # every output empty
    no_bytes.outputs.add(name="EMPTY", datatype="FP32", shape=[1, 0])
    no_bytes.raw_output_contents.append(b"")
    responses.append(no_bytes)
    longer = make_response()  # same head, another size: another header
    longer.outputs[0].shape[:] = [1, 40_000]
    longer.raw_output_contents[0] = np.arange(40_000, dtype=np.int32).tobytes()
    responses.append(longer)
    return responses


def test_an_encoded_answer_renders_as_its_message_first_and_remembered():
    rendering_module._remembered.clear()
    for _ in range(2):  # the second round from the remembered headers, where remembered
        for response in _responses():
            for rendering in _renderings():
                expected = render_infer_response(response, rendering)
                assert render_encoded(response.SerializeToString(), rendering) == expected
    # Only answers whose every output rendered binary from raw contents are remembered.
    assert 0 < len(rendering_module._remembered) < len(_responses()) * len(_renderings())
    heads = {key[2] for key in rendering_module._remembered}
    head = make_response()
    del head.raw_output_contents[:]
    assert head.SerializeToString() in heads  # the response before its raw contents


def test_an_answer_that_is_not_laid_out_as_expected_takes_the_full_render():
    response = make_response()
    rendering = OutputRendering(default_binary=True)
    expected = render_infer_response(response, rendering)
    encoded = response.SerializeToString()
    raw_first = ModelInferResponse(raw_output_contents=response.raw_output_contents).SerializeToString()
    reordered = (
        raw_first
        + ModelInferResponse(
            model_name="simple", model_version="1", id="r1", outputs=response.outputs
        ).SerializeToString()
    )
    rendering_module._remembered.clear()
    assert render_encoded(reordered, rendering) == expected  # parsed: protobuf takes any order
    assert not rendering_module._remembered
    assert render_encoded(encoded, rendering) == expected
    assert len(rendering_module._remembered) == 1
    truncated = encoded[:-3]
    with pytest.raises(DecodeError):
        render_encoded(truncated, rendering)  # what the full parse says of it


def test_remembered_answers_are_bounded():
    rendering_module._remembered.clear()
    rendering = OutputRendering(default_binary=True)
    for number in range(rendering_module._REMEMBERED_ANSWERS + 5):
        response = make_response()
        response.id = str(number)  # each id its own head
        assert render_encoded(response.SerializeToString(), rendering) == render_infer_response(response, rendering)
        assert len(rendering_module._remembered) <= rendering_module._REMEMBERED_ANSWERS


def test_response_encoding_q_values():
    assert response_encoding(None) is None
    assert response_encoding("gzip") == "gzip"
    assert response_encoding("deflate;q=0.5, gzip;q=0.8") == "gzip"
    assert response_encoding("identity, gzip;q=0.5") is None
    # A long value is weighed each time, never remembered; a short one the same either way.
    long_value = ", ".join(["br;q=0.9"] * 20 + ["deflate;q=0.3"])
    assert len(long_value) > 128 and response_encoding(long_value) == "deflate"
    assert response_encoding("deflate;q=0.5, gzip;q=0.8") == "gzip"
    assert gzip.decompress(compress(b"abc", "gzip")) == b"abc"
    assert zlib.decompress(compress(b"abc", "deflate")) == b"abc"


def test_parse_json_reports_offset():
    err = error_of(parse_json, b'{"a":1}x')
    assert err.message == (
        "failed to parse the request JSON buffer: The document root must not be followed by other values. at 7"
    )


def test_parse_json_ends_the_document_at_a_nul_as_rapidjson_does():
    # Checked on Triton 2.51: what follows a NUL is never read; a NUL first is an empty document.
    assert parse_json(b'{"a":1}\0 anything') == {"a": 1}
    assert parse_json(b'{"a":1}  \0') == {"a": 1}
    err = error_of(parse_json, b"  \0{}")
    assert err.message == "failed to parse the request JSON buffer: The document is empty. at 2"
    err = error_of(parse_json, b'{"a":"x\0y"}')
    assert err.message.startswith(
        "failed to parse the request JSON buffer: Missing a closing quotation mark in string."
    )


_ESCAPED = b"\\n\\u0041\\ud83d\\ude00"
# Each answered by Triton 2.51 (rapidjson) to an infer body: its words, and its offset in
# bytes, which is often not where Python's parser stops.
RAPIDJSON_FAULTS = [
    (b'{"a": "xy', "Missing a closing quotation mark in string.", 9),
    (b'{"\xc3\xa9": "xy', "Missing a closing quotation mark in string.", 10),  # bytes, not characters
    (b'{"a": "x\\q"}', "Invalid escape character in string.", 8),
    (b'{"a": "x\\', "Invalid escape character in string.", 8),
    (b'{"a": "x\ty"}', "Invalid escape character in string.", 8),
    (b'{"a": "x\\u12G4"}', "Incorrect hex digit after \\u escape in string.", 8),
    (b'{"a": "x\\u12', "Incorrect hex digit after \\u escape in string.", 8),
    (b'{"a": "x\\ud800"}', "The surrogate pair in string is invalid.", 8),
    (b'{"a": "x\\ud800\\u0041"}', "The surrogate pair in string is invalid.", 8),
    (b'{"a": "x\\ud800', "The surrogate pair in string is invalid.", 8),
    (b'{"a": "x\\ud800\\u00', "Incorrect hex digit after \\u escape in string.", 8),
    (b'{"a": "\\ud800 \\q"}', "The surrogate pair in string is invalid.", 7),
    (b'{"a": tru}', "Invalid value.", 9),
    (b'{"a": fals', "Invalid value.", 10),
    (b'{"a": nulx', "Invalid value.", 9),
    (b'{"a": -}', "Invalid value.", 7),
    (b'{"a": 1.}', "Miss fraction part in number.", 8),
    (b"[1.", "Miss fraction part in number.", 3),
    (b'{"a": 1e}', "Miss exponent in number.", 8),
    (b'{"a": 1.5e-x}', "Miss exponent in number.", 11),
    (b'\xef\xbb\xbf{"a": t', "Invalid value.", 10),  # a byte order mark is skipped, and counted
    # a string's escapes read past at once, the fault after them found where rapidjson finds it
    (b'{"a": "' + _ESCAPED * 100 + b'\\\\\\ud800"}', "The surrogate pair in string is invalid.", 2009),
    (b'{"a": "' + _ESCAPED * 100 + b"\\\\\\ud800", "The surrogate pair in string is invalid.", 2009),
    (b'{"a": "\\\\ud800', "Missing a closing quotation mark in string.", 14),  # an escaped backslash, then text
    (b'{"a": "\\\\\\\\\\ud800x', "The surrogate pair in string is invalid.", 11),
    (b'{"a": "' + b'\\"' * 300 + b'\\x"}', "Invalid escape character in string.", 607),
    (b'{"a": "' + b"\\/" * 300, "Missing a closing quotation mark in string.", 607),
    # a bracket inside a string opens nothing
    (b'{"a":"[" "b":1}', "Missing a comma or '}' after an object member.", 9),
    (b'{"a":["]" 1]}', "Missing a comma or ']' after an array element.", 10),
    (b'[{"a":"{" "b":1}]', "Missing a comma or '}' after an object member.", 10),
    (b'{"a":["\\"]" 1]}', "Missing a comma or ']' after an array element.", 12),
]


@pytest.mark.parametrize(("body", "text", "offset"), RAPIDJSON_FAULTS)
def test_json_faults_are_reported_where_rapidjson_stops(body: bytes, text: str, offset: int) -> None:
    for raw_strings in (False, True):
        err = error_of(parse_json, body, raw_strings)
        assert err.message == f"failed to parse the request JSON buffer: {text} at {offset}"


_TOO_BIG = "Number too big to be stored in double."
# JSON numbers and whether Triton 2.51 (rapidjson) refuses each as "Number too big to be
# stored in double.", each checked there as the first element of an INT32 input's data.
_Z309, _M309, _N309 = "1" + "0" * 308, "17976931348623157" + "0" * 292, "2" + "0" * 308
TOO_BIG_NUMBERS = [
    ("1e309", True),
    ("1E+309", True),
    ("1e0309", True),
    ("-1e999", True),
    ("0e999", True),
    ("-0e999", True),
    ("0.0e400", True),
    ("1e0000000309", True),
    (_N309, True),
    ("9" * 400, True),
    ("1.00000000000000000000001e326", True),
    ("0.000000000000000000000000000001e339", True),
    ("1.23456789012345678e326", True),
    # an exponent may pass 308 by the fraction digits rapidjson counted (up to 17 significant);
    # a value that overflows some other way is taken, as infinity
    ("1e308", False),
    ("1.5e308", False),
    ("1.5e309", False),
    ("10e308", False),
    ("0.00001e312", False),
    ("-0.0e309", False),
    ("1.5e0000000309", False),
    ("1.00000000000000000000001e325", False),
    ("0.000000000000000000000000000001e338", False),
    ("12345678901234567890e300", False),
    ("-18446744073709551616e308", False),
    ("1.2345678901234567e309", False),
    ("1.23456789012345678e325", False),
    ("1e-999", False),
    (_Z309, False),
    (_M309, False),
]


@pytest.mark.parametrize(("number", "too_big"), TOO_BIG_NUMBERS)
def test_numbers_too_big_for_a_double_are_refused_as_rapidjson_refuses_them(number: str, too_big: bool) -> None:
    ones = ",".join(["1"] * 15)
    body = (
        f'{{"inputs":[{{"name":"INPUT0","shape":[1,16],"datatype":"INT32","data":[{number},{ones}]}},'
        f'{{"name":"INPUT1","shape":[1,16],"datatype":"INT32","data":[1,{ones}]}}]}}'
    ).encode()
    err = error_of(parse_infer_request, body, None, "simple", "")
    if too_big:
        assert err.message == "failed to parse the request JSON buffer: Number too big to be stored in double. at 70"
    else:  # not an integer: the INT32 input refuses it, as Triton's does
        assert err.message == "Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer"


@pytest.mark.parametrize(
    ("body", "offset"),
    [
        (b'{"id":1e999,"inputs":[]}', 6),  # before a field's type is checked
        (b'{"inputs":[{"name":"I","shape":[1e999],"datatype":"INT32","data":[1]}]}', 32),
        (b'{"inputs":[{"name":"I","shape":[1],"datatype":"FP32","data":[' + b"9" * 400 + b"]}]}", 61),
        # read by Python as infinity, a request it would have built: Triton's parse refuses it
        (b'{"inputs":[{"name":"I","shape":[1],"datatype":"FP32","data":[1e400]}]}', 61),
        (b'{"inputs":[{"name":"I","shape":[2],"datatype":"FP64","data":[0,-1.5e999]}]}', 63),
        (b"[1e999]", 1),  # a document that is no object
        (b'\xef\xbb\xbf{"id":1e999}', 9),  # a byte order mark is counted
        (b'{"a":"1e999\\"","id":2e999}', 20),  # in a string, not a number
        (b'{"a":"\\\\","id":2e999}', 15),  # after a string ending in an escaped backslash
        (b'{"a":1e999,', 5),  # before a fault further on
        (b'{"a":1e999,"b":"\\ud800"}', 5),  # before a lone surrogate
        # after a name that is not UTF-8 (which Triton's parse takes as it is)
        (b'{"inputs":[{"name":"S\xfe","datatype":"INT32","shape":[1],"data":[1]}],"parameters":{"x":1e999}}', 86),
    ],
)
def test_a_number_too_big_for_a_double_is_the_first_fault(body: bytes, offset: int) -> None:
    # Each Triton 2.51's answer to the same infer body. Python reads such a number as
    # infinity, or an integer too large to convert (an internal error before).
    err = error_of(parse_infer_request, body, None, "simple", "")
    assert err.message == f"failed to parse the request JSON buffer: Number too big to be stored in double. at {offset}"


def test_numbers_are_looked_for_in_the_whole_document() -> None:
    err = error_of(refuse_too_big_number, b'{"pad":"' + b"x" * 70_000 + b'","v":1e999}')
    assert err.message == "failed to parse the request JSON buffer: Number too big to be stored in double. at 70014"
    body = b'{"a":[' + b"1.2345e+05," * 400_000 + b"-1e999]}"  # every number's exponent looked at
    err = error_of(refuse_too_big_number, body)
    assert err.message == "failed to parse the request JSON buffer: Number too big to be stored in double. at 4400006"


def test_an_integer_of_more_digits_than_python_converts_is_too_big() -> None:
    # Python's parser stops at 4 300 digits with its own text (an internal error before);
    # such an integer is one rapidjson refuses, at its first digit.
    err = error_of(parse_json, b'{"b":true,"a":[' + b"1" * 5000 + b"]}")
    assert err.message == "failed to parse the request JSON buffer: Number too big to be stored in double. at 15"
    err = error_of(parse_json, b'{"x":1e999,"a":[' + b"1" * 5000 + b"]}")  # the first of two
    assert err.message == "failed to parse the request JSON buffer: Number too big to be stored in double. at 5"
    body = b'{"inputs":[{"name":"I","shape":[1],"datatype":"INT64","data":[' + b"7" * 5000 + b"]}]}"
    err = error_of(parse_infer_request, body, None, "simple", "")
    assert err.message == "failed to parse the request JSON buffer: Number too big to be stored in double. at 62"


@pytest.mark.parametrize(
    ("body", "offset"),
    [
        # a fraction read digit by digit for every 309 of its digits took 0.6 s for 64 KiB
        (b'{"a":[0.' + b"1" * 65_000 + b"]}", None),
        (b'{"a":[0.' + b"0" * 65_000 + b"1e999]}", None),  # its zeros counted: not too big
        (b'{"a":[1e' + b"0" * 65_000 + b"400]}", 6),
        (b'{"a":[' + b"2" * 65_000 + b"]}", 6),
        (b'{"a":"' + b"e999" * 16_000 + b'"}', None),
        (b'{"a":[' + b"1.5e309," * 8_000 + b"1]}", None),  # each one read: taken as infinity
    ],
)
def test_a_document_crafted_against_the_number_scan_is_read_in_bounded_time(body: bytes, offset: int | None) -> None:
    # Each takes at most 15 ms here (the last: 4 096 numbers read, the most read); the
    # reading digit by digit took 0.6 s for each of the first two.
    started = time.perf_counter()
    if offset is None:
        refuse_too_big_number(body)
    else:
        err = error_of(refuse_too_big_number, body)
        assert err.message == f"failed to parse the request JSON buffer: {_TOO_BIG} at {offset}"
    assert time.perf_counter() - started < 0.25


def test_the_number_scan_reads_a_bounded_count_of_places() -> None:
    # Each place where such a number may be costs Python a microsecond or two: past 4 096
    # of them (none in a document a client writes), the rest stands as Python's parser read it.
    refuse_too_big_number(b'{"a":[' + b'"e999",' * 4_100 + b"1e999]}")
    err = error_of(refuse_too_big_number, b'{"a":[' + b'"e999",' * 4_000 + b"1e999]}")
    assert err.message == "failed to parse the request JSON buffer: Number too big to be stored in double. at 28006"


def test_a_fault_before_a_number_too_big_is_reported_first() -> None:
    err = error_of(parse_json, b'{"b":"\\ud800","a":1e999}')
    assert err.message == "failed to parse the request JSON buffer: The surrogate pair in string is invalid. at 6"
    err = error_of(parse_json, b'{"b":tru,"a":1e999}')
    assert err.message == "failed to parse the request JSON buffer: Invalid value. at 8"


def test_what_rapidjson_takes_and_python_would_not_or_the_reverse() -> None:
    assert parse_json(b'\xef\xbb\xbf{"a": 1}', raw_strings=True) == {"a": 1}
    assert parse_json(b'{"a": "\\uD800\\uDC00 \\udc00 \\\\ud800"}') == {"a": "\U00010000 \udc00 \\ud800"}


def test_json_strings_keep_bytes_that_are_not_utf8_where_a_tensor_can_carry_them():
    body = b'{"inputs":[{"name":"S","datatype":"BYTES","shape":[1],"data":["a\xff"]}]}'
    request, _ = parse_infer_request(body, None, "m", "")
    assert request.raw_input_contents[0] == codec.serialize_bytes([b"a\xff"])
    # Triton takes them in a name, an id or a parameter as well; a protobuf string cannot
    # carry them, so there each becomes U+FFFD, and the element keeps its bytes.
    body = (
        b'{"id":"r\xfe","parameters":{"k\xfe":"v\xff"},"inputs":[{"name":"S\xfe","datatype":"BYTES","shape":[1],'
        b'"parameters":{"p":"\xfe"},"data":["a\xff"]}],"outputs":[{"name":"O\xfe"}]}'
    )
    request, rendering = parse_infer_request(body, None, "m", "")
    assert (request.id, request.inputs[0].name, request.outputs[0].name) == ("r\ufffd", "S\ufffd", "O\ufffd")
    assert request.parameters["k\ufffd"].string_param == "v\ufffd"
    assert request.raw_input_contents[0] == codec.serialize_bytes([b"a\xff"])
    assert list(rendering.binary) == ["O\ufffd"]
    # A number too big for a double anywhere is still the first fault.
    err = error_of(parse_infer_request, body.replace(b'"r\xfe"', b'"r\xfe","x":1e999'), None, "m", "")
    assert err.message == f"failed to parse the request JSON buffer: {_TOO_BIG} at 15"


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


def test_model_config_keeps_the_int64_strings_triton_keeps():
    # Triton rewrites a sequence state's dims but looks for its initial state's in the
    # wrong object (checked against Triton 2.51 with a python model's config).
    config = ModelConfig(name="acc")
    state = config.sequence_batching.state.add(input_name="IN", output_name="OUT", dims=[1])
    state.initial_state.add(name="zero", dims=[1], zero_data=True)
    document = messages.model_config(config)
    assert document["sequence_batching"]["state"][0]["dims"] == [1]
    assert document["sequence_batching"]["state"][0]["initial_state"][0]["dims"] == ["1"]


def test_statistics_numbers():
    response = ModelStatisticsResponse()
    stats = response.model_stats.add(name="simple", version="1", inference_count=3)
    stats.inference_stats.success.count = 3
    document = messages.statistics(response)
    entry = document["model_stats"][0]
    assert entry["inference_count"] == 3 and entry["version"] == "1"
    assert entry["inference_stats"]["success"] == {"count": 3, "ns": 0}
    assert entry["batch_stats"] == []
    # Triton's key order, which is not the proto's: response_stats after inference_stats.
    assert list(entry) == [
        "name",
        "version",
        "last_inference",
        "inference_count",
        "execution_count",
        "inference_stats",
        "response_stats",
        "batch_stats",
        "memory_usage",
    ]


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
    doc = {"parameters": {"config": '{"max_batch_size":"16"}', "file:1/model.onnx": "AAEC"}}
    request = messages.load_request("m", doc)
    assert request.parameters["config"].string_param == '{"max_batch_size":"16"}'
    assert request.parameters["file:1/model.onnx"].bytes_param == b"\x00\x01\x02"
    assert messages.load_request("m", [1]) == RepositoryModelLoadRequest(model_name="m")  # no member found
    unload = messages.unload_request("m", {"parameters": {"unload_dependents": True}})
    assert unload.parameters["unload_dependents"].bool_param is True


@pytest.mark.parametrize(
    ("text", "decoded"),
    [
        ("AAEC", b"\x00\x01\x02"),
        ("AA\nEC\n", b"\x00\x01\x02"),  # line breaks, as MIME writes base64
        ("AAEC!!==", b"\x00\x01\x02"),  # characters outside the alphabet are skipped
        ("QQ==QQ==", b"A\x04\x10"),  # '=' too, wherever it stands: QQQQ
        ("abc", b"i\xb7"),  # 18 bits: two whole bytes
        ("a", b""),
        ("", b""),
        ("é€QQ", b"A"),
    ],
)
def test_base64_is_decoded_as_libb64_does(text: str, decoded: bytes) -> None:
    """Triton decodes load files and CUDA handles with libb64, which never fails."""
    assert messages.decode_base64(text) == decoded
    request = messages.load_request("m", {"parameters": {"file:1/model.onnx": text}})
    assert request.parameters["file:1/model.onnx"].bytes_param == decoded


@pytest.mark.parametrize(
    ("parameters", "text"),
    [
        (5, "attempt to get members for non-object"),
        ({"config": 5}, "attempt to access JSON non-string as string"),
        ({"config": "{}", "other": True}, "attempt to access JSON non-string as string"),
        ({"config": "{}", "other": "x"}, "unexpected error on creating Triton parameter"),
    ],
)
def test_load_parameters_are_refused_in_triton_words(parameters: object, text: str) -> None:
    """Triton 2.51's HTTP front reads every load parameter as a string and knows only
    "config" and "file:*"; it refuses the rest before the load, with INTERNAL."""
    with pytest.raises(TurnoutError) as caught:
        messages.load_request("m", {"parameters": parameters})
    assert (caught.value.status, caught.value.message) == (Status.INTERNAL, text)


@pytest.mark.parametrize("document", [None, [1], {"parameters": 5}, {"parameters": {"unload_dependents": "yes"}}])
def test_unload_goes_on_without_parameters_it_cannot_read(document: object) -> None:
    """Triton drops the error of unload parameters it cannot read: the model alone unloads."""
    assert messages.unload_request("m", document) == RepositoryModelUnloadRequest(model_name="m")


def test_trace_settings_shapes():
    response = TraceSettingResponse()
    response.settings["trace_level"].value.append("OFF")
    response.settings["trace_rate"].value.append("1000")
    assert messages.trace_settings(response) == {"trace_level": ["OFF"], "trace_rate": "1000"}
    request = messages.trace_request("m", {"trace_rate": "5", "trace_level": ["TIMESTAMPS"], "trace_count": None})
    assert list(request.settings["trace_rate"].value) == ["5"]
    assert list(request.settings["trace_count"].value) == []
