"""Which address a sidecar advertises to Consul, and the warning when that address is one
no other host can reach."""

from __future__ import annotations

import logging

import pytest

from sidecars.registration import advertised_host
from sidecars.settings import SidecarSettings


def test_an_explicit_advertise_address_wins(caplog: pytest.LogCaptureFixture) -> None:
    settings = SidecarSettings("onnxruntime", (), host="0.0.0.0", consul="127.0.0.1:8500", advertise_address="10.1.2.3")
    assert advertised_host(settings) == "10.1.2.3"
    assert not caplog.records


def test_a_bound_host_is_advertised_as_it_is(caplog: pytest.LogCaptureFixture) -> None:
    assert advertised_host(SidecarSettings("onnxruntime", (), host="127.0.0.1", consul="127.0.0.1:8500")) == "127.0.0.1"
    assert not caplog.records


def test_all_interfaces_with_a_loopback_route_to_consul_warns_that_others_cannot_reach_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="sidecars.registration")
    assert advertised_host(SidecarSettings("onnxruntime", (), host="0.0.0.0", consul="127.0.0.1:8500")) == "127.0.0.1"
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert "advertising 127.0.0.1 to Consul" in record.getMessage()
    assert "--advertise-address" in record.getMessage()
