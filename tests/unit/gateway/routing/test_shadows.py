"""Shadow comparison (`gateway.routing.shadows.compare_outputs`), in process: floating
outputs match within rtol/atol as numpy.isclose (NaN matching NaN, per-output tolerances
over the shadow's), integers, BOOL and BYTES exactly, raw or typed contents alike, and
the largest difference per numeric output."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gateway.routing.shadows import compare_outputs, same_outputs
from gateway.routing.versions import Shadow, Tolerance, parse_policy
from protos import codec
from protos import grpc_service_pb2 as pb


def response(*tensors: tuple[str, str, np.ndarray], typed: bool = False) -> bytes:
    """A serialized ModelInferResponse carrying `tensors` (name, datatype, values) as raw
    contents, or as typed contents with `typed`."""
    message = pb.ModelInferResponse(model_name="m", model_version="1")
    for name, datatype, values in tensors:
        output = message.outputs.add(name=name, datatype=datatype, shape=list(values.shape))
        kind = codec.datatype(datatype)
        assert kind is not None
        if typed:
            field = getattr(output.contents, kind.contents_field or "")
            field.extend(values.reshape(-1).tolist())
        else:
            message.raw_output_contents.append(codec.to_raw(values, kind))
    return message.SerializeToString()


def fp32(*values: float) -> np.ndarray:
    return np.array([values], dtype=np.float32)


def tolerant(rtol: float = 0.0, atol: float = 0.0, **outputs: Tolerance) -> Shadow:
    return Shadow("2", 1.0, Tolerance(rtol, atol), tuple(outputs.items()))


def test_floating_outputs_within_the_tolerance_read_the_same() -> None:
    primary = response(("OUT", "FP32", fp32(1.0, 100.0)))
    shadow = response(("OUT", "FP32", fp32(1.0005, 100.05)))
    assert compare_outputs(primary, shadow, tolerant(rtol=1e-3)).same
    assert not compare_outputs(primary, shadow, tolerant(rtol=1e-4)).same
    assert compare_outputs(primary, shadow, tolerant(atol=0.06)).same
    assert not compare_outputs(primary, shadow).same  # exact by default
    assert compare_outputs(primary, shadow, tolerant(rtol=1e-3)).differences["OUT"] == pytest.approx(0.05, rel=1e-3)


def test_the_tolerance_is_relative_to_the_primary_as_numpy_isclose() -> None:
    # |shadow - primary| <= atol + rtol * |primary|: 1 against 2 is within rtol 0.5 of 2, not of 1.
    assert compare_outputs(
        response(("OUT", "FP64", np.array([2.0]))), response(("OUT", "FP64", np.array([1.0]))), tolerant(0.5)
    ).same
    assert not compare_outputs(
        response(("OUT", "FP64", np.array([1.0]))), response(("OUT", "FP64", np.array([2.0]))), tolerant(0.5)
    ).same


def test_an_outputs_own_tolerance_wins_over_the_shadows() -> None:
    primary = response(("A", "FP32", fp32(1.0)), ("B", "FP32", fp32(1.0)))
    shadow = response(("A", "FP32", fp32(1.01)), ("B", "FP32", fp32(1.01)))
    assert not compare_outputs(primary, shadow, tolerant(0.0, 0.0, A=Tolerance(0.1, 0.0))).same
    assert compare_outputs(primary, shadow, tolerant(0.0, 0.0, A=Tolerance(0.1, 0.0), B=Tolerance(0.0, 0.1))).same


def test_integers_and_bytes_are_compared_exactly_whatever_the_tolerance() -> None:
    loose = tolerant(rtol=1.0, atol=10.0)
    ints = compare_outputs(
        response(("OUT", "INT32", np.array([[5, 6]], dtype=np.int32))),
        response(("OUT", "INT32", np.array([[5, 7]], dtype=np.int32))),
        loose,
    )
    assert not ints.same and ints.differences == {"OUT": 1.0}
    words = np.array([[b"a", b"b"]], dtype=np.object_)
    assert compare_outputs(response(("OUT", "BYTES", words)), response(("OUT", "BYTES", words)), loose).same
    other = np.array([[b"a", b"c"]], dtype=np.object_)
    result = compare_outputs(response(("OUT", "BYTES", words)), response(("OUT", "BYTES", other)), loose)
    assert not result.same and result.differences == {}


def test_nan_matches_nan_and_differs_from_a_number() -> None:
    nan = fp32(math.nan, 1.0)
    assert compare_outputs(response(("OUT", "FP32", nan)), response(("OUT", "FP32", nan))).differences["OUT"] == 0.0
    assert compare_outputs(response(("OUT", "FP32", nan)), response(("OUT", "FP32", nan))).same
    result = compare_outputs(
        response(("OUT", "FP32", nan)), response(("OUT", "FP32", fp32(1.0, 1.0))), tolerant(1.0, 1.0)
    )
    assert not result.same and result.differences["OUT"] == math.inf


def test_names_datatypes_and_shapes_must_match() -> None:
    primary = response(("OUT", "FP32", fp32(1.0, 2.0)))
    assert not same_outputs(primary, response(("OTHER", "FP32", fp32(1.0, 2.0))))
    assert not same_outputs(primary, response(("OUT", "FP64", np.array([[1.0, 2.0]]))))
    assert not same_outputs(primary, response(("OUT", "FP32", np.array([1.0, 2.0], dtype=np.float32))))
    assert same_outputs(primary, primary)


def test_typed_contents_compare_as_raw_ones_do() -> None:
    raw = response(("OUT", "FP32", fp32(1.0, 2.0)))
    typed = response(("OUT", "FP32", fp32(1.0, 2.0 + 1e-6)), typed=True)
    assert compare_outputs(raw, typed, tolerant(rtol=1e-5)).same
    assert not compare_outputs(raw, typed).same


def test_a_policy_names_its_shadows_tolerances_with_numpy_defaults() -> None:
    policy = parse_policy(
        "m", {"weights": {"1": 1}, "shadow": {"version": "other:2", "atol": 0.5, "outputs": {"P": {"rtol": 0.1}}}}
    )
    assert policy.shadow is not None
    assert policy.shadow.version == "other:2"
    assert policy.shadow.tolerance == Tolerance(1e-05, 0.5)
    assert policy.shadow.tolerance_of("P") == Tolerance(0.1, 0.5)  # the output's rtol, the shadow's atol
    assert policy.shadow.tolerance_of("Q") == Tolerance(1e-05, 0.5)
