"""Write calculator-tool conversations for an SFT warm start (JSONL, ``{"messages": [...]}`` per line).

Delegates to `sao.envs.sft_data.calculator_conversations`: episodes played against the ``calculator``
environment, so the warm start learns exactly the env's formats (``<tool_call>{"name": "calc", ...}``,
``answer: <n>``). A share answers directly without the tool (sometimes wrongly), so the warm-started model
is competent but imperfect, as an RL starting point should be.

    python examples/make_tool_chats.py --n 200 --out runs/demo/chats.jsonl
    python examples/make_tool_chats.py --n 200 --tools --out runs/demo/chats.jsonl   # schema in the prompt
    python examples/make_tool_chats.py --n 200 --think --out runs/demo/chats.jsonl   # <think> first
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sao.envs import calculator
from sao.envs.sft_data import calculator_conversations, write_jsonl


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=200, help="number of conversations")
    parser.add_argument("--direct-frac", type=float, default=0.2, help="share answered without the tool")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--tools",
        action="store_true",
        help="show the calc tool's schema in every prompt (as an OpenAI-SDK agent's tools=[...] does)",
    )
    parser.add_argument(
        "--think",
        action="store_true",
        help="open every assistant turn with a short <think> block (for a thinking template such as qwen3)",
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    conversations = calculator_conversations(
        args.n, args.seed, direct_frac=args.direct_frac, think=args.think
    )
    count = write_jsonl(conversations, args.out, tools=[calculator.TOOL_SCHEMA] if args.tools else None)
    print(f"wrote {count} conversations to {args.out}")


if __name__ == "__main__":
    main()
