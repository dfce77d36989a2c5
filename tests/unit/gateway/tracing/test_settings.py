"""The trace settings in force and Triton's sampling, through TraceSettings itself."""

from __future__ import annotations

import pytest

from gateway.tracing.config import TIMESTAMPS, TraceConfig, TraceMode
from gateway.tracing.settings import TraceSettings
from protos.status import Status, TurnoutError

ON = TraceConfig(level=frozenset({TIMESTAMPS}), rate=1, file="/unused/trace.json")


def traced(settings: TraceSettings, model: str, requests: int) -> list[int]:
    """Which of `requests` requests to `model` (numbered from 1) the setting samples."""
    return [n for n in range(1, requests + 1) if settings.get(model).sample()]


def test_rate_n_samples_every_nth_request() -> None:
    settings = TraceSettings(TraceConfig(level=frozenset({TIMESTAMPS}), rate=3, file="t.json"))
    assert traced(settings, "simple", 10) == [3, 6, 9]


def test_count_stops_tracing_at_zero_and_the_api_reports_what_is_left() -> None:
    settings = TraceSettings(TraceConfig(level=frozenset({TIMESTAMPS}), rate=2, count=3, file="t.json"))
    assert traced(settings, "simple", 20) == [2, 4, 6]
    assert settings.report("")["trace_count"] == ("0",)


def test_count_minus_one_never_stops() -> None:
    settings = TraceSettings(ON)
    assert len(traced(settings, "simple", 500)) == 500
    assert settings.report("")["trace_count"] == ("-1",)


@pytest.mark.parametrize(
    "config",
    [
        TraceConfig(rate=1, file="t.json"),  # level OFF
        TraceConfig(level=frozenset({TIMESTAMPS}), rate=1),  # triton mode without a file
        TraceConfig(level=frozenset({TIMESTAMPS}), rate=0, file="t.json"),
        TraceConfig(level=frozenset({TIMESTAMPS}), rate=1, count=0, file="t.json"),
    ],
)
def test_an_invalid_setting_samples_nothing(config: TraceConfig) -> None:
    assert traced(TraceSettings(config), "simple", 10) == []


def test_a_propagated_context_forces_a_trace_whatever_the_rate() -> None:
    settings = TraceSettings(TraceConfig(level=frozenset({TIMESTAMPS}), rate=0, mode=TraceMode.OPENTELEMETRY))
    assert settings.get("simple").sample(force=True)
    assert not settings.get("simple").sample()


def test_a_model_setting_applies_to_that_model_only() -> None:
    settings = TraceSettings(ON)
    settings.update("linear", {"trace_level": ["OFF"]})
    assert traced(settings, "linear", 3) == []
    assert traced(settings, "simple", 3) == [1, 2, 3]
    assert settings.report("linear")["trace_level"] == ("OFF",)
    assert settings.report("simple")["trace_level"] == (TIMESTAMPS,)


def test_a_model_setting_keeps_its_own_values_and_follows_the_global_ones_for_the_rest() -> None:
    settings = TraceSettings(ON)
    settings.update("simple", {"trace_rate": ["5"]})
    settings.update("", {"trace_count": ["7"]})
    assert settings.report("simple")["trace_rate"] == ("5",)
    assert settings.report("simple")["trace_count"] == ("7",)  # the global change reached it
    assert settings.report("")["trace_rate"] == ("1",)
    settings.update("simple", {"trace_rate": []})  # cleared: the model setting is gone
    assert settings.get("simple") is settings.global_setting


def test_clearing_a_global_value_returns_to_the_start_up_value() -> None:
    settings = TraceSettings(TraceConfig(level=frozenset({TIMESTAMPS}), rate=4, file="t.json"))
    settings.update("", {"trace_rate": ["9"]})
    assert settings.report("")["trace_rate"] == ("9",)
    settings.update("", {"trace_rate": []})
    assert settings.report("")["trace_rate"] == ("4",)


