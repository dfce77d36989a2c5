"""Sequence batching (stateful models) through `turnout up`: the direct and oldest
strategies, the control tensors the model sees, implicit state, string and integer
correlation ids, the idle timeout, the backlog, every error Triton words, and the
batches oldest forms across concurrent sequences."""

from __future__ import annotations

import asyncio
import json
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.harness import Server, make_models, turnout_up

IDLE_SECS = 0.3
OLDEST = "oldest { max_candidate_sequences: 16 max_queue_delay_microseconds: 50000 }"


@pytest.fixture(scope="module")
def sequence_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = tmp_path_factory.mktemp("repo_sequence")
    models = make_models()
    models.write_sequence_examples(repo)
    controls = ("START", "END", "READY")
    models.write_sequence(repo, "echo_fp32", controls, "FP32", corrid="UINT64", echo_controls=True, instances=1)
    models.write_sequence(
        repo, "echo_bool", controls, "BOOL", corrid="BYTES", max_batch_size=0, echo_controls=True, instances=1
    )
    models.write_sequence(repo, "sum_oldest", ("READY",), state=True, strategy=OLDEST, instances=1)
    models.write_sequence(
        repo, "short_idle", state=True, strategy=f"max_sequence_idle_microseconds: {int(IDLE_SECS * 1e6)}"
    )
    models.write_sequence(repo, "one_slot", ("START", "READY"), state=True, max_batch_size=1, instances=1)
    with turnout_up(repo) as running:
        yield running


def _grpc_input(value: int, batch: int = 1, module: Any = grpcclient, name: str = "INPUT") -> list[Any]:
    data = np.full([batch, 1], value, dtype=np.int32)
    tensor = module.InferInput(name, list(data.shape), "INT32")
    tensor.set_data_from_numpy(data)
    return [tensor]


def _output(result: Any, name: str = "OUTPUT") -> Any:
    return result.as_numpy(name).reshape(-1)[0]


