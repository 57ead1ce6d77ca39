"""Read an n-gram-input drafter with a longer reach: matches up to ``--ngram-max`` tokens, optionally
continued past the anchor with the match's period (``--periodic``). No training.

    .venv/bin/python experiments/longer_reach.py assets/smollm2-135m-instruct-dflash-stage8 \\
        /work/tmp/reach/n16_periodic --ngram-max 16 --periodic

The weights stay as they are. The copy-bias table (``drafter.copy_prior``, one row per matched
length) gains rows for the longer matches, each at ``--new-rows`` (a number, as a training run's
``init_from`` starts them at ``drafter.copy_bias``; or ``repeat``: the longest row the drafter had,
so only which occurrence is read changes). ``ngram_periodic`` (``ngram.ngram_matches``' ``periodic``)
fills the offsets after a continuation that reaches the anchor with the match's period instead of
mask tokens. Writes the released format (float32, or ``--dtype bfloat16``) with the drafter's draft
vocabulary, for ``experiments/study_tau.py`` (docs/BENCHMARKS.md, "A longer reach for the block input"); with
``--with-record`` also a shipped folder's record, the README saying how it is read: the package's drafter was made
so from stage 8 (docs/BENCHMARKS.md, "Stage 8 with the longer reach, decoded and shipped"). ``--tree-temperature``
sets the temperature of the drafter's greedy draft-tree scores (``DrafterConfig.tree_temperature``), tuned on held-out
answers with ``experiments/tune_tree_scores.py`` (docs/BENCHMARKS.md, "Draft trees").
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import numpy as np


def with_longer_reach(params, cfg, ngram_max: int, new_rows: float | None, periodic: bool, tree_temperature=None):
    """``(params, DrafterConfig)``: ``(params, cfg)`` matching suffixes up to ``ngram_max`` tokens, the
    copy-bias table's added rows at ``new_rows`` (None: copies of its last row), ``ngram_periodic``
    set to ``periodic``, ``tree_temperature`` set (None: the drafter's own kept).

    Raises:
      ConfigError: ``cfg`` has no copy-bias table, or ``ngram_max`` is below its own.
    """
    from dflash_jax.drafter import grow_copy_bias
    from dflash_jax.errors import ConfigError

    if cfg.copy_bias is None:
        raise ConfigError("the drafter has no copy-bias table (block_input='ngram' with copy_bias)")
    table = np.asarray(params["copy_bias"], np.float32)
    grown = grow_copy_bias(table, ngram_max, table[-1] if new_rows is None else new_rows)
    t = cfg.tree_temperature if tree_temperature is None else tree_temperature
    cfg = dataclasses.replace(cfg, ngram_max=ngram_max, ngram_periodic=periodic, tree_temperature=t)
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
    ap.add_argument("out", help="the folder to write (released format)")
    ap.add_argument("--ngram-max", type=int, default=16, help="the longest suffix matched")
    ap.add_argument(
        "--new-rows",
        type=new_rows_value,
        default=30.0,
        help="the added rows' value (logits), or 'repeat' (its last row)",
    )
    ap.add_argument("--periodic", action="store_true", help="continue a continuation past the anchor (a loop)")
    ap.add_argument(
        "--tree-temperature",
        type=float,
        metavar="T",
        help="the greedy draft tree's scores at temperature T (DrafterConfig.tree_temperature; default: the "
        "drafter's own)",
    )
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="the weights' dtype")
    ap.add_argument(
        "--with-record",
        action="store_true",
        help="also carry a shipped folder's record (README, train_config.json, training_summary.json, loss.png), "
        "the README and the summary saying how it is now read",
    )
    ap.add_argument("--overwrite", action="store_true", help="replace a drafter folder already at OUT")
    args = ap.parse_args()

    import json
    import shlex
    import shutil
    from pathlib import Path

    from dflash_jax.drafter_io import export_released, load_drafter, stored_draft_vocab
    from dflash_jax.errors import DFlashError
    from dflash_jax.utils import atomic_folder

    src = Path(args.drafter)
    try:
        params, cfg, identity = load_drafter(src)
        was = (cfg.ngram_max, cfg.ngram_periodic)
        params, cfg = with_longer_reach(
            params, cfg, args.ngram_max, args.new_rows, args.periodic, args.tree_temperature
        )
        with atomic_folder(Path(args.out), args.overwrite, kind="released-drafter") as tmp:
            export_released(
                params,
                cfg,
                tmp / "drafter",
                dtype=args.dtype,
                target_identity=identity,
                draft_vocab=stored_draft_vocab(src, cfg.vocab_size),
            )
            for f in (tmp / "drafter").iterdir():
                f.rename(tmp / f.name)
            (tmp / "drafter").rmdir()
            if args.with_record:
                for name in ("train_config.json", "loss.png"):
                    if (src / name).is_file():
                        shutil.copy(src / name, tmp / name)
                read_with = {
                    "ngram_max": cfg.ngram_max,
                    "ngram_periodic": cfg.ngram_periodic,
                    "new_rows": "repeat" if args.new_rows is None else args.new_rows,
                    "tree_temperature": cfg.tree_temperature,
                    "trained_with": {"ngram_max": was[0], "ngram_periodic": was[1]},
                }
                summary = src / "training_summary.json"
                info = json.loads(summary.read_text()) if summary.is_file() else {}
                (tmp / "training_summary.json").write_text(json.dumps({**info, "read_with": read_with}, indent=1))
                command = " ".join(shlex.quote(a) for a in ["python", *sys.argv])
                rows = "copies of its longest row" if args.new_rows is None else f"at {args.new_rows} logits"
                note = (
                    f"\n## Read with a longer reach\n\nTrained matching {cfg.ngram_min}..{was[0]} tokens; read "
                    "matching "
                    f"{cfg.ngram_min}..{cfg.ngram_max}"
                    + (
                        ", a continuation that reaches the anchor going on with the match's period"
                        if cfg.ngram_periodic
                        else ""
                    )
                    + " (`dflash_config.ngram_max`, `ngram_periodic`). Its weights are the trained ones; the "
                    "copy-bias "
                    f'table gained rows for the longer matches, {rows} (docs/BENCHMARKS.md, "A longer reach for the '
                    f'block input").'
                    + (
                        f" Its greedy draft trees read its log-probabilities at temperature {cfg.tree_temperature} "
                        "(`dflash_config.tree_temperature`, tuned on held-out answers: "
                        'docs/BENCHMARKS.md, "Draft trees").'
                        if cfg.tree_temperature != 1.0
                        else ""
                    )
                    + f" Made from the trained folder with:\n\n```bash\n{command}\n```\n"
                )
                readme = (src / "README.md").read_text() if (src / "README.md").is_file() else ""
                (tmp / "README.md").write_text(readme + note)
    except DFlashError as e:
        sys.exit(f"longer_reach: {e}")
    print(f"wrote {args.out}: n-gram reach {cfg.ngram_min}..{cfg.ngram_max}, periodic {cfg.ngram_periodic}")


if __name__ == "__main__":
    main()
