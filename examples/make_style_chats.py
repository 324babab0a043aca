"""Write style_shift conversations for an SFT warm start (JSONL, ``{"messages": [...]}`` per line).

Delegates to `sao.envs.sft_data.style_conversations`: episodes played against the ``style_shift``
environment, one sentence about the prompt's topic each, in a mix of styles (cute, chuunibyou, classical
and plain, a quarter each), from several templates per style. ``--bad-frac`` of the replies break the
quality rule, so the warm-started model can produce every style the online study shifts through, and RL
must learn from rewards which one currently pays.

    python examples/make_style_chats.py --n 4000 --out runs/style/chats.jsonl
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sao.envs.sft_data import style_conversations, write_jsonl


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=4000, help="number of conversations")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bad-frac", type=float, default=0.1, help="share of replies failing quality")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    conversations = style_conversations(args.n, args.seed, bad_frac=args.bad_frac)
    count = write_jsonl(conversations, args.out)
    print(f"wrote {count} conversations to {args.out}")


if __name__ == "__main__":
    main()
