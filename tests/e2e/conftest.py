"""Servers the end-to-end tests share: one `turnout up` per configuration.

Tests that only read state share a session server; tests that load, unload or
register things get servers of their own so they cannot disturb the others.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.harness import Server, turnout_up, write_repository

DEFAULT_MODELS = (
    "simple",
    "simple_string",
    "simple_identity",
    "linear",
    "identity_fp32",
    "identity_fp16",
    "simple_stats",
    "simple_batched",
    "simple_queue",
    "simple_timeout",
)


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The default configuration: model control `none`, client shared memory off."""
    repo = write_repository(tmp_path_factory.mktemp("repo_default"), DEFAULT_MODELS)
    with turnout_up(repo) as running:
        yield running


@pytest.fixture(scope="session")
def shm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = write_repository(tmp_path_factory.mktemp("repo_shm"), ("simple", "simple_string"))
    with turnout_up(repo, "--allow-client-shm=true") as running:
        yield running


@pytest.fixture(scope="module")
def explicit_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Explicit model control with only `simple` loaded at start."""
    repo = write_repository(
        tmp_path_factory.mktemp("repo_explicit"), ("simple", "simple_string", "identity_fp32", "linear")
    )
    with turnout_up(repo, "--model-control-mode=explicit", "--load-model=simple") as running:
        yield running
