"""The `sao` command line.

`app` lives in `sao.cli.common`; the command modules register on it when imported here, in the order
`sao --help` lists them: `config` (``sao config``, ``sao presets``; `explain` renders the schema that
`config_docs` walks for ``--explain`` / ``--reference``), `inspect` (``sao inspect``), `models`
(``sao init-model``, ``sao sft``, ``sao pretrain-value``), `plan` (``sao plan``; its throughput half in
`plan_throughput`), `run` (``sao serve``,
``sao eval``, ``sao plot``, ``sao train``) and `sweep` (``sao sweep``, ``sao report``, ``sao compare``).

Importing it stays light (no torch, no transformers): commands import models, engines and trainers inside
their bodies, and the config's algorithm classes import their tensor math where it runs.
"""

from __future__ import annotations

from sao.cli import config, inspect, models, plan, run, sweep
from sao.cli.common import app

__all__ = ["app", "config", "inspect", "models", "plan", "run", "sweep"]
