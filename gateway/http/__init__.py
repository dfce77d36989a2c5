"""The HTTP/REST front end: Triton's routes over starlette, one `Gateway` call each.

- `front`: the routes, restrictions, request size limits and error rendering.
- `parsing`: an inference request body (JSON and binary tensors) -> ModelInferRequest,
  and how each output must render.
- `rendering`: ModelInferResponse -> Triton's response body (JSON `data` or binary).
- `messages`: every other protobuf answer <-> Triton's JSON shapes (config, metadata,
  statistics, index, shared memory, trace and log settings).
- `encoding`: JSON on the wire as Triton writes it, and gzip/deflate bodies.

Only `front` imports starlette.
"""
