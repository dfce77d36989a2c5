"""A monotonic clock (seconds) that moves only when a test moves it: the `clock` seam of
the registry, the dispatcher and the sequence pins."""

from __future__ import annotations


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
