"""What the gateway and the sidecars share: the protocol, and every rule both must apply
the same way (one owner each).

- The wire: `*.proto` and their generated modules (`generate`, `pool`), `rpc` (the service,
  its methods, channel limits, TLS credentials, the one gRPC error ladder), `wire`
  (protobuf fields appended and walked by hand), `lane` (the gateway-sidecar infer lane),
  `trace` (what a traced request and its answer carry across that hop).
- Tensors and requests: `datatypes`, `codec`, `sequence` (sequence id and flags),
  `validation` (a request against its model, as Triton's core checks it, in its order and
  words; the sidecars before they queue it, the gateway before it runs an ensemble),
  `input_order` (the order core's hash maps walk names in: a request's inputs, an
  ensemble's outputs).
- Errors: `status` (the error type and its HTTP and gRPC tables).
- Servers: `identity` (server name, version, extensions), `ready` (the ready line),
  `flags` (shared command-line rules), `logs` (Triton's logging extension).
- Repositories: `layout` (which framework serves a model folder), `remote` (S3 and GCS),
  `ensemble_steps` (an ensemble's step maps against its step models' configs).
- Counters: `statistics`, `triton_metrics`.
"""
