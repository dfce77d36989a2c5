"""--trace-config read as Triton's command line reads it."""

from __future__ import annotations

import pytest

from gateway.tracing.config import (
    DEFAULT_OTEL_URL,
    TENSORS,
    TIMESTAMPS,
    OpenTelemetryConfig,
    TraceConfig,
    TraceConfigError,
    TraceMode,
    parse_trace_config,
)


def test_no_flags_are_triton_defaults() -> None:
    config, warnings = parse_trace_config([])
    assert config == TraceConfig()
    assert (config.level, config.rate, config.count, config.mode, config.file, config.log_frequency) == (
        frozenset(),
        1000,
        -1,
        TraceMode.TRITON,
        "",
        0,
    )
    assert warnings == []


def test_triton_mode_settings() -> None:
    config, warnings = parse_trace_config(
        [
            "triton,file=/tmp/trace.json",
            "triton,log-frequency=50",
            "rate=100",
            "level=TIMESTAMPS",
            "count=10",
        ]
    )
    assert config.file == "/tmp/trace.json"
    assert (config.log_frequency, config.rate, config.count) == (50, 100, 10)
    assert config.level == {TIMESTAMPS}
    assert warnings == []


@pytest.mark.parametrize(
    ("value", "level"),
    [
        ("TIMESTAMPS", {TIMESTAMPS}),
        ("timestamps", {TIMESTAMPS}),
        ("on", {TIMESTAMPS}),
        ("max", {TIMESTAMPS}),
        ("TENSORS", {TENSORS}),
        ("OFF", set()),
        ("false", set()),
    ],
)
def test_levels_as_triton_spells_them(value: str, level: set[str]) -> None:
    assert parse_trace_config([f"level={value}"])[0].level == level


def test_levels_add_up_and_an_explicit_off_wins() -> None:
    assert parse_trace_config(["level=TIMESTAMPS", "level=TENSORS"])[0].level == {TIMESTAMPS, TENSORS}
    assert parse_trace_config(["level=TIMESTAMPS", "level=OFF"])[0].level == set()


def test_tensors_is_accepted_but_says_it_records_nothing() -> None:
    _, warnings = parse_trace_config(["level=TENSORS"])
    assert any("TENSORS" in warning for warning in warnings)


def test_opentelemetry_settings_and_defaults() -> None:
    config, warnings = parse_trace_config(["mode=opentelemetry"])
    assert config.mode is TraceMode.OPENTELEMETRY
    assert config.opentelemetry == OpenTelemetryConfig()
    assert config.opentelemetry.url == DEFAULT_OTEL_URL
    assert dict(config.opentelemetry.resource) == {"service.name": "triton-inference-server"}
    assert warnings == []
    config, _ = parse_trace_config(
        [
            "mode=opentelemetry",
            "opentelemetry,url=http://collector:4318/v1/traces",
            "opentelemetry,resource=service.name=turnout",
            "opentelemetry,resource=deployment.environment=test",
            "opentelemetry,bsp_max_queue_size=100",
            "opentelemetry,bsp_schedule_delay=200",
            "opentelemetry,bsp_max_export_batch_size=10",
        ]
    )
    otel = config.opentelemetry
    assert otel.url == "http://collector:4318/v1/traces"
    # The value is everything after the first '=' of the setting: a key=value pair itself.
    assert dict(otel.resource) == {"service.name": "turnout", "deployment.environment": "test"}
    assert (otel.bsp_max_queue_size, otel.bsp_schedule_delay, otel.bsp_max_export_batch_size) == (100, 200, 10)


def test_the_other_modes_settings_are_ignored_with_a_warning() -> None:
    config, warnings = parse_trace_config(["mode=opentelemetry", "triton,file=/tmp/x.json"])
    assert config.file == ""
    assert warnings == ["--trace-config triton,file=/tmp/x.json ignored: the trace mode is opentelemetry"]
    config, warnings = parse_trace_config(["opentelemetry,url=http://x/v1/traces"])
    assert config.opentelemetry.url == DEFAULT_OTEL_URL
    assert len(warnings) == 1


def test_unknown_settings_are_ignored_with_a_warning() -> None:
    config, warnings = parse_trace_config(["colour=blue", "triton,colour=red"])
    assert config == TraceConfig()
    assert len(warnings) == 2


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (",rate=1", "No trace mode specified"),
        ("rate", "--trace-config option format is '<trace mode>,<setting>=<value>'. Got rate"),
        ("rate=", "format is"),
        ("triton,file", "format is"),
        ("jaeger,url=x", 'invalid value for trace mode option: jaeger. Available options are "triton"'),
        ("mode=zipkin", "invalid value for trace mode option: zipkin"),
        ("level=loud", "invalid value for trace level option: loud"),
        ("rate=often", 'Bad option: "--trace-config rate"'),
        ("count=-2", 'Bad option: "--trace-config count"'),
        ("triton,log-frequency=x", 'Bad option: "--trace-config triton,log-frequency"'),
    ],
)
def test_refusals_in_tritons_words(spec: str, message: str) -> None:
    with pytest.raises(TraceConfigError, match=None) as caught:
        parse_trace_config([spec])
    assert message in str(caught.value)


def test_an_export_batch_larger_than_the_queue_is_refused() -> None:
    with pytest.raises(TraceConfigError):
        parse_trace_config(
            ["mode=opentelemetry", "opentelemetry,bsp_max_queue_size=10", "opentelemetry,bsp_max_export_batch_size=20"]
        )
