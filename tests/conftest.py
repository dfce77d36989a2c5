"""Shared test configuration: the harness module beside this file starts real servers."""

from __future__ import annotations

import random

import pytest


@pytest.fixture
def rng() -> random.Random:
    """Seeded randomness, injected: a failing run replays with the same values."""
    return random.Random(20240611)
