"""Shared test configuration: the harness module beside this file starts real servers."""

from __future__ import annotations

import random

import pytest

from tests.pki import Pki


@pytest.fixture
def rng() -> random.Random:
    """Seeded randomness, injected: a failing run replays with the same values."""
    return random.Random(20240611)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A throwaway CA with a server and a client certificate, per test module."""
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def other_pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A second CA, which signed none of `pki`'s certificates."""
    return Pki(tmp_path_factory.mktemp("other_pki"))
