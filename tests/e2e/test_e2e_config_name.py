"""--model-config-name, as Triton: a model whose folder holds configs/<name>.pbtxt is
configured by it instead of its config.pbtxt; a model without one keeps config.pbtxt.
`turnout up` reads the same file to pick the model's framework."""

from __future__ import annotations

from pathlib import Path

import tritonclient.http as httpclient

from tests.e2e.simple_requests import check_simple, http_inputs, simple_arrays
from tests.harness import make_models, turnout_up, write_repository


def custom_config_repository(root: Path) -> Path:
    """`simple` with configs/small.pbtxt (max_batch_size 2), `simple_string` without one, and
    `custom_only`, whose config.pbtxt names a backend turnout lacks and whose small.pbtxt is ONNX."""
    repo = write_repository(root, ("simple", "simple_string"))
    config = (repo / "simple" / "config.pbtxt").read_text()
    assert "max_batch_size: 8" in config
    (repo / "simple" / "configs").mkdir()
    (repo / "simple" / "configs" / "small.pbtxt").write_text(config.replace("max_batch_size: 8", "max_batch_size: 2"))
    # A folder whose config.pbtxt names no framework: only its custom config says it is ONNX.
    make_models().write_identity(repo, name="custom_only", datatype="FP32")
    own = (repo / "custom_only" / "config.pbtxt").read_text()
    (repo / "custom_only" / "configs").mkdir()
    (repo / "custom_only" / "configs" / "small.pbtxt").write_text(own)
    (repo / "custom_only" / "config.pbtxt").write_text(
        own.replace('platform: "onnxruntime_onnx"', 'backend: "no_such"')
    )
    return repo


def test_a_custom_config_replaces_config_pbtxt_where_a_model_has_one(tmp_path: Path) -> None:
    repo = custom_config_repository(tmp_path / "repo")
    with (
        turnout_up(repo, "--model-config-name=small") as server,
        httpclient.InferenceServerClient(server.http) as client,
    ):
        assert client.get_model_config("simple")["max_batch_size"] == 2
        assert client.get_model_config("simple_string")["max_batch_size"] == 8  # no configs/small.pbtxt
        assert client.is_model_ready("custom_only")
        a, b = simple_arrays(batch=2, seed=4)
        check_simple(client.infer("simple", http_inputs(a, b)), a, b)


def test_without_the_flag_config_pbtxt_configures(tmp_path: Path) -> None:
    repo = custom_config_repository(tmp_path / "repo")
    with turnout_up(repo, "--exit-on-error=false") as server, httpclient.InferenceServerClient(server.http) as client:
        assert client.get_model_config("simple")["max_batch_size"] == 8
        assert not client.is_model_ready("custom_only")
