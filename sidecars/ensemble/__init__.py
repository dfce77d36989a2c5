"""The ensemble framework of the sidecar: configs only; the gateway runs the steps."""
