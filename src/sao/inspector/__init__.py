"""The trajectory inspector: what the trainer computed for each token of kept trajectories, as one
self-contained HTML report (`sao inspect`; docs/inspect.md).

`records` turns a trained batch's `sao.train.capture.StepCapture` (or a plain trajectory) into JSON records,
`store` keeps a run's records on disk within a size bound, `sources` reads a run directory, a JSONL file
of trajectories or an evaluation report into one view document, `checks` adds a run's weight-sync checks
(from its ``metrics.jsonl``) to it, and `html` renders it.
"""

from .html import render_html, write_html
from .records import train_records, trajectory_record
from .sources import InspectSourceError, load_source
from .store import InspectStore, read_step_files

__all__ = [
    "InspectSourceError",
    "InspectStore",
    "load_source",
    "read_step_files",
    "render_html",
    "train_records",
    "trajectory_record",
    "write_html",
]
