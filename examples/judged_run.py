"""A run whose reward comes from an LLM judge in a separate process, killed and restarted mid-run.

    python examples/judged_run.py --judge runs/judge/sft --config configs/judge_reasoning_gym.yaml \
        --run-dir runs/judge/rl --kill-at-step 8 --down-s 20

1. serves the judge checkpoint with ``sao serve --port PORT`` (a process of its own);
2. starts ``sao train CONFIG judge.url=http://127.0.0.1:PORT`` (another process);
3. when the run has logged ``--kill-at-step`` steps, kills the judge (SIGKILL), waits ``--down-s`` seconds
   and serves it again on the same port;
4. when training ends, prints per step the reward, the judge's counters (``judge/*``) and the episodes
   dropped as ``judge_error``, and writes them to ``RUN_DIR/judged_run.json``.

While the judge is down, every episode that finishes fails its grade after the judge's retries and is
dropped as ``judge_error`` (never trained on a made-up reward); the run goes on, and grading resumes when
the judge is back. Exits non-zero when the run failed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

BIN = Path(sys.executable).parent


def serve_judge(model: str, port: int, log: Path) -> subprocess.Popen[bytes]:
    """``sao serve`` of the judge on ``port``; returns once it answers (or raises)."""
    cmd = [str(BIN / "sao"), "serve", "--model", model, "--port", str(port), "--max-tokens", "24",
           "--device", "cpu", "--dtype", "float32", "--max-running", "16"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=log.open("ab"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the judge server exited with {proc.returncode}; see {log}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"the judge server did not answer within 120 s; see {log}")


def logged_steps(metrics: Path) -> list[dict[str, Any]]:
    if not metrics.exists():
        return []
    rows = []
    for line in metrics.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # a line being written
            continue
        if "reward/mean" in row:
            rows.append(row)
    return rows


def summary(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    keys = ("reward/mean", "judge/grades", "judge/requests", "judge/failures", "judge/failures/transport",
            "judge/retries", "judge/latency_mean_s", "judge/latency_max_s",
            "runtime/dropped/judge_error")  # fmt: skip
    return [{"step": r["step"], **{k: r.get(k, 0.0) for k in keys}} for r in steps]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--judge", required=True, help="the judge's checkpoint directory")
    parser.add_argument("--config", default="configs/judge_reasoning_gym.yaml")
    parser.add_argument("--run-dir", type=Path, default=Path("runs/judge/rl"))
    parser.add_argument("--port", type=int, default=8011)
    parser.add_argument("--kill-at-step", type=int, default=8, help="kill the judge once this step is logged")
    parser.add_argument("--down-s", type=float, default=20.0, help="seconds the judge stays down")
    parser.add_argument("overrides", nargs="*", help="more dotted config overrides for sao train")
    args = parser.parse_args()
    shutil.rmtree(args.run_dir, ignore_errors=True)
    args.run_dir.mkdir(parents=True)
    log = args.run_dir.parent / f"{args.run_dir.name}_judge.log"
    judge = serve_judge(args.judge, args.port, log)
    train = subprocess.Popen([
        str(BIN / "sao"), "train", args.config, f"judge.url=http://127.0.0.1:{args.port}",
        f"logging.run_dir={args.run_dir}", *args.overrides,
    ], env={**os.environ, "HF_HUB_OFFLINE": "1"})  # fmt: skip
    events: dict[str, Any] = {}
    try:
        while train.poll() is None:
            steps = logged_steps(args.run_dir / "metrics.jsonl")
            if "killed_after_step" not in events and steps and steps[-1]["step"] >= args.kill_at_step:
                judge.send_signal(signal.SIGKILL)
                judge.wait()
                events["killed_after_step"] = steps[-1]["step"]
                print(f"[judged_run] judge killed after step {steps[-1]['step']}", flush=True)
                time.sleep(args.down_s)
                judge = serve_judge(args.judge, args.port, log)
                events["back_after_step"] = logged_steps(args.run_dir / "metrics.jsonl")[-1]["step"]
                print(f"[judged_run] judge back after step {events['back_after_step']}", flush=True)
            time.sleep(0.5)
    finally:
        judge.terminate()
        judge.wait()
    rows = summary(logged_steps(args.run_dir / "metrics.jsonl"))
    report = {"train_returncode": train.returncode, **events, "down_s": args.down_s, "steps": rows}
    (args.run_dir / "judged_run.json").write_text(json.dumps(report, indent=1))
    print(f"{'step':>4} {'reward':>7} {'grades':>7} {'fails':>6} {'judge_err':>9} {'lat_mean_s':>10}")
    for r in rows:
        print(f"{r['step']:>4} {r['reward/mean']:>7.3f} {r['judge/grades']:>7.0f} "
              f"{r['judge/failures']:>6.0f} {r['runtime/dropped/judge_error']:>9.0f} "
              f"{r['judge/latency_mean_s']:>10.3f}")  # fmt: skip
    print(json.dumps({k: v for k, v in report.items() if k != "steps"}))
    sys.exit(train.returncode)


if __name__ == "__main__":
    main()
