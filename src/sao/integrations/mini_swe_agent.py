"""A mini-swe-agent environment that runs every command inside sao's sandbox, on a SWE-style instance.

mini-swe-agent (``pip install mini-swe-agent``) builds its environment from its own config, by import
path; nothing of sao is imported by the harness except this module::

    environment:
      environment_class: sao.integrations.mini_swe_agent.SandboxEnvironment
      instances: runs/swe/instances.jsonl     # sao's instance JSONL (SWE-bench fields + repo_path)
      instance_id: synth__ledger-0003         # set per episode
      timeout: 30                             # seconds per command

`SandboxEnvironment` follows mini-swe-agent's environment interface (that of its ``LocalEnvironment``):
``execute(action, cwd="", *, timeout=None) -> {"output", "returncode", "exception_info"[, "extra"]}``,
``get_template_vars()``, ``serialize()`` and ``cleanup()``; its config is a pydantic model as theirs are
(`SandboxEnvironmentConfig`, unknown keys refused). On construction it opens the instance's workspace
(`sao.envs.swe_workspace.open_workspace`: the repository at ``base_commit`` as a one-commit git repository
in a bubblewrap sandbox) and keeps it across the episode's commands.

Each command is run by ``bash -c`` in the workspace (or ``cwd``), stderr merged into stdout, with the
sandbox's guarantees: no network, no host files beyond the read-only system dirs and sao's interpreter,
bounded time / memory / output, no process outliving its command. A command that times out, overruns its
output or runs out of memory comes back as an observation (``returncode`` -1 and ``exception_info``
saying why), never as an exception; only the submit command raises (mini-swe-agent's ``Submitted``): a
command whose output's first line is ``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` and exits 0, exactly as in
mini-swe-agent's own environments. ``get_template_vars`` has the config and the platform, never the host
process's environment variables.

Beyond the interface, ``grade()`` scores the workspace's current state with the instance's hidden tests
(`sao.envs.swe_grading.grade`), for the episode runner to post as the session's reward.
"""

from __future__ import annotations

import functools
import platform
import threading
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sao.envs.swe_instance import SWEInstance, SWEInstanceError, load_instances
from sao.envs.swe_workspace import DEFAULT_OUTPUT_LIMIT, Workspace, open_workspace

try:
    from minisweagent.exceptions import Submitted
except ImportError as _err:  # pragma: no cover - exercised only without the package
    raise ImportError(
        "sao.integrations.mini_swe_agent is a mini-swe-agent environment: pip install mini-swe-agent"
    ) from _err

__all__ = ["SUBMIT_MARKER", "SandboxEnvironment", "SandboxEnvironmentConfig", "find_instance"]

SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"  # mini-swe-agent's submit line
_GRADE_OUTPUT_CHARS = 4000  # tail of the hidden-test run kept in grade()'s result
# $1: directory, $2: the command. stderr joins stdout so the model sees them interleaved, as with
# mini-swe-agent's LocalEnvironment (stderr=STDOUT); the command runs as its own `bash -c` script.
_RUN_IN = 'cd -- "$1" || exit 1\nexec 2>&1\nexec bash -c "$2"'


class SandboxEnvironmentConfig(BaseModel):
    """The ``environment`` section of a mini-swe-agent config (besides ``environment_class``)."""

    model_config = ConfigDict(extra="forbid")

    instances: str = Field(description="sao's SWE instance file (JSONL, SWE-bench field names + repo_path).")
    instance_id: str = Field(description="The instance this episode plays (its instance_id in the file).")
    repos_dir: str | None = Field(
        None, description="Where relative repo_path values resolve; null = the instance file's directory."
    )
    cwd: str = Field(
        "", description="Directory commands start in, relative to the workspace ('' = its root)."
    )
    env: dict[str, str] = Field(default_factory=dict, description="Environment variables of every command.")
    timeout: float = Field(30.0, gt=0, description="Wall-clock seconds per command; over it, killed.")
    memory_mb: int = Field(2048, ge=16, description="Address-space limit per process of a command, in MiB.")
    output_limit: int = Field(
        DEFAULT_OUTPUT_LIMIT, ge=1, description="Bytes of output a command may print before it is killed."
    )
    grade_timeout_s: float = Field(300.0, gt=0, description="Wall-clock seconds of grade()'s test run.")


@functools.lru_cache(maxsize=16)
def _instances(path: str, mtime_ns: int, repos_dir: str | None) -> dict[str, SWEInstance]:
    return {inst.instance_id: inst for inst in load_instances(path, repos_dir)}


def find_instance(path: str, instance_id: str, repos_dir: str | None = None) -> SWEInstance:
    """``instance_id`` of the instance file ``path`` (files are read once per modification).

    Raises:
        SWEInstanceError: the file is missing or invalid, or has no such instance.
    """
    file = Path(path)
    if not file.is_file():
        raise SWEInstanceError(f"instance file {path!r} does not exist")
    table = _instances(str(file.resolve()), file.stat().st_mtime_ns, repos_dir)
    if instance_id not in table:
        raise SWEInstanceError(f"{path}: no instance {instance_id!r} ({len(table)} instances in the file)")
    return table[instance_id]


