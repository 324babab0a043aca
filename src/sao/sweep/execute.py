"""Running a sweep's planned runs: each in its own run dir, a bounded number at once, restartable.

Each run is ``python -m sao train BASE OVERRIDES... logging.run_dir=DIR name=ARM`` in a child process
(its output in ``DIR/train.log``), with ``OMP_NUM_THREADS = cores // jobs`` unless the caller set it.
When a run ends, ``DIR/sweep.json`` records its outcome:

- ``done``: exit 0, the run trained its ``trainer.total_steps``;
- ``stopped``: exit 3, the run stopped itself (training diverged, the engine could not be kept alive);
  its metrics up to there are part of the results;
- ``failed``: any other exit (a bad config, a crash); see ``train.log``.

A later `run_sweep` skips runs with an outcome (``retry_failed`` reruns ``failed`` ones), resumes a run
that was interrupted (a run dir with a checkpoint and no outcome: ``sao train --resume``) and restarts one
interrupted before its first checkpoint. Interrupting the sweep (Ctrl-C) terminates the running children
without an outcome, so the next `run_sweep` resumes them.

``in_process=True`` trains the runs one after another in this process instead (no per-run start-up cost:
the smoke tests use it); the outcome files are the same.

Owns: launching, the outcome file, skip/resume. Does not own: what a run trains (`sao train`) or the
report (`sao.sweep.report`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from .spec import PlannedRun, SweepSpec

__all__ = ["STATUS_FILE", "Outcome", "read_outcome", "run_state", "run_sweep"]

STATUS_FILE = "sweep.json"
LOG_FILE = "train.log"
_STOPPED_RC = 3  # `sao train`: the run stopped itself cleanly (RunStopped)

State = Literal["new", "interrupted", "running", "done", "stopped", "failed"]
_LOCK = ".sweep.lock"


@dataclass(frozen=True)
class Outcome:
    """What ``sweep.json`` holds: how a run ended and what it cost."""

    status: Literal["done", "stopped", "failed"]
    returncode: int
    wall_s: float  # summed over attempts (a resumed run adds its attempts)
    attempts: int
    arm: str
    seed: int
    command: list[str]
    error: str = ""
    started_at: float = 0.0  # unix seconds, the last attempt
    ended_at: float = 0.0


def read_outcome(run_dir: Path) -> Outcome | None:
    """The run's outcome, or None (never finished, or an unreadable file)."""
    try:
        data = json.loads((run_dir / STATUS_FILE).read_text())
        return Outcome(**{**data, "command": list(data.get("command", []))})
    except (OSError, ValueError, TypeError):
        return None


def run_state(run_dir: Path) -> State:
    """``new`` (nothing there), ``running`` (a sweep holds its lock), ``interrupted`` (a run dir without an
    outcome) or the outcome's status."""
    outcome = read_outcome(run_dir)
    if outcome is not None:
        return outcome.status
    if not (run_dir.exists() and any(p.name != _LOCK for p in run_dir.iterdir())):
        return "new"
    return "interrupted" if _lock_free(run_dir) else "running"


