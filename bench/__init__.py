"""Trace-replay benchmark: scaling policies compared on a simulated disaggregated pool."""
