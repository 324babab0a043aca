"""Wiring: metric sinks and progress (the async runtime lands here too)."""

from .metrics import JsonlMetricsSink

__all__ = ["JsonlMetricsSink"]