def _lock_free(run_dir: Path) -> bool:
    """Whether no process holds the run's lock (a shared probe: never blocks a sweep taking it)."""
    try:
        with (run_dir / _LOCK).open("a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            fcntl.flock(f, fcntl.LOCK_UN)
            return True
    except OSError:
        return True


@contextlib.contextmanager
def _locked(run_dir: Path, wait_s: float = 2.0):  # type: ignore[no-untyped-def]
    """The run dir's lock file, held exclusively (None when another process holds it for longer than
    ``wait_s``: a sweep or the run it started). Two sweeps sharing a run never train it twice at once; the
    child run inherits the lock's file descriptor, so the lock stays held while it lives, even when the
    sweep that started it was killed."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with (run_dir / _LOCK).open("a") as f:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:  # a probe (run_state) holds it for microseconds, a run for minutes
                if time.monotonic() >= deadline:
                    yield None
                    return
                time.sleep(0.05)
        try:
            yield f
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _has_checkpoint(run_dir: Path) -> bool:
    from sao.train.checkpoint import CheckpointManager

    return CheckpointManager(run_dir).latest() is not None


def _train_command(spec: SweepSpec, run: PlannedRun, resume: bool) -> list[str]:
    base = [spec.base] if spec.base else []
    return [
        sys.executable,
        "-m",
        "sao",
        "train",
        *base,
        *run.command_overrides(),
        *(["--resume"] if resume else []),
    ]


_ATTEMPTS = ".sweep_attempts.jsonl"  # one line per attempt: {"wall_s": ...}, so a resumed run adds up
# The running attempt's wall time so far, rewritten every _HEARTBEAT_S while its child runs: an attempt killed
# with the sweep (SIGKILL, the machine going down) leaves it behind, and the next attempt adds it up.
_OPEN_ATTEMPT = ".sweep_attempt_open.json"
_HEARTBEAT_S = 30.0


def _note_attempt(run_dir: Path, wall_s: float, **extra: Any) -> None:
    with (run_dir / _ATTEMPTS).open("a") as f:
        f.write(json.dumps({"wall_s": wall_s, **extra}) + "\n")
    (run_dir / _OPEN_ATTEMPT).unlink(missing_ok=True)


def _write_replacing(path: Path, text: str) -> None:
    """Write ``path`` through a temporary file, so a reader never sees it half written."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _heartbeat(run_dir: Path, wall_s: float) -> None:
    _write_replacing(run_dir / _OPEN_ATTEMPT, json.dumps({"wall_s": wall_s}))


def _close_killed_attempt(run_dir: Path) -> None:
    """Add up the wall time (to within `_HEARTBEAT_S`) of an attempt that died without noting it."""
    try:
        wall_s = float(json.loads((run_dir / _OPEN_ATTEMPT).read_text())["wall_s"])
    except FileNotFoundError:
        return
    except (OSError, ValueError, KeyError, TypeError):
        wall_s = 0.0  # a torn heartbeat: the attempt counts, its time is lost
    _note_attempt(run_dir, wall_s, killed=True)


def _attempt_lines(run_dir: Path) -> list[dict[str, Any]]:
    try:
        return [json.loads(line) for line in (run_dir / _ATTEMPTS).read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return []


def _finish(
    run: PlannedRun, status: str, rc: int, started: float, command: list[str], error: str, t0: float
) -> Outcome:
    """Note this attempt (``t0``: its monotonic start) and write the outcome (its wall time summed over
    every attempt)."""
    _note_attempt(run.run_dir, time.monotonic() - t0)
    attempts = _attempt_lines(run.run_dir)
    total = sum(float(a.get("wall_s", 0.0)) for a in attempts)
    outcome = Outcome(status, rc, total, len(attempts), run.arm, run.seed, command, error,  # type: ignore[arg-type]
                      started, time.time())  # fmt: skip
    _write_replacing(run.run_dir / STATUS_FILE, json.dumps(asdict(outcome), indent=1))
    return outcome


class _Children:
    """The running child processes, so an interrupt can terminate them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._procs: set[subprocess.Popen[bytes]] = set()
        self.stopping = False

    def add(self, proc: subprocess.Popen[bytes]) -> None:
        with self._lock:
            self._procs.add(proc)
            late = self.stopping  # started after terminate_all took its snapshot
        if late:
            proc.terminate()

    def discard(self, proc: subprocess.Popen[bytes]) -> None:
        with self._lock:
            self._procs.discard(proc)

    def terminate_all(self) -> None:
        with self._lock:
            self.stopping = True
            procs = list(self._procs)
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def _prepare(run: PlannedRun) -> bool:
    """Make the run dir ready (its lock held); True when the run resumes from its checkpoint (an interrupted
    run, or a failed one retried). A run without a checkpoint starts again from an empty dir, but for the
    lock, the attempts file (the outcome's wall time counts every attempt) and ``train.log`` (appended to)."""
    (run.run_dir / STATUS_FILE).unlink(missing_ok=True)
    _close_killed_attempt(run.run_dir)
    if _has_checkpoint(run.run_dir):
        return True
    for entry in run.run_dir.iterdir():
        if entry.name in (_LOCK, _ATTEMPTS, LOG_FILE):  # (a killed attempt's heartbeat is closed above)
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    return False


def _run_child(
    spec: SweepSpec, run: PlannedRun, threads: int, children: _Children, lock: Any
) -> Outcome | None:
    resume = _prepare(run)
    command = _train_command(spec, run, resume)
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(threads))
    env.setdefault("HF_HUB_OFFLINE", "1")
    t0, started = time.monotonic(), time.time()
    with (run.run_dir / LOG_FILE).open("ab") as log:
        log.write(f"$ {' '.join(command)}\n".encode())
        log.flush()
        proc = subprocess.Popen(  # the child keeps the run's lock (its fd) for as long as it lives
            command, stdout=log, stderr=subprocess.STDOUT, env=env, pass_fds=(lock.fileno(),)
        )
        children.add(proc)
        try:
            rc = _wait_noting(proc, run.run_dir, t0)
        finally:
            children.discard(proc)
    if children.stopping:
        _note_attempt(run.run_dir, time.monotonic() - t0)
        return None  # interrupted: no outcome, the next sweep resumes it
    status = "done" if rc == 0 else "stopped" if rc == _STOPPED_RC else "failed"
    error = "" if rc == 0 else _log_tail(run.run_dir / LOG_FILE)
    return _finish(run, status, rc, started, command, error, t0)


def _wait_noting(proc: subprocess.Popen[bytes], run_dir: Path, t0: float) -> int:
    """Wait for the child, writing the attempt's wall time so far every `_HEARTBEAT_S`."""
    while True:
        _heartbeat(run_dir, time.monotonic() - t0)
        try:
            return proc.wait(timeout=_HEARTBEAT_S)
        except subprocess.TimeoutExpired:
            continue


def _log_tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])


