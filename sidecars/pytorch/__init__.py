"""The PyTorch framework of the sidecar: TorchScript (model.pt) and torch.export (model.pt2)."""
