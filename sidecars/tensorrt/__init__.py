"""The TensorRT framework of the sidecar: model.plan engines on NVIDIA GPUs."""
