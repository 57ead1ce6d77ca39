"""What a user runs on the files that training, data preparation and benchmarking leave behind (the
``dflash-jax`` subcommands ``draft-vocab``, ``plot-run``, ``ship-drafter`` and ``bench-report``; ``cli``
only parses their arguments):

- a **draft vocabulary** counted on a ``prepare-data`` folder's answer tokens, and how much of held-out
  answers the N most frequent of them cover (``draft_vocab_coverage``, ``count_draft_vocab``);
- **plots of a training run**: its ``metrics.jsonl`` as loss, per-offset accuracy and tau (``plot_run``);
- a trained drafter **shipped**: the released format (bfloat16) with the run's config, a summary of its
  log over every stage it continued, its loss curve and a README that says how to make it again
  (``ship_drafter``);
- a ``bench`` **report** written again from its records file, over every turn in it (``bench_report``).
"""

from __future__ import annotations

import json
import shlex
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from dflash_jax import bench
from dflash_jax.drafter_io import export_released, load_drafter, stored_draft_vocab, write_draft_vocab
from dflash_jax.errors import BenchError, CheckpointError, ConfigError, DataError
from dflash_jax.prompts import DATASETS
from dflash_jax.utils import atomic_folder, log, read_jsonl

# --- draft vocabularies --------------------------------------------------------------------------


def answer_shards(data: str | Path) -> list[Path]:
    """The shards of a ``prepare-data`` folder (``shard_*/``; or the folder itself if it is one shard).

    Raises:
      DataError: no shard there.
    """
    data = Path(data)
    shards = sorted(data.glob("shard_*")) or ([data] if (data / "tokens.npy").exists() else [])
    if not shards:
        raise DataError(f"{data}: no shard_*/ (nor tokens.npy) here; pass a folder made by dflash-jax prepare-data")
    return shards


def answer_tokens(shard: str | Path) -> np.ndarray:
    """The answer tokens of one shard (``tokens`` where ``loss_mask``), int64 ``[n]``.

    Raises:
      DataError: the shard's two arrays differ in size.
    """
    shard = Path(shard)
    tokens, mask = np.load(shard / "tokens.npy").ravel(), np.load(shard / "loss_mask.npy").ravel()
    if tokens.shape != mask.shape:
        raise DataError(f"{shard}: tokens.npy and loss_mask.npy differ in size; remake the shard")
    return tokens[mask.astype(bool)].astype(np.int64)


def draft_vocab_coverage(data: str | Path, sizes: Sequence[int]) -> str:
    """How much of held-out answers a draft vocabulary of each size covers, as a Markdown table: the share
    of shard 0's answer tokens among (a) the first N token ids (BPE merge order) and (b) the N most
    frequent answer tokens counted on every other shard (a vocabulary chosen from training answers, on
    new ones), and (c) the same list's share of the answers it was counted on.

    Raises:
      DataError: fewer than two shards (the first one is held out).
    """
    shards = answer_shards(data)
    if len(shards) < 2:
        raise DataError(f"{data}: the coverage table needs 2 or more shards (the first is held out), found 1")
    answers = [answer_tokens(s) for s in shards]
    held, train = answers[0], np.concatenate(answers[1:])
    by_count = np.argsort(-np.bincount(train), kind="stable")
    lines = [
        f"answer tokens: {train.size} counted on shards 1..{len(shards) - 1}, {held.size} held out (shard 0)",
        "",
        "| N | first N ids | N most frequent (held out) | N most frequent (in sample) |",
        "|---|---|---|---|",
    ]
    for n in sizes:
        top = by_count[:n]
        shares = (np.mean(held < n), np.mean(np.isin(held, top)), np.mean(np.isin(train, top)))
        lines.append(f"| {n} | " + " | ".join(f"{x:.3f}" for x in shares) + " |")
    return "\n".join(lines)


def drafter_vocab_size(drafter: str | Path) -> int:
    """The vocabulary size of the drafter in ``drafter`` (its ``config.json``, in either drafter format).

    Raises:
      CheckpointError: not a drafter folder.
    """
    config = Path(drafter) / "config.json"
    vocab = json.loads(config.read_text()).get("vocab_size", 0) if config.is_file() else 0
    if not vocab:
        raise CheckpointError(f"{drafter}: not a drafter folder (no config.json with vocab_size)")
    return int(vocab)


