"""Sequences across a fleet: with two replicas and an A/B split over two versions,
every request of a sequence reaches the replica and version that took its START (the
model keeps a running sum in its implicit state, so any other replica or version
would refuse the request), and a sequence whose replica is gone gets a clear error
instead of moving."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.utils import InferenceServerException

from tests.fleet.fleet_harness import Consul, gateway, running, sidecar, wait_until
from tests.harness import make_models

SERVICE, PREFIX = "sequence-pins", "sequence-pins/policies/"


@pytest.fixture(scope="module")
def sum_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`running_sum`: OUTPUT = the sequence's running sum, in versions 1 and 2."""
    repo = tmp_path_factory.mktemp("fleet_sequence_repo")
    model_dir = make_models().write_sequence(repo, "running_sum", ("READY",), state=True, instances=1)
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
            open_ids = [100 + i for i in range(8)]
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
