"""Check, before a testbed's sweep, that its warm start wins often enough for RL to have a signal.

Evaluates ``--model`` on the held-out file of the testbed's base config (``data.eval_file``) exactly as the
runs' in-training evaluations do (their settings, built by the same function from the config: env and
env kwargs, turn and token limits, ``eval.k`` samples per task, temperature; only the sampling seed is the
gate's own), and passes when Pass@1 lies in [``--min-pass``, ``--max-pass``]: a
warm start that never wins gives every episode reward 0 (nothing to learn from), one that nearly always
wins leaves nothing to improve. Prints the figure and exits 1 when it is out of the band; with ``--out`` it
writes the report as JSON only when the check passes (make's target: no file, no sweep).

    .venv/bin/python experiments/warm_start_gate.py --config experiments/base/grid_walk.yaml \\
        --model runs/experiments/grid/sft --min-pass 0.05 --max-pass 0.5
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from sao.config.loading import load_config
from sao.eval import run_eval
from sao.runtime.factory_args import eval_args


def held_out_pass1(config_path: Path, model: Path, seed: int) -> tuple[float, dict]:
    """Pass@1 of ``model`` on the config's held-out file, and the evaluation's settings."""
    cfg = load_config(config_path, [f"model.path={model}"])
    if cfg.data.eval_file is None:
        raise SystemExit(f"{config_path}: data.eval_file is not set; the gate evaluates on the held-out file")
    # The in-training evaluator's own settings (`eval_args`), with the gate's sampling seed.
    args = eval_args(cfg.data, cfg.eval, cfg.logging, cfg.engine, cfg.runtime)
    settings = dataclasses.replace(args.settings, seed=seed)
    report = run_eval(model, list(args.files), settings, device="cpu", dtype="float32")
    return float(report["overall"]["pass@1"]), report["settings"]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", type=Path, required=True, help="the testbed's base config")
    parser.add_argument("--model", type=Path, required=True, help="the warm start")
    parser.add_argument("--min-pass", type=float, required=True)
    parser.add_argument("--max-pass", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=321)
    parser.add_argument("--out", type=Path, help="write the report as JSON here when the check passes")
    args = parser.parse_args()
    pass1, settings = held_out_pass1(args.config, args.model, args.seed)
    ok = args.min_pass <= pass1 <= args.max_pass
    print(f"{args.model}: held-out Pass@1 {pass1:.3f} -> {'passes' if ok else 'FAILS'} the gate "
          f"[{args.min_pass}, {args.max_pass}]")  # fmt: skip
    if args.out and ok:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        report = {"pass@1": pass1, "band": [args.min_pass, args.max_pass], "settings": settings}
        args.out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
