"""The batches the dynamic batcher and the `oldest` sequence strategy form, and when,
through `turnout up` on ONNX Runtime and TorchScript models: read from the model's
statistics (`execution_count`, `batch_stats`) and the clients' own clocks.

Each scenario was first run against Triton 2.51 (the nvidia-pytriton wheel's server, a
python-backend model with the same `dynamic_batching` or `sequence_batching` section and
one instance); TRITON_* beside each scenario says what Triton formed. Timing is asserted
only with wide bounds: "at once" means well inside a long queue delay, and a request that
must wait its delay is checked never to come back before it. A step that needs the queue
to hold the previous requests waits for the server's pending-request gauge; the only
sleeps are spans a scenario means to let pass (a gap between two requests, a backlog
outlasting the delay)."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc.aio as grpcaio

from tests.harness import Server, make_models, turnout_up

FRAMEWORKS = ("onnx", "torch")
LONG_DELAY_S = 20.0  # a queue delay that nothing in these tests may wait out
AT_ONCE_S = LONG_DELAY_S / 2  # "at once": well before the long delay would have run out
HELD_DELAY_S = 6.0  # a delay a test does wait out
GAP_S = 2.0  # how long a request waits alone before the next one arrives
CLIENT_TIMEOUT_S = 90.0


@dataclass(frozen=True)
class Scenario:
    name: str
    batching: str  # the model's dynamic_batching section


PREFERRED_AT_HEAD = Scenario(
    "preferred_at_head",
    f"dynamic_batching {{ preferred_batch_size: [ 2, 4 ] max_queue_delay_microseconds: {int(LONG_DELAY_S * 1e6)} }}",
)
BEYOND_LARGEST_PREFERRED = Scenario(
    "beyond_largest_preferred",
    f"dynamic_batching {{ preferred_batch_size: [ 4 ] max_queue_delay_microseconds: {int(HELD_DELAY_S * 1e6)} }}",
)
FILLS_MAX_BATCH_SIZE = Scenario(
    "fills_max_batch_size", f"dynamic_batching {{ max_queue_delay_microseconds: {int(LONG_DELAY_S * 1e6)} }}"
)
SHAPE_CLOSES_BATCH = Scenario(
    "shape_closes_batch",
    f"dynamic_batching {{ preferred_batch_size: [ 2 ] max_queue_delay_microseconds: {int(LONG_DELAY_S * 1e6)} }}",
)
NO_DELAY = Scenario("no_delay", "dynamic_batching { preferred_batch_size: [ 4 ] }")
SCENARIOS = (PREFERRED_AT_HEAD, BEYOND_LARGEST_PREFERRED, FILLS_MAX_BATCH_SIZE, SHAPE_CLOSES_BATCH, NO_DELAY)

SEQUENCE_MODEL = "oldest_backlog"
# Sequences idle for a minute before their slots are taken back: the backlog waits for ENDs.
SEQUENCE_STRATEGY = (
    "max_sequence_idle_microseconds: 60000000 oldest { max_candidate_sequences: 4 preferred_batch_size: [ 4 ] "
    f"max_queue_delay_microseconds: {int(HELD_DELAY_S * 1e6)} }}"
)

# What Triton 2.51 formed for each scenario, as {rows: executions} from its batch_stats, and
# (in the comments) its spans, as the scenarios below measure them.
# Two requests at once, the fourth's pair at once (pair 0.089 s, second pair 0.006 s).
TRITON_PREFERRED_AT_HEAD = {2: 2}
# The first 2.158 s after it was sent, 0.075 s after the second; the second 6.008 s after it was sent.
TRITON_BEYOND_LARGEST_PREFERRED = {3: 2}
# All five answered in 0.039 s.
TRITON_FILLS_MAX_BATCH_SIZE = {8: 1}
# The first in 0.095 s, the pair 0.003 s after the third was sent.
TRITON_SHAPE_CLOSES_BATCH = {1: 1, 2: 1}
# The lone request in 0.029 s, the four shapes in 0.005 s.
TRITON_NO_DELAY = {3: 1, 1: 4}
# Each step (starts, ends, starts, ends) answered within 0.04 s; the backlog waited 7 s.
TRITON_OLDEST_BACKLOG = {4: 4}


# -- the server's side -----------------------------------------------------------------------


def write_models(repo: Path) -> None:
    """Every scenario's model twice, `<name>_onnx` and `<name>_torch`: FP32 identity on a
    [-1] vector (so shapes may differ), max_batch_size 8, one CPU instance; and the oldest
    strategy's stateful models."""
    models = make_models()
    instance = "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
    for scenario in SCENARIOS:
        onnx_dir = models.write_identity(repo, f"{scenario.name}_onnx", "FP32", with_config=False)
        (onnx_dir / "config.pbtxt").write_text(
            f'name: "{scenario.name}_onnx"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
            'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
            'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
            f"{instance}{scenario.batching}\n"
        )
        models.write_torch_identity(repo, f"{scenario.name}_torch", "FP32", extra_config=instance + scenario.batching)
    controls = ("START", "END", "READY")
    models.write_sequence(
        repo, f"{SEQUENCE_MODEL}_onnx", controls, corrid="UINT64", strategy=SEQUENCE_STRATEGY, instances=1
    )
    torch_dir = models.write_torch_sequence(repo, f"{SEQUENCE_MODEL}_torch")
    config = torch_dir / "config.pbtxt"
    text = config.read_text().replace("sequence_batching {\n", f"sequence_batching {{\n  {SEQUENCE_STRATEGY}\n", 1)
    config.write_text(text + instance)


