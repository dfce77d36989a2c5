"""Sequences across a fleet: with two replicas and an A/B split over two versions,
every request of a sequence reaches the replica and version that took its START (the
model keeps a running sum in its implicit state, so any other replica or version
would refuse the request), and a sequence whose replica is gone gets a clear error
instead of moving; with two gateways, a client alternating between them inside each
sequence (one over gRPC, the other over HTTP) gets the same, though neither gateway
saw every START."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
import tritonclient.http.aio as httpclient
from tritonclient.utils import InferenceServerException

from tests.fleet.fleet_harness import Consul, Process, gateway, metric, running, sidecar, wait_until
from tests.harness import make_models

SERVICE, PREFIX = "sequence-pins", "sequence-pins/policies/"


# Sequences must not idle out while a loaded machine runs many of them: a sequence that
# idled out (Triton's default is a second) would lose its slot and its pin, and a START
# finding no free slot would wait for one.
LONG_IDLE = "max_sequence_idle_microseconds: 60000000"
UNKNOWN_TO_TRITON = "must specify the START flag on the first request of the sequence"


@pytest.fixture(scope="module")
def sum_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`running_sum`: OUTPUT = the sequence's running sum, in versions 1 and 2, idle for a
    minute before a sequence's slot is freed, with two instances (16 slots) per version."""
    repo = tmp_path_factory.mktemp("fleet_sequence_repo")
    models = make_models()
    model_dir = models.write_sequence(repo, "running_sum", ("READY",), state=True, strategy=LONG_IDLE, instances=2)
    shutil.copytree(model_dir / "1", model_dir / "2")
    config = model_dir / "config.pbtxt"
    config.write_text(config.read_text() + "version_policy: { all { } }\n")
    return repo


def _input(value: int) -> list[aioclient.InferInput]:
    tensor = aioclient.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.full([1, 1], value, dtype=np.int32))
    return [tensor]


async def _step(
    client: aioclient.InferenceServerClient, sequence_id: int | str, value: int, **flags: bool
) -> tuple[int, str]:
    result = await client.infer("running_sum", _input(value), sequence_id=sequence_id, **flags)
    return int(result.as_numpy("OUTPUT")[0, 0]), result.get_response().model_version


def _served(address: str) -> int:
    with grpcclient.InferenceServerClient(address) as client:
        stats = client.get_inference_statistics("running_sum", as_json=True)["model_stats"]
    return sum(int(entry.get("inference_count", 0)) for entry in stats)


async def test_sequences_stay_on_their_replica_and_version(consul: Consul, sum_repository: Path) -> None:
    assert consul.put(f"/v1/kv/{PREFIX}running_sum", json.dumps({"weights": {"1": 50, "2": 50}}).encode())
    replicas = [sidecar(consul.http, sum_repository, f"--consul-service={SERVICE}") for _ in range(2)]
    front = gateway(consul.http, f"--consul-service={SERVICE}", f"--routing-kv-prefix={PREFIX}", "--routing-seed=3")
    with running(front, *replicas):
        wait_until(lambda: len(consul.passing(SERVICE)) == 2, 15, "two passing replicas")
        client = aioclient.InferenceServerClient(front.fields["grpc"])
        try:
            ids: list[int | str] = [*range(1, 9), *(f"user-{i}" for i in range(8))]
            steps = 6

            async def run(sequence_id: int | str) -> set[str]:
                versions = set()
                for step in range(steps):
                    total, version = await _step(
                        client, sequence_id, 3, sequence_start=step == 0, sequence_end=step == steps - 1
                    )
                    assert total == 3 * (step + 1), (sequence_id, step, total)
                    versions.add(version)
                return versions

            per_sequence = await asyncio.gather(*(run(i) for i in ids))
            assert all(len(versions) == 1 for versions in per_sequence)  # one version per sequence
            assert set().union(*per_sequence) == {"1", "2"}  # the A/B split still splits sequences
            served = [_served(r.fields["grpc"]) for r in replicas]
            assert sum(served) == len(ids) * steps and all(served), served  # both replicas took sequences

            # Replica 0 goes away mid-sequence: its sequences fail clearly, the others go on.
            # Each sequence's replica follows from its id and the replicas' (random) ports:
            # of 8 sequences, all went to one replica in about one run of 128; of 24, one in 8 million.
            open_ids = [100 + i for i in range(24)]
            for sequence_id in open_ids:
                assert (await _step(client, sequence_id, 1, sequence_start=True))[0] == 1
            replicas[0].kill()
            lost, kept = 0, 0
            for sequence_id in open_ids:
                try:
                    assert (await _step(client, sequence_id, 1))[0] == 2
                    kept += 1
                except InferenceServerException as error:
                    assert error.status() == "StatusCode.UNAVAILABLE", error
                    assert f"sequence {sequence_id} of model 'running_sum' was started on replica" in error.message()
                    assert error.message().endswith("start the sequence again")
                    lost += 1
            assert kept and lost, (kept, lost)
        finally:
            await client.close()


