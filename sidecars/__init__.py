"""A sidecar: one process per framework that loads that framework's models from a Triton
model repository and serves them over the v2 gRPC service and the infer lane.

- `__main__` (the command line), `settings`, `process` (composition root, lifecycle).
- `server`: the v2 gRPC service (each request checked against its model by
  `protos.validation`); `responses`: ModelInferResponse building.
- `repository` (model folders, local or in an object store), `config` (config.pbtxt and
  overrides, the first stage of a load), `config_rules` (Triton core's configuration rules),
  `models` (ModelManager: versions, states, loads, unloads, polls),
  `journal` (explicit loads replayed after a restart), `warmup`.
- `batcher` (the dynamic batcher), `sequence` and `sequence_config` (the sequence batcher),
  `batch_rules` (Triton's batch formation, which both share).
- `runtime`: the Runtime and ModelInstance contracts and the table of frameworks, each in
  its own package (`onnxruntime/`, `pytorch/`, `tensorrt/`, `ensemble/`), imported by name
  so an image loads only its own framework.
- `metrics` (`/metrics`), `registration` (Consul), `healthcheck` (container checks).

Never imports `gateway/`; both depend on `protos/`.
"""
