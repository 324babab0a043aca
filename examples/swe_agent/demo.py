"""The mini-swe-agent demo (`make demo-swe`): train a model online on mini-swe-agent's sessions, with nothing
but the harness talking to the run.

1. a tiny model (``sao init-model``) and synthetic instances (``python -m sao.envs.swe_synth``), unless the
   work dir already has them; then a warm start (``--warm-start-steps`` of ``sao sft`` on
   ``make_warm_chats.py``'s conversations in mini-swe-agent's format), so the model writes valid tool calls
   often enough for sessions of several turns (0 skips it: nearly every reply is then a format error);
2. ``sao train CONFIG`` (``data.source: gateway``) and, beside it, ``run_episode.py`` playing the instances
   with mini-swe-agent against the run's server (its URL from ``RUN_DIR/gateway.json``), ``--concurrency``
   episodes at once, until the run ends;
3. the session report, from the run's own files and the harness's episode log: turns, tokens and the
   observation share of the trained trajectories, reward and solve rate, and the books (sessions: admitted
   = rewarded + truncated + abandoned + discarded + open; trajectories: every trained one came from a
   session the harness closed, once). ``--report`` also writes it as JSON.

Only processes and files: like the harness, this script imports nothing of sao.

    python examples/swe_agent/demo.py --work-dir runs/swe_gateway --instances 16 --concurrency 4
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SAO = [sys.executable, "-m", "sao"]
AGENT = [sys.executable, str(HERE / "run_episode.py")]
SESSION_STATES = ("rewarded", "truncated", "abandoned", "discarded", "open", "lost_on_resume")


def _stop(proc: subprocess.Popen | None, timeout: float = 30) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def prepare(work: Path, n: int, seed: int, model: Path | None) -> tuple[Path, Path]:
    """The model and the instance file (built when missing)."""
    if model is None:
        model = work / "base"
        if not (model / "config.json").is_file():
            cmd = [*SAO, "init-model", "--arch", "qwen3", "--size", "test", "--tokenizer", "bpe",
                   "--chat-template", "qwen3", "--out", str(model)]  # fmt: skip
            subprocess.run(cmd, check=True)
    instances = work / "synth" / "instances.jsonl"
    if not instances.is_file():
        cmd = [sys.executable, "-m", "sao.envs.swe_synth", "--out", str(instances.parent), "--n", str(n),
               "--seed", str(seed)]  # fmt: skip
        subprocess.run(cmd, check=True)
    return model, instances


def warm_start(
    work: Path, model: Path, instances: Path, steps: int, seed: int, agent_config: str | None
) -> Path:
    """``model`` after ``steps`` of SFT on mini-swe-agent-shaped conversations (built once per work dir)."""
    out = work / "warm"
    if (out / "config.json").is_file():
        return out
    chats = work / "warm_chats.jsonl"
    cmd = [sys.executable, str(HERE / "make_warm_chats.py"), "--instances", str(instances), "--n", "2000",
           "--seed", str(seed), "--out", str(chats)]  # fmt: skip
    if agent_config:
        cmd += ["--config", agent_config]
    subprocess.run(cmd, check=True)
    cmd = [*SAO, "sft", "--model", str(model), "--data", str(chats), "--out", str(out), "--steps", str(steps),
           "--lr", "3e-3", "--batch-size", "16", "--eval-every", str(max(steps // 2, 1))]  # fmt: skip
    subprocess.run(cmd, check=True)
    return out


def train(args: argparse.Namespace, model: Path, instances: Path, run_dir: Path, log: Path) -> float:
    """``sao train`` in gateway mode with the harness beside it; returns the wall time in seconds."""
    if (run_dir / "gateway.json").exists():
        sys.exit(f"error: {run_dir} already holds a run; remove it first")
    t0 = time.monotonic()
    cmd = [*SAO, "train", args.config, f"logging.run_dir={run_dir}", f"model.path={model}", *args.overrides]
    trainer = subprocess.Popen(cmd)
    agent = None
    try:
        while not (run_dir / "gateway.json").is_file():
            if trainer.poll() is not None:
                sys.exit(f"error: sao train exited with {trainer.returncode} before its gateway started")
            time.sleep(0.2)
        url = json.loads((run_dir / "gateway.json").read_text())["base_url"]
        agent = subprocess.Popen([
            *AGENT, "--base-url", url, "--instances", str(instances), "--concurrency", str(args.concurrency),
            "--seed", str(args.seed), "--log", str(log), "--traj-dir", str(run_dir.parent / "trajectories"),
            *(["--config", args.agent_config] if args.agent_config else []),
        ])  # fmt: skip
        code = trainer.wait()
        if code != 0:
            sys.exit(f"error: sao train exited with {code}")
        if agent.wait(timeout=300) != 0:
            sys.exit(f"error: the harness exited with {agent.returncode}")
    finally:
        for proc in (agent, trainer):
            _stop(proc)
    return time.monotonic() - t0


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def report(run_dir: Path, log: Path, seconds: float) -> dict[str, Any]:
    """The session report (see the module docstring) from the run's and the harness's files."""
    metrics = [r for r in _jsonl(run_dir / "metrics.jsonl") if "gateway/sessions_admitted" in r]
    last = metrics[-1] if metrics else {}
    sessions = {k: int(last.get(f"gateway/sessions_{k}", 0)) for k in ("admitted", *SESSION_STATES)}
    dropped = {
        k.removeprefix("runtime/dropped/"): int(v)
        for k, v in last.items()
        if k.startswith("runtime/dropped/")
    }
    started, trained = int(last.get("runtime/started", 0)), int(last.get("runtime/trained", 0))
    harness = _jsonl(log)
    closed = {
        h["session_id"]: h.get("branches", 0) for h in harness if h["outcome"] in ("rewarded", "truncated")
    }
    episodes = _jsonl(run_dir / "episodes.jsonl")  # one line per trained trajectory
    trained_sessions = {e.get("session_id") for e in episodes}
    books = {
        "started": started,  # trajectories (a session's first request reserves one; extra branches on close)
        "trained": trained,
        "dropped": sum(dropped.values()),
        "pending": started - trained - sum(dropped.values()),  # open sessions and the queue at the last step
        "emitted_by_closed_sessions": sum(closed.values()),  # the harness's count, from the reward replies
        "sessions_balanced": sessions["admitted"] == sum(sessions[k] for k in SESSION_STATES),
        # every trained trajectory came from a session the harness closed, and each once
        "trained_are_closed": trained_sessions <= set(closed) and len(episodes) == trained,
    }
    books["balanced"] = books["sessions_balanced"] and books["trained_are_closed"]
    prompt = [e["prompt_tokens"] for e in episodes]
    gen = [sum(t["gen_tokens"] for t in e["turns"]) for e in episodes]
    obs = [sum(t["obs_tokens"] for t in e["turns"]) for e in episodes]
    total = sum(prompt) + sum(gen) + sum(obs)
    by_session: dict[str, list[dict[str, Any]]] = {}
    for e in episodes:
        by_session.setdefault(e.get("session_id", "?"), []).append(e)
    graded = [h for h in harness if "resolved" in h]
    return {
        "seconds": round(seconds, 1),
        "steps": len(metrics),
        "sessions": sessions,
        "books": {**books, "dropped_by_reason": dropped},
        "trajectories": {
            "trained": len(episodes),
            "sessions": len(by_session),
            "per_session": round(len(episodes) / max(len(by_session), 1), 2),
            "turns_mean": round(_mean([len(e["turns"]) for e in episodes]), 2),
            "turns_max": max((len(e["turns"]) for e in episodes), default=0),
            "reward_mean": round(_mean([e["reward"] for e in episodes]), 3),
        },
        "tokens": {
            "mean": round(total / max(len(episodes), 1), 1),
            "prompt_mean": round(_mean(prompt), 1),
            "generated_mean": round(_mean(gen), 1),
            "observation_mean": round(_mean(obs), 1),
            "observation_share": round((sum(prompt) + sum(obs)) / total, 3) if total else 0.0,
        },
        "harness": {
            "episodes": len(harness),
            "outcomes": dict(Counter(h["outcome"] for h in harness)),
            "exit_statuses": dict(Counter(h["exit_status"] for h in harness)),
            "model_calls_mean": round(_mean([h["model_calls"] for h in harness]), 2),
            "graded": len(graded),
            "solve_rate": round(_mean([float(h["resolved"]) for h in graded]), 3),
            "episode_s_mean": round(_mean([h["seconds"] for h in harness]), 2),
            "grade_s_mean": round(_mean([h["grade_s"] for h in graded]), 2),
        },
    }


def print_report(out: dict[str, Any]) -> None:
    s, b, t, k, h = out["sessions"], out["books"], out["trajectories"], out["tokens"], out["harness"]
    ok = {True: "balanced", False: "NOT balanced"}
    lines = [
        f"mini-swe-agent through the gateway: {out['steps']} steps in {out['seconds'] / 60:.1f} min",
        f"harness: {h['episodes']} episodes {h['outcomes']}; exits {h['exit_statuses']}",
        f"  {h['model_calls_mean']} model calls, {h['episode_s_mean']} s per episode"
        f" (grading {h['grade_s_mean']} s); solve rate {h['solve_rate']:.3f} of {h['graded']} graded",
        f"sessions (run, at the last step): admitted {s['admitted']} = rewarded {s['rewarded']}"
        f" + truncated {s['truncated']}"
        f" + abandoned {s['abandoned']} + discarded {s['discarded']} + open {s['open']}"
        f" -> {ok[b['sessions_balanced']]}",
        f"trajectories (run, at the last step): started {b['started']} = trained {b['trained']}"
        f" + dropped {b['dropped']}"
        f" + pending {b['pending']}; {b['emitted_by_closed_sessions']} emitted by the sessions the harness"
        f" closed; every trained one from such a session, once: {'yes' if b['trained_are_closed'] else 'NO'}",
        f"trained: {t['trained']} trajectories from {t['sessions']} sessions ({t['per_session']} branches"
        f" each), {t['turns_mean']} turns per trajectory (max {t['turns_max']}), reward {t['reward_mean']}",
        f"tokens per trajectory: {k['mean']} (prompt {k['prompt_mean']}, generated {k['generated_mean']},"
        f" observations {k['observation_mean']}); not generated (prompt + observations):"
        f" {k['observation_share']:.1%}",
    ]
    print("\n" + "\n".join(lines))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="configs/swe_gateway.yaml", help="the sao run's config")
    p.add_argument("--work-dir", type=Path, default=Path("runs/swe_gateway"))
    p.add_argument(
        "--model", type=Path, help="checkpoint to train (default: a tiny one built in the work dir)"
    )
    p.add_argument("--instances", type=int, default=16, help="synthetic instances to generate")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warm-start-steps", type=int, default=300, help="SFT steps on tool-call chats (0: none)")
    p.add_argument("--concurrency", type=int, default=4, help="mini-swe-agent episodes in flight")
    p.add_argument("--agent-config", help="mini-swe-agent config (default: run_episode.py's)")
    p.add_argument("--report", type=Path, help="also write the report here (JSON)")
    p.add_argument("overrides", nargs="*", help="extra key=value overrides of sao train")
    args = p.parse_args()
    args.work_dir.mkdir(parents=True, exist_ok=True)
    model, instances = prepare(args.work_dir, args.instances, args.seed, args.model)
    if args.warm_start_steps > 0:
        model = warm_start(
            args.work_dir, model, instances, args.warm_start_steps, args.seed, args.agent_config
        )
    run_dir, log = args.work_dir / "rl", args.work_dir / "agent_episodes.jsonl"
    log.unlink(missing_ok=True)
    seconds = train(args, model, instances, run_dir, log)
    out = report(run_dir, log, seconds)
    print_report(out)
    if args.report is not None:
        args.report.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
