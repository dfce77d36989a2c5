"""--event-loop: which loop each choice runs, and auto's fallback without uvloop."""

from __future__ import annotations

import asyncio
import builtins
from typing import Any

import pytest

from protos import event_loop


async def _loop_type() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_asyncio_runs_asyncios_own_loop() -> None:
    assert event_loop.loop_factory("asyncio") is None
    assert event_loop.run(_loop_type(), "asyncio").startswith("asyncio")


@pytest.mark.parametrize("choice", ["auto", "uvloop"])
def test_auto_and_uvloop_run_uvloop_where_installed(choice: str) -> None:
    pytest.importorskip("uvloop")
    assert event_loop.run(_loop_type(), choice).startswith("uvloop")


def test_without_uvloop_auto_falls_back_and_uvloop_by_name_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_uvloop(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "uvloop":
            raise ImportError("No module named 'uvloop'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_uvloop)
    assert event_loop.loop_factory("auto") is None
    with pytest.raises(ImportError):
        event_loop.loop_factory("uvloop")
