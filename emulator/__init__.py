"""An in-memory Kubernetes API server over real HTTP (see docs/kube-emulator.md)."""
