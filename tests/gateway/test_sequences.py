"""Sequence pins: which requests belong to a sequence, and how long a pin lives (the
model's idle time plus a grace, renewed by use, dropped at END), on an injected clock."""

from __future__ import annotations

import pytest

from gateway.routing.sequences import DEFAULT_IDLE_SECS, PIN_GRACE_SECS, SequencePins
from gateway.upstream import SidecarClient
from protos import grpc_service_pb2 as pb
from protos.sequence import SequenceFlags, sequence_of


def _request(**parameters: object) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m")
    for key, value in parameters.items():
        field = {bool: "bool_param", int: "int64_param", str: "string_param", float: "double_param"}[type(value)]
        setattr(request.parameters[key], field, value)
    return request


@pytest.mark.parametrize(
    ("parameters", "expected"),
    [
        ({}, None),
        ({"priority": 1}, None),
        ({"sequence_id": 0, "sequence_start": True}, None),  # zero: no sequence (the sidecar says so)
        ({"sequence_id": ""}, None),
        ({"sequence_id": 1.5}, None),  # a wrong type: the sidecar words the error
        ({"sequence_id": 7}, SequenceFlags(7, False, False)),
        ({"sequence_id": -1, "sequence_start": True}, SequenceFlags(2**64 - 1, True, False)),
        ({"sequence_id": "abc", "sequence_end": True}, SequenceFlags("abc", False, True)),
    ],
)
def test_sequence_of(parameters: dict[str, object], expected: SequenceFlags | None) -> None:
    assert sequence_of(_request(**parameters)) == expected


async def test_pins_live_for_the_idle_time_renewed_by_use() -> None:
    now = [100.0]
    pins = SequencePins(clock=lambda: now[0])
    replica = SidecarClient("onnxruntime", "127.0.0.1:9")  # never reached: its config lookup fails
    start = SequenceFlags(1, True, False)
    pins.bind("m", start, "2", replica)
    lifetime = DEFAULT_IDLE_SECS + PIN_GRACE_SECS
    now[0] += lifetime - 0.1
    pin = pins.get("m", SequenceFlags(1, False, False))
    assert pin is not None and (pin.version, pin.replica) == ("2", replica)
    now[0] += lifetime - 0.1  # renewed by the last use
    assert pins.get("m", start) is not None
    assert pins.get("other", start) is None  # pins are per model
    now[0] += lifetime
    assert pins.get("m", start) is None and len(pins) == 0

    pins.bind("m", SequenceFlags("a", True, False), "1", replica)
    pins.end("m", SequenceFlags("a", False, True))
    assert pins.get("m", SequenceFlags("a", False, False)) is None

    # Expired pins are dropped as new ones come, least recently used first.
    for sequence_id in range(10, 15):
        pins.bind("m", SequenceFlags(sequence_id, True, False), "1", replica)
    now[0] += lifetime
    pins.bind("m", SequenceFlags(99, True, False), "1", replica)
    assert len(pins) == 1
    await replica.close()


async def test_a_load_or_unload_forgets_the_idle_times_learned() -> None:
    now = [0.0]
    pins = SequencePins(clock=lambda: now[0])
    replica = SidecarClient("onnxruntime", "127.0.0.1:9")
    pins._idle_secs["m"] = 30.0  # as learned from the model's config at its first START
    pins.forget_idle_times()
    pins.bind("m", SequenceFlags(1, True, False), "1", replica)
    now[0] += DEFAULT_IDLE_SECS + PIN_GRACE_SECS
    assert pins.get("m", SequenceFlags(1, False, False)) is None  # the default, not the stale 30 s
    await replica.close()
