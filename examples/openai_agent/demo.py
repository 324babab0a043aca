"""The gateway demo (`make demo-gateway`): train the OpenAI-SDK agent's model online, with nothing but the
agent talking to the run.

1. before: ``sao serve`` the warm-started model and let ``agent.py --eval`` measure held-out Pass@1;
2. train: ``sao train CONFIG`` (``data.source: gateway``) and, side by side, ``agent.py`` playing training
   tasks against the run's server (its URL from ``RUN_DIR/gateway.json``) until the run ends;
3. after: the same evaluation of the trained checkpoint; then reward over training and the before/after
   table.

Only processes and files: like the agent, this script imports nothing of sao.

    python examples/openai_agent/demo.py --config configs/quickstart_gateway.yaml \\
        --model runs/quickstart_gateway/sft --run-dir runs/quickstart_gateway/rl \\
        --train-tasks runs/quickstart_gateway/train.jsonl --heldout runs/quickstart_gateway/heldout.jsonl
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
AGENT = [sys.executable, str(HERE / "agent.py")]
SAO = [sys.executable, "-m", "sao"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def evaluate(model: str, heldout: str, k: int, out: Path, max_tokens: int) -> dict:
    """Serve ``model`` (not recorded: the agent's eval sessions have no id) and measure Pass@1 on it."""
    port = _free_port()
    cmd = [*SAO, "serve", "--model", model, "--port", str(port), "--max-tokens", str(max_tokens)]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}/v1"
        cmd = [*AGENT, "--base-url", url, "--tasks", heldout, "--eval", "--k", str(k), "--out", str(out)]
        subprocess.run(cmd, check=True)
    finally:
        _stop(server)
    return json.loads(out.read_text())


def train(
    config: str, model: str, run_dir: Path, tasks: str, concurrency: int, overrides: list[str]
) -> float:
    """``sao train`` in gateway mode with the agent beside it; returns the run's wall time in seconds."""
    if (run_dir / "gateway.json").exists():
        sys.exit(f"error: {run_dir} already holds a run; remove it first")
    t0 = time.monotonic()
    cmd = [*SAO, "train", config, f"logging.run_dir={run_dir}", f"model.path={model}",
           f"data.train_file={tasks}", *overrides]  # fmt: skip
    trainer = subprocess.Popen(cmd)
    agent = None
    try:
        while not (run_dir / "gateway.json").is_file():
            if trainer.poll() is not None:
                sys.exit(f"error: sao train exited with {trainer.returncode} before its gateway started")
            time.sleep(0.2)
        url = json.loads((run_dir / "gateway.json").read_text())["base_url"]
        agent = subprocess.Popen(
            [*AGENT, "--base-url", url, "--tasks", tasks, "--concurrency", str(concurrency)]
        )
        code = trainer.wait()
        if code != 0:
            sys.exit(f"error: sao train exited with {code}")
        if agent.wait(timeout=120) != 0:
            sys.exit(f"error: the agent exited with {agent.returncode}")
    finally:
        for proc in (agent, trainer):
            if proc is not None:
                _stop(proc)
    return time.monotonic() - t0


def reward_curve(run_dir: Path, window: int = 10) -> tuple[float, float, int]:
    """Mean ``reward/mean`` of the first and the last ``window`` steps, and the number of steps."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rewards = [r["reward/mean"] for r in rows if "reward/mean" in r]
    first, last = rewards[:window], rewards[-window:]
    return sum(first) / len(first), sum(last) / len(last), len(rewards)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True)
    p.add_argument("--model", required=True, help="the warm-started checkpoint to train")
    p.add_argument("--run-dir", required=True, type=Path)
    p.add_argument("--train-tasks", required=True)
    p.add_argument("--heldout", required=True)
    p.add_argument("--k", type=int, default=4, help="samples per held-out task")
    p.add_argument("--concurrency", type=int, default=32, help="the agent's sessions in flight")
    p.add_argument(
        "--max-tokens", type=int, default=64, help="per turn at evaluation (engine.max_new_tokens)"
    )
    p.add_argument("overrides", nargs="*", help="extra key=value overrides of sao train")
    args = p.parse_args()
    args.run_dir.parent.mkdir(parents=True, exist_ok=True)
    before = evaluate(
        args.model, args.heldout, args.k, args.run_dir.parent / "eval_before.json", args.max_tokens
    )
    seconds = train(args.config, args.model, args.run_dir, args.train_tasks, args.concurrency, args.overrides)
    checkpoints = args.run_dir / "checkpoints"
    actor = checkpoints / (checkpoints / "latest").read_text().strip() / "actor"  # the final step's
    after = evaluate(
        str(actor), args.heldout, args.k, args.run_dir.parent / "eval_after.json", args.max_tokens
    )
    first, last, steps = reward_curve(args.run_dir)
    gain = 100 * (after["pass@1"] - before["pass@1"])
    print()
    print(f"training reward (the agent's sessions): first 10 steps {first:.3f} -> last 10 steps {last:.3f}")
    print(f"{'':18} {'Pass@1':>8} {'pass@' + str(args.k):>8}   ({before['tasks']} held-out tasks x {args.k})")
    print(f"{'before (warm start)':18} {before['pass@1']:8.3f} {before['pass@k']:8.3f}")
    print(f"{'after ' + str(steps) + ' steps':18} {after['pass@1']:8.3f} {after['pass@k']:8.3f}")
    print(f"Pass@1 {gain:+.1f} points; training with the agent took {seconds / 60:.1f} min ({actor})")


if __name__ == "__main__":
    main()
