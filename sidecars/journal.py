"""The journal of a supervised sidecar's explicit loads: which models clients loaded, with
which config override and which uploaded files, kept beside the lane socket so that a
process restarted by `turnout up` loads them again instead of coming back with only its
--load-model set.

Uploaded files (a load's `file:<version>/<name>` contents) are copied under `uploads/`
in the journal's folder, one folder per model named by a digest of its name, and removed
when the model is unloaded; no path in a load request can reach outside that folder.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import json_format

from protos import model_config_pb2 as mc

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Replay:
    """A load to repeat: its override (None: the repository's config) and its uploaded
    files by relative path (None: the repository's folder)."""

    override: mc.ModelConfig | None = None
    files: dict[str, bytes] | None = None


class LoadJournal:
    """Model name -> how it was loaded. Without a path (a sidecar no supervisor restarts)
    it remembers nothing. Safe to call from worker threads: uploads are written off the
    event loop."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._uploads = path.with_name("uploads") if path is not None else None
        # name -> {"config": the override as JSON or None, "files": whether uploads/ holds its files}
        self._entries: dict[str, dict[str, str | bool | None]] = {}
        self._lock = threading.Lock()
        if path is not None and path.exists():
            try:
                self._entries = json.loads(path.read_text())
            except (OSError, ValueError) as exc:
                log.warning("ignoring the load journal %s: %s", path, exc)

    @classmethod
    def beside(cls, lane_path: str) -> LoadJournal:
        # The supervisor keeps the lane socket's folder across restarts; nothing else does.
        return cls(Path(lane_path).with_name("loads.json") if lane_path else None)

    def entries(self) -> dict[str, Replay]:
        """The loads to repeat. One whose files cannot be read comes back without them,
        so its load fails and is forgotten (as the repository's would)."""
        replays = {}
        for name, entry in self._entries.items():
            text = entry.get("config")
            override = json_format.Parse(text, mc.ModelConfig()) if isinstance(text, str) else None
            files = self._read_files(name) if entry.get("files") else None
            replays[name] = Replay(override, files)
        return replays

    def loaded(self, name: str, override: mc.ModelConfig | None, files: Mapping[str, bytes] | None = None) -> None:
        """Remember a load that succeeded; blocking (it may write the uploaded files)."""
        if self.path is None:
            return
        with self._lock:
            if files:
                try:
                    self._write_files(name, files)  # before the entry that names them
                except (OSError, ValueError) as exc:
                    # The model serves; only a restart will not bring it back.
                    log.warning("'%s' will not load again after a restart: could not keep its files: %s", name, exc)
                    self._remove_files(name)
                    if self._entries.pop(name, None) is not None:
                        self._save()
                    return
            elif self._entries.get(name, {}).get("files"):
                self._remove_files(name)
            config = None if override is None else json_format.MessageToJson(override)
            self._entries[name] = {"config": config, "files": bool(files)}
            self._save()

    def unloaded(self, name: str) -> None:
        if self.path is None:
            return
        with self._lock:
            entry = self._entries.pop(name, None)
            if entry is None:
                return
            self._save()
            if entry.get("files"):
                self._remove_files(name)  # after the entry that named them is gone

    def _folder(self, name: str) -> Path:
        assert self._uploads is not None
        # A digest, not the name: any model name makes one safe, fixed-length folder name.
        return self._uploads / hashlib.sha256(name.encode()).hexdigest()

    def _write_files(self, name: str, files: Mapping[str, bytes]) -> None:
        folder = self._folder(name)
        partial = folder.with_suffix(".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True, mode=0o700)
        root = partial.resolve()
        for relative, content in files.items():
            target = (root / relative).resolve()
            if not target.is_relative_to(root) or target == root:
                raise ValueError(f"uploaded file path '{relative}' leaves the model folder")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
        # Swap the whole folder in: a sidecar killed mid-write leaves the old files or none.
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(partial, folder)

    def _read_files(self, name: str) -> dict[str, bytes]:
        folder = self._folder(name)
        try:
            return {str(path.relative_to(folder)): path.read_bytes() for path in folder.rglob("*") if path.is_file()}
        except OSError as exc:
            log.warning("could not read the uploaded files of '%s' again: %s", name, exc)
            return {}

    def _remove_files(self, name: str) -> None:
        folder = self._folder(name)
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(folder.with_suffix(".partial"), ignore_errors=True)

    def _save(self) -> None:
        assert self.path is not None
        # Write then rename: a sidecar killed mid-write must not leave half a journal.
        partial = self.path.with_suffix(".partial")
        partial.write_text(json.dumps(self._entries))
        os.replace(partial, self.path)
