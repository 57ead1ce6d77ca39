"""Read an n-gram-input drafter with other copy-bias rows or a shorter shortest match. No training.

    .venv/bin/python experiments/copy_rows.py dflash_jax/assets/smollm2-135m-instruct-dflash \\
        /work/tmp/rows/min1_30 --ngram-min 1 --row 1=30

The weights stay as they are. ``--ngram-min`` sets the shortest suffix that proposes a block input
(``DrafterConfig.ngram_min``); ``--row L=V`` sets the copy-bias row of L-token matches
(``copy_bias[L - 1, :]``, every offset) to V logits, ``--row L+=D`` adds D (signed) to it; ``L`` may
be a range ``A-B``. Rows are applied in the order given. Writes the released format (float32) with the
drafter's draft vocabulary, for ``experiments/study_tau.py`` (docs/BENCHMARKS.md, "Short matches: the copy
bias read harder").
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import numpy as np


def with_rows(params, cfg, ngram_min: int | None, rows: list[tuple[int, int, str, float]]):
    """``(params, cfg)`` with ``ngram_min`` (None: unchanged) and each ``(first, last, op, value)`` of
    ``rows`` applied in order to the copy-bias rows of first..last-token matches: ``op`` ``"="`` sets
    them to ``value`` logits, ``"+="`` adds ``value``.

    Raises:
      ConfigError: no copy-bias table, or a row past ``ngram_max``.
    """
    from dflash_jax.errors import ConfigError

    if cfg.copy_bias is None:
        raise ConfigError("the drafter has no copy-bias table (block_input='ngram' with copy_bias)")
    table = np.array(params["copy_bias"], np.float32)
    for first, last, op, value in rows:
        if not 1 <= first <= last <= table.shape[0]:
            raise ConfigError(f"--row {first}-{last}: the table has rows for 1..{table.shape[0]}-token matches")
        sl = slice(first - 1, last)
        table[sl] = table[sl] + value if op == "+=" else value
    if ngram_min is not None:
        cfg = dataclasses.replace(cfg, ngram_min=ngram_min)
    return dict(params, copy_bias=table), cfg


def row_spec(text: str) -> tuple[int, int, str, float]:
    """``--row``: ``L=V`` or ``A-B=V`` (set to V logits), ``L+=D`` or ``A-B+=D`` (add D, signed)."""
    op = "+=" if "+=" in text else "="
    try:
        lengths, value = text.split(op)
        first, _, last = lengths.partition("-")
        first, last = int(first), int(last or first)
        spec = first, last, op, float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"give L=V, A-B=V or L+=D (V, D logits), got {text!r}") from None
    if first > last:
        raise argparse.ArgumentTypeError(f"--row {text!r}: the range A-B needs A <= B")
    return spec


def main() -> None:
    from pathlib import Path

    from dflash_jax.drafter_io import export_released, load_drafter, stored_draft_vocab
    from dflash_jax.errors import DFlashError

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("drafter", help="an n-gram-input drafter folder with a copy-bias table")
    ap.add_argument("out", help="the folder to write (released format, float32)")
    ap.add_argument("--ngram-min", type=int, default=None, help="the shortest suffix that proposes a block input")
    ap.add_argument(
        "--row",
        type=row_spec,
        action="append",
        default=[],
        help="L=V or A-B=V sets rows to V logits, L+=D adds D (repeatable, in order)",
    )
    ap.add_argument("--overwrite", action="store_true", help="replace a drafter folder already at OUT")
    args = ap.parse_args()
    src = Path(args.drafter)
    try:
        params, cfg, identity = load_drafter(src)
        params, cfg = with_rows(params, cfg, args.ngram_min, args.row)
        export_released(  # atomic: a folder already at OUT stays unless --overwrite
            params,
            cfg,
            args.out,
            target_identity=identity,
            overwrite=args.overwrite,
            draft_vocab=stored_draft_vocab(src, cfg.vocab_size),
        )
    except DFlashError as e:
        sys.exit(f"copy_rows: {e}")
    print(f"wrote {args.out}: n-gram reach {cfg.ngram_min}..{cfg.ngram_max}")


if __name__ == "__main__":
    main()
