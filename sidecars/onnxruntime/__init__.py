"""The ONNX Runtime framework of the sidecar."""
