"""Graceful drain of `turnout up`: on SIGTERM, requests already accepted (queued in a
sidecar) finish and are answered, new ones are refused with UNAVAILABLE, and the
process exits 0 within --exit-timeout-secs."""

from __future__ import annotations

import asyncio
import signal
import time

import grpc
import pytest
import tritonclient.grpc.aio as grpcaio
from tritonclient.utils import InferenceServerException

from tests.e2e.simple_requests import check_simple, grpc_inputs, simple_arrays
from tests.harness import turnout_up, write_repository


def test_sigterm_finishes_accepted_requests_and_refuses_new_ones(tmp_path_factory: pytest.TempPathFactory) -> None:
    repo = write_repository(tmp_path_factory.mktemp("repo_drain"), ("simple_held",))
    a, b = simple_arrays()
    with turnout_up(repo) as server:

        async def scenario() -> tuple[list[object], list[object]]:
            async with grpcaio.InferenceServerClient(server.grpc) as client:
                accepted = [
                    asyncio.ensure_future(client.infer("simple_held", grpc_inputs(a, b, module=grpcaio)))
                    for _ in range(4)
                ]
                await asyncio.sleep(0.4)  # queued in the sidecar, held 1.5 s
                started = time.monotonic()
                server.process.send_signal(signal.SIGTERM)
                await asyncio.sleep(0.3)
                late: list[object] = []
                for _ in range(3):
                    try:
                        late.append(await client.infer("simple_held", grpc_inputs(a, b, module=grpcaio)))
                    except InferenceServerException as exc:
                        late.append(exc)
                answers = list(await asyncio.gather(*accepted, return_exceptions=True))
                assert time.monotonic() - started < 5.0
                return answers, late

        answers, late = asyncio.run(scenario())
        for answer in answers:
            assert not isinstance(answer, BaseException), answer
            check_simple(answer, a, b)
        for refusal in late:
            assert isinstance(refusal, InferenceServerException)
            assert refusal.status() == str(grpc.StatusCode.UNAVAILABLE)
        assert server.process.wait(timeout=10) == 0
