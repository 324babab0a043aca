"""Task files: JSONL / JSON / Parquet rows → `Task` objects (through Hugging Face ``datasets``, local files
only), and `Task` objects → JSONL.

A row has a prompt (a string, or a list of chat messages), optionally an id, a reference answer and hidden
tests; which column is which is configurable (``sao.config.DataConfig``: ``id_field``, ``prompt_field``,
``answer_field``, ``tests_field``). Every other column goes to ``Task.metadata``. A row without an id gets
``"<file stem>-<row index>"``. Columns a row lacks (``None`` in the loaded table) are left out of its
metadata, and ``None`` keys of message dicts are dropped (a table fills absent keys with ``None``).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from sao.envs.base import Task

__all__ = ["TaskFileError", "load_tasks", "save_tasks_jsonl"]

PathLike = str | os.PathLike[str]


class TaskFileError(ValueError):
    """A task file that cannot be read as tasks; the message names the file (and the row or column)."""


def _format(path: Path) -> str:
    suffixes = [s.lower() for s in path.suffixes]
    if ".parquet" in suffixes:
        return "parquet"
    if ".jsonl" in suffixes or ".json" in suffixes:
        return "json"
    raise TaskFileError(f"{path}: unknown task file format (expected .jsonl, .json or .parquet)")


@contextlib.contextmanager
def _quiet_datasets() -> Iterator[Any]:
    """Import ``datasets`` offline, with its progress bars off for the duration (restored after)."""
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import datasets

    was_disabled = datasets.utils.are_progress_bars_disabled()
    datasets.utils.disable_progress_bars()
    try:
        yield datasets
    finally:
        if not was_disabled:
            datasets.utils.enable_progress_bars()


def _read_rows(path: Path) -> list[dict[str, Any]]:
    """All rows of one local file, as plain Python values."""
    if not path.is_file():
        raise TaskFileError(f"task file {str(path)!r} does not exist")
    fmt = _format(path)
    with _quiet_datasets() as datasets, tempfile.TemporaryDirectory(prefix="sao-tasks-") as cache:
        try:
            table = datasets.load_dataset(
                fmt, data_files=str(path), split="train", cache_dir=cache, keep_in_memory=True
            )
        except Exception as err:
            raise TaskFileError(f"{path}: cannot read as {fmt}: {type(err).__name__}: {err}") from err
        return table.to_list()


def _without_none(message: Any) -> Any:
    return {k: v for k, v in message.items() if v is not None} if isinstance(message, dict) else message


def _prompt(value: Any, where: str) -> str | list[dict[str, Any]]:
    if isinstance(value, str) and value:
        return value
    if isinstance(value, list) and value and all(isinstance(m, dict) and "role" in m for m in value):
        return [_without_none(m) for m in value]
    raise TaskFileError(
        f"{where}: the prompt must be a non-empty string or a list of messages, got {value!r}"
    )


def load_tasks(
    path_or_paths: PathLike | Sequence[PathLike],
    *,
    id_field: str = "id",
    prompt_field: str = "prompt",
    answer_field: str = "answer",
    tests_field: str = "tests",
    limit: int | None = None,
) -> list[Task]:
    """Read tasks from one or more local ``.jsonl`` / ``.json`` / ``.parquet`` files, in file and row order.

    Args:
        path_or_paths: a file or a list of files.
        id_field, prompt_field, answer_field, tests_field: the column holding each part of a `Task`.
        limit: keep only the first ``limit`` tasks (over all files).

    Raises:
        TaskFileError: a missing or unreadable file, a file without the prompt column (the message lists
            the columns it has), an empty or malformed prompt, or two tasks with the same id.
    """
    paths = [path_or_paths] if isinstance(path_or_paths, (str, os.PathLike)) else list(path_or_paths)
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    named = {id_field, prompt_field, answer_field, tests_field}
    tasks: list[Task] = []
    seen: dict[str, str] = {}
    for raw_path in paths:
        if limit is not None and len(tasks) >= limit:
            break
        path = Path(raw_path)
        rows = _read_rows(path)
        if rows and prompt_field not in rows[0]:
            raise TaskFileError(
                f"{path}: no prompt column {prompt_field!r}; its columns are {sorted(rows[0])} "
                "(set data.prompt_field to the one holding the prompt)"
            )
        for index, row in enumerate(rows):
            if limit is not None and len(tasks) >= limit:
                break
            where = f"{path}, row {index}"
            task_id = row.get(id_field)
            task_id = f"{path.stem}-{index}" if task_id is None else str(task_id)
            if task_id in seen:
                raise TaskFileError(f"{where}: task id {task_id!r} already used by {seen[task_id]}")
            seen[task_id] = where
            metadata = {k: v for k, v in row.items() if k not in named and v is not None}
            tasks.append(
                Task(
                    id=task_id,
                    prompt=_prompt(row.get(prompt_field), where),
                    answer=row.get(answer_field),
                    tests=row.get(tests_field),
                    metadata=metadata,
                )
            )
    return tasks


def save_tasks_jsonl(path: PathLike, tasks: Sequence[Task]) -> None:
    """Write ``tasks`` as JSONL with the default column names (``id``, ``prompt``, ``answer``, ``tests``;
    the last two only when set) and the metadata as further columns; `load_tasks` reads it back.

    Written to a temporary file renamed at the end. Raises ValueError if a metadata key collides with a
    column name or a value is not JSON-serialisable.
    """
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with tmp.open("w", encoding="utf-8") as f:
            for task in tasks:
                row: dict[str, Any] = {"id": task.id, "prompt": task.prompt}
                for name in ("answer", "tests"):
                    if getattr(task, name) is not None:
                        row[name] = getattr(task, name)
                clash = sorted(set(task.metadata) & {"id", "prompt", "answer", "tests"})
                if clash:
                    raise ValueError(f"task {task.id!r}: metadata keys {clash} collide with task columns")
                row.update(task.metadata)
                try:
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")
                except TypeError as err:
                    raise ValueError(f"task {task.id!r} is not JSON-serialisable: {err}") from err
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