def count_draft_vocab(data: str | Path, drafter: str | Path, size: int, command: str = "") -> tuple[Path, float]:
    """Store the ``size`` most frequent answer tokens of ``data`` (counted on every shard; most frequent
    first, then, past the tokens ever counted, the others in token-id order, which is BPE merge order)
    as the draft vocabulary of the drafter in ``drafter`` (``draft_vocab.json``, read by ``generate``,
    ``bench`` and ``demo``; their ``--draft-vocab N`` takes its first N). Returns the file and the share
    of the counted answer tokens the list covers; ``command`` is recorded in the file.

    Raises:
      CheckpointError: ``drafter`` is not a drafter folder (no ``config.json`` with ``vocab_size``).
      DataError: no shards, or ``size`` outside 1 .. the drafter's vocabulary size.
    """
    vocab = drafter_vocab_size(drafter)
    if not 1 <= size <= vocab:
        raise DataError(f"draft vocabulary size {size}: the drafter's vocabulary has {vocab} tokens; pass 1 .. {vocab}")
    shards = answer_shards(data)
    counts = np.bincount(np.concatenate([answer_tokens(s) for s in shards]), minlength=vocab)[:vocab]
    if not counts.sum():
        raise DataError(f"{data}: its shards hold no answer tokens (loss_mask is all zero)")
    ids = np.argsort(-counts, kind="stable")[:size]
    covers = float(counts[ids].sum() / counts.sum())
    path = write_draft_vocab(
        drafter,
        ids.tolist(),
        counted_on=f"{data}: answer tokens of {len(shards)} shards ({counts.sum()} tokens)",
        covers=covers,
        command=command,
    )
    return path, covers


# --- plots of a training run ---------------------------------------------------------------------


def metrics_file(run: str | Path) -> Path:
    """``run``'s ``metrics.jsonl`` (``run`` is a training run's folder, its ``out_dir``, or the file itself).

    Raises:
      CheckpointError: neither exists.
    """
    path = Path(run)
    path = path / "metrics.jsonl" if path.is_dir() else path
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file; pass a training run's folder (its out_dir) or its metrics.jsonl")
    return path


def read_metrics(run: str | Path) -> list[dict]:
    """The rows of a run's ``metrics.jsonl`` (``metrics_file``); a line cut by a kill is skipped, with a warning.

    Raises:
      CheckpointError: no metrics file, or no row in it.
    """
    path = metrics_file(run)
    rows, skipped = read_jsonl(path)
    if skipped:
        log(f"warning: {path}: {skipped} line(s) not JSON (cut by a kill?); skipped")
    rows = [r for r in rows if isinstance(r, dict) and "step" in r]
    if not any("loss" in r for r in rows):
        raise CheckpointError(f"{path} holds no training metrics (no row with a step and a loss)")
    return rows


def _smooth(xs: list[float], k: int) -> list[float]:
    out, acc = [], 0.0
    for i, x in enumerate(xs):
        acc += x
        if i >= k:
            acc -= xs[i - k]
        out.append(acc / min(i + 1, k))
    return out


