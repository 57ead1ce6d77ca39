"""Ship a trained drafter into ``dflash_jax/assets/`` (package data): released format (bfloat16) + its training record.

    .venv/bin/python launch/ship_drafter.py runs/smollm2_v1 --out dflash_jax/assets/smollm2-135m-instruct-dflash \\
        --command "dflash-jax train --config configs/smollm2_135m.py ..."

Writes, atomically (the old folder is replaced only once the new one is complete):
``config.json`` + ``model.safetensors`` (what ``dflash.model.DFlashDraftModel`` loads, with
the target's identity so that ``--drafter auto`` finds it), ``train_config.json`` (the run's
config), ``training_summary.json`` (steps, time, losses, validation tau), ``loss.png`` (the
run's curves, ``launch/plot_metrics.py``) and ``README.md`` (how it was made, with the
commands given by ``--data-command`` and ``--command``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def read_metrics(run: Path) -> list[dict]:
    """The rows of ``run/metrics.jsonl``."""
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def summary(rows: list[dict]) -> dict:
    """Headline figures of a run's metrics rows."""
    train = [r for r in rows if "loss" in r]
    val = [r for r in rows if "val_loss" in r]
    last = train[-1]
    tail = train[-20:]
    out = {
        "steps": last["step"],
        "train_hours": round(sum(r.get("step_s", 0.0) for r in train) / 3600, 2),
        "final_loss_mean_last_20": round(sum(r["loss"] for r in tail) / len(tail), 4),
        "final_tau_blocks_mean_last_20": round(sum(r["tau_blocks"] for r in tail) / len(tail), 3),
        "final_offset_accuracy_mean_last_20": [
            round(sum(r["acc"][k] for r in tail) / len(tail), 3) for k in range(len(last["acc"]))
        ],
    }
    if val:
        best = min(val, key=lambda r: r["val_loss"])
        out.update(
            {
                "best_val_step": best["step"],
                "best_val_loss": round(best["val_loss"], 4),
                "val": [
                    {k: round(r[k], 4) for k in ("step", "val_loss", "val_tau_blocks", "val_decode_tau") if k in r}
                    for r in val
                ],
            }
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", help="training run folder (out_dir)")
    ap.add_argument("--out", default="dflash_jax/assets/smollm2-135m-instruct-dflash")
    ap.add_argument("--which", default="best", choices=["best", "drafter"], help="lowest validation loss, or final")
    ap.add_argument("--data-command", default="", help="the prepare-data command that made the run's data")
    ap.add_argument("--command", default="", help="the train command(s) that made the run")
    ap.add_argument(
        "--earlier-stage",
        action="append",
        default=[],
        metavar="RUN",
        help="the run folder (out_dir, not its best/) that this run continued from through init_from, "
        "oldest first; repeatable: its steps and hours go into the summary and the README",
    )
    ap.add_argument(
        "--continues",
        default="",
        metavar="FOLDER",
        help="a shipped drafter folder (this script's output) that the first stage continued through "
        "init_from, e.g. the folder being replaced: its steps, hours and reproduction commands are "
        "carried into the summary and the README",
    )
    ap.add_argument(
        "--draft-vocab",
        default="",
        metavar="DATA",
        help="also store a draft vocabulary (launch/draft_vocab.py --write) counted on this prepare-data "
        "folder's answers",
    )
    ap.add_argument("--draft-vocab-size", type=int, default=8192, help="its length (default 8192)")
    args = ap.parse_args()

    from dflash_jax.drafter_io import export_released, load_drafter
    from dflash_jax.utils import atomic_folder

    run, out = Path(args.run), Path(args.out)
    params, cfg, identity = load_drafter(run / args.which)
    info = summary(read_metrics(run))
    info["shipped"] = args.which
    stages = []
    for earlier in map(Path, args.earlier_stage):
        if not (earlier / "metrics.jsonl").exists():
            sys.exit(
                f"--earlier-stage {earlier}: no metrics.jsonl there; give the earlier run's folder (its out_dir, "
                f"e.g. runs/smollm2_v1), not the drafter inside it"
            )
        e = summary(read_metrics(earlier))
        stages.append(
            {
                "run": str(earlier),
                "steps": e["steps"],
                "train_hours": e["train_hours"],
                "best_val_loss": e.get("best_val_loss"),
            }
        )
    before_commands = ""
    if args.continues:
        shipped = Path(args.continues)
        if not (shipped / "training_summary.json").exists():
            sys.exit(f"--continues {shipped}: no training_summary.json there; give a folder made by this script")
        e = json.loads((shipped / "training_summary.json").read_text())
        stages.insert(
            0,
            {
                "run": f"{shipped} as shipped before",
                "steps": e.get("total_steps", e["steps"]),
                "train_hours": e.get("total_train_hours", e["train_hours"]),
                "best_val_loss": e.get("best_val_loss"),
            },
        )
        readme = (shipped / "README.md").read_text() if (shipped / "README.md").exists() else ""
        if "```bash\n" in readme:
            before_commands = readme.split("```bash\n", 1)[1].split("```", 1)[0]
    if stages:
        info["earlier_stages"] = stages
        info["total_steps"] = info["steps"] + sum(x["steps"] for x in stages)
        info["total_train_hours"] = round(info["train_hours"] + sum(x["train_hours"] for x in stages), 2)
    if args.which == "best" and "best_val_step" in info:
        shipped_at = f"step {info['best_val_step']}, validation loss {info['best_val_loss']}"
    else:
        last_val = info.get("val", [{}])[-1]
        shipped_at = f"step {info['steps']}, last validation loss {last_val.get('val_loss')}"
    with atomic_folder(out, overwrite=True, kind="released-drafter") as tmp:
        export_released(params, cfg, tmp / "drafter", dtype="bfloat16", target_identity=identity)
        for f in (tmp / "drafter").iterdir():
            f.rename(tmp / f.name)
        (tmp / "drafter").rmdir()
        shutil.copy(run / "config.json", tmp / "train_config.json")
        (tmp / "training_summary.json").write_text(json.dumps(info, indent=1))
        subprocess.run(
            [
                sys.executable,
                str(ROOT / "launch" / "plot_metrics.py"),
                str(run / "metrics.jsonl"),
                "--out",
                str(tmp / "loss.png"),
            ],
            check=True,
        )
        if args.draft_vocab:
            size = str(min(args.draft_vocab_size, cfg.vocab_size))
            script = [str(ROOT / "launch" / "draft_vocab.py"), args.draft_vocab, "--sizes", size]
            subprocess.run([sys.executable, *script, "--write", str(tmp), "--size", size], check=True)
        kind, ref_class = ("DFlash 2", "DFlash2DraftModel") if cfg.dflash2 else ("DFlash", "DFlashDraftModel")
        extras = ""
        if cfg.dflash2:
            extras += (
                f" Grouped dynamic causal convolutions of kernel {cfg.conv_kernel_size} over groups of "
                f"{cfg.conv_group_size} channels; candidate selector of rank {cfg.selector_rank} over the head's "
                f"top {cfg.selector_top_k}."
            )
        if cfg.block_input == "ngram":
            extras += (
                f" Its block input is the prompt-lookup continuation (the last {cfg.ngram_min}..{cfg.ngram_max} "
                f"committed tokens' most recent earlier match) in place of mask tokens"
                + (", with a learned copy bias on the continued tokens' logits" if cfg.copy_bias is not None else "")
                + ": `dflash_config.block_input`, read by dflash-jax; `dflash` loads the same tensors and "
                "drafts from mask tokens."
            )
        (tmp / "README.md").write_text(
            f"# {kind} drafter for SmolLM2-135M-Instruct\n\n"
            f"Released {kind} format (bfloat16): `config.json` + `model.safetensors`; loads in "
            f"`dflash.model.{ref_class}` and in dflash-jax (`--drafter auto` picks it for this target).\n\n"
            f"{cfg.num_layers} drafter layers, block size {cfg.block_size}, target layers "
            f"{list(cfg.target_layer_ids)}, mask token id {cfg.mask_token_id}.{extras} Trained {info['steps']} steps "
            f"({info['train_hours']} h on 2 CPU cores)"
            + "".join(f", continuing {x['run']} ({x['steps']} steps, {x['train_hours']} h)" for x in reversed(stages))
            + (f": {info['total_steps']} steps, {info['total_train_hours']} h in all" if stages else "")
            + f"; shipped: `{args.which}` ({shipped_at}).\n\n"
            f"- `train_config.json`: the run's full config\n- `training_summary.json`: losses, per-offset "
            f"accuracy, validation tau\n- `loss.png`: the curves (of the last stage)\n"
            + (
                f"- `draft_vocab.json`: the draft vocabulary, the {args.draft_vocab_size} tokens dflash-jax lets "
                "it propose (the most frequent answer tokens, plus each offset's prompt-lookup token whatever "
                "the list): its LM head then costs a fraction of the full one; `--draft-vocab 0` drafts over "
                "the whole vocabulary; `dflash` ignores the file\n"
                if args.draft_vocab
                else ""
            )
            + "\n"
            "## Reproduce\n\n```bash\n"
            + (f"# before: how {args.continues} was made\n{before_commands}# then:\n" if before_commands else "")
            + "".join(f"{c}\n" for c in (args.data_command, args.command) if c)
            + f".venv/bin/python launch/ship_drafter.py {run} --out {out} --which {args.which}"
            + (f" --continues {args.continues}" if args.continues else "")
            + (
                f" --draft-vocab {args.draft_vocab} --draft-vocab-size {args.draft_vocab_size}"
                if args.draft_vocab
                else ""
            )
            + "".join(f" --earlier-stage {x['run']}" for x in stages if not x["run"].endswith("as shipped before"))
            + "\n```\n"
            "\nMeasured tau and speedup: `docs/BENCHMARKS.md`.\n"
        )
    print(f"wrote {out}: {json.dumps({k: v for k, v in info.items() if k != 'val'})}")


if __name__ == "__main__":
    main()
