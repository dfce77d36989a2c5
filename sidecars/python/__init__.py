"""The `python` framework: Triton python-backend models (`model.py` defining
`TritonPythonModel`), each model instance in a child process of its own, as Triton's stub.

- `runtime`: the sidecar side; loads versions, starts and restarts the instance processes.
- `stub`: the child process's main loop; imports `model.py` and runs it.
- `channel`: the messages between the two over a socket pair, numpy arrays pickled in them.
- `backend_utils`: `triton_python_backend_utils` as models import it (in the child only),
  with `auto_complete` (pb_utils.ModelConfig) and `numpy_types` (datatype helpers).
- `bls`: a model's requests to other models, through the gateway's gRPC port.
- `model_json`: a config as the JSON a model's `initialize` and `auto_complete_config` read.
- `custom_metrics`: the families models declare, served on the sidecar's metrics port.
"""