def plot_run(rows: list[dict], out: str | Path, title: str = "") -> Path:
    """Plot a run's metrics rows (``read_metrics``) to the PNG ``out``: training loss (and validation
    loss where logged); accuracy per block offset at the last logged step (training, and validation if
    present); the acceptance-length estimates (``tau_est`` from per-offset accuracies, ``tau_blocks``
    from leading correct offsets, and the real decode's ``val_decode_tau``) against the step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out, val = Path(out), [r for r in rows if "val_loss" in r]
    rows = [r for r in rows if "loss" in r]
    steps = [r["step"] for r in rows]
    k = max(1, len(rows) // 50)
    fig, ax = plt.subplots(1, 3, figsize=(16, 4.5))
    ax[0].plot(steps, [r["loss"] for r in rows], alpha=0.3, color="C0")
    ax[0].plot(steps, _smooth([r["loss"] for r in rows], k), color="C0", label=f"train (mean of {k})")
    if val:
        ax[0].plot([r["step"] for r in val], [r["val_loss"] for r in val], "o-", color="C1", label="validation")
    # log scale: the first steps are ~10x the rest
    ax[0].set(xlabel="step", ylabel="weighted cross-entropy (log scale)", title="loss", yscale="log")
    ax[0].legend()

    last = rows[-1]
    offsets = list(range(1, len(last["acc"]) + 1))
    ax[1].plot(offsets, last["acc"], "o-", label=f"train, step {last['step']}")
    if val and "val_acc" in val[-1]:
        ax[1].plot(offsets, val[-1]["val_acc"], "s-", label=f"validation, step {val[-1]['step']}")
    ax[1].set(xlabel="block offset k", ylabel="top-1 accuracy", title="accuracy per offset", ylim=(0, 1))
    ax[1].legend()

    ax[2].plot(steps, _smooth([r["tau_est"] for r in rows], k), label="tau from per-offset accuracy")
    ax[2].plot(steps, _smooth([r["tau_blocks"] for r in rows], k), label="tau from leading correct offsets")
    dec = [r for r in rows if "val_decode_tau" in r]
    if dec:
        ax[2].plot([r["step"] for r in dec], [r["val_decode_tau"] for r in dec], "o-", label="real decode (validation)")
    ax[2].set(xlabel="step", ylabel="tokens per round", title="acceptance length (tau)")
    ax[2].legend()
    fig.suptitle(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


# --- shipping a drafter --------------------------------------------------------------------------


def run_summary(rows: list[dict]) -> dict:
    """Headline figures of a run's metrics rows: steps, hours, final loss / tau / per-offset accuracy
    (means of the last 20 steps), the best validation step and every validation row."""
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


def _averaged(params, cfg, other: Path, weight: float):
    """``weight * params + (1 - weight) * other's``, leaf by leaf in float32 (``ship_drafter``'s ``average_with``).

    Raises:
      CheckpointError: ``other`` is not a drafter, or its configuration differs from ``cfg`` (the fields named).
      ConfigError: ``weight`` outside (0, 1].
    """
    import dataclasses

    import jax

    if not 0.0 < weight <= 1.0:
        raise ConfigError(f"average weight {weight}: give the run's share in (0, 1] (0.5: the plain mean)")
    theirs, their_cfg, _ = load_drafter(other)
    # the reading-time fields (how far the block input reaches, tree scores) may differ; a longer reach also adds
    # copy-bias rows, which the shape check below names
    reading = {"ngram_max", "ngram_periodic", "tree_temperature", "dtype"}
    a, b = dataclasses.asdict(cfg), dataclasses.asdict(their_cfg)
    differ = sorted(k for k in a if k not in reading and a[k] != b.get(k))
    if differ:
        raise CheckpointError(
            f"{other} is a drafter of another configuration ({', '.join(differ)} differ); average only two "
            "drafters of one training path"
        )
    if jax.tree.structure(params) != jax.tree.structure(theirs) or any(
        np.shape(x) != np.shape(y) for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(theirs))
    ):
        raise CheckpointError(
            f"{other}: its tensors differ in shape from the run's (a folder read with a longer reach has more "
            "copy-bias rows); average with the folder as trained"
        )
    return jax.tree.map(
        lambda x, y: weight * np.asarray(x, np.float32) + (1.0 - weight) * np.asarray(y, np.float32), params, theirs
    )


def _earlier_stages(earlier: Sequence[str | Path], continues: str | Path | None) -> tuple[list[dict], str]:
    """The stages a run continued (oldest first) and the reproduction commands of the shipped folder the
    first of them continued (``""`` if none)."""
    stages = []
    for run in map(Path, earlier):
        if not (run / "metrics.jsonl").exists():
            raise CheckpointError(
                f"earlier stage {run}: no metrics.jsonl there; give the earlier run's folder (its out_dir, "
                "e.g. runs/smollm2_v1), not the drafter inside it"
            )
        e = run_summary(read_metrics(run))
        stages.append(
            {
                "run": str(run),
                "steps": e["steps"],
                "train_hours": e["train_hours"],
                "best_val_loss": e.get("best_val_loss"),
            }
        )
    commands = ""
    if continues:
        shipped = Path(continues)
        if not (shipped / "training_summary.json").exists():
            raise CheckpointError(
                f"{shipped}: no training_summary.json there; give a folder made by dflash-jax ship-drafter"
            )
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
            commands = readme.split("```bash\n", 1)[1].split("```", 1)[0]
    return stages, commands


def ship_drafter(
    run: str | Path,
    out: str | Path,
    *,
    which: str = "best",
    data_command: str = "",
    command: str = "",
    earlier_stages: Sequence[str | Path] = (),
    continues: str | Path | None = None,
    draft_vocab: str | Path | None = None,
    draft_vocab_size: int = 8192,
    target_name: str = "",
    hardware: str = "",
    average_with: str | Path | None = None,
    average_weight: float = 0.5,
    overwrite: bool = False,
) -> dict:
    """Write the drafter of training run ``run`` (its ``which``: ``best`` or ``drafter``, the final one) to ``out``
    in the released format (bfloat16, with the target's identity so that ``--drafter auto`` finds it), with
    ``train_config.json`` (the run's config), ``training_summary.json`` (``run_summary`` plus ``earlier_stages``:
    the runs it continued through ``init_from``, oldest first, and before them the shipped folder ``continues``,
    with total steps and hours), ``loss.png`` (``plot_run``), optionally ``draft_vocab.json`` (``count_draft_vocab``
    on the ``prepare-data`` folder ``draft_vocab``; without one, the ``continues`` folder's own ``draft_vocab.json``
    is carried over: the most frequent answer tokens of the data before, which the run does not change) and
    ``README.md`` (how it was made: ``data_command``, ``command``, and the shipped folder's own commands before
    them). ``average_with``: a drafter folder of the same configuration (e.g. the shipped one the run continued);
    the weights written are then ``average_weight`` times the run's plus ``1 - average_weight`` times that
    drafter's, tensor by tensor in float32 (checkpoint averaging, as model soups and LAWA: two points of one
    training path, whose mean is often better than either), recorded in the summary (``averaged_with``) and the
    README. Atomic: ``out`` appears (or replaces an earlier shipped folder, with ``overwrite``) only once complete.
    Returns the summary.

    Raises:
      CheckpointError: ``run`` has no such drafter or no metrics, an earlier stage is not a run folder,
        ``continues`` is not a shipped folder or its ``draft_vocab.json`` is malformed, ``average_with`` is not a
        drafter of the same configuration, or ``out`` may not be written.
      ConfigError: ``average_weight`` is outside (0, 1].
      DataError: ``draft_vocab`` holds no shards.
    """
    if which not in ("best", "drafter"):
        raise CheckpointError(f"which={which!r}: 'best' (lowest validation loss) or 'drafter' (the final one)")
    run, out = Path(run), Path(out)
    if not (run / which).is_dir():
        raise CheckpointError(f"{run}: no {which}/ drafter there; pass a training run's folder (its out_dir)")
    params, cfg, identity = load_drafter(run / which)
    rows = read_metrics(run)
    info = run_summary(rows)
    info["shipped"] = which
    if average_with is not None:
        params = _averaged(params, cfg, Path(average_with), average_weight)
        info["averaged_with"] = {"drafter": str(average_with), "weight_of_this_run": average_weight}
    stages, before_commands = _earlier_stages(earlier_stages, continues)
    if stages:
        info["earlier_stages"] = stages
        info["total_steps"] = info["steps"] + sum(x["steps"] for x in stages)
        info["total_train_hours"] = round(info["train_hours"] + sum(x["train_hours"] for x in stages), 2)
    if which == "best" and "best_val_step" in info:
        shipped_at = f"step {info['best_val_step']}, validation loss {info['best_val_loss']}"
    else:
        last_val = info.get("val", [{}])[-1]
        shipped_at = f"step {info['steps']}, last validation loss {last_val.get('val_loss')}"
    if average_with is not None:
        shipped_at += f"; its weights times {average_weight} plus {average_with}'s times {1 - average_weight:g}"
    run_config = json.loads((run / "config.json").read_text()) if (run / "config.json").is_file() else {}
    default_name = Path(str(run_config.get("target", "its target"))).name  # a known name, or a checkpoint folder's
    target_name = target_name or default_name
    vocab_size = min(draft_vocab_size, cfg.vocab_size)
    carried = stored_draft_vocab(continues, cfg.vocab_size) if continues and not draft_vocab else None  # checked
    if carried is not None:
        vocab_size = len(carried["ids"])
    with atomic_folder(out, overwrite=overwrite, kind="released-drafter") as tmp:
        export_released(params, cfg, tmp / "drafter", dtype="bfloat16", target_identity=identity)
        for f in (tmp / "drafter").iterdir():
            f.rename(tmp / f.name)
        (tmp / "drafter").rmdir()
        if (run / "config.json").is_file():
            shutil.copy(run / "config.json", tmp / "train_config.json")
        (tmp / "training_summary.json").write_text(json.dumps(info, indent=1))
        plot_run(rows, tmp / "loss.png", run.name)
        if draft_vocab:
            count_draft_vocab(
                draft_vocab,
                tmp,
                vocab_size,
                command=f"dflash-jax draft-vocab {draft_vocab} --write {out} --size {vocab_size}",
            )
        elif carried is not None:
            shutil.copy(Path(continues) / "draft_vocab.json", tmp / "draft_vocab.json")
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
                f" Its block input is the prompt-lookup continuation (the longest, then latest, earlier match "
                f"of the last {cfg.ngram_min}..{cfg.ngram_max} committed tokens"
                + (", continued past the anchor with the match's period" if cfg.ngram_periodic else "")
                + ") in place of mask tokens"
                + (", with a learned copy bias on the continued tokens' logits" if cfg.copy_bias is not None else "")
                + ": `dflash_config.block_input`, read by dflash-jax; `dflash` loads the same tensors and "
                "drafts from mask tokens."
            )
        on = f" on {hardware}" if hardware else ""
        q = lambda x: shlex.quote(str(x))
        ship_command = (
            f"dflash-jax ship-drafter {q(run)} --out {q(out)} --which {which}"
            + (f" --continues {q(continues)}" if continues else "")
            + (f" --draft-vocab {q(draft_vocab)} --draft-vocab-size {draft_vocab_size}" if draft_vocab else "")
            + "".join(f" --earlier-stage {q(x)}" for x in earlier_stages)
            + (f" --target-name {q(target_name)}" if target_name != default_name else "")
            + (f" --hardware {q(hardware)}" if hardware else "")
            + (f" --average-with {q(average_with)} --average-weight {average_weight:g}" if average_with else "")
        )
        (tmp / "README.md").write_text(
            f"# {kind} drafter for {target_name}\n\n"
            f"Released {kind} format (bfloat16): `config.json` + `model.safetensors`; loads in "
            f"`dflash.model.{ref_class}` and in dflash-jax (`--drafter auto` picks it for this target).\n\n"
            f"{cfg.num_layers} drafter layers, block size {cfg.block_size}, target layers "
            f"{list(cfg.target_layer_ids)}, mask token id {cfg.mask_token_id}.{extras} Trained {info['steps']} steps "
            f"({info['train_hours']} h{on})"
            + "".join(f", continuing {x['run']} ({x['steps']} steps, {x['train_hours']} h)" for x in reversed(stages))
            + (f": {info['total_steps']} steps, {info['total_train_hours']} h in all" if stages else "")
            + f"; shipped: `{which}` ({shipped_at}).\n\n"
            f"- `train_config.json`: the run's full config\n- `training_summary.json`: losses, per-offset "
            f"accuracy, validation tau\n- `loss.png`: the curves (of the last stage)\n"
            + (
                f"- `draft_vocab.json`: the draft vocabulary, the {vocab_size} tokens dflash-jax lets "
                "it propose (the most frequent answer tokens, plus each offset's prompt-lookup token whatever "
                "the list): its LM head then costs a fraction of the full one; `--draft-vocab 0` drafts over "
                "the whole vocabulary; `dflash` ignores the file"
                + (f" (carried over from {continues})" if carried is not None else "")
                + "\n"
                if draft_vocab or carried is not None
                else ""
            )
            + "\n## Reproduce\n\n```bash\n"
            + (f"# before: how {continues} was made\n{before_commands}# then:\n" if before_commands else "")
            + "".join(f"{c}\n" for c in (data_command, command) if c)
            + ship_command
            + "\n```\n"
        )
    return info


# --- bench reports -------------------------------------------------------------------------------


def bench_report(records: str | Path, out: str | Path) -> dict:
    """Write the report of a ``bench`` records file (the ``.records.jsonl`` beside a ``--json-out``; a
    run still going or interrupted included) over every turn in it, as ``bench`` does: ``out`` (JSON),
    the Markdown table (``.md``) and the two plots beside it, with the arms of the run's settings and the
    sets in the records (in ``bench``'s order). ``bench`` reports only the prompts of its last
    invocation; this covers several, e.g. two with different prompt counts into one records file.
    Returns the report.

    Raises:
      BenchError: not a records file, or it holds no measured turn yet.
    """
    if not Path(records).is_file():
        raise BenchError(f"{records}: no such file; pass the .records.jsonl beside a bench --json-out")
    settings, rows = bench.read_records(records)
    # one record per turn, the last written (bench measures a turn again if its prompt's text changed)
    rows = list({(r["dataset"], r["id"], r["turn"]): r for r in rows}.values())
    if not rows:
        raise BenchError(f"{records}: no measured turns yet")
    arms = [int(a) if str(a).isdigit() else a for a in settings.get("arms", settings["block_sizes"])]
    present = {r["dataset"] for r in rows}
    datasets = [d for d in DATASETS if d in present] + sorted(present - set(DATASETS))
    rep = bench.report(rows, arms, datasets)
    bench.write_outputs(rep, rows, settings, Path(out))
    return rep
