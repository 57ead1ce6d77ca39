"""Where a drafter's acceptance is won and lost, from the per-round records of ``dflash-jax bench``.

Reads a ``--json-out`` run's ``.records.jsonl`` (every turn's output tokens and the acceptance
length of each speculative round) and prints, per block size:
  - tau by where a round starts in the answer (tokens 0-63, 64-127, ...), for looping answers
    (an 8-gram repeated 3 times, ``data.loops``) and loop-free ones apart;
  - with ``--show I``, record I's answer with each round in brackets, coloured by how many tokens
    it committed (1: red, 2-3: yellow, 4 and more: green; the prefill's first token dim), so a
    reader sees which text the drafter gets and which it misses.
The records keep the plain decode's tokens, so ``--show`` draws only turns whose speculative output
was identical to them (always at temperature 0 in float32; the others are refused).

    .venv/bin/python experiments/show_rounds.py docs/bench/interim_v3.records.jsonl --block-size 16 --show 2
"""

import argparse
import sys
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table
from rich.text import Text

from dflash_jax import bench
from dflash_jax.errors import BenchError


def rounds(acceptance_lengths):
    """``(start, length)`` of each round in the answer: the prefill commits answer token 0, and
    each round starts where the previous ones' tokens end."""
    starts = 1 + np.concatenate([[0], np.cumsum(acceptance_lengths)[:-1]])
    return list(zip(starts.tolist(), acceptance_lengths))


def by_position(records, key: str, bucket: int):
    """{(looping, bucket index): [tokens, rounds]} over all records with speculative results ``key``."""
    acc = {}
    for r in records:
        for start, n in rounds(r[key]["acceptance_lengths"]):
            cell = acc.setdefault((bool(r.get("loops")), start // bucket), [0, 0])
            cell[0] += n
            cell[1] += 1
    return acc


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("records", type=Path, help="a bench run's .records.jsonl")
    ap.add_argument("--block-size", type=int, default=16, help="which speculative run of the records (b<N>)")
    ap.add_argument("--bucket", type=int, default=64, help="answer tokens per row of the position table")
    ap.add_argument(
        "--show",
        type=int,
        nargs="*",
        default=[],
        metavar="I",
        help="print turn I (0-based, among the turns with results at --block-size) with its rounds",
    )
    ap.add_argument("--target", default="smollm2-135m-instruct", help="target whose tokenizer decodes --show")
    args = ap.parse_args()

    if args.bucket < 1:
        sys.exit("--bucket must be at least 1")
    try:
        settings, rows = bench.read_records(args.records)
    except BenchError as e:
        sys.exit(str(e))
    key = f"b{args.block_size}"
    records = [r for r in rows if r.get(key, {}).get("acceptance_lengths")]
    if not records:
        sys.exit(
            f"{args.records} has no speculative records at block size {args.block_size} "
            f"(its block sizes: {settings.get('block_sizes')})"
        )
    con = Console()
    if settings.get("temperature", 0.0) != 0.0:
        con.print(f"[yellow]note: these records were sampled at temperature {settings['temperature']}[/]")

    acc = by_position(records, key, args.bucket)
    table = Table(
        title=f"tau (rounds) by where a round starts in the answer, block {args.block_size}, "
        f"{len(records)} turns ({sum(bool(r.get('loops')) for r in records)} looping)"
    )
    table.add_column("answer tokens")
    for name in ("looping", "loop-free", "all"):
        table.add_column(name, justify="right")
    for b in range(max(k[1] for k in acc) + 1):
        cells = []
        for want in ((True,), (False,), (True, False)):
            tok = sum(acc.get((w, b), [0, 0])[0] for w in want)
            n = sum(acc.get((w, b), [0, 0])[1] for w in want)
            cells.append(f"{tok / n:.2f} ({n})" if n else "-")
        table.add_row(f"{b * args.bucket}-{(b + 1) * args.bucket - 1}", *cells)
    con.print(table)

    if args.show:
        from transformers import AutoTokenizer

        from dflash_jax.checkpoint import resolve_target

        tok = AutoTokenizer.from_pretrained(str(resolve_target(args.target)))
        for i in args.show:
            if not 0 <= i < len(records):
                sys.exit(f"--show {i}: the records hold {len(records)} turns (0..{len(records) - 1})")
            r = records[i]
            ids, lengths = r["output_ids"], r[key]["acceptance_lengths"]
            if not r[key].get("identical") or sum(lengths) + 1 != len(ids):
                sys.exit(
                    f"--show {i}: its speculative output differs from the plain one the records keep, "
                    "so its rounds cannot be drawn on it"
                )
            out = Text(tok.decode(ids[:1]), style="dim")  # the prefill's token
            for start, n in rounds(lengths):
                style = "red" if n == 1 else "yellow" if n < 4 else "green"
                # the text the round adds (decoding prefixes keeps a character split across rounds whole)
                piece = tok.decode(ids[: start + n])[len(tok.decode(ids[:start])) :]
                out.append("[" + piece + "]", style=style)
            con.rule(
                f"record {i}: {r['dataset']} {r['id']} turn {r['turn']}, tau {np.mean(lengths):.2f}, "
                f"{'looping' if r.get('loops') else 'loop-free'}"
            )
            con.print(out)


if __name__ == "__main__":
    main()
