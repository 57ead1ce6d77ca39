"""Read an n-gram-input drafter with a longer reach: matches up to ``--ngram-max`` tokens, optionally
continued past the anchor with the match's period (``--periodic``). No training.

    .venv/bin/python experiments/longer_reach.py dflash_jax/assets/smollm2-135m-instruct-dflash \\
        /work/tmp/reach/n16_periodic --ngram-max 16 --periodic

The weights stay as they are. The copy-bias table (``drafter.copy_prior``, one row per matched
length) gains rows for the longer matches, each at ``--new-rows`` (a number, as a training run's
``init_from`` starts them at ``drafter.copy_bias``; or ``repeat``: the longest row the drafter had,
so only which occurrence is read changes). ``ngram_periodic`` (``ngram.ngram_matches``' ``periodic``)
fills the offsets after a continuation that reaches the anchor with the match's period instead of
mask tokens. Writes the released format in float32 with the drafter's draft vocabulary, for
``experiments/study_tau.py``: docs/BENCHMARKS.md, "A longer reach for the block input".
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import numpy as np


def with_longer_reach(params, cfg, ngram_max: int, new_rows: float | None, periodic: bool):
    """``(params, DrafterConfig)``: ``(params, cfg)`` matching suffixes up to ``ngram_max`` tokens, the
    copy-bias table's added rows at ``new_rows`` (None: copies of its last row), ``ngram_periodic``
    set to ``periodic``.

    Raises:
      ConfigError: ``cfg`` has no copy-bias table, or ``ngram_max`` is below its own.
    """
    from dflash_jax.drafter import grow_copy_bias
    from dflash_jax.errors import ConfigError

    if cfg.copy_bias is None:
        raise ConfigError("the drafter has no copy-bias table (block_input='ngram' with copy_bias)")
    table = np.asarray(params["copy_bias"], np.float32)
    grown = grow_copy_bias(table, ngram_max, table[-1] if new_rows is None else new_rows)
    cfg = dataclasses.replace(cfg, ngram_max=ngram_max, ngram_periodic=periodic)
    return dict(params, copy_bias=grown), cfg


def new_rows_value(text: str) -> float | None:
    """``--new-rows``: a number (logits), or ``repeat`` (None)."""
    if text == "repeat":
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"give a number (logits) or 'repeat', got {text!r}") from None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("drafter", help="an n-gram-input drafter folder with a copy-bias table")
    ap.add_argument("out", help="the folder to write (released format, float32)")
    ap.add_argument("--ngram-max", type=int, default=16, help="the longest suffix matched")
    ap.add_argument(
        "--new-rows",
        type=new_rows_value,
        default=30.0,
        help="the added rows' value (logits), or 'repeat' (its last row)",
    )
    ap.add_argument("--periodic", action="store_true", help="continue a continuation past the anchor (a loop)")
    ap.add_argument("--overwrite", action="store_true", help="replace a drafter folder already at OUT")
    args = ap.parse_args()

    from dflash_jax.drafter_io import export_released, load_drafter, stored_draft_vocab
    from dflash_jax.errors import DFlashError

    try:
        params, cfg, identity = load_drafter(args.drafter)
        params, cfg = with_longer_reach(params, cfg, args.ngram_max, args.new_rows, args.periodic)
        export_released(
            params,
            cfg,
            args.out,
            target_identity=identity,
            overwrite=args.overwrite,
            draft_vocab=stored_draft_vocab(args.drafter, cfg.vocab_size),
        )
    except DFlashError as e:
        sys.exit(f"longer_reach: {e}")
    print(f"wrote {args.out}: n-gram reach {cfg.ngram_max}..{cfg.ngram_min}, periodic {cfg.ngram_periodic}")


if __name__ == "__main__":
    main()
