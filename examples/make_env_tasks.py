"""Write an environment's generated tasks to a JSONL task file (for `sao eval --tasks`).

    python examples/make_env_tasks.py --env calculator --n 64 --seed 123 --out runs/demo/calc_eval.jsonl

Works for the built-in environments that generate their tasks (`calculator`, `guess_number`,
`style_shift`): each module's ``make_tasks(n, seed)``.
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

from sao.envs.tasks import save_tasks_jsonl

GENERATED = ("calculator", "guess_number", "style_shift")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--env", choices=GENERATED, required=True)
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--seed", type=int, default=123, help="use a seed the SFT data did not use")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    tasks = importlib.import_module(f"sao.envs.{args.env}").make_tasks(args.n, seed=args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save_tasks_jsonl(args.out, tasks)
    print(f"wrote {len(tasks)} {args.env} tasks to {args.out}")


if __name__ == "__main__":
    main()
