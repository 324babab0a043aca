"""Task files: JSONL / JSON / Parquet rows → `Task` objects, and `Task` objects → JSONL.

A row has a prompt (a string, or a list of chat messages), optionally an id, a reference answer and hidden
tests; which column is which is configurable (``sao.config.DataConfig``: ``id_field``, ``prompt_field``,
``answer_field``, ``tests_field``). Every other column goes to ``Task.metadata``. A row without an id gets
``"<file stem>-<row index>"`` (the index counts rows from 0, blank lines skipped). Columns a row lacks, or
holds as ``null``, are left out of its metadata, and ``None`` keys of message dicts are dropped (a Parquet
table fills absent keys with ``None``).

``.jsonl`` files (and ``.json`` files that are not one JSON array) are read line by line with `json`, so
an error names the file and the 1-based line (``tasks.jsonl:2: invalid JSON: ...``); a ``.json`` array
and Parquet (or compressed JSON) go through Hugging Face ``datasets`` / `json` (local files only), and an
error names the 1-based row. A file with no rows is an error (``tasks.jsonl has no tasks``).
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
from sao.jsonl import iter_jsonl

__all__ = ["TaskFileError", "load_tasks", "save_tasks_jsonl"]

PathLike = str | os.PathLike[str]
Row = tuple[str, Any]  # (where: "<file>:<line>" or "<file>, row <n>", the decoded row)


class TaskFileError(ValueError):
    """A task file that cannot be read as tasks; the message names the file (and the line or row)."""


def _format(path: Path) -> str:
    """``jsonl`` (line by line), ``json`` (a JSON array, or lines), or ``datasets`` (Parquet, compressed)."""
    suffixes = [s.lower() for s in path.suffixes]
    if ".parquet" in suffixes:
        return "parquet"
    if suffixes and suffixes[-1] in (".jsonl", ".json"):
        return suffixes[-1][1:]
    if ".jsonl" in suffixes or ".json" in suffixes:
        return "compressed json"
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


def _datasets_rows(path: Path, fmt: str) -> list[Any]:
    """All rows of a Parquet or compressed JSON file, through ``datasets``, as plain Python values."""
    with _quiet_datasets() as datasets, tempfile.TemporaryDirectory(prefix="sao-tasks-") as cache:
        try:
            table = datasets.load_dataset(
                fmt, data_files=str(path), split="train", cache_dir=cache, keep_in_memory=True
            )
        except Exception as err:
            raise TaskFileError(f"{path}: cannot read as {fmt}: {type(err).__name__}: {err}") from err
        return table.to_list()


def _starts_an_array(path: Path) -> bool:
    """Whether the file's first non-blank character is ``[`` (a JSON array rather than JSON lines)."""
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                return line.lstrip().startswith("[")
    return False


def _json_array_rows(path: Path) -> list[Any]:
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise TaskFileError(f"{path}:{err.lineno}: invalid JSON: {err.msg} at column {err.colno}") from err
    return rows


def _rows(path: Path) -> Iterator[Row]:
    """``(where, row)`` for each row of one local file, in order; ``where`` names the file and the 1-based
    line (``"tasks.jsonl:2"``, JSON lines) or row (``"tasks.parquet, row 2"``, a table or a JSON array)."""
    if not path.is_file():
        raise TaskFileError(f"task file {str(path)!r} does not exist")
    fmt = _format(path)
    try:
        if fmt == "jsonl" or (fmt == "json" and not _starts_an_array(path)):
            for line, row in iter_jsonl(path, TaskFileError):
                yield f"{path}:{line}", row
            return
        rows = _json_array_rows(path) if fmt == "json" else _datasets_rows(path, fmt.split()[-1])
    except UnicodeDecodeError as err:
        raise TaskFileError(f"{path}: not UTF-8 text ({err})") from None
    for number, row in enumerate(rows, start=1):
        yield f"{path}, row {number}", row


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


class _Columns:
    """The column holding each part of a `Task`, and the check that a row is an object with a prompt."""

    def __init__(self, id_field: str, prompt_field: str, answer_field: str, tests_field: str) -> None:
        self.id, self.prompt, self.answer, self.tests = id_field, prompt_field, answer_field, tests_field

    def task(self, row: Any, where: str, default_id: str) -> Task:
        if not isinstance(row, dict):
            raise TaskFileError(
                f"{where}: expected an object with a prompt column {self.prompt!r} (optional: {self.id!r}, "
                f"{self.answer!r}, {self.tests!r}), got {_json_kind(row)} {_short(row)}"
            )
        if self.prompt not in row:
            raise TaskFileError(
                f"{where}: no prompt column {self.prompt!r}; its columns are {sorted(row)} "
                "(set data.prompt_field to the one holding the prompt)"
            )
        task_id = row.get(self.id)
        named = (self.id, self.prompt, self.answer, self.tests)
        return Task(
            id=default_id if task_id is None else str(task_id),
            prompt=_prompt(row[self.prompt], where),
            answer=row.get(self.answer),
            tests=row.get(self.tests),
            metadata={k: v for k, v in row.items() if k not in named and v is not None},
        )


def _json_kind(value: Any) -> str:
    kinds = {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return "null" if value is None else kinds.get(type(value), type(value).__name__)


def _short(value: Any, width: int = 60) -> str:
    text = json.dumps(value, ensure_ascii=False, default=repr)
    return text if len(text) <= width else text[: width - 3] + "..."


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
        TaskFileError: a missing, unreadable or empty file, a line that is not JSON or not an object, a row
            without the prompt column (the message lists the columns it has), an empty or malformed prompt,
            or two tasks with the same id. The message names the file and the 1-based line (or row).
    """
    paths = [path_or_paths] if isinstance(path_or_paths, (str, os.PathLike)) else list(path_or_paths)
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    columns = _Columns(id_field, prompt_field, answer_field, tests_field)
    tasks: list[Task] = []
    seen: dict[str, str] = {}
    for raw_path in paths:
        if limit is not None and len(tasks) >= limit:
            break
        path = Path(raw_path)
        count = 0
        for where, row in _rows(path):
            if limit is not None and len(tasks) >= limit:
                break
            task = columns.task(row, where, default_id=f"{path.stem}-{count}")
            count += 1
            if task.id in seen:
                raise TaskFileError(f"{where}: task id {task.id!r} already used by {seen[task.id]}")
            seen[task.id] = where
            tasks.append(task)
        if count == 0:
            raise TaskFileError(f"{path} has no tasks")
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
