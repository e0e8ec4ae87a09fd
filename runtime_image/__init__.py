"""The engine image's runtime: the role launcher (`poolpilot launch`) that starts vLLM."""
