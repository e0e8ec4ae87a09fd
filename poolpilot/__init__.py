"""poolpilot: a Kubernetes operator and autoscaler for disaggregated LLM inference pools."""

__version__ = "0.1.0"
