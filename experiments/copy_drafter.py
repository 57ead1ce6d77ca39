"""Read a mask-token DFlash drafter as an n-gram-input drafter with a copy bias: no training.

    .venv/bin/python experiments/copy_drafter.py dflash_jax/assets/smollm2-135m-instruct-dflash runs/copy30 \\
        --copy-bias 30 --ngram-min 2

The weights stay as they are; the drafter's config changes to ``block_input="ngram"`` (offsets
``1 .. num`` of each block hold prompt lookup's continuation, SPEC "N-gram (prompt-lookup)
drafting", where the last ``n >= ngram_min`` committed tokens occurred before; mask tokens follow
it) and a copy-bias table (``drafter.copy_prior``) of one value is added. Per anchor:

- no earlier occurrence of the last ``ngram_min`` tokens: the block is ``[anchor, MASK ...]``,
  exactly what the mask-token drafter saw in training, and it drafts as before;
- a match: with a bias larger than the drafter's logit margins (30 kept the shipped SmolLM2
  drafter's copies: docs/BENCHMARKS.md, "A mask-token drafter reading prompt lookup") the draft
  keeps the continuation, as prompt lookup would, and the drafter's own
  tokens follow where the continuation ends (prompt lookup proposes nothing there).

So it drafts like ``ngram.HybridStep`` (prompt lookup on a match of ``min_match`` tokens, the
drafter elsewhere) and adds the drafter's tokens after a short continuation. It is also the
starting point of a copy run (``experiments/smollm2/smollm2_135m_mix_copy2.py``), which learns the table.
Writes our drafter format (``drafter_io.save_drafter``, atomic); ``--released`` writes the
released format in bfloat16 instead (the reference ``dflash`` loads it as the mask-token drafter:
it reads neither the n-gram input nor the table).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import numpy as np


def as_copy_drafter(params, cfg, copy_bias: float, ngram_min: int = 2, ngram_max: int = 4):
    """``(params, DrafterConfig)`` of the mask-token drafter ``(params, cfg)`` read as an n-gram-input
    drafter whose copy-bias table holds ``copy_bias`` everywhere (``[ngram_max, block_size - 1]``).

    Raises:
      ConfigError: ``cfg`` is not a mask-token DFlash drafter, or bad n-gram lengths.
    """
    from dflash_jax.errors import ConfigError

    if cfg.block_input != "mask" or cfg.dflash2:
        kind = "a DFlash 2 drafter" if cfg.dflash2 else f"block_input={cfg.block_input!r}"
        raise ConfigError(f"a mask-token DFlash drafter is needed, this one has {kind}")
    cfg = dataclasses.replace(cfg, block_input="ngram", ngram_min=ngram_min, ngram_max=ngram_max, copy_bias=copy_bias)
    table = np.full((cfg.ngram_max, cfg.block_size - 1), cfg.copy_bias, np.float32)
    return dict(params, copy_bias=table), cfg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("drafter", help="a mask-token DFlash drafter folder (ours or released format)")
    ap.add_argument("out", help="the folder to write")
    ap.add_argument("--copy-bias", type=float, default=30.0, help="every entry of the copy-bias table (logits)")
    ap.add_argument("--ngram-min", type=int, default=2, help="the shortest matched suffix that proposes a continuation")
    ap.add_argument("--ngram-max", type=int, default=4, help="the longest suffix tried first")
    ap.add_argument("--released", action="store_true", help="write the released format (bfloat16)")
    ap.add_argument("--overwrite", action="store_true", help="replace a drafter folder already at OUT")
    args = ap.parse_args()

    from dflash_jax.drafter_io import export_released, load_drafter, save_drafter
    from dflash_jax.errors import DFlashError

    try:
        params, cfg, identity = load_drafter(args.drafter)
        params, cfg = as_copy_drafter(params, cfg, args.copy_bias, args.ngram_min, args.ngram_max)
        write = export_released if args.released else save_drafter
        extra = {"dtype": "bfloat16"} if args.released else {}
        write(params, cfg, args.out, target_identity=identity, overwrite=args.overwrite, **extra)
    except DFlashError as e:
        sys.exit(f"copy_drafter: {e}")
    print(
        f"wrote {args.out}: {args.drafter} reading prompt lookup (n {args.ngram_max}..{args.ngram_min}), "
        f"copy bias {args.copy_bias}"
    )


if __name__ == "__main__":
    main()
