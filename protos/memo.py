"""A bounded memo for what a request of a form seen before lets a process skip: the
gateway's remembered HTTP headers and answers, the sidecar's remembered request forms
and output metadata. Clients send one form again and again, so a memo that fills up is
forgotten whole and learned again, never grown past its bound."""

from __future__ import annotations

from typing import TypeVar

_K = TypeVar("_K")
_V = TypeVar("_V")


class Memo(dict[_K, _V]):
    """A dictionary of at most `limit` entries: remembering one more forgets them all."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def remember(self, key: _K, value: _V) -> _V:
        if len(self) >= self.limit:
            self.clear()
        self[key] = value
        return value