class SandboxEnvironment:
    """mini-swe-agent's environment interface over one instance's workspace sandbox (see the module doc)."""

    def __init__(self, *, config_class: type = SandboxEnvironmentConfig, **kwargs: Any):
        self.config = config_class(**kwargs)
        self.instance = find_instance(self.config.instances, self.config.instance_id, self.config.repos_dir)
        self.workspace: Workspace = open_workspace(
            self.instance,
            timeout_s=self.config.timeout,
            memory_mb=self.config.memory_mb,
            output_limit=self.config.output_limit,
        )
        self.sandbox = self.workspace.sandbox
        self._lock = threading.Lock()  # a sandbox runs one command at a time

    def execute(self, action: dict, cwd: str = "", *, timeout: float | None = None) -> dict[str, Any]:
        """Run ``action["command"]`` in the workspace; raises ``Submitted`` for the submit command."""
        command = action.get("command", "")
        if not isinstance(command, str):
            raise ValueError(f"action['command'] must be a string, got {type(command).__name__}")
        limit = timeout or self.config.timeout
        env = [f"{key}={value}" for key, value in self.config.env.items()]
        argv = ["env", *env, "bash", "-c", _RUN_IN, "mswea", cwd or self.config.cwd or ".", command]
        with self._lock:
            result = self.sandbox.run(argv, timeout_s=limit)
        output: dict[str, Any] = {
            "output": result.stdout + result.stderr,  # stderr: only the sandbox's own notes
            "returncode": result.exit_code if result.exit_code is not None else -1,
            "exception_info": "",
        }
        why = _failure(result, limit, self.config.output_limit)
        if why is not None:
            output["returncode"] = -1
            output["exception_info"] = why
            output["extra"] = {"exception_type": _kind(result), "exception": why}
        self._check_finished(output)
        return output

    def _check_finished(self, output: dict[str, Any]) -> None:
        """Raise ``Submitted`` when the output's first line is the submit marker and the command exited 0."""
        lines = output.get("output", "").lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT_MARKER and output["returncode"] == 0:
            submission = "".join(lines[1:])
            raise Submitted(
                {
                    "role": "exit",
                    "content": submission,
                    "extra": {"exit_status": "Submitted", "submission": submission},
                }
            )

    def grade(self, timeout_s: float | None = None) -> dict[str, Any]:
        """Score the workspace as it is now with the hidden tests (`sao.envs.swe_grading.grade`).

        Returns a JSON-ready dict: ``resolved``, ``fail_to_pass`` / ``pass_to_pass`` (node id: status),
        ``error`` (why the tests could not run, or None) and ``output`` (the test run's tail).
        """
        with self._lock:
            result = self.workspace.grade(timeout_s or self.config.grade_timeout_s)
        return {
            "resolved": result.resolved,
            "fail_to_pass": dict(result.fail_to_pass),
            "pass_to_pass": dict(result.pass_to_pass),
            "error": result.error,
            "output": result.output[-_GRADE_OUTPUT_CHARS:],
        }

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        """The config, the platform (``system``, ``release``, ``machine``, ...), the instance's ids and the
        workspace path; never the host process's environment."""
        inst = self.instance
        own = {"instance_id": inst.instance_id, "repo": inst.repo, "workspace": str(self.sandbox.root)}
        return {**self.config.model_dump(), **platform.uname()._asdict(), **own, **kwargs}

    def serialize(self) -> dict[str, Any]:
        return {
            "info": {
                "config": {
                    "environment": self.config.model_dump(mode="json"),
                    "environment_type": f"{type(self).__module__}.{type(self).__name__}",
                }
            }
        }

    def cleanup(self) -> None:
        """Kill what is left and remove the workspace; idempotent."""
        workspace = getattr(self, "workspace", None)  # absent when the constructor failed
        if workspace is not None:
            workspace.close()

    def __del__(self) -> None:
        self.cleanup()


def _failure(result: Any, limit: float, output_limit: int) -> str | None:
    """Why a command did not finish on its own (a sentence for the model), or None."""
    if result.timed_out:
        return f"The command timed out after {limit:g} s and was killed (output so far is shown)."
    if result.truncated:
        return f"The command printed more than {output_limit} bytes and was killed (output so far is shown)."
    if result.oom:
        return "The command ran out of memory and was killed."
    if result.exit_code is None:
        return "The command could not be run."
    return None


def _kind(result: Any) -> str:
    if result.timed_out:
        return "TimeoutExpired"
    if result.truncated:
        return "OutputLimitExceeded"
    return "MemoryError" if result.oom else "SandboxError"
