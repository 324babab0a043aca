"""Training progress for a person watching: step / total, mean reward, trajectories/s, staleness
(mean policy lag), ETA, and a few configurable metric columns.

On a terminal it is a rich live display; otherwise (pipes, CI, log files) it prints one plain line at most
every ``plain_interval_s`` seconds, plus the first and the last step. The caller owns it as a context
manager: the only thread is rich's own refresh, started on ``__enter__`` and stopped on ``__exit__``.

It reads the trainer's metric names (see :mod:`sao.runtime.plots`): ``reward/mean``, ``lag/token_mean``
and ``throughput/trajectories_per_s``; when the last is absent, trajectories/s is computed from the
``trajectories=`` counts passed to :meth:`TrainingProgress.update`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table

from sao.sinks import scalar_value

__all__ = ["TrainingProgress", "format_duration"]

REWARD = "reward/mean"
LAG = "lag/token_mean"
TRAJ_PER_S = "throughput/trajectories_per_s"


def format_duration(seconds: float | None) -> str:
    """``1h02m03s`` / ``4m05s`` / ``6s``; ``-`` when unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    total = max(0, round(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if math.isnan(value):
        return "nan"
    return f"{value:.4g}"


class TrainingProgress:
    """Live (terminal) or periodic plain-line (non-terminal) progress of a training run.

    ``columns`` are extra metric names shown beside the standard ones (missing values print ``-``).
    ``live``: force the rich display on/off (default: on exactly when ``console`` is a terminal).
    """

    def __init__(
        self,
        total_steps: int,
        *,
        columns: Sequence[str] = (),
        console: Console | None = None,
        live: bool | None = None,
        plain_interval_s: float = 10.0,
        start_step: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total_steps = total_steps
        self.columns = tuple(columns)
        self.console = console or Console()
        self.plain_interval_s = plain_interval_s
        self._use_live = self.console.is_terminal if live is None else live
        self._clock = clock
        self._start_step = self.step = start_step
        self._start_time = clock()
        self._trajectories = 0
        self._values: dict[str, float] = {}
        self._last_plain: float | None = None
        self._printed_step: int | None = None
        self._live: Live | None = None

    # -- state -------------------------------------------------------------------------------------------

    def update(self, step: int, metrics: Mapping[str, Any] | None = None, *, trajectories: int = 0) -> None:
        """Record ``step`` (steps done so far), its ``metrics``, and the trajectories it consumed."""
        self.step = step
        self._trajectories += trajectories
        for name, value in (metrics or {}).items():
            plain = scalar_value(value)
            if plain is not None:
                self._values[name] = float(plain)
        if self._live is not None:
            self._live.refresh()
        elif not self._use_live:
            self._maybe_print_plain()

    def value(self, name: str) -> float | None:
        """The latest value of metric ``name``, or None when it was never logged."""
        return self._values.get(name)

    def trajectories_per_s(self) -> float | None:
        if TRAJ_PER_S in self._values:
            return self._values[TRAJ_PER_S]
        elapsed = self._clock() - self._start_time
        return self._trajectories / elapsed if self._trajectories and elapsed > 0 else None

    def eta_s(self) -> float | None:
        done = self.step - self._start_step
        if done <= 0:
            return None
        per_step = (self._clock() - self._start_time) / done
        return max(0, self.total_steps - self.step) * per_step

    def fields(self) -> dict[str, str]:
        """What is displayed, formatted: name -> text (standard fields first, then ``columns``)."""
        out = {
            "step": f"{self.step}/{self.total_steps}",
            "reward": _fmt(self.value(REWARD)),
            "traj/s": _fmt(self.trajectories_per_s()),
            "lag": _fmt(self.value(LAG)),
            "eta": format_duration(self.eta_s()),
        }
        out.update({name: _fmt(self.value(name)) for name in self.columns})
        return out

    # -- output ------------------------------------------------------------------------------------------

    def plain_line(self) -> str:
        return " | ".join(f"{name} {text}" for name, text in self.fields().items())

    def _maybe_print_plain(self) -> None:
        now = self._clock()
        due = self._last_plain is None or now - self._last_plain >= self.plain_interval_s
        if due or self.step >= self.total_steps:
            self._last_plain = now
            self._print_plain()

    def _print_plain(self) -> None:
        self._printed_step = self.step
        self.console.print(self.plain_line(), markup=False, highlight=False, soft_wrap=True)

    def _render(self) -> RenderableType:
        fields = self.fields()
        table = Table(box=None, padding=(0, 2), show_edge=False)
        for name in fields:
            table.add_column(name, justify="right", no_wrap=True)
        table.add_row(*fields.values())
        bar = ProgressBar(total=max(self.total_steps, 1), completed=min(self.step, self.total_steps))
        return Group(bar, table)

    def __enter__(self) -> TrainingProgress:
        self._start_time = self._clock()
        if self._use_live:
            self._live = Live(
                get_renderable=self._render, console=self.console, refresh_per_second=2, transient=False
            )
            self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.stop()  # joins rich's refresh thread
            self._live = None
        elif self._printed_step is not None and self._printed_step != self.step:
            self._print_plain()  # the final state, when the last update fell between periodic lines
