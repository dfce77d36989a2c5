"""turnout.scan: which sidecar loads which --load-model name, and which are steps only."""

from __future__ import annotations

from turnout.scan import FoundModel, startup_loads, startup_steps

ENSEMBLE = """
name: "pipeline"
platform: "ensemble"
ensemble_scheduling {
  step [ { model_name: "tokens" model_version: -1 }, { model_name: "scores" model_version: -1 } ]
}
"""
MODELS = {
    "pipeline": FoundModel("ensemble", ENSEMBLE),
    "tokens": FoundModel("python", ""),
    "scores": FoundModel("onnxruntime", ""),
    "other": FoundModel("onnxruntime", ""),
}
FRAMEWORKS = ["ensemble", "onnxruntime", "python"]


def test_an_ensemble_named_at_start_brings_its_steps_to_their_own_sidecars() -> None:
    loads = startup_loads(MODELS, ["pipeline", "other"], FRAMEWORKS)
    assert loads == {"ensemble": ["pipeline"], "onnxruntime": ["other", "scores"], "python": ["tokens"]}
    assert startup_loads(MODELS, ["*"], FRAMEWORKS) == {framework: ["*"] for framework in FRAMEWORKS}


def test_a_name_found_nowhere_goes_to_every_sidecar() -> None:
    assert startup_loads(MODELS, ["ghost"], FRAMEWORKS) == {framework: ["ghost"] for framework in FRAMEWORKS}


def test_the_steps_loaded_only_for_an_ensemble_are_its_dependents() -> None:
    assert startup_steps(MODELS, ["pipeline"]) == ["tokens", "scores"]
    assert startup_steps(MODELS, ["pipeline", "scores"]) == ["tokens"]  # named itself: the client's
    assert startup_steps(MODELS, ["*"]) == []
    assert startup_steps(MODELS, ["other"]) == []
