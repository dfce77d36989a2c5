"""Where routing policies come from (`gateway.routing.policy_sources`), in process: the
`PolicyStore` lookups, Consul KV listings applied over the file's policies (override,
fall back on delete, reject an invalid value and keep the last good one), and
`read_routing_file` on YAML files written to tmp_path."""

from __future__ import annotations

import base64
import json
import logging
from pathlib import Path

import pytest

from gateway.routing.policy_sources import PolicyStore, read_routing_file
from gateway.routing.versions import ModelPolicy, PolicyError, Shadow, parse_policy

PREFIX = "turnout/routing/"
LOGGER = "gateway.routing.policy_sources"

FILE_SIMPLE = parse_policy("simple", {"weights": {"1": 90, "2": 10}})
FILE_OTHER = parse_policy("other", {"weights": {"3": 1}})


def entry(model: str, value: object) -> dict[str, object]:
    """One key of a Consul `?recurse` listing: `Value` is base64 of the JSON text."""
    return {"Key": f"{PREFIX}{model}", "Value": base64.b64encode(json.dumps(value).encode()).decode()}


def raw_entry(model: str, value: str | None) -> dict[str, object]:
    return {"Key": f"{PREFIX}{model}", "Value": value}


def store_with_file() -> PolicyStore:
    return PolicyStore({"simple": FILE_SIMPLE, "other": FILE_OTHER})


KV_SIMPLE = {"weights": {"1": 50, "2": 50}, "sticky_header": "X-User"}
PARSED_KV_SIMPLE = ModelPolicy((("1", 50.0), ("2", 50.0)), "x-user")


# --- the store -----------------------------------------------------------------------


def test_a_store_answers_the_files_policies_and_none_for_other_models() -> None:
    store = store_with_file()
    assert store.get("simple") == FILE_SIMPLE
    assert store.get("other") == FILE_OTHER
    assert store.get("unknown") is None
    assert PolicyStore().get("simple") is None


def test_a_store_keeps_its_own_copy_of_the_files_policies() -> None:
    file_policies = {"simple": FILE_SIMPLE}
    store = PolicyStore(file_policies)
    file_policies["simple"] = FILE_OTHER
    store.apply_kv(PREFIX, [])
    assert store.get("simple") == FILE_SIMPLE


def test_a_kv_policy_overrides_the_files_for_its_model_only() -> None:
    store = store_with_file()
    store.apply_kv(PREFIX, [entry("simple", KV_SIMPLE)])
    assert store.get("simple") == PARSED_KV_SIMPLE
    assert store.get("other") == FILE_OTHER


def test_a_kv_policy_may_name_a_model_the_file_does_not() -> None:
    store = store_with_file()
    store.apply_kv(PREFIX, [entry("newcomer", {"weights": {"4": 1}, "shadow": {"version": 5, "fraction": 0.5}})])
    assert store.get("newcomer") == ModelPolicy((("4", 1.0),), "", Shadow("5", 0.5))


def test_a_deleted_kv_key_falls_back_to_the_files_policy() -> None:
    store = store_with_file()
    store.apply_kv(PREFIX, [entry("simple", KV_SIMPLE), entry("other", {"weights": {"9": 1}})])
    store.apply_kv(PREFIX, [entry("other", {"weights": {"9": 1}})])
    assert store.get("simple") == FILE_SIMPLE
    assert store.get("other") == parse_policy("other", {"weights": {"9": 1}})


def test_a_deleted_kv_key_of_a_model_the_file_does_not_name_leaves_no_policy() -> None:
    store = store_with_file()
    store.apply_kv(PREFIX, [entry("newcomer", {"weights": {"4": 1}})])
    store.apply_kv(PREFIX, [])
    assert store.get("newcomer") is None


@pytest.mark.parametrize("entries", [None, []])
def test_an_empty_listing_brings_back_every_policy_of_the_file(entries: list[dict[str, object]] | None) -> None:
    store = store_with_file()
    store.apply_kv(PREFIX, [entry("simple", KV_SIMPLE), entry("other", KV_SIMPLE)])
    store.apply_kv(PREFIX, entries)
    assert (store.get("simple"), store.get("other")) == (FILE_SIMPLE, FILE_OTHER)


@pytest.mark.parametrize("prefix", ["turnout/routing/", "turnout/routing"])
def test_the_model_is_the_key_below_the_prefix(prefix: str) -> None:
    store = PolicyStore()
    store.apply_kv(prefix, [entry("simple", KV_SIMPLE)])
    assert store.get("simple") == PARSED_KV_SIMPLE


