"""schemathesis against docs/openapi.yaml, the published description of the HTTP API:
for each operation a bounded number of generated requests (TURNOUT_FUZZ_EXAMPLES
raises it), each answered with a status the description allows and a clear error,
and the server alive at the end."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings

from tests.harness import ROOT, Server, turnout_up, write_repository

schemathesis = pytest.importorskip("schemathesis", reason="schemathesis is not installed (test extra)")

EXAMPLES = max(1, int(os.environ.get("TURNOUT_FUZZ_EXAMPLES", "30")) // 6)
SCHEMA = schemathesis.openapi.from_path(ROOT / "docs" / "openapi.yaml")
OPERATIONS = [result.ok() for result in SCHEMA.get_all_operations()]


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = write_repository(tmp_path_factory.mktemp("repo_openapi"), ("simple",))
    with turnout_up(repo, "--allow-client-shm=true", "--model-control-mode=explicit", "--load-model=simple") as server:
        yield server


def test_every_route_is_described() -> None:
    paths = {operation.path for operation in OPERATIONS}
    assert {"/v2/models/{model}/infer", "/v2/repository/models/{model}/load", "/v2/logging"} <= paths


@pytest.mark.parametrize("operation", OPERATIONS, ids=lambda op: op.label)
def test_schemathesis(target: Server, operation: object) -> None:
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy())  # type: ignore[attr-defined]
    def run(case: object) -> None:
        response = case.call(base_url=f"http://{target.http}", timeout=30)  # type: ignore[attr-defined]
        assert response.status_code in {200, 400, 403, 404, 405, 409, 500, 501, 503}, response.text
        if response.status_code >= 400 and response.headers.get("content-type") == "application/json":
            error = response.json()["error"]
            assert isinstance(error, str) and error and not error.startswith("internal error:"), error

    run()
    assert target.alive()
