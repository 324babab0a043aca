"""Write arithmetic-with-a-calculator-tool conversations for an SFT warm start (JSONL, one per line).

Each conversation: the user asks for ``a op b``; the assistant calls the tool with ``<tool_call>``; the tool
answers; the assistant states the result. A share of the conversations skip the tool and answer directly
(sometimes wrongly), so the warm-started model is competent but imperfect, as an RL starting point should be.

    python examples/make_tool_chats.py --n 200 --out runs/demo/chats.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path


def conversation(rng: random.Random, direct_frac: float) -> list[dict[str, str]]:
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    op = rng.choice("+-*")
    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    user = {"role": "user", "content": f"What is {a} {op} {b}?"}
    if rng.random() < direct_frac:  # no tool: right or off by a little
        guess = value if rng.random() < 0.5 else value + rng.choice((-2, -1, 1, 2))
        return [user, {"role": "assistant", "content": f"The answer is {guess}."}]
    return [
        user,
        {"role": "assistant", "content": f"<tool_call>{a} {op} {b}</tool_call>"},
        {"role": "tool", "content": str(value)},
        {"role": "assistant", "content": f"The answer is {value}."},
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=200, help="number of conversations")
    parser.add_argument("--direct-frac", type=float, default=0.2, help="share answered without the tool")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", encoding="utf-8") as f:
        for _ in range(args.n):
            f.write(json.dumps({"messages": conversation(rng, args.direct_frac)}) + "\n")
    print(f"wrote {args.n} conversations to {args.out}")


if __name__ == "__main__":
    main()
