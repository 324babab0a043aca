"""sao: Single-Rollout Asynchronous Optimization for agentic RL of LLMs."""

from __future__ import annotations

import os

# A Hugging Face hub look-up hangs for ~45 s on machines without internet; sao never needs the hub at run
# time, so offline is the default. Users who want the hub set HF_HUB_OFFLINE=0 themselves.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

__version__ = "0.1.0"

__all__ = ["__version__"]
