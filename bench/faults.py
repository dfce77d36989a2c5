"""`python -m bench.faults`: concurrent load through `turnout up` while faults are
injected, one scenario at a time, then a table: requests sent, succeeded, rejected
with a clear error (a status and a message), lost (accepted but never answered: the
client's own deadline ran out, or the call broke without a status), and the time to
recover (from the fault, or its end, to the first success of a request sent after it).

Scenarios: a sidecar killed (SIGKILL; `turnout up` restarts it), a sidecar frozen
(SIGSTOP for 2 s, then SIGCONT), an overload burst beyond --sidecar-max-inflight; then,
with Consul (bench/fleet.py), two replicas behind a gateway: one killed, one drained,
Consul stopped and restarted, a version rollout by KV weights, and one replica that
failed to load the model under load (the gateway routes to the other and stays ready);
and two replicas of a stateful model behind two gateways, with each sequence's requests
alternating between the gateways, while one replica is killed. There a request answered
with a wrong running sum counts as lost, and a sequence that got an error starts afresh
under a new id.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc.aio as grpcaio
from tritonclient.utils import InferenceServerException

from bench.fleet import SEQUENCE_MODEL, fleet, sequence_fleet
from scripts.make_models import write_linear, write_sequence, write_simple
from tests.fleet.fleet_harness import consul_binary
from tests.harness import live_children, turnout_up

CLIENT_TIMEOUT_S = 10.0
SEQUENCE_STEPS = 8
# No sequence may idle out while the load runs: a minute before a slot is freed.
LONG_IDLE = "max_sequence_idle_microseconds: 60000000"


@dataclass
class Tally:
    sent: int = 0
    succeeded: int = 0
    rejected: int = 0
    lost: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    successes: list[tuple[float, float]] = field(default_factory=list)  # (sent at, answered at)

    def recovery(self, since: float | None) -> float | None:
        if since is None:
            return None
        later = [answered for sent, answered in self.successes if sent >= since]
        return min(later) - since if later else None


def sidecar_of(pid: int) -> int:
    children = live_children(pid)
    if not children:
        raise RuntimeError("no sidecar found")
    return children[0]


def request_for(model: str) -> tuple[list[grpcaio.InferInput], Callable[[Any], bool]]:
    """A request's inputs and the check of its answer: `linear` multiplies by its version
    (so a rollout shows in the answers), the `simple` models add their two inputs."""
    if model == "linear":
        ones = grpcaio.InferInput("INPUT0", [1, 4], "FP32")
        ones.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
        return [ones], lambda r: bool(r.as_numpy("OUTPUT0")[0, 0] == float(r.get_response().model_version))
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [grpcaio.InferInput("INPUT0", [1, 16], "INT32"), grpcaio.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(a)
    return inputs, lambda r: bool((r.as_numpy("OUTPUT0") == a + a).all())


async def drive(
    address: str, model: str, concurrency: int, seconds: float, fault: Callable[[], Awaitable[float | None]]
) -> tuple[Tally, float | None]:
    """`concurrency` workers send `model` requests for `seconds`; `fault` runs beside them
    and returns the moment recovery is measured from."""
    tally = Tally()
    stop = time.monotonic() + seconds
    inputs, correct = request_for(model)
    async with grpcaio.InferenceServerClient(address) as client:

        async def worker() -> None:
            while time.monotonic() < stop:
                tally.sent += 1
                sent = time.monotonic()
                try:
                    result = await client.infer(model, inputs, client_timeout=CLIENT_TIMEOUT_S)
                    assert correct(result)
                except InferenceServerException as exc:
                    if count_error(tally, exc):
                        await asyncio.sleep(0.01)  # a rejected client backs off a little
                else:
                    tally.succeeded += 1
                    tally.successes.append((sent, time.monotonic()))

        workers = [asyncio.ensure_future(worker()) for _ in range(concurrency)]
        since = await fault()
        await asyncio.gather(*workers)
    return tally, since


def count_error(tally: Tally, exc: InferenceServerException) -> bool:
    """Count a failed request in `tally`: True when it was refused with a clear error."""
    status, message = str(exc.status()), exc.message() or ""
    key = f"{status.rpartition('.')[2]}: {message[:60]}"
    tally.errors[key] = tally.errors.get(key, 0) + 1
    if status.endswith("DEADLINE_EXCEEDED") or not message:
        tally.lost += 1
        return False
    tally.rejected += 1
    return True


async def drive_sequences(
    addresses: list[str], concurrency: int, seconds: float, fault: Callable[[], Awaitable[float | None]]
) -> tuple[Tally, float | None]:
    """`concurrency` workers run sequences of SEQUENCE_STEPS requests to SEQUENCE_MODEL,
    each request through the next of `addresses` (the gateways) in turn, checking every
    running sum; an error ends the sequence and the worker starts another."""
    tally = Tally()
    stop = time.monotonic() + seconds
    tensor = grpcaio.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.full([1, 1], 3, dtype=np.int32))
    clients = [grpcaio.InferenceServerClient(address) for address in addresses]

    async def worker(index: int) -> None:
        for number in itertools.count(1):
            sequence_id = index * 1_000_000 + number
            for step in range(SEQUENCE_STEPS):
                if time.monotonic() >= stop:
                    return
                tally.sent += 1
                sent = time.monotonic()
                flags = {"sequence_start": step == 0, "sequence_end": step == SEQUENCE_STEPS - 1}
                client = clients[(index + step) % len(clients)]
                try:
                    result = await client.infer(
                        SEQUENCE_MODEL, [tensor], sequence_id=sequence_id, client_timeout=CLIENT_TIMEOUT_S, **flags
                    )
                except InferenceServerException as exc:
                    if count_error(tally, exc):
                        await asyncio.sleep(0.01)
                    break  # the sequence is over; the next starts afresh
                if int(result.as_numpy("OUTPUT")[0, 0]) != 3 * (step + 1):
                    tally.lost += 1  # answered, but from the wrong state: accepted, then lost
                    tally.errors["wrong running sum"] = tally.errors.get("wrong running sum", 0) + 1
                    break
                tally.succeeded += 1
                tally.successes.append((sent, time.monotonic()))

    try:
        workers = [asyncio.ensure_future(worker(index)) for index in range(concurrency)]
        since = await fault()
        await asyncio.gather(*workers)
    finally:
        for client in clients:
            await client.close()
    return tally, since


def scenarios(process: subprocess.Popen[str]) -> dict[str, Callable[[], Awaitable[float | None]]]:
    async def kill() -> float | None:
        await asyncio.sleep(1.0)
        os.kill(sidecar_of(process.pid), signal.SIGKILL)
        return time.monotonic()

    async def freeze() -> float | None:
        await asyncio.sleep(1.0)
        pid = sidecar_of(process.pid)
        os.kill(pid, signal.SIGSTOP)
        await asyncio.sleep(2.0)
        os.kill(pid, signal.SIGCONT)
        return time.monotonic()

    async def none() -> float | None:
        return None

    return {"sidecar SIGKILL (restarted)": kill, "sidecar SIGSTOP 2 s": freeze, "baseline": none}


def _fleet_rows(
    consul: Path, repository: Path, folder: Path, args: argparse.Namespace
) -> list[tuple[str, Tally, float | None]]:
    """The rows that need Consul: each fleet fault on a fresh two-replica fleet, a replica
    failing one model, Consul under ACLs, two gateways with sequences under a replica's kill."""
    rows: list[tuple[str, Tally, float | None]] = []
    for index in range(4):
        # A fresh fleet per row, so each fault starts from two healthy replicas.
        with fleet(consul, repository) as running:
            name, (model, fault) = list(running.faults().items())[index]
            tally, since = asyncio.run(drive(running.address, model, args.concurrency, args.seconds, fault))
            rows.append((name, tally, tally.recovery(since)))
    # The second replica's copy of `simple` is not a model: its load fails there.
    broken = folder / "broken"
    shutil.copytree(repository, broken)
    (broken / "simple" / "1" / "model.onnx").write_bytes(b"not an onnx model")
    with fleet(consul, repository, broken) as running:

        async def steady() -> float | None:
            return None

        tally, _ = asyncio.run(drive(running.address, "simple", args.concurrency, args.seconds, steady))
        rows.append(("fleet: a replica failing one model", tally, None))
    # Consul in production form: default-deny ACLs, least-privilege tokens.
    acl_dir = folder / "consul-acl"
    acl_dir.mkdir()
    with fleet(consul, repository, acl_dir=acl_dir) as running:
        model, fault = running.faults()["fleet: consul stopped 2 s, restarted"]
        tally, since = asyncio.run(drive(running.address, model, args.concurrency, args.seconds, fault))
        rows.append(("fleet: consul under ACLs stopped 2 s, restarted", tally, tally.recovery(since)))
    write_sequence(repository, SEQUENCE_MODEL, ("READY",), state=True, strategy=LONG_IDLE, instances=2)
    with sequence_fleet(consul, repository) as sequences:
        tally, since = asyncio.run(drive_sequences(sequences.addresses, args.concurrency, args.seconds, sequences.kill))
        rows.append(("two gateways with sequences under a replica's kill", tally, tally.recovery(since)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=6.0, help="load per scenario")
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    rows: list[tuple[str, Tally, float | None]] = []
    with tempfile.TemporaryDirectory(prefix="turnout-faults-") as folder:
        repository = Path(folder)
        write_simple(repository)
        write_simple(
            repository, name="simple_held", extra_config="dynamic_batching { max_queue_delay_microseconds: 200000 }"
        )
        for name in ("baseline", "sidecar SIGKILL (restarted)", "sidecar SIGSTOP 2 s"):
            with turnout_up(repository) as server:
                fault = scenarios(server.process)[name]
                tally, since = asyncio.run(drive(server.grpc, "simple", args.concurrency, args.seconds, fault))
                rows.append((name, tally, tally.recovery(since)))
        # Overload: many more clients than the gateway lets in flight, on a model that holds requests.
        with turnout_up(repository, "--sidecar-max-inflight=4") as server:

            async def burst() -> float | None:
                return None

            tally, _ = asyncio.run(drive(server.grpc, "simple_held", args.concurrency * 8, args.seconds, burst))
            rows.append((f"overload: {args.concurrency * 8} clients, limit 4", tally, None))
        write_linear(repository)
        consul = consul_binary()
        if consul is None:
            print("no consul binary (scripts/install-consul): the fleet rows are skipped", file=sys.stderr)
        else:
            rows += _fleet_rows(consul, repository, Path(folder), args)

    width = max(len(name) for name, _, _ in rows)
    print(f"{'scenario':<{width}} {'sent':>7} {'succeeded':>9} {'rejected':>8} {'lost':>5} {'recovery s':>10}")
    for name, tally, recovery in rows:
        shown = f"{recovery:.2f}" if recovery is not None else "-"
        print(f"{name:<{width}} {tally.sent:>7} {tally.succeeded:>9} {tally.rejected:>8} {tally.lost:>5} {shown:>10}")
    print()
    for name, tally, _ in rows:
        for error, count in sorted(tally.errors.items()):
            print(f"  {name}: {count} x {error}")


if __name__ == "__main__":
    main()
