"""Triton's trace files: for each path, one JSON array that every setting naming the path
appends to, and the indexed files `<path>.0`, `<path>.1`, ... that a setting writes
whole when its log frequency or its trace count says so (Triton's TraceFile).

Writes run in order on the one thread TraceFiles owns; the event loop only hands them
over. The main file is a complete JSON array after every write: its closing bracket is
written each time and overwritten by the next, so the file can be read while the server
runs, and no shutdown step is needed to close it."""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO

logger = logging.getLogger(__name__)


class TraceFile:
    """One trace file path: its main file, opened (truncated) on its first write as in
    Triton, and the next index for its indexed files."""

    def __init__(self, path: str, writer: ThreadPoolExecutor) -> None:
        self.path = path
        self._writer = writer
        self._next_index = 0
        self._handle: BinaryIO | None = None

    def save(self, traces: list[str], indexed: bool) -> None:
        """Queue `traces` (each one trace's JSON objects, comma-joined) for the main file,
        or for the next indexed file as an array of their own."""
        text = ",".join(traces).encode()
        if indexed:
            name = f"{self.path}.{self._next_index}"
            self._next_index += 1
            self._writer.submit(_write_whole, name, text)
        else:
            self._writer.submit(self._append, text)

    def _append(self, text: bytes) -> None:
        try:
            if self._handle is None:
                self._handle = open(self.path, "wb")  # noqa: SIM115 - held open for the file's life
                self._handle.write(b"[" + text + b"]")
            else:
                self._handle.seek(-1, os.SEEK_END)  # over the closing bracket
                self._handle.write(b"," + text + b"]")
            self._handle.flush()
        except OSError as exc:
            logger.error("failed creating trace file: %s", exc)

    def close(self) -> None:
        """On the writer thread, after the last write."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None


def _write_whole(name: str, text: bytes) -> None:
    try:
        with open(name, "wb") as handle:
            handle.write(b"[" + text + b"]")
    except OSError as exc:
        logger.error("failed creating trace file: %s", exc)


class TraceFiles:
    """The trace files by path, and the thread that writes them all."""

    def __init__(self) -> None:
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="turnout-trace")
        self._files: dict[str, TraceFile] = {}

    def get(self, path: str) -> TraceFile:
        file = self._files.get(path)
        if file is None:
            file = self._files[path] = TraceFile(path, self._writer)
        return file

    def close(self) -> None:
        """Finish every queued write and close the files (blocking: call it off the loop)."""
        for file in self._files.values():
            self._writer.submit(file.close)
        self._writer.shutdown(wait=True)
