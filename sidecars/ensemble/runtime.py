"""The ensemble sidecar's runtime: it validates and serves ensemble configs (metadata,
config, index, load and unload) but executes nothing; the gateway runs an ensemble's
steps on the sidecars that own their models."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from protos import model_config_pb2 as mc
from protos.status import unsupported
from sidecars.ensemble.validation import validate_ensemble
from sidecars.runtime import ModelInstance, Tensors


class GatewayExecuted:
    """Stands in for an instance, so a request sent here directly gets an answer."""

    def __init__(self, model: str) -> None:
        self._model = model

    async def execute(self, inputs: Tensors) -> dict[str, np.ndarray]:
        raise unsupported(f"ensemble '{self._model}' is executed by the turnout gateway, not by a sidecar")

    def close(self) -> None:
        pass


class EnsembleRuntime:
    """Loads ensembles as their validated configs."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self._options = dict(options)

    def gpu_count(self) -> int:
        return 0

    def auto_complete(self, config: mc.ModelConfig, version_dir: Path, default_max_batch_size: int) -> None:
        """Triton completes nothing for an ensemble: it must name its inputs and outputs."""

    def load(self, config: mc.ModelConfig, version_dir: Path, first: Sequence[int] = ()) -> list[ModelInstance]:
        validate_ensemble(config)
        return [GatewayExecuted(config.name)]
