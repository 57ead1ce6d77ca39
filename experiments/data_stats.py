"""Per-source statistics of a ``prepare-data`` folder: answers, tokens, and how many hit the cap or loop.

    .venv/bin/python experiments/data_stats.py data/smollm2-mix [--target smollm2-135m-instruct] [--json-out F]

Works on a folder that is still being written (the finished shards). An answer *hits the cap*
when it has ``max_new_tokens`` tokens and does not end in a stop token; it *loops* when some
8-gram occurs 3 times (``tokens.loops``), as ``prepare-data`` counts them. The source of an answer
is the prompt file its prompt came from (each shard's ``meta.json`` lists them).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from dflash_jax import checkpoint, data
from dflash_jax.tokens import loops, stop_ids


def per_source(folder: Path, stops: set[int]) -> dict:
    index = json.loads((folder / "meta.json").read_text())
    cap = index["settings"]["max_new_tokens"]
    rows: dict = defaultdict(lambda: {"answers": 0, "answer_tokens": 0, "hit_cap": 0, "looping": 0})
    for name in index["shards"]:
        shard = data.Shard(folder / name)
        for i, where in enumerate(shard.meta["prompts"]):
            tokens, mask = shard[i]
            answer = tokens[mask].tolist()
            r = rows[Path(where.rsplit(":", 1)[0]).name]
            r["answers"] += 1
            r["answer_tokens"] += len(answer)
            r["hit_cap"] += len(answer) >= cap and answer[-1] not in stops
            r["looping"] += loops(answer)
    return {
        "shards": len(index["shards"]),
        "complete": index["complete"],
        "max_new_tokens": cap,
        "sources": dict(sorted(rows.items())),
    }


def markdown(stats: dict) -> str:
    lines = ["| source | answers | mean answer tokens | hit the cap | loop |", "|---|---|---|---|---|"]
    for name, r in stats["sources"].items():
        n = max(r["answers"], 1)
        lines.append(
            f"| {name} | {r['answers']} | {r['answer_tokens'] / n:.0f} | {r['hit_cap']} ({r['hit_cap'] / n:.0%}) "
            f"| {r['looping']} ({r['looping'] / n:.0%}) |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path, help="a prepare-data --out folder")
    ap.add_argument("--target", default="smollm2-135m-instruct", help="the target whose tokenizer made the data")
    ap.add_argument("--json-out", type=Path, default=None)
    args = ap.parse_args()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(checkpoint.resolve_target(args.target)), trust_remote_code=False)
    stats = per_source(args.folder, set(stop_ids(tok)))
    print(
        f"{args.folder}: {stats['shards']} shards ({'complete' if stats['complete'] else 'in progress'}), "
        f"answers capped at {stats['max_new_tokens']} tokens\n"
    )
    print(markdown(stats))
    if args.json_out:
        args.json_out.write_text(json.dumps(stats, indent=1))


if __name__ == "__main__":
    main()
