"""Write calculator-tool conversations for an SFT warm start (JSONL, ``{"messages": [...]}`` per line).

Delegates to `sao.envs.sft_data.calculator_conversations`: episodes played against the ``calculator``
environment, so the warm start learns exactly the env's formats (``<tool_call>{"name": "calc", ...}``,
``answer: <n>``). A share answers directly without the tool (sometimes wrongly), so the warm-started model
is competent but imperfect, as an RL starting point should be.

    python examples/make_tool_chats.py --n 200 --out runs/demo/chats.jsonl
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sao.envs.sft_data import calculator_conversations, write_jsonl


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=200, help="number of conversations")
    parser.add_argument("--direct-frac", type=float, default=0.2, help="share answered without the tool")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    count = write_jsonl(calculator_conversations(args.n, args.seed, direct_frac=args.direct_frac), args.out)
    print(f"wrote {count} conversations to {args.out}")


if __name__ == "__main__":
    main()
