"""The `sao` command line.

Module import stays light (no torch/transformers): commands import heavy modules inside their bodies.

`app` lives in `sao.cli.common`; the command modules register on it when imported here, in the order
`sao --help` lists them.
"""

from __future__ import annotations

from sao.cli import config, inspect, models, plan, run, sweep
from sao.cli.common import app

__all__ = ["app", "config", "inspect", "models", "plan", "run", "sweep"]
