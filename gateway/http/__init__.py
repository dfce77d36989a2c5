"""The HTTP/REST front end: Triton's routes over starlette, one `Gateway` call each.

- `front`: the routes, restrictions, request size limits and error rendering.
- `parsing`: an inference request body (JSON and binary tensors) -> ModelInferRequest,
  and how each output must render.
- `rendering`: ModelInferResponse -> Triton's response body (JSON `data` or binary).
- `messages`: every other protobuf answer <-> Triton's JSON shapes (config, metadata,
  statistics, index, shared memory, trace and log settings).
- `encoding`: bodies on the wire: read within `--http-max-input-size` as they arrive
  (`read_body`, compressed ones limited after inflating too), JSON parsed and written
  as Triton does, gzip/deflate.
- `protocol`: the HTTP/1.1 connections uvicorn's server runs the front on.
- `nesting`: JSON nested deeper than Python's parser recurses, read in bands it can parse.

Only `front` imports starlette.
"""