def _run_in_process(spec: SweepSpec, run: PlannedRun) -> Outcome:
    from sao.runtime.runner import RunStopped, train_sync_entry

    resume = _prepare(run)
    command = _train_command(spec, run, resume)
    t0, started = time.monotonic(), time.time()
    status, rc, error = "done", 0, ""
    try:
        train_sync_entry(run.config, resume=resume)
    except RunStopped as err:
        status, rc, error = "stopped", _STOPPED_RC, str(err)
    except Exception as err:
        status, rc, error = "failed", 1, f"{type(err).__name__}: {err}"
    except BaseException:  # Ctrl-C: no outcome (resumed next time), but the attempt's time counts
        _note_attempt(run.run_dir, time.monotonic() - t0)
        raise
    return _finish(run, status, rc, started, command, error, t0)


def run_sweep(
    spec: SweepSpec,
    runs: list[PlannedRun],
    *,
    jobs: int | None = None,
    retry_failed: bool = False,
    in_process: bool = False,
    on_event: Callable[[str, PlannedRun, Outcome | None], None] | None = None,
) -> dict[str, list[PlannedRun]]:
    """Run what is not finished; returns the runs by state after the sweep (``done``, ``stopped``,
    ``failed``, ``skipped``: finished before). ``on_event(kind, run, outcome)`` is called with ``start``,
    ``skip`` and ``end``. Runs sharing a run dir (equal configs) run once."""
    jobs = 1 if in_process else (jobs or spec.jobs)
    threads = max(1, (os.cpu_count() or 1) // jobs)
    notify = on_event or (lambda *_: None)
    result: dict[str, list[PlannedRun]] = {"done": [], "stopped": [], "failed": [], "skipped": []}
    todo = _unfinished(runs, retry_failed, result, notify)
    sweep = _Sweep(spec, retry_failed, in_process, threads, notify, result)
    if in_process:
        for run in todo:
            sweep.run_one(run)
        return result
    pool = ThreadPoolExecutor(max_workers=jobs)
    try:
        futures = [pool.submit(sweep.run_one, run) for run in todo]
        for future in futures:
            future.result()
    except BaseException:
        sweep.children.terminate_all()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown()
    return result


def _unfinished(
    runs: list[PlannedRun],
    retry_failed: bool,
    result: dict[str, list[PlannedRun]],
    notify: Callable[[str, PlannedRun, Outcome | None], None],
) -> list[PlannedRun]:
    """The runs to launch, one per run dir; the others (finished, or running in another sweep) go to
    ``result["skipped"]``, each announced with ``skip``."""
    unique: dict[Path, PlannedRun] = {}
    for run in runs:
        unique.setdefault(run.run_dir, run)
    todo: list[PlannedRun] = []
    for run in unique.values():
        state = run_state(run.run_dir)
        if state in ("done", "stopped", "running") or (state == "failed" and not retry_failed):
            result["skipped"].append(run)
            notify("skip", run, read_outcome(run.run_dir))
        else:
            todo.append(run)
    return todo


@dataclass
class _Sweep:
    """One sweep's launches: each run under its lock, in a child (or in this process), its outcome filed
    into ``result`` by status and announced with ``start`` and ``end``."""

    spec: SweepSpec
    retry_failed: bool
    in_process: bool
    threads: int  # OMP threads of a child run
    notify: Callable[[str, PlannedRun, Outcome | None], None]
    result: dict[str, list[PlannedRun]]
    children: _Children = field(default_factory=_Children)

    def run_one(self, run: PlannedRun) -> Outcome | None:
        """Train ``run`` unless the sweep is stopping or another sweep holds it or finished it meanwhile."""
        if self.children.stopping:
            return None
        with _locked(run.run_dir) as lock:
            before = read_outcome(run.run_dir)
            if lock is None or (before is not None and not (self.retry_failed and before.status == "failed")):
                # another sweep (or its orphaned run) is running it, or it finished meanwhile
                self.result["skipped"].append(run)
                self.notify("skip", run, before)
                return None
            self.notify("start", run, None)
            if self.in_process:
                outcome = _run_in_process(self.spec, run)
            else:
                outcome = _run_child(self.spec, run, self.threads, self.children, lock)
        if outcome is not None:
            self.result[outcome.status].append(run)
            self.notify("end", run, outcome)
        return outcome
