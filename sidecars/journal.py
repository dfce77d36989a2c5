"""The journal of a supervised sidecar's explicit loads: which models clients loaded (and
with which config override), kept in a file beside the lane socket so that a process
restarted by `turnout up` loads them again instead of coming back with only its
--load-model set."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from google.protobuf import json_format

from protos import model_config_pb2 as mc

log = logging.getLogger(__name__)


class LoadJournal:
    """Model name -> the override it was loaded with (None: the repository's config).
    Without a path (a sidecar no supervisor restarts) it remembers nothing."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._entries: dict[str, str | None] = {}
        if path is not None and path.exists():
            try:
                self._entries = json.loads(path.read_text())
            except (OSError, ValueError) as exc:
                log.warning("ignoring the load journal %s: %s", path, exc)

    @classmethod
    def beside(cls, lane_path: str) -> LoadJournal:
        # The supervisor keeps the lane socket's folder across restarts; nothing else does.
        return cls(Path(lane_path).with_name("loads.json") if lane_path else None)

    def entries(self) -> dict[str, mc.ModelConfig | None]:
        return {
            name: None if text is None else json_format.Parse(text, mc.ModelConfig())
            for name, text in self._entries.items()
        }

    def loaded(self, name: str, override: mc.ModelConfig | None) -> None:
        self._entries[name] = None if override is None else json_format.MessageToJson(override)
        self._save()

    def unloaded(self, name: str) -> None:
        if self._entries.pop(name, "absent") != "absent":
            self._save()

    def _save(self) -> None:
        if self.path is None:
            return
        # Write then rename: a sidecar killed mid-write must not leave half a journal.
        partial = self.path.with_suffix(".partial")
        partial.write_text(json.dumps(self._entries))
        os.replace(partial, self.path)