def _error(call: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value


def test_direct_sequences_interleave_with_their_start_flags(sequence_server: Server) -> None:
    values = [0, 11, 7, 5]
    with grpcclient.InferenceServerClient(sequence_server.grpc) as client:
        answers: dict[int, list[int]] = {1000: [], 1001: []}
        for step, value in enumerate(values):
            for sequence_id, offset in ((1000, 0), (1001, 100)):
                result = client.infer(
                    "simple_sequence",
                    _grpc_input(value + offset),
                    sequence_id=sequence_id,
                    sequence_start=step == 0,
                    sequence_end=step == len(values) - 1,
                )
                answers[sequence_id].append(int(_output(result)))
    assert answers[1000] == [1, 11, 7, 5]  # START adds one
    assert answers[1001] == [101, 111, 107, 105]


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_control_tensors_fp32_and_uint64_corrid(sequence_server: Server, protocol: str) -> None:
    module: Any = grpcclient if protocol == "grpc" else httpclient
    url = sequence_server.grpc if protocol == "grpc" else sequence_server.http
    sequence_id = 2**40 + 3  # beyond 32 bits, to prove the id is not truncated
    with module.InferenceServerClient(url) as client:
        seen = []
        for start, end in ((True, False), (False, False), (False, True)):
            result = client.infer(
                "echo_fp32",
                _grpc_input(5, module=module),
                sequence_id=sequence_id,
                sequence_start=start,
                sequence_end=end,
            )
            seen.append([float(_output(result, f"{c}_OUT")) for c in ("START", "END", "READY")])
            assert result.as_numpy("START_OUT").dtype == np.float32
            assert int(_output(result, "CORRID_OUT")) == sequence_id
    assert seen == [[1.0, 0.0, 1.0], [0.0, 0.0, 1.0], [0.0, 1.0, 1.0]]


def test_control_tensors_bool_and_string_corrid_without_batching(sequence_server: Server) -> None:
    with grpcclient.InferenceServerClient(sequence_server.grpc) as client:
        data = np.array([4], dtype=np.int32)
        tensor = grpcclient.InferInput("INPUT", [1], "INT32")
        tensor.set_data_from_numpy(data)
        first = client.infer("echo_bool", [tensor], sequence_id="42", sequence_start=True, sequence_end=True)
    assert first.as_numpy("START_OUT").tolist() == [True]
    assert first.as_numpy("END_OUT").tolist() == [True]
    assert first.as_numpy("READY_OUT").tolist() == [True]
    assert first.as_numpy("CORRID_OUT").tolist() == [b"42"]
    assert first.as_numpy("OUTPUT").tolist() == [4 + 1 + 42]


async def test_implicit_state_with_string_ids_over_an_aio_stream(sequence_server: Server) -> None:
    """The running sum lives in the sidecar; the client sends one value at a time, and
    END adds the (numeric) string id."""
    sequences = {"2001": [20, -11, -7, 1], "2002": [5, 5, 5, 5]}

    async def requests() -> Any:
        for step in range(4):
            for sequence_id, values in sequences.items():
                yield {
                    "model_name": "simple_string_dyna_sequence",
                    "inputs": _grpc_input(values[step], module=grpcaio),
                    "request_id": f"{sequence_id}_{step}",
                    "sequence_id": sequence_id,
                    "sequence_start": step == 0,
                    "sequence_end": step == 3,
                }

    got: dict[str, int] = {}
    async with grpcaio.InferenceServerClient(sequence_server.grpc) as client:
        async for result, error in client.stream_infer(requests()):
            assert error is None, error
            got[result.get_response().id] = int(_output(result))
    assert [got[f"2001_{s}"] for s in range(4)] == [20, 9, 2, 3 + 2001]
    assert [got[f"2002_{s}"] for s in range(4)] == [5, 10, 15, 20 + 2002]


def test_http_string_id_keeps_state(sequence_server: Server) -> None:
    with httpclient.InferenceServerClient(sequence_server.http) as client:
        sums = [
            int(
                _output(
                    client.infer(
                        "sum_oldest",
                        _grpc_input(v, module=httpclient),
                        sequence_id="s-1",
                        sequence_start=i == 0,
                        sequence_end=i == 2,
                    )
                )
            )
            for i, v in enumerate((3, 4, 5))
        ]
    assert sums == [3, 7, 12]


def test_idle_sequence_is_released(sequence_server: Server) -> None:
    with grpcclient.InferenceServerClient(sequence_server.grpc) as client:
        assert _output(client.infer("short_idle", _grpc_input(2), sequence_id=7, sequence_start=True)) == 3
        assert _output(client.infer("short_idle", _grpc_input(2), sequence_id=7)) == 4  # state: 2 + 2, no START
        time.sleep(IDLE_SECS * 3)  # the behaviour under test is the passing of time
        error = _error(lambda: client.infer("short_idle", _grpc_input(2), sequence_id=7))
        assert error.status() == "StatusCode.INVALID_ARGUMENT"
        assert error.message() == (
            "inference request for sequence 7 to model 'short_idle' must specify the START flag on the first "
            "request of the sequence"
        )
        # The slot is free again: a new START begins from the initial state.
        assert _output(client.infer("short_idle", _grpc_input(2), sequence_id=7, sequence_start=True)) == 3


def test_backlogged_sequence_waits_for_a_free_slot(sequence_server: Server) -> None:
    """one_slot has a single slot: a second sequence starts only when the first ends."""
    answers: queue.Queue[Any] = queue.Queue()
    with grpcclient.InferenceServerClient(sequence_server.grpc) as client:
        assert _output(client.infer("one_slot", _grpc_input(10), sequence_id=1, sequence_start=True)) == 11

        def second() -> None:
            with grpcclient.InferenceServerClient(sequence_server.grpc) as other:
                answers.put(other.infer("one_slot", _grpc_input(100), sequence_id=2, sequence_start=True))

        waiter = threading.Thread(target=second)
        waiter.start()
        with pytest.raises(queue.Empty):
            answers.get(timeout=0.5)  # backlogged behind sequence 1
        assert _output(client.infer("one_slot", _grpc_input(5), sequence_id=1, sequence_end=True)) == 15
        waiter.join(timeout=30)
        assert _output(answers.get(timeout=1)) == 101  # a fresh state: 100 + START
        last = client.infer("one_slot", _grpc_input(1), sequence_id=2, sequence_end=True)
        assert _output(last) == 101


def test_backlogged_sequence_times_out(sequence_server: Server) -> None:
    """A request's `timeout` bounds its sequence's wait for a slot, as Triton's reaper does."""
    with grpcclient.InferenceServerClient(sequence_server.grpc) as client:
        assert _output(client.infer("one_slot", _grpc_input(1), sequence_id=3, sequence_start=True)) == 2
        error = _error(
            lambda: client.infer("one_slot", _grpc_input(1), sequence_id=4, sequence_start=True, timeout=200_000)
        )
        assert (error.status(), error.message()) == (
            "StatusCode.UNAVAILABLE",
            "timeout of the corresponding sequence has been expired",
        )
        error = _error(lambda: client.infer("one_slot", _grpc_input(1), sequence_id=4))
        assert "must specify the START flag on the first request of the sequence" in error.message()
        assert _output(client.infer("one_slot", _grpc_input(1), sequence_id=3, sequence_end=True)) == 2


def test_cancelled_backlogged_sequence_gives_its_slot_up(sequence_server: Server) -> None:
    """A client deadline cancels a backlogged START in the sidecar; when the slot frees,
    that sequence is skipped, not given the slot."""
    with grpcclient.InferenceServerClient(sequence_server.grpc) as client:
        assert _output(client.infer("one_slot", _grpc_input(1), sequence_id=5, sequence_start=True)) == 2
        error = _error(
            lambda: client.infer("one_slot", _grpc_input(1), sequence_id=6, sequence_start=True, client_timeout=0.3)
        )
        assert error.status() == "StatusCode.DEADLINE_EXCEEDED"
        assert _output(client.infer("one_slot", _grpc_input(1), sequence_id=5, sequence_end=True)) == 2
        started = time.monotonic()
        assert _output(client.infer("one_slot", _grpc_input(3), sequence_id=7, sequence_start=True)) == 4
        assert time.monotonic() - started < 0.9  # at once: not after sequence 6 idled out (1 s)
        error = _error(lambda: client.infer("one_slot", _grpc_input(1), sequence_id=6))
        assert "must specify the START flag on the first request of the sequence" in error.message()
        assert _output(client.infer("one_slot", _grpc_input(1), sequence_id=7, sequence_end=True)) == 4


async def test_oldest_batches_concurrent_sequences(sequence_server: Server) -> None:
    count, steps = 8, 5
    async with grpcaio.InferenceServerClient(sequence_server.grpc) as client:
        before = (await client.get_inference_statistics("sum_oldest", as_json=True))["model_stats"][0]

        async def run(sequence_id: int) -> list[int]:
            sums = []
            for step in range(steps):
                result = await client.infer(
                    "sum_oldest",
                    _grpc_input(sequence_id, module=grpcaio),
                    sequence_id=sequence_id,
                    sequence_start=step == 0,
                    sequence_end=step == steps - 1,
                )
                sums.append(int(_output(result)))
            return sums

        results = await asyncio.gather(*(run(sequence_id) for sequence_id in range(1, count + 1)))
        after = (await client.get_inference_statistics("sum_oldest", as_json=True))["model_stats"][0]
    for sequence_id, sums in zip(range(1, count + 1), results, strict=True):
        assert sums == [sequence_id * (step + 1) for step in range(steps)]
    inferences = int(after.get("inference_count", 0)) - int(before.get("inference_count", 0))
    executions = int(after.get("execution_count", 0)) - int(before.get("execution_count", 0))
    assert inferences == count * steps
    assert executions < inferences / 2, (executions, inferences)
    stats = after["inference_stats"]
    assert int(stats["queue"]["count"]) >= count * steps and int(stats["compute_infer"]["ns"]) > 0


def test_sequence_errors_in_tritons_words(sequence_server: Server) -> None:
    with grpcclient.InferenceServerClient(sequence_server.grpc) as client:
        cases = [
            (
                lambda: client.infer("simple_sequence", _grpc_input(1), sequence_id=99),
                "INVALID_ARGUMENT",
                "inference request for sequence 99 to model 'simple_sequence' must specify the START flag on the "
                "first request of the sequence",
            ),
            (
                lambda: client.infer("simple_sequence", _grpc_input(1), sequence_id="unknown-id"),
                "INVALID_ARGUMENT",
                "inference request for sequence unknown-id to model 'simple_sequence' must specify the START flag "
                "on the first request of the sequence",
            ),
            (
                lambda: client.infer("simple_sequence", _grpc_input(1)),
                "INVALID_ARGUMENT",
                "inference request to model 'simple_sequence' must specify a non-zero or non-empty correlation ID",
            ),
            (
                lambda: client.infer("simple_sequence", _grpc_input(1, batch=2), sequence_id=5, sequence_start=True),
                "INVALID_ARGUMENT",
                "inference request to model 'simple_sequence' must specify batch-size 1 due to requirements of "
                "sequence batcher",
            ),
            (
                lambda: client.infer("simple_dyna_sequence", _grpc_input(1), sequence_id="7", sequence_start=True),
                "INVALID_ARGUMENT",
                "[request id: <id_unknown>] sequence batching control 'CORRID' data-type is 'BYTES', but model "
                "'simple_dyna_sequence' expects 'UINT64'",
            ),
            (
                lambda: client.infer(
                    "simple_string_dyna_sequence", _grpc_input(1), sequence_id=7, sequence_start=True, request_id="r1"
                ),
                "INVALID_ARGUMENT",
                "[request id: r1] sequence batching control 'CORRID' data-type is 'UINT64', but model "
                "'simple_string_dyna_sequence' expects 'BYTES'",
            ),
            (
                lambda: client.infer("simple_sequence", _grpc_input(1), sequence_id="x" * 129, sequence_start=True),
                "UNIMPLEMENTED",
                "string correlation ID cannot be longer than 128 characters",
            ),
        ]
        for call, status, message in cases:
            error = _error(call)
            assert (error.status(), error.message()) == (f"StatusCode.{status}", message)
    with httpclient.InferenceServerClient(sequence_server.http) as client:
        error = _error(lambda: client.infer("simple_sequence", _grpc_input(1, module=httpclient), sequence_id=98))
        assert error.status() == "400"
        assert "must specify the START flag on the first request of the sequence" in error.message()


def test_config_and_metadata_report_sequence_batching(sequence_server: Server) -> None:
    with grpcclient.InferenceServerClient(sequence_server.grpc) as client:
        config = client.get_model_config("simple_dyna_sequence", as_json=True)["config"]
        assert "sequence" in client.get_server_metadata().extensions
    batching = config["sequence_batching"]
    assert batching["max_sequence_idle_microseconds"] == "10000000"
    assert batching["oldest"]["preferred_batch_size"] == [8]
    with httpclient.InferenceServerClient(sequence_server.http) as client:
        config = client.get_model_config("simple_sequence")
    assert config["sequence_batching"]["max_sequence_idle_microseconds"] == 1_000_000  # Triton's default
    assert [c["name"] for c in config["sequence_batching"]["control_input"]] == ["START", "READY"]


_BASE_CONFIG = {
    "name": "bad_sequence",
    "platform": "onnxruntime_onnx",
    "max_batch_size": 8,
    "input": [{"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [16]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [16]}],
}
_INVALID = [
    (
        {"control_input": [{"name": "START", "control": [{"kind": "CONTROL_SEQUENCE_START"}]}]},
        "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or 'bool_false_true' for "
        "CONTROL_SEQUENCE_START for bad_sequence",
    ),
    (
        {"control_input": [{"name": "S", "control": [{"kind": "CONTROL_SEQUENCE_END", "int32_false_true": [0]}]}]},
        "sequence batching control 'int32_false_true' must have exactly 2 entries for CONTROL_SEQUENCE_END for "
        "bad_sequence",
    ),
    (
        {
            "control_input": [
                {"name": "S", "control": [{"kind": "CONTROL_SEQUENCE_READY", "bool_false_true": [False, True]}]},
                {"name": "S", "control": [{"kind": "CONTROL_SEQUENCE_START", "bool_false_true": [False, True]}]},
            ]
        },
        "sequence batching control tensor 'S' is specified for multiple control kinds for bad_sequence",
    ),
    (
        {"control_input": [{"name": "C", "control": [{"kind": "CONTROL_SEQUENCE_CORRID", "data_type": "TYPE_FP32"}]}]},
        "unexpected data type for control CONTROL_SEQUENCE_CORRID for bad_sequence. Allowed data types are "
        "TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING",
    ),
    (
        {"oldest": {"preferred_batch_size": [16]}},
        "sequence batching preferred batch size must be <= max batch size for bad_sequence",
    ),
    (
        {
            "state": [
                {
                    "input_name": "S",
                    "output_name": "T",
                    "data_type": "TYPE_INT32",
                    "dims": [1],
                    "initial_state": [{"data_type": "TYPE_FP32", "dims": [1], "zero_data": True, "name": "z"}],
                }
            ]
        },
        "The data type used for 'initial_state' field of state 'S' does not match the state data type.",
    ),
    (
        {
            "control_input": [
                {"name": "NOPE", "control": [{"kind": "CONTROL_SEQUENCE_READY", "int32_false_true": [0, 1]}]}
            ]
        },
        "configuration specified sequence control 'NOPE', but model does not provide that input",
    ),
]


def test_invalid_sequence_configs_fail_to_load(tmp_path_factory: pytest.TempPathFactory) -> None:
    repo = tmp_path_factory.mktemp("repo_bad_sequence")
    make_models().write_simple(repo, name="bad_sequence")
    with (
        turnout_up(repo, "--model-control-mode=explicit") as server,
        httpclient.InferenceServerClient(server.http) as client,
    ):
        for sequence_batching, message in _INVALID:
            config = json.dumps({**_BASE_CONFIG, "sequence_batching": sequence_batching})
            error = _error(lambda config=config: client.load_model("bad_sequence", config=config))
            assert message in error.message(), error.message()


def test_pytorch_model_keeps_implicit_state(tmp_path_factory: pytest.TempPathFactory) -> None:
    pytest.importorskip("torch", reason="the PyTorch sidecar needs torch")
    repo = tmp_path_factory.mktemp("repo_torch_sequence")
    make_models().write_torch_sequence(repo)
    with turnout_up(repo) as server, grpcclient.InferenceServerClient(server.grpc) as client:
        sums = {}
        for step, value in enumerate((5, 6, 7)):
            for sequence_id in (1, 2):
                result = client.infer(
                    "running_sum_torch",
                    _grpc_input(value * sequence_id, name="INPUT__0"),
                    sequence_id=sequence_id,
                    sequence_start=step == 0,
                    sequence_end=step == 2,
                )
                sums.setdefault(sequence_id, []).append(int(_output(result, "OUTPUT__0")))
    assert sums == {1: [6, 11, 18], 2: [11, 22, 36]}  # START adds one to the first answer only
