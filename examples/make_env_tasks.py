"""Write an environment's generated tasks to a JSONL task file (for `sao eval --tasks`).

    python examples/make_env_tasks.py --env calculator --n 64 --seed 123 --out runs/demo/calc_eval.jsonl

Works for every environment that generates its own tasks (`sao.envs.make_env_tasks`): the built-in
`calculator`, `guess_number`, `long_tail` and `style_shift`, and user envs (``path/to/env.py:MyEnv`` or
``package.module:MyEnv``) whose class defines ``make_tasks(n, seed)``; the library adapters take their
configuration as ``--env-kwargs`` (the run's ``data.env_kwargs``), e.g.

    python examples/make_env_tasks.py --env reasoning_gym --n 200 --seed 123 --out rg_eval.jsonl \\
        --env-kwargs '{"datasets": ["chain_sum", "basic_arithmetic"]}'
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sao.envs import EnvError, make_env_tasks
from sao.envs.tasks import save_tasks_jsonl


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--env", required=True, help="a registered name or a file.py:Class / module:Class")
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--seed", type=int, default=123, help="use a seed the SFT data did not use")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--env-kwargs", type=json.loads, default={},
        help="JSON object: the env's constructor arguments (data.env_kwargs), e.g. reasoning-gym's datasets",
    )  # fmt: skip
    args = parser.parse_args()
    if not isinstance(args.env_kwargs, dict):
        sys.exit("error: --env-kwargs must be a JSON object")
    try:
        tasks = make_env_tasks(args.env, args.n, args.seed, **args.env_kwargs)
    except EnvError as err:
        sys.exit(f"error: {err}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save_tasks_jsonl(args.out, tasks)
    print(f"wrote {len(tasks)} {args.env} tasks to {args.out}")


if __name__ == "__main__":
    main()
