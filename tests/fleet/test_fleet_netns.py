"""Multi-host, on one machine: sidecars each in their own network namespace (own
address), a gateway in another, one Consul agent on the bridge between them. Cutting
one sidecar's link moves the traffic to the other."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.fleet.fleet_harness import NO_CONSUL, Consul, consul_binary, gateway, running, sidecar, wait_until

SUBNET = "10.213.77"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@contextlib.contextmanager
def _namespaces(count: int) -> Iterator[list[tuple[str, str, str]]]:
    """`count` namespaces on one bridge: (namespace, its address, its link's host end)."""
    tag = f"t{os.getpid() % 100000}"
    bridge = f"{tag}br"
    made: list[tuple[str, str, str]] = []
    try:
        _ip("link", "add", bridge, "type", "bridge")
        _ip("addr", "add", f"{SUBNET}.1/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for index in range(count):
            namespace, host_end, inner = f"{tag}n{index}", f"{tag}h{index}", f"{tag}i{index}"
            address = f"{SUBNET}.{index + 2}"
            _ip("netns", "add", namespace)
            made.append((namespace, address, host_end))
            _ip("link", "add", host_end, "type", "veth", "peer", "name", inner)
            _ip("link", "set", inner, "netns", namespace)
            _ip("link", "set", host_end, "master", bridge, "up")
            _ip("-n", namespace, "addr", "add", f"{address}/24", "dev", inner)
            _ip("-n", namespace, "link", "set", inner, "up")
            _ip("-n", namespace, "link", "set", "lo", "up")
        yield made
    finally:
        for namespace, _, host_end in made:
            subprocess.run(["ip", "link", "del", host_end], capture_output=True)
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)


def _can_make_namespaces() -> str:
    """Why namespaces cannot be made here ("" when they can)."""
    probe = f"t{os.getpid() % 100000}probe"
    try:
        done = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot run `ip netns`: {exc}"
    if done.returncode != 0:
        return f"`ip netns add` failed (needs root or CAP_SYS_ADMIN): {done.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return ""


def test_sidecars_in_namespaces_fail_over_when_a_link_is_cut(fleet_repository: Path) -> None:
    reason = _can_make_namespaces()
    if reason:
        pytest.skip(reason)
    binary = consul_binary()
    if binary is None:
        pytest.skip(NO_CONSUL)
    with _namespaces(3) as spaces:
        agent = Consul(binary, bind=f"{SUBNET}.1", clients=(f"{SUBNET}.1",))
        try:
            (ns_a, addr_a, link_a), (ns_b, addr_b, _), (ns_gw, addr_gw, _) = spaces
            service = "netns"
            # A test network of namespaces on this machine alone: no TLS to make here.
            flags = (f"--consul-service={service}", "--consul-check-interval=500ms", "--allow-unauthenticated-network")
            one = sidecar(agent.http, fleet_repository, f"--host={addr_a}", *flags, python=_in(ns_a))
            two = sidecar(agent.http, fleet_repository, f"--host={addr_b}", *flags, python=_in(ns_b))
            gw = gateway(agent.http, f"--consul-service={service}", f"--host={addr_gw}", python=_in(ns_gw))
            with running(gw, one, two):
                wait_until(lambda: len(agent.passing(service)) == 2, 20, "both namespaced sidecars passing")
                advertised = sorted(e["Service"]["Address"] for e in agent.passing(service))
                assert advertised == sorted([addr_a, addr_b])
                port = gw.fields["grpc"].rsplit(":", 1)[1]
                with grpcclient.InferenceServerClient(f"{addr_gw}:{port}") as client:
                    tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
                    tensor.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
                    for _ in range(20):
                        client.infer("linear", [tensor])
                    served_a = _inference_count(f"{addr_a}:{one.fields['grpc'].rsplit(':', 1)[1]}")
                    assert served_a > 0, "both sidecars should share the traffic"

                    _ip("link", "set", link_a, "down")  # cut sidecar A off the network
                    cut_at = time.monotonic()
                    failures = 0
                    recovered_at = None
                    while time.monotonic() - cut_at < 20:
                        try:
                            client.infer("linear", [tensor], client_timeout=2)
                        except InferenceServerException:
                            failures += 1
                            continue
                        recovered_at = recovered_at or time.monotonic()
                        if time.monotonic() - recovered_at > 2:
                            break
                    assert recovered_at is not None, "no request succeeded after the cut"
                    for _ in range(50):  # everything now goes to sidecar B
                        client.infer("linear", [tensor], client_timeout=5)
                    print(f"link cut: {failures} failed; first success {recovered_at - cut_at:.1f}s after the cut")
        finally:
            agent.close()


def _in(namespace: str) -> tuple[str, ...]:
    return ("ip", "netns", "exec", namespace, sys.executable)


def _inference_count(address: str) -> int:
    with grpcclient.InferenceServerClient(address) as client:
        stats = client.get_inference_statistics("linear").model_stats
    return sum(s.inference_count for s in stats)
