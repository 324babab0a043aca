"""Run mini-swe-agent episodes against a sao run's gateway, grade each with the hidden tests, post the reward.

One episode is mini-swe-agent's own agent (``DefaultAgent``, unmodified, from PyPI), built from its own
config (``mini_swe_agent.yaml`` beside this file, merged with ``-c key=value`` specs as its CLI does):

- its model (litellm, OpenAI-compatible provider) gets ``model_kwargs.api_base`` = the run's base URL and
  ``model_kwargs.extra_headers`` = ``X-Session-Id`` (a fresh id per episode: the gateway records the session
  under it) and ``X-Task-Id`` (the instance id: the trajectories' prompt id);
- its environment is loaded by mini-swe-agent from ``environment.environment_class`` =
  ``sao.integrations.mini_swe_agent.SandboxEnvironment`` with ``environment.instances`` /
  ``environment.instance_id`` set per episode: every command runs in sao's sandbox on the instance's
  workspace;
- when the agent stops (submitted, step limit, repeated format errors, an error), the workspace is graded
  with the instance's hidden tests (``env.grade()``: reward 1.0 when every FAIL_TO_PASS and PASS_TO_PASS test
  passes, else 0.0; graded as it stands whether or not the agent submitted, as sao's own ``swe`` env does),
  and the reward posted: ``POST {base_url}/sessions/{id}/reward``.

This process imports nothing of sao itself: the only sao code in it is the environment module that
mini-swe-agent imports by path. Episodes run in ``--concurrency`` threads (as mini-swe-agent's own batch
runner does) for ``--episodes`` episodes, or, without it, until the run's gateway goes away or answers
that the run has finished. One JSON line per episode goes to ``--log``.

    python examples/swe_agent/run_episode.py --base-url http://127.0.0.1:8000/v1 \\
        --instances runs/swe_gateway/synth/instances.jsonl --concurrency 4 --log runs/swe_gateway/agent.jsonl
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import sys
import threading
import time
import traceback
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# mini-swe-agent's and litellm's own settings, before they are imported: no banner, no price lookup for a
# model litellm does not know (the run's), no fetch of litellm's price list (no network needed), and few
# retries of a failed model call (the gateway answers 4xx for requests it will never accept).
os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
os.environ.setdefault("MSWEA_COST_TRACKING", "ignore_errors")
os.environ.setdefault("MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT", "2")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm
import requests
from minisweagent.agents import get_agent
from minisweagent.config import get_config_from_spec
from minisweagent.environments import get_environment
from minisweagent.models import get_model
from minisweagent.utils.serialize import recursive_merge

HERE = Path(__file__).resolve().parent
DEFAULT_CONFIG = HERE / "mini_swe_agent.yaml"
MAX_FAILURES_IN_A_ROW = 20  # episodes that recorded nothing, one after another: stop rather than spin
_FINISHED_SIGNS = ("run_finished", "training run has finished")
litellm.suppress_debug_info = True


@dataclass(frozen=True)
class Instance:
    instance_id: str
    problem_statement: str


@dataclass
class Books:
    """The harness's side of the books; updated under ``lock`` from the worker threads."""

    started: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)  # rewarded / truncated / not_recorded / ...
    resolved: int = 0
    failures_in_a_row: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def load_instances(path: Path, ids: list[str] | None) -> list[Instance]:
    """The instances of sao's JSONL file (only the two fields the harness needs), in file order."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    found = [Instance(r["instance_id"], r["problem_statement"]) for r in rows]
    if ids:
        known = {inst.instance_id: inst for inst in found}
        missing = [i for i in ids if i not in known]
        if missing:
            sys.exit(f"error: {path} has no instance {missing[0]!r}")
        found = [known[i] for i in ids]
    if not found:
        sys.exit(f"error: {path} has no instances")
    return found


def episode_config(base: dict, *, base_url: str, session_id: str, inst: Instance, args: Any) -> dict:
    """mini-swe-agent's config for one episode: ``base`` with the gateway, the session and the instance."""
    per_episode: dict[str, Any] = {
        "model": {
            "model_kwargs": {
                "api_base": base_url,
                "extra_headers": {"X-Session-Id": session_id, "X-Task-Id": inst.instance_id},
            }
        },
        "environment": {"instances": str(args.instances.resolve()), "instance_id": inst.instance_id},
    }
    if args.traj_dir is not None:
        per_episode["agent"] = {"output_path": str(args.traj_dir / f"{session_id}.traj.json")}
    return recursive_merge(base, per_episode)


def post_reward(base_url: str, session_id: str, reward: float, metadata: dict) -> tuple[str, dict]:
    """Close the session: ``(outcome, reply)``; outcome ``rewarded``, ``truncated`` (the gateway had closed
    it: 409), ``not_recorded`` (404: no request of it was recorded, or it was abandoned) or ``error``."""
    body = {"reward": reward, "metadata": metadata}
    reply = requests.post(f"{base_url}/sessions/{session_id}/reward", json=body, timeout=60)
    detail = _json(reply)
    if reply.status_code == 200:
        return "rewarded", detail
    if reply.status_code == 409:
        return "truncated", detail
    if reply.status_code == 404:
        return "not_recorded", detail
    return "error", detail


def _json(reply: requests.Response) -> dict:
    try:
        out = reply.json()
    except ValueError:
        return {"text": reply.text[:500]}
    return out if isinstance(out, dict) else {"body": out}


def gateway_state(base_url: str) -> str:
    """``up``, or ``gone`` when nothing answers at ``base_url``."""
    try:
        requests.get(f"{base_url}/models", timeout=10)
    except requests.RequestException:
        return "gone"
    return "up"