def test_an_update_starts_counting_afresh() -> None:
    settings = TraceSettings(TraceConfig(level=frozenset({TIMESTAMPS}), rate=1, count=1, file="t.json"))
    assert traced(settings, "simple", 3) == [1]
    settings.update("", {"trace_count": ["2"]})
    assert traced(settings, "simple", 3) == [1, 2]


def test_report_per_mode() -> None:
    triton = TraceSettings(TraceConfig(file="t.json")).report("")
    assert list(triton) == ["trace_level", "trace_rate", "trace_count", "log_frequency", "trace_file", "trace_mode"]
    assert triton["trace_file"] == ("t.json",)
    otel = TraceSettings(TraceConfig(mode=TraceMode.OPENTELEMETRY)).report("")
    assert "trace_file" not in otel and "log_frequency" not in otel
    assert otel["trace_mode"] == ("opentelemetry",)
    assert otel["url"] == ("http://localhost:4318/v1/traces",)
    assert otel["resource"] == ("service.name=triton-inference-server",)


@pytest.mark.parametrize(
    ("updates", "status", "message"),
    [
        ({"trace_file": ["x.json"]}, Status.UNSUPPORTED, "trace file location can not be updated through network"),
        ({"trace_file": []}, Status.UNSUPPORTED, "trace file location can not be updated through network"),
        ({"trace_level": ["OFF", "TIMESTAMPS"]}, Status.INVALID_ARG, "Expect only one trace level 'OFF' is specified"),
        ({"trace_rate": ["1", "2"]}, Status.INVALID_ARG, "expect only 1 value for 'trace_rate'"),
        ({"trace_rate": ["often"]}, Status.INVALID_ARG, "Unable to parse 'trace_rate', got: often"),
        (
            {"trace_rate": ["10000000000"]},
            Status.INVALID_ARG,
            "Unable to parse 'trace_rate', value is out of range [ 0, 4294967295 ], got: 10000000000",
        ),
        ({"trace_count": ["-2"]}, Status.INVALID_ARG, "Unable to parse 'trace_count'. Expecting value >= -1, got: -2"),
        (
            {"trace_count": ["3000000000"]},
            Status.INVALID_ARG,
            "Unable to parse 'trace_count', value is out of range [ -1, 2147483647 ], got: 3000000000",
        ),
    ],
)
def test_refused_updates_change_nothing(updates: dict[str, list[str]], status: Status, message: str) -> None:
    settings = TraceSettings(ON)
    before = settings.report("")
    with pytest.raises(TurnoutError) as caught:
        settings.update("", {"trace_rate": ["3"], **updates})
    assert caught.value.status is status
    assert message in caught.value.message
    assert settings.report("") == before


def test_updates_read_as_triton_reads_them() -> None:
    """Numbers as std::stoi reads them (an int32, wrapped into the uint32 settings); level
    names and settings Triton does not know are passed over, not refused."""
    settings = TraceSettings(ON)
    settings.update("", {"trace_rate": [" 12abc"], "log_frequency": ["-1"], "trace_mode": ["x"], "colour": ["blue"]})
    report = settings.report("")
    assert (report["trace_rate"], report["log_frequency"]) == (("12",), ("4294967295",))
    settings.update("", {"trace_level": ["LOUD"]})  # no level Triton knows: the level stays
    assert report["trace_level"] == settings.report("")["trace_level"]
    settings.update("", {"trace_level": ["TENSORS", "LOUD"]})
    assert settings.report("")["trace_level"] == ("TENSORS",)


def test_turning_tracing_on_without_a_file_is_refused_as_triton_refuses_it() -> None:
    settings = TraceSettings(TraceConfig())
    with pytest.raises(TurnoutError) as caught:
        settings.update("", {"trace_level": ["TIMESTAMPS"]})
    assert caught.value.message == "Attempting to set invalid trace setting :trace file name is not given"
    settings.update("", {"trace_level": ["OFF"], "trace_rate": ["0"]})  # invalid but off: allowed
