"""protos.status: each transport table covers every Status, and gRPC codes map back."""

from __future__ import annotations

import grpc
import pytest

from protos.status import GRPC_STATUS, HTTP_STATUS, Status, TurnoutError, status_from_grpc


@pytest.mark.parametrize("status", list(Status), ids=lambda s: s.name)
def test_tables_cover_every_status(status: Status) -> None:
    assert status in HTTP_STATUS
    assert status in GRPC_STATUS
    error = TurnoutError(status, "text")
    assert error.http_status == HTTP_STATUS[status]
    assert error.grpc_status == GRPC_STATUS[status]


@pytest.mark.parametrize("status", list(Status), ids=lambda s: s.name)
def test_grpc_round_trip(status: Status) -> None:
    assert status_from_grpc(GRPC_STATUS[status]) is status


@pytest.mark.parametrize("code", list(grpc.StatusCode), ids=lambda c: c.name)
def test_every_grpc_code_maps_to_a_status(code: grpc.StatusCode) -> None:
    assert isinstance(status_from_grpc(code), Status)


def test_triton_http_codes() -> None:
    assert HTTP_STATUS[Status.INTERNAL] == 500
    assert HTTP_STATUS[Status.NOT_FOUND] == 404
    assert HTTP_STATUS[Status.UNAVAILABLE] == 503
    assert HTTP_STATUS[Status.UNSUPPORTED] == 501
    others = set(Status) - {Status.INTERNAL, Status.NOT_FOUND, Status.UNAVAILABLE, Status.UNSUPPORTED}
    assert {HTTP_STATUS[s] for s in others} == {400}