@pytest.fixture(scope="module")
def batching_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = tmp_path_factory.mktemp("repo_batching")
    write_models(repo)
    with turnout_up(repo) as running:
        yield running


# -- the client's side (also run against Triton) ---------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    grpc: str
    metrics: str


class Client:
    """One model behind one endpoint: sends requests as tasks, reads the pending gauge and
    the model's batch statistics."""

    def __init__(self, endpoint: Endpoint, model: str, grpc: grpcaio.InferenceServerClient) -> None:
        self.endpoint = endpoint
        self.model = model
        self.grpc = grpc

    def send(self, rows: int = 1, length: int = 1, value: float = 1.0) -> asyncio.Task[float]:
        """Infer one [rows, length] request; the task gives the monotonic time its answer came."""
        data = np.full((rows, length), value, dtype=np.float32)
        tensor = grpcaio.InferInput("INPUT0", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        return asyncio.create_task(
            self._answered(self.grpc.infer(self.model, [tensor], client_timeout=CLIENT_TIMEOUT_S))
        )

    def send_in_sequence(self, sequence: int, *, start: bool = False, end: bool = False) -> asyncio.Task[float]:
        # Triton's PyTorch backend takes a sequence model's tensors by `<name>__<index>` names only.
        name = "INPUT__0" if self.model.endswith("_torch") else "INPUT"
        tensor = grpcaio.InferInput(name, [1, 1], "INT32")
        tensor.set_data_from_numpy(np.full((1, 1), sequence, dtype=np.int32))
        call = self.grpc.infer(
            self.model,
            [tensor],
            sequence_id=sequence,
            sequence_start=start,
            sequence_end=end,
            client_timeout=CLIENT_TIMEOUT_S,
        )
        return asyncio.create_task(self._answered(call))

    @staticmethod
    async def _answered(call: Awaitable[object]) -> float:
        await call
        return time.monotonic()

    async def pending(self) -> int:
        async with httpx.AsyncClient(timeout=10) as http:
            text = (await http.get(f"http://{self.endpoint.metrics}/metrics")).text
        pattern = rf'^nv_inference_pending_request_count{{[^}}]*model="{re.escape(self.model)}"[^}}]*}} (\S+)$'
        found = re.search(pattern, text, re.MULTILINE)
        return int(float(found.group(1))) if found else 0

    async def until_pending(self, count: int, timeout: float = 30.0) -> None:
        """Wait until the model's queue holds `count` requests."""
        deadline = time.monotonic() + timeout
        while (seen := await self.pending()) != count:
            assert time.monotonic() < deadline, f"{self.model}: {seen} requests pending, never {count}"
            await asyncio.sleep(0.05)

    async def batches(self) -> dict[int, int]:
        """{rows: executions} from the model's batch statistics."""
        stats = (await self.grpc.get_inference_statistics(self.model)).model_stats[0]
        return {b.batch_size: b.compute_infer.count for b in stats.batch_stats if b.compute_infer.count}


@dataclass(frozen=True)
class Observed:
    """What a scenario saw: the batches formed, and named spans in seconds."""

    batches: dict[int, int]
    seconds: dict[str, float]


async def preferred_at_head(client: Client) -> Observed:
    """Three requests under preferred sizes [2, 4] and a long delay: the first two form a
    preferred size and go at once though a third is queued behind them; a fourth makes
    the third a preferred size too."""
    sent = time.monotonic()
    first = [client.send() for _ in range(3)]
    waiting = set(first)
    while len(waiting) > 1:
        _, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
    pair_done = max(task.result() for task in first if task.done())
    await client.until_pending(1)
    (alone,) = waiting
    fourth_sent = time.monotonic()
    finished = await asyncio.gather(alone, client.send())
    return Observed(
        await client.batches(),
        {"pair": pair_done - sent, "second pair after the fourth was sent": max(finished) - fourth_sent},
    )


async def beyond_largest_preferred(client: Client) -> Observed:
    """Preferred size [4], two 3-row requests GAP_S apart: the second would pass 4, so the
    first goes at once when it arrives; the second then waits its own whole delay."""
    first_sent = time.monotonic()
    first = client.send(rows=3)
    await client.until_pending(1)
    await asyncio.sleep(GAP_S)
    second_sent = time.monotonic()
    second = client.send(rows=3)
    first_done = await first
    second_done = await second
    return Observed(
        await client.batches(),
        {
            "first after it was sent": first_done - first_sent,
            "first after the second was sent": first_done - second_sent,
            "second after it was sent": second_done - second_sent,
        },
    )


async def fills_max_batch_size(client: Client) -> Observed:
    """No preferred size (so max_batch_size, 8, is the one) and a long delay: requests of
    1, 1, 2, 2 and 2 rows run as one batch of 8 as soon as the last arrives."""
    sent = time.monotonic()
    done = await asyncio.gather(*(client.send(rows=rows) for rows in (1, 1, 2, 2, 2)))
    return Observed(await client.batches(), {"all": max(done) - sent})


async def shape_closes_batch(client: Client) -> Observed:
    """Preferred size [2] and a long delay: a request of another shape closes the pending
    batch, which goes at once; the next request of that shape makes a preferred size."""
    first_sent = time.monotonic()
    first = client.send(length=1)
    await client.until_pending(1)
    second = client.send(length=2)
    first_done = await first
    await client.until_pending(1)
    third_sent = time.monotonic()
    done = await asyncio.gather(second, client.send(length=2))
    return Observed(
        await client.batches(),
        {"first": first_done - first_sent, "second pair after the third was sent": max(done) - third_sent},
    )


async def no_delay(client: Client) -> Observed:
    """Preferred size [4] without a delay: a lone request of 3 rows, a size no preferred one
    matches, goes at once; then four requests of different shapes sent together go one by
    one, however they arrive (a batch never takes a request of another shape)."""
    sent = time.monotonic()
    alone = await client.send(rows=3) - sent
    sent = time.monotonic()
    done = await asyncio.gather(*(client.send(length=length) for length in (1, 2, 3, 4)))
    return Observed(await client.batches(), {"alone": alone, "shapes": max(done) - sent})


async def oldest_backlog(client: Client) -> Observed:
    """The oldest strategy, 4 candidate sequences, preferred size [4], delay HELD_DELAY_S:
    four STARTs form one batch; two more sequences wait in the backlog longer than the
    delay; the four ENDs form one batch and free the slots; the backlogged STARTs then
    count their delay from getting a slot, not from their arrival, so they wait for two
    new sequences and the four STARTs form one batch, and their ENDs one more."""
    spans: dict[str, float] = {}
    sent = time.monotonic()
    spans["first starts"] = max(await asyncio.gather(*(client.send_in_sequence(s, start=True) for s in (1, 2, 3, 4))))
    spans["first starts"] -= sent
    backlogged = [client.send_in_sequence(s, start=True) for s in (5, 6)]
    await asyncio.sleep(HELD_DELAY_S + 1)  # longer than the delay, in the backlog
    assert not any(task.done() for task in backlogged), "a backlogged sequence ran without a slot"
    sent = time.monotonic()
    spans["first ends"] = max(await asyncio.gather(*(client.send_in_sequence(s, end=True) for s in (1, 2, 3, 4))))
    spans["first ends"] -= sent
    sent = time.monotonic()
    later = [client.send_in_sequence(s, start=True) for s in (7, 8)]
    spans["second starts"] = max(await asyncio.gather(*backlogged, *later)) - sent
    sent = time.monotonic()
    spans["second ends"] = max(await asyncio.gather(*(client.send_in_sequence(s, end=True) for s in (5, 6, 7, 8))))
    spans["second ends"] -= sent
    return Observed(await client.batches(), spans)


async def observe(endpoint: Endpoint, model: str, scenario: Callable[[Client], Awaitable[Observed]]) -> Observed:
    async with grpcaio.InferenceServerClient(endpoint.grpc) as grpc:
        observed = await scenario(Client(endpoint, model, grpc))
    seconds = ", ".join(f"{span} {value:.3f} s" for span, value in observed.seconds.items())
    print(f"{model}: batches {observed.batches}; {seconds}")
    return observed


def endpoint_of(server: Server) -> Endpoint:
    return Endpoint(server.grpc, server.metrics)


# -- the tests ---------------------------------------------------------------------------------


@pytest.mark.parametrize("framework", FRAMEWORKS)
async def test_a_preferred_size_at_the_head_of_the_queue_runs_at_once(batching_server: Server, framework: str) -> None:
    observed = await observe(endpoint_of(batching_server), f"{PREFERRED_AT_HEAD.name}_{framework}", preferred_at_head)
    assert observed.batches == TRITON_PREFERRED_AT_HEAD
    assert observed.seconds["pair"] < AT_ONCE_S
    assert observed.seconds["second pair after the fourth was sent"] < AT_ONCE_S


@pytest.mark.parametrize("framework", FRAMEWORKS)
async def test_a_request_that_would_pass_the_largest_preferred_size_sends_what_fits_and_waits_its_own_delay(
    batching_server: Server, framework: str
) -> None:
    model = f"{BEYOND_LARGEST_PREFERRED.name}_{framework}"
    observed = await observe(endpoint_of(batching_server), model, beyond_largest_preferred)
    assert observed.batches == TRITON_BEYOND_LARGEST_PREFERRED
    # The first waited alone until the second came, then went at once, before its own delay.
    assert observed.seconds["first after it was sent"] >= GAP_S
    assert observed.seconds["first after the second was sent"] < HELD_DELAY_S - GAP_S
    # The second is held for its whole delay, counted from its own arrival.
    assert HELD_DELAY_S <= observed.seconds["second after it was sent"] < HELD_DELAY_S + AT_ONCE_S


@pytest.mark.parametrize("framework", FRAMEWORKS)
async def test_a_batch_that_reaches_max_batch_size_runs_at_once(batching_server: Server, framework: str) -> None:
    observed = await observe(
        endpoint_of(batching_server), f"{FILLS_MAX_BATCH_SIZE.name}_{framework}", fills_max_batch_size
    )
    assert observed.batches == TRITON_FILLS_MAX_BATCH_SIZE
    assert observed.seconds["all"] < AT_ONCE_S


@pytest.mark.parametrize("framework", FRAMEWORKS)
async def test_a_request_of_another_shape_closes_the_pending_batch(batching_server: Server, framework: str) -> None:
    observed = await observe(endpoint_of(batching_server), f"{SHAPE_CLOSES_BATCH.name}_{framework}", shape_closes_batch)
    assert observed.batches == TRITON_SHAPE_CLOSES_BATCH
    assert observed.seconds["first"] < AT_ONCE_S
    assert observed.seconds["second pair after the third was sent"] < AT_ONCE_S


@pytest.mark.parametrize("framework", FRAMEWORKS)
async def test_without_a_delay_requests_go_at_once_and_shapes_stay_apart(
    batching_server: Server, framework: str
) -> None:
    observed = await observe(endpoint_of(batching_server), f"{NO_DELAY.name}_{framework}", no_delay)
    assert observed.batches == TRITON_NO_DELAY
    assert observed.seconds["alone"] < AT_ONCE_S
    assert observed.seconds["shapes"] < AT_ONCE_S


@pytest.mark.parametrize("framework", FRAMEWORKS)
async def test_oldest_counts_a_backlogged_sequences_delay_from_when_it_gets_a_slot(
    batching_server: Server, framework: str
) -> None:
    observed = await observe(endpoint_of(batching_server), f"{SEQUENCE_MODEL}_{framework}", oldest_backlog)
    assert observed.batches == TRITON_OLDEST_BACKLOG
    for span in ("first starts", "first ends", "second starts", "second ends"):
        assert observed.seconds[span] < HELD_DELAY_S, span
