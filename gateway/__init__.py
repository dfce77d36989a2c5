"""The gateway: Triton's HTTP and gRPC APIs in front of the sidecars that serve the models.

A request goes front end -> `core.Gateway` -> `routing` -> `upstream` -> a sidecar:
- `http/` and `grpc_front`: the front ends; each turns a request into one `core.Gateway`
  call and maps TurnoutError once. `context`: what travels beside a request (headers,
  deadline, sequence). `restrictions`: restricted APIs, for both front ends.
  `grpc_server`: the gRPC server the front runs on, on the event loop itself over
  `http2` (our HTTP/2, sans I/O); grpc.aio where TLS or grpc's keepalive and
  connection-age rules are asked for.
- `core`: the gateway's decisions, what it answers itself (server metadata, trace and log
  settings) and what it asks every replica (statistics, index, load and unload).
- `routing/`: version choice and replica choice for one inference (its own map).
- Sidecars and who owns what: `registry` (a static set of sidecars), `discovery` (the
  fleet as Consul sees it), `consul` (the Consul HTTP client), `upstream` (one sidecar's
  gRPC channel and infer lane), `fleet` (repository calls on every replica, indexes and
  statistics combined).
- `ensemble` and `ensemble_plan`: ensembles, run by the gateway across sidecars.
- `shm`: client shared-memory regions and an inference's tensors resolved against them.
- `metrics` (the gateway's own counters) and `metrics_port` (what a scrape answers, the
  fleet's Triton families included); `tracing/`: the trace extension, its settings and
  where traces go (its own map).
- `settings` and `app`: the settings value and the composition root with its lifecycle.

Never imports `sidecars/`; both depend on `protos/`.
"""