def test_the_prefix_folder_and_nested_keys_are_not_models() -> None:
    store = PolicyStore()
    nested = {"Key": f"{PREFIX}team/simple", "Value": entry("x", KV_SIMPLE)["Value"]}
    store.apply_kv(PREFIX, [raw_entry("", None), nested])
    assert store.get("") is None
    assert store.get("team/simple") is None
    assert store.get("team") is None
    assert store.get("simple") is None


INVALID_VALUES = [
    pytest.param(raw_entry("simple", "not base64!"), "base64", id="not base64"),
    pytest.param(raw_entry("simple", base64.b64encode(b"{weights").decode()), "Expecting", id="not JSON"),
    pytest.param(raw_entry("simple", base64.b64encode(b"\xff\xfe").decode()), "utf-8", id="not UTF-8"),
    pytest.param(raw_entry("simple", None), "Expecting value", id="no value"),
    pytest.param(
        entry("simple", {"weights": {"1": 0}}), "weights of model 'simple' must not all be zero", id="invalid policy"
    ),
    pytest.param(entry("simple", ["weights"]), "policy for model 'simple' must be a mapping", id="not a mapping"),
]


@pytest.mark.parametrize(("bad", "reason"), INVALID_VALUES)
def test_an_invalid_kv_value_is_rejected_saying_why_and_the_last_good_policy_stays(
    bad: dict[str, object], reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    store = store_with_file()
    store.apply_kv(PREFIX, [entry("simple", KV_SIMPLE)])
    caplog.clear()  # the good policy's own line
    store.apply_kv(PREFIX, [bad])
    assert store.get("simple") == PARSED_KV_SIMPLE
    (record,) = caplog.records
    assert record.levelno == logging.ERROR
    assert record.getMessage().startswith(f"routing policy {PREFIX}simple rejected, keeping the last good one: "), (
        record.getMessage()
    )
    assert reason in record.getMessage()


def test_the_last_good_policy_outlasts_repeated_invalid_listings() -> None:
    store = store_with_file()
    store.apply_kv(PREFIX, [entry("simple", KV_SIMPLE)])
    for _ in range(3):
        store.apply_kv(PREFIX, [entry("simple", {"weights": {}})])
    assert store.get("simple") == PARSED_KV_SIMPLE


def test_an_invalid_kv_value_for_a_model_without_one_leaves_the_files_policy_in_force(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = store_with_file()
    caplog.set_level(logging.ERROR, logger=LOGGER)
    store.apply_kv(PREFIX, [entry("simple", {"weights": {"1": -5}})])
    assert store.get("simple") == FILE_SIMPLE
    assert [r.levelno for r in caplog.records] == [logging.ERROR]


def test_an_invalid_value_for_one_model_does_not_hold_back_the_others() -> None:
    store = store_with_file()
    store.apply_kv(PREFIX, [entry("simple", {"weights": {}}), entry("other", KV_SIMPLE)])
    assert store.get("simple") == FILE_SIMPLE
    assert store.get("other") == parse_policy("other", KV_SIMPLE)


def test_a_valid_value_after_an_invalid_one_takes_over() -> None:
    store = store_with_file()
    store.apply_kv(PREFIX, [entry("simple", {"weights": {}})])
    store.apply_kv(PREFIX, [entry("simple", KV_SIMPLE)])
    assert store.get("simple") == PARSED_KV_SIMPLE


def test_changes_are_logged_once_and_an_unchanged_listing_is_quiet(caplog: pytest.LogCaptureFixture) -> None:
    store = store_with_file()
    caplog.set_level(logging.INFO, logger=LOGGER)
    store.apply_kv(PREFIX, [entry("simple", KV_SIMPLE)])
    assert [r.getMessage() for r in caplog.records] == [
        f"routing policy for model 'simple' from consul key {PREFIX}simple: {PARSED_KV_SIMPLE}"
    ]
    caplog.clear()
    store.apply_kv(PREFIX, [entry("simple", KV_SIMPLE)])
    assert caplog.records == []
    store.apply_kv(PREFIX, [])
    assert [r.getMessage() for r in caplog.records] == ["routing policy for model 'simple' removed from consul"]


# --- experiments across models ------------------------------------------------------

FLEET = {"simple", "other", "resnet_onnx", "resnet_trt"}


def test_a_kv_experiment_naming_a_model_the_fleet_does_not_know_is_rejected(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger=LOGGER)
    store = PolicyStore(known=FLEET.__contains__)
    good = {"weights": {"resnet_onnx:3": 90, "resnet_trt:1": 10}}
    store.apply_kv(PREFIX, [entry("resnet", good)])
    store.apply_kv(PREFIX, [entry("resnet", {"weights": {"resnet_onnx:3": 1, "resnet_tvm": 1}})])
    assert store.get("resnet") == parse_policy("resnet", good)
    assert store.experiments() == ["resnet"]
    (record,) = caplog.records
    assert record.getMessage().endswith("arm 'resnet_tvm' of model 'resnet' names unknown model 'resnet_tvm'")


def test_a_kv_policy_that_would_chain_experiments_is_rejected_and_the_others_stand() -> None:
    store = PolicyStore(known=FLEET.__contains__)
    experiment = {"weights": {"resnet_onnx:3": 1}}
    store.apply_kv(PREFIX, [entry("resnet", experiment)])
    # resnet_onnx may not become an experiment while resnet has an arm of it.
    store.apply_kv(PREFIX, [entry("resnet", experiment), entry("resnet_onnx", {"weights": {"resnet_trt:1": 1}})])
    assert store.get("resnet_onnx") is None
    # Once resnet's key is gone, it may.
    store.apply_kv(PREFIX, [entry("resnet_onnx", {"weights": {"resnet_trt:1": 1}})])
    assert store.get("resnet_onnx") == parse_policy("resnet_onnx", {"weights": {"resnet_trt:1": 1}})
    assert store.get("resnet") is None


def test_the_files_arms_of_unknown_models_are_reported() -> None:
    file_policies = {"resnet": parse_policy("resnet", {"weights": {"resnet_onnx:3": 1, "gone": 1}})}
    assert PolicyStore(file_policies).unknown_file_arms(FLEET.__contains__) == [
        "arm 'gone' of model 'resnet' names unknown model 'gone'"
    ]


# --- the routing file ----------------------------------------------------------------


def test_a_routing_file_gives_its_policies(tmp_path: Path) -> None:
    path = tmp_path / "routing.yaml"
    path.write_text(
        "models:\n"
        "  simple:\n"
        "    weights: {1: 90, 2: 10}\n"
        "    sticky_header: X-User\n"
        "    shadow: {version: 3, fraction: 0.1}\n"
        "  other:\n"
        "    weights: {'3': 1}\n"
    )
    assert read_routing_file(str(path)) == {
        "simple": ModelPolicy((("1", 90.0), ("2", 10.0)), "x-user", Shadow("3", 0.1)),
        "other": ModelPolicy((("3", 1.0),)),
    }


def test_an_empty_routing_file_has_no_policies(tmp_path: Path) -> None:
    path = tmp_path / "routing.yaml"
    path.write_text("")
    assert read_routing_file(str(path)) == {}


def test_a_missing_routing_file_is_a_policy_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "missing.yaml"
    with pytest.raises(PolicyError) as info:
        read_routing_file(str(path))
    assert str(info.value).startswith(f"cannot read routing file {path}: ")
    assert "No such file or directory" in str(info.value)


def test_a_routing_file_that_is_not_yaml_is_a_policy_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "routing.yaml"
    path.write_text("models:\n  simple: {weights: {1: 90\n")
    with pytest.raises(PolicyError) as info:
        read_routing_file(str(path))
    assert str(info.value).startswith(f"cannot read routing file {path}: ")


def test_a_routing_file_with_an_invalid_policy_says_which_and_why(tmp_path: Path) -> None:
    path = tmp_path / "routing.yaml"
    path.write_text("models:\n  simple:\n    weights: {1: 90, 2: -10}\n")
    with pytest.raises(PolicyError) as info:
        read_routing_file(str(path))
    assert str(info.value) == "weight of version 2 of model 'simple' must be a number >= 0"


def test_a_routing_file_of_the_wrong_shape_is_a_policy_error(tmp_path: Path) -> None:
    path = tmp_path / "routing.yaml"
    path.write_text("- simple\n- other\n")
    with pytest.raises(PolicyError) as info:
        read_routing_file(str(path))
    assert str(info.value) == "a routing document must be a mapping with a 'models' mapping"


def test_a_routing_file_that_is_not_utf8_is_a_policy_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "routing.yaml"
    path.write_bytes(b"models:\n  simple:\n    weights: {1: 1}\n    sticky_header: \xff\xfe\n")
    with pytest.raises(PolicyError) as info:
        read_routing_file(str(path))
    assert str(info.value).startswith(f"cannot read routing file {path}: ")
