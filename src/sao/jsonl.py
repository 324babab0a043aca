"""Reading JSONL files with errors that name the file and line."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["iter_jsonl"]


def iter_jsonl(
    path: str | os.PathLike[str], error: type[ValueError] = ValueError
) -> Iterator[tuple[int, Any]]:
    """Yield ``(line_number, record)`` for each non-blank line (numbers start at 1).

    A line that is not valid JSON raises ``error`` (a ValueError subclass) as ``"{path}:{line}: ..."``.
    """
    path = Path(path)
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as e:
                raise error(f"{path}:{lineno}: invalid JSON: {e.msg} at column {e.colno}") from e
