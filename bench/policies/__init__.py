"""Scaling policies the benchmark compares (each documented with its sources)."""
