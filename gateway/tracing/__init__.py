"""Triton's trace extension: which requests are traced, and where their traces go.

- `config`: `--trace-config` read as Triton reads it, into one frozen TraceConfig.
- `settings`: the settings in force (global, per model) as the trace API changes them,
  and Triton's sampling by rate and count.
- `trace`: one traced request's record and Triton's timestamp names.
- `tracer`: the composition of the above, and Triton's trace file records.
- `files`: the trace files (Triton mode). `otel`: the spans (OpenTelemetry mode), the
  only module that imports the OpenTelemetry SDK.

What a sampled request tells its sidecar, and how the sidecar answers, is protos.trace.
"""