class TwoGateways:
    """A client of both gateways: each sequence alternates between them, step by step,
    over gRPC to one and HTTP to the other (which is which depends on the sequence)."""

    def __init__(self, fronts: tuple[Process, Process]) -> None:
        self.grpc = [aioclient.InferenceServerClient(front.fields["grpc"]) for front in fronts]
        self.http = [httpclient.InferenceServerClient(front.fields["http"]) for front in fronts]

    async def step(self, sequence_id: int, step: int, value: int, **flags: bool) -> tuple[int, str]:
        """Step `step` of the sequence, through gateway (sequence_id + step) % 2: (its sum, its version)."""
        front = (sequence_id + step) % 2
        if (sequence_id // 2 + front) % 2 == 0:
            result = await self.grpc[front].infer(
                "running_sum", _input(value), sequence_id=sequence_id, client_timeout=30, **flags
            )
            return int(result.as_numpy("OUTPUT")[0, 0]), result.get_response().model_version
        tensor = httpclient.InferInput("INPUT", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.full([1, 1], value, dtype=np.int32))
        answer = await self.http[front].infer("running_sum", [tensor], sequence_id=sequence_id, **flags)
        return int(answer.as_numpy("OUTPUT")[0, 0]), str(answer.get_response()["model_version"])

    async def run(self, sequence_id: int, steps: int, first: int = 0, total: int = 0) -> set[str]:
        """Steps `first`..`steps - 1` (the first a START, the last an END) adding 3 each; checks every sum."""
        versions = set()
        for step in range(first, steps):
            flags = {"sequence_start": step == 0, "sequence_end": step == steps - 1}
            total += 3
            answer, version = await self.step(sequence_id, step, 3, **flags)
            assert answer == total, (sequence_id, step, answer, total)
            versions.add(version)
        return versions

    async def close(self) -> None:
        for client in [*self.grpc, *self.http]:
            await client.close()


def _fleet_up(consul: Consul, replicas: list[Process], fronts: tuple[Process, Process], service: str) -> None:
    wait_until(lambda: len(consul.passing(service)) == len(replicas), 30, "every replica passing")
    for front in fronts:
        healthy = (lambda m: lambda: metric(m, "turnout_gateway_replicas", state="healthy") == len(replicas))(
            front.fields["metrics"]
        )
        wait_until(healthy, 30, "each gateway to know every replica")


async def test_sequences_alternating_between_two_gateways_keep_their_replica_and_version(
    consul: Consul, sum_repository: Path
) -> None:
    service, prefix = "sequence-fleet", "sequence-fleet/policies/"
    assert consul.put(f"/v1/kv/{prefix}running_sum", json.dumps({"weights": {"1": 50, "2": 50}}).encode())
    replicas = [sidecar(consul.http, sum_repository, f"--consul-service={service}") for _ in range(2)]
    flags = (f"--consul-service={service}", f"--routing-kv-prefix={prefix}")
    # Differently seeded: only the sequence id may decide a START's version.
    fronts = (gateway(consul.http, *flags, "--routing-seed=3"), gateway(consul.http, *flags, "--routing-seed=4"))
    with running(*fronts, *replicas):
        _fleet_up(consul, replicas, fronts, service)
        client = TwoGateways(fronts)
        try:
            # Many concurrent sequences, each alternating between the gateways.
            ids = range(1, 25)
            per_sequence = await asyncio.gather(*(client.run(i, 6) for i in ids))
            assert all(len(versions) == 1 for versions in per_sequence)  # each sequence stays on one version
            assert set().union(*per_sequence) == {"1", "2"}  # and the split still splits sequences
            served = [_served(r.fields["grpc"]) for r in replicas]
            assert sum(served) == len(ids) * 6 and all(served), served

            # Sequences left open, then replica 0 is killed: those it held fail clearly, the others go on.
            open_ids = range(101, 117)
            for sequence_id in open_ids:
                assert (await client.step(sequence_id, 0, 3, sequence_start=True))[0] == 3
                assert (await client.step(sequence_id, 1, 3))[0] == 6
            replicas[0].kill()
            kept, lost = [], []
            for sequence_id in open_ids:
                try:
                    assert (await client.step(sequence_id, 2, 3))[0] == 9
                    kept.append(sequence_id)
                except InferenceServerException as error:
                    message = error.message() or ""
                    assert "start the sequence again" in message or UNKNOWN_TO_TRITON in message, message
                    lost.append(sequence_id)
            assert kept and lost, (kept, lost)
            for sequence_id in lost:  # its state is gone: no other replica takes it up afresh
                with pytest.raises(InferenceServerException) as again:
                    await client.step(sequence_id, 3, 3)
                message = again.value.message() or ""
                assert "start the sequence again" in message or UNKNOWN_TO_TRITON in message, message
            await asyncio.gather(*(client.run(i, 5, first=3, total=9) for i in kept))
            # A lost sequence started again (its id reused) runs on a survivor, through both
            # gateways, though one of them remembers where its first START went.
            await asyncio.gather(*(client.run(i, 4) for i in lost))

            # New sequences go to the survivor, through either gateway.
            before = _served(replicas[1].fields["grpc"])
            await asyncio.gather(*(client.run(i, 4) for i in range(201, 209)))
            assert _served(replicas[1].fields["grpc"]) == before + 8 * 4
        finally:
            await client.close()
