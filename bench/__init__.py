"""Benchmarks: every way turnout is measured, under one name.

- `loadgen/`: `turnout bench`, a load generator in perf_analyzer's spirit for any server
  that speaks the v2 protocol (installed with the package).
- `__main__`: `python -m bench` (`make bench`): turnout beside in-process ONNX Runtime and
  torch, plain gRPC and HTTP echo servers, a sidecar alone and the floor, all in one run
  (`closed_loop` drives the load; `echo_server`, `http_echo` are the echo servers;
  `floor_server` serves `simple` itself over both protocols in one process).
- `faults`, `fleet`: `python -m bench.faults`: throughput and errors while replicas are
  killed, frozen, drained or rolled out, alone and in a Consul fleet.

Run from the repository root; the side-by-side runs import `scripts.make_models` and the
fleet rows the fleet test harness (`tests.fleet.fleet_harness`).
"""