def run_episode(base: dict, base_url: str, inst: Instance, session_id: str, args: Any) -> dict[str, Any]:
    """One episode (see the module docstring); returns its record. Raises nothing but KeyboardInterrupt."""
    config = episode_config(base, base_url=base_url, session_id=session_id, inst=inst, args=args)
    record: dict[str, Any] = {"session_id": session_id, "instance_id": inst.instance_id}
    t0 = time.monotonic()
    env = agent = None
    try:
        env = get_environment(config["environment"])
        agent = get_agent(get_model(config=config["model"]), env, config["agent"], default_type="default")
        info = agent.run(inst.problem_statement)
        record["exit_status"] = info.get("exit_status", "")
    except Exception as err:  # the model calls failed (gateway refused, gone): the agent re-raises
        record["exit_status"] = type(err).__name__
        record["error"] = str(err)[:500]
        if env is None:
            record["traceback"] = traceback.format_exc()[-2000:]
    record["model_calls"] = agent.n_calls if agent is not None else 0
    record["agent_s"] = round(time.monotonic() - t0, 3)
    try:
        if env is None:
            record["outcome"] = "no_workspace"
            return record
        if any(sign in record.get("error", "") for sign in _FINISHED_SIGNS):
            record["outcome"] = "run_finished"
            return record
        if "error" in record and gateway_state(base_url) == "gone":  # the run ended under the episode
            record["outcome"] = "server_gone"
            return record
        t1 = time.monotonic()
        graded = env.grade()
        record["grade_s"] = round(time.monotonic() - t1, 3)
        record["resolved"] = graded["resolved"]
        record["grade_error"] = graded["error"]
        reward = 1.0 if graded["resolved"] else 0.0
        record["reward"] = reward
        meta = {
            "harness": "mini-swe-agent",
            "exit_status": record["exit_status"],
            "resolved": graded["resolved"],
        }
        try:
            record["outcome"], reply = post_reward(base_url, session_id, reward, meta)
        except requests.RequestException as err:
            record["outcome"], reply = "server_gone", {"error": str(err)[:300]}
        trajs = reply.get("trajectories") or []
        record["branches"] = len(trajs)
        record["tokens"] = [t.get("num_tokens") for t in trajs]
        if record["outcome"] not in ("rewarded", "server_gone"):
            record["reply"] = reply
        return record
    finally:
        if env is not None:
            env.cleanup()
        record["seconds"] = round(time.monotonic() - t0, 3)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", required=True, help="the run's base URL (RUN_DIR/gateway.json's base_url)")
    p.add_argument("--instances", required=True, type=Path, help="sao's SWE instance file (JSONL)")
    p.add_argument("--instance-id", action="append", help="play only these instances (repeatable)")
    p.add_argument("--config", default=str(DEFAULT_CONFIG), help="mini-swe-agent config file (YAML)")
    p.add_argument("-c", dest="specs", action="append", default=[], help="mini-swe-agent key=value spec")
    p.add_argument("--episodes", type=int, help="stop after this many (default: until the run ends)")
    p.add_argument("--concurrency", type=int, default=4, help="episodes in flight (threads)")
    p.add_argument("--seed", type=int, default=0, help="the order instances are played in")
    p.add_argument("--log", type=Path, help="append one JSON line per episode here")
    p.add_argument("--traj-dir", type=Path, help="save mini-swe-agent's trajectory of each episode here")
    args = p.parse_args()
    base_url = args.base_url.rstrip("/")
    base = recursive_merge(*(get_config_from_spec(spec) for spec in [args.config, *args.specs]))
    instances = load_instances(args.instances, args.instance_id)
    random.Random(args.seed).shuffle(instances)
    order = itertools.cycle(instances)
    tag = uuid.uuid4().hex[:8]
    books, stop = Books(), threading.Event()
    log_lock = threading.Lock()
    if args.log is not None:
        args.log.parent.mkdir(parents=True, exist_ok=True)

    def next_episode() -> tuple[Instance, str] | None:
        with books.lock:
            if stop.is_set() or (args.episodes is not None and books.started >= args.episodes):
                return None
            books.started += 1
            inst = next(order)
            return inst, f"mswea-{tag}-{books.started:05d}-{inst.instance_id}"

    def worker() -> None:
        while (job := next_episode()) is not None:
            inst, sid = job
            record = run_episode(base, base_url, inst, sid, args)
            outcome = record["outcome"]
            with books.lock:
                books.outcomes[outcome] = books.outcomes.get(outcome, 0) + 1
                books.resolved += bool(record.get("resolved"))
                recorded = outcome in ("rewarded", "truncated")
                books.failures_in_a_row = 0 if recorded else books.failures_in_a_row + 1
                too_many = books.failures_in_a_row >= MAX_FAILURES_IN_A_ROW
            if args.log is not None:
                with log_lock, args.log.open("a") as f:
                    f.write(json.dumps(record) + "\n")
            print(
                f"{sid}: {record['exit_status']}, {record['model_calls']} calls, {outcome}, "
                f"reward {record.get('reward')}, {record['seconds']:.1f} s",
                flush=True,
            )
            if outcome in ("run_finished", "server_gone") or (
                not recorded and gateway_state(base_url) == "gone"
            ):
                stop.set()
            if too_many:
                print(
                    f"stopping: {MAX_FAILURES_IN_A_ROW} episodes in a row recorded nothing", file=sys.stderr
                )
                stop.set()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(args.concurrency)]
    for t in threads:
        t.start()
    try:
        for t in threads:
            t.join()
    except KeyboardInterrupt:
        stop.set()
    outcomes = ", ".join(f"{k} {v}" for k, v in sorted(books.outcomes.items())) or "none"
    print(f"episodes started {books.started}: {outcomes}; resolved {books.resolved}", flush=True)


if __name__ == "__main__":
    main()
