"""Multi-turn chats of about ``--length`` tokens made of the target's own single-turn answers (issue 38,
"long context": training at the served length). Each chat strings together exchanges (user prompt, the
target's greedy answer) of the given shards of ``data/smollm2-mix`` in a random order until the next one
would pass ``--length`` tokens, as OpenAI ``messages`` rows for ``prepare-data --conversations`` (which
applies the chat template and puts the loss on every assistant turn). The answers were made one turn
alone, so a later turn's answer is what the target said without the earlier turns (regenerating them
in context is ``prepare-data --conversations ... --server URL``). Keep the shards apart from
``study_long_context.py``'s (30-41 by default), which measure the drafter on such chats.

    .venv/bin/python experiments/long_chats.py --shards 0 30 --length 2048 --out runs/long_chats/chats.jsonl
    .venv/bin/dflash-jax prepare-data --conversations runs/long_chats/chats.jsonl --out runs/long_chats/data
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=ROOT / "data" / "smollm2-mix")
    ap.add_argument("--shards", type=int, nargs=2, required=True, help="shard range [first, last) to draw from")
    ap.add_argument("--length", type=int, default=2048, help="tokens a chat holds at most (about)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    from study_long_context import exchange_tokens, exchanges

    from dflash_jax import checkpoint, hub
    from dflash_jax.utils import atomic_write_text

    tok = checkpoint.load_target(hub.SMOLLM2).tokenizer()
    pairs = exchanges(args.data, range(*args.shards), tok)
    sizes = [exchange_tokens(tok, u, a) for u, a in pairs]
    chats, messages, used = [], [], 0
    for j in np.random.RandomState(args.seed).permutation(len(pairs)):
        if used + sizes[j] > args.length and messages:
            chats.append(messages)
            messages, used = [], 0
        user, answer = pairs[j]
        messages = [*messages, {"role": "user", "content": user}, {"role": "assistant", "content": answer}]
        used += sizes[j]
    chats.append(messages)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, "".join(json.dumps({"messages": m}) + "\n" for m in chats))
    turns = [len(m) // 2 for m in chats]
    print(f"{len(chats)} chats from {len(pairs)} exchanges, {np.mean(turns):.1f} turns a chat, in {args.out}")


if __name__ == "__main__":
    main()
