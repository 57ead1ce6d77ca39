"""Evaluation harness: plain and speculative decoding, interleaved, on standard prompt sets.

``dflash-jax bench`` runs, prompt by prompt, our plain decoding (block size 1) and then
DFlash speculative decoding at each requested block size, on the same prompts in the same
process, and reports what papers report (DFlash paper, section 5; the reference benchmark
``dflash.benchmark``):

- **tau**: tokens committed per target verify. ``tau`` averages over all rounds of all
  prompts; ``tau_per_prompt`` is the mean of each prompt's own mean, as the reference
  benchmark reports it. The first token (from prefill) is not a round.
- the acceptance-length histogram (rounds that committed 1 .. B tokens) and the per-offset
  acceptance rate (fraction of rounds whose draft offset k was accepted, k = 1 .. B-1);
- decode tokens/s of plain and speculative decoding and their ratio, the **speedup**
  (decode only: the first token and the prefill are reported apart as time to first token,
  compilation apart again);
- the same on loop-free prompts only (a plain output in which some 8-gram occurs 3 times or
  more is *looping*; loops make drafting easy and inflate tau).

Records are appended to ``<json-out>.records.jsonl`` as they are measured, so an
interrupted run resumes where it stopped (same settings required).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import jax
import numpy as np

from dflash_jax import dflash_format
from dflash_jax.errors import BenchError
from dflash_jax.prompts import EvalPrompt
from dflash_jax.tokens import chat_ids, loops
from dflash_jax.utils import atomic_write_text, differences_text, json_sha256, read_jsonl


def _timing(r) -> dict:
    return {"tokens": r.num_output_tokens, "decode_s": r.decode_s, "prefill_s": r.prefill_s, "compile_s": r.compile_s}


def run(
    prompts: Sequence[EvalPrompt],
    tok,
    plain,
    speculative: dict[int | str, object],
    *,
    max_new_tokens: int,
    stop_ids: Sequence[int],
    records: Path,
    settings: dict,
    batch_size: int = 1,
    seed: int = 0,
    progress: Callable | None = None,
) -> list[dict]:
    """Measure every prompt (and turn) with ``plain`` and each speculative decoder, interleaved.

    Args:
      prompts: benchmark items.
      tok: the target's tokenizer (chat template).
      plain: a ``Decoder`` without drafter; ``speculative``: arm -> ``Decoder``; an arm is a block size
        (the DFlash drafter at that block, recorded as ``b{B}``) or a name (any other decoder:
        ``ngram``, ``default``, ...), recorded under that name.
      max_new_tokens: per turn.
      records: JSONL file the per-turn records are appended to (created; a header line holds
        ``settings``); records already there are kept and their turns skipped.
      settings: what the records depend on (target, drafter, block sizes, ...).
      batch_size: items decoded together; each row's time is its share of the batch's.
      seed: sampling seed; item ``i`` (in ``prompts`` order) uses ``seed + i``, the same for plain
        and speculative decoding (their outputs then differ, but not in distribution).
      progress: called with the number of turns finished after each batch (a progress bar).

    Returns:
      every record (old and new), one per (dataset, id, turn): ``plain`` and per-arm timings
      (``tokens``, ``decode_s``, ``prefill_s``, ``compile_s``), ``acceptance_lengths``, ``verify_widths``
      (positions verified per round), ``block_size`` and ``identical`` (same tokens as plain) per arm, ``loops``,
      ``prompt_tokens``, ``output_ids`` (plain).

    Raises:
      BenchError: ``records`` was written with other settings (the fields that differ are named) or
        is not a records file.
    """
    done = _open_records(records, settings)
    # a record is reused only for the same item with the same text (another prompts file may reuse ids)
    items = {(p.dataset, p.id): p for p in prompts}
    by_key = {
        (r["dataset"], r["id"], r["turn"]): r
        for r in done
        if r.get("text_sha") == _text_sha(items.get((r["dataset"], r["id"])), r["turn"])
    }
    max_turns = max(len(p.turns) for p in prompts)
    index = {(p.dataset, p.id): i for i, p in enumerate(prompts)}
    with records.open("a", encoding="utf-8") as out:
        for turn in range(max_turns):
            todo = [p for p in prompts if len(p.turns) > turn and (p.dataset, p.id, turn) not in by_key]
            for i in range(0, len(todo), batch_size):
                chunk = todo[i : i + batch_size]
                ids = [chat_ids(tok, _messages(p, turn, by_key, tok)) for p in chunk]
                seeds = [seed + index[(p.dataset, p.id)] for p in chunk]
                base = plain.generate(ids, max_new_tokens, stop_ids, seeds)
                new = [
                    {
                        "dataset": p.dataset,
                        "id": p.id,
                        "turn": turn,
                        "text_sha": _text_sha(p, turn),
                        "prompt_tokens": len(x),
                        "output_ids": r.token_ids,
                        "loops": loops(r.token_ids),
                        "plain": _timing(r),
                    }
                    for p, x, r in zip(chunk, ids, base)
                ]
                for arm, dec in speculative.items():
                    for rec, r, b in zip(new, dec.generate(ids, max_new_tokens, stop_ids, seeds), base):
                        rec[arm_key(arm)] = {
                            **_timing(r),
                            "acceptance_lengths": r.acceptance_lengths,
                            "verify_widths": r.verify_widths,
                            "block_size": dec.block_size,
                            **({"tree_nodes": dec.tree_size} if dec.tree_size else {}),
                            "identical": r.token_ids == b.token_ids,
                        }
                for rec in new:
                    for key in ["plain"] + [arm_key(arm) for arm in speculative]:
                        # decode and compile time: each row's share of the batch (throughput); the
                        # prefill stays whole, since every row waits for all of it (time to first token)
                        rec[key]["decode_s"] /= len(chunk)
                        rec[key]["compile_s"] /= len(chunk)
                    by_key[(rec["dataset"], rec["id"], turn)] = rec
                    out.write(json.dumps(rec) + "\n")
                out.flush()
                if progress is not None:
                    progress(len(chunk))
    keys = {(p.dataset, p.id, t) for p in prompts for t in range(len(p.turns))}
    return [r for k, r in by_key.items() if k in keys]


def _text_sha(p: EvalPrompt | None, turn: int) -> str | None:
    """Hash of an item's user turns up to ``turn`` (what its record was measured on)."""
    if p is None or turn >= len(p.turns):
        return None
    return json_sha256(list(p.turns[: turn + 1]), 16)


def _messages(p: EvalPrompt, turn: int, by_key: dict, tok) -> list[dict]:
    """The conversation up to ``turn``: earlier user turns with the target's (plain) replies."""
    msgs = []
    for t in range(turn):
        reply = tok.decode(by_key[(p.dataset, p.id, t)]["output_ids"], skip_special_tokens=True)
        msgs += [{"role": "user", "content": p.turns[t]}, {"role": "assistant", "content": reply}]
    return msgs + [{"role": "user", "content": p.turns[turn]}]


def drafter_fingerprint(params, cfg) -> str:
    """sha256 (hex, 16 digits) of a drafter's configuration and weights: what bench records depend
    on, whatever folder the drafter was loaded from (a re-shipped drafter at the same path gets a
    new fingerprint, so its records are never mixed with the old one's)."""
    config = json.dumps(dflash_format.config_json(cfg), sort_keys=True)
    h = hashlib.sha256(config.encode())  # then the weights, leaf by leaf
    for leaf in jax.tree.leaves(params):
        a = np.asarray(leaf)
        h.update(f"{a.dtype}{a.shape}".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


def settings_without_folder(settings: dict) -> dict:
    """``settings`` without the drafter's folder: what a records file's key hashes (``drafter_sha256``
    names the drafter whatever its path, so a moved checkout or a copied drafter resumes its records)."""
    return {k: v for k, v in settings.items() if k != "drafter"}


def settings_key(settings: dict) -> str:
    """The 16-hex-digit key a records file is resumed under: a sha256 of ``settings_without_folder``."""
    return json_sha256(settings_without_folder(settings), 16)


def _legacy_settings_key(settings: dict) -> str:
    """The key of records files written before 2026-12-03, which hashed the drafter's absolute path too."""
    return json_sha256(settings, 16)


def read_records(path: str | Path) -> tuple[dict, list[dict]]:
    """Read a ``.records.jsonl`` file without changing it: ``(settings, records)``.

    A line cut by a killed run is skipped, as a resumed ``run`` drops it (the file may still be
    being appended to).

    Raises:
      BenchError: the file has no settings header (not the records file beside a ``--json-out``).
    """
    rows, _ = read_jsonl(path)
    if not rows or not isinstance(rows[0], dict) or "settings" not in rows[0]:
        raise BenchError(f"{path} is not a bench records file (the .records.jsonl beside a --json-out file)")
    return rows[0]["settings"], [r for r in rows[1:] if isinstance(r, dict)]


def _open_records(path: Path, settings: dict) -> list[dict]:
    """The records already in ``path`` (created with a ``settings`` header if absent; a cut last line dropped).

    Raises:
      BenchError: ``path`` was written with other settings (the message names the fields that differ,
        old -> new, shortened) or has no settings header.
    """
    key = settings_key(settings)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"settings": settings, "settings_key": key}) + "\n")
        return []
    rows, skipped = read_jsonl(path)  # a line cut by a kill is dropped, and its turn measured again
    header = rows[0] if rows and isinstance(rows[0], dict) and "settings_key" in rows[0] else {}
    if not rows:  # a header cut by a kill before any record: start afresh
        path.write_text(json.dumps({"settings": settings, "settings_key": key}) + "\n")
        return []
    if header.get("settings_key") not in (key, _legacy_settings_key(settings)):
        old = rows[0].get("settings") if isinstance(rows[0], dict) else None
        if not isinstance(old, dict):
            raise BenchError(
                f"{path} has no settings header, so it is not a bench records file; pass another --json-out, "
                "or delete it to start over"
            )
        new = json.loads(json.dumps(settings, default=str))  # as it was written (lists, not tuples)
        diff = differences_text(settings_without_folder(old), settings_without_folder(new))
        raise BenchError(
            f"{path} was written with other settings ({diff}); pass another --json-out, or delete it to start over"
        )
    recs = rows[1:]
    if skipped or not path.read_text(encoding="utf-8").endswith("\n"):
        atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in [header, *recs]))
    return recs


def arm_key(arm: int | str) -> str:
    """The record key of an arm: ``b{B}`` for a block size of the DFlash drafter, else the arm's name."""
    return f"b{arm}" if isinstance(arm, int) else str(arm)


def summarise(records: Sequence[dict], arm: int | str) -> dict:
    """Aggregate figures of ``records`` for one arm (a DFlash block size or an arm name; see the
    module docstring).

    Decode tokens/s counts the tokens after the first (which comes from the prefill) over
    the decode time, summed over records; ``speedup`` = speculative / plain tokens/s.
    """
    k = arm_key(arm)
    recs = [r for r in records if k in r]
    if not recs:
        return {"prompts": 0}
    block_size = int(recs[0][k].get("block_size", arm if isinstance(arm, int) else 0))
    acc = [a for r in recs for a in r[k]["acceptance_lengths"]]
    per_prompt = [float(np.mean(r[k]["acceptance_lengths"])) for r in recs if r[k]["acceptance_lengths"]]
    hist = np.bincount(np.asarray(acc, int), minlength=block_size + 1)[1 : block_size + 1]
    rounds = max(len(acc), 1)
    offset_rate = [float(np.sum(np.asarray(acc) > j) / rounds) for j in range(1, block_size)]

    def tps(key):
        toks = sum(max(r[key]["tokens"] - 1, 0) for r in recs)
        return toks / max(sum(r[key]["decode_s"] for r in recs), 1e-9)

    plain_tps, spec_tps = tps("plain"), tps(k)
    # tokens per position the target verifies, from each round's verify width where recorded; records made
    # before widths were: a DFlash row verifies its whole block, a tree row its anchor and nodes, an arm that
    # chooses its width per round is unknown (None)
    width = block_size if isinstance(arm, int) else None  # a DFlash row: its whole block
    if str(arm).startswith("tree") and "tree_nodes" in recs[0][k]:  # a tree row: its anchor and nodes
        width = recs[0][k]["tree_nodes"] + 1
    verified = [w for r in recs for w in r[k].get("verify_widths", [])]
    if len(verified) == len(acc) and acc:
        width = float(np.mean(verified))
    return {
        "prompts": len(recs),
        "tau": float(np.mean(acc)) if acc else 0.0,
        "tokens_per_verified": float(np.mean(acc)) / width if acc and width else None,
        "mean_verify_width": float(width) if acc and width else None,
        "tau_per_prompt": float(np.mean(per_prompt)) if per_prompt else 0.0,
        "rounds": len(acc),
        "acceptance_histogram": hist.tolist(),
        "offset_acceptance": offset_rate,
        "plain_tokens_per_s": plain_tps,
        "dflash_tokens_per_s": spec_tps,
        "speedup": spec_tps / max(plain_tps, 1e-9),
        "mean_output_tokens": float(np.mean([r["plain"]["tokens"] for r in recs])),
        "ttft_plain_s": float(np.mean([r["plain"]["prefill_s"] for r in recs])),
        "ttft_dflash_s": float(np.mean([r[k]["prefill_s"] for r in recs])),
        "compile_s": float(sum(r["plain"]["compile_s"] + r[k]["compile_s"] for r in recs)),
        "identical": sum(bool(r[k]["identical"]) for r in recs),
        "looping": sum(bool(r["loops"]) for r in recs),
    }


# Arms compared prompt by prompt when both were measured: (arm, against)
PAIRED = (("default", "chains"), ("default", "ungated"))


def paired(records: Sequence[dict], arm: str, against: str) -> dict:
    """``arm`` against ``against`` prompt by prompt (both decoded in turn on each, so a slow spell of the
    machine falls on both): the ratio of their decode speeds (tokens after the first over decode
    seconds) per prompt, its mean with one standard error, its geometric mean, and the prompts on
    which ``arm`` was faster. Prompts of fewer than 2 tokens are left out."""
    ratios = []
    for r in records:
        if arm in r and against in r and r[arm]["tokens"] > 1 and r[arm]["decode_s"] > 0 and r[against]["decode_s"] > 0:
            speed = lambda k: (r[k]["tokens"] - 1) / r[k]["decode_s"]  # noqa: E731
            ratios.append(speed(arm) / speed(against))
    if not ratios:
        return {"prompts": 0}
    x = np.asarray(ratios)
    se = float(x.std(ddof=1) / np.sqrt(len(x))) if len(x) > 1 else None
    return {
        "prompts": len(x),
        "mean": float(x.mean()),
        "standard_error": se,
        "geometric_mean": float(np.exp(np.log(x).mean())),
        "faster": int(np.sum(x > 1)),
    }


def report(records: Sequence[dict], block_sizes: Sequence[int | str], datasets: Sequence[str]) -> dict:
    """Per dataset (and all together) and per arm (``block_sizes``: DFlash block sizes and arm
    names): ``summarise`` of all prompts and of the loop-free ones; for each pair of ``PAIRED`` arms
    both measured, ``paired`` per dataset (``paired[f"{arm}/{against}"][dataset]``). Top level:
    ``tau`` and ``speedup`` of all prompts for the first arm."""
    groups = {d: [r for r in records if r["dataset"] == d] for d in datasets}
    if len(datasets) > 1:
        groups["all"] = list(records)
    table = {
        d: {
            str(b): {"all": summarise(rs, b), "loop_free": summarise([r for r in rs if not r["loops"]], b)}
            for b in block_sizes
        }
        for d, rs in groups.items()
    }
    head = table["all" if len(datasets) > 1 else datasets[0]][str(block_sizes[0])]["all"]
    arms = {str(b) for b in block_sizes}
    pairs = {f"{a}/{b}": {d: paired(rs, a, b) for d, rs in groups.items()} for a, b in PAIRED if {a, b} <= arms}
    out = {"tau": head.get("tau"), "speedup": head.get("speedup"), "block_size": block_sizes[0], "table": table}
    return out | ({"paired": pairs} if pairs else {})


def markdown(rep: dict) -> str:
    """The report as a Markdown table (one row per dataset and arm; a number is the DFlash block size;
    tokens per verified position: tau over the positions a round verifies, from each round's recorded
    width, or for records without widths the fixed width of a DFlash block or a tree's anchor and nodes)."""
    lines = [
        "| dataset | arm | prompts | tau | tau/prompt | tokens per verified position | plain tok/s | DFlash tok/s | "
        "speedup | TTFT plain / DFlash (ms) | looping | loop-free tau | loop-free speedup | identical |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for d, by_block in rep["table"].items():
        for b, s in by_block.items():
            a, lf = s["all"], s["loop_free"]
            if not a["prompts"]:
                continue
            lf_cells = f"{lf['tau']:.2f} | {lf['speedup']:.2f}x" if lf["prompts"] else "- | -"
            per = a.get("tokens_per_verified")
            lines.append(
                f"| {d} | {b} | {a['prompts']} | {a['tau']:.2f} | {a['tau_per_prompt']:.2f} | "
                f"{'-' if per is None else f'{per:.3f}'} | "
                f"{a['plain_tokens_per_s']:.1f} | {a['dflash_tokens_per_s']:.1f} | {a['speedup']:.2f}x | "
                f"{a['ttft_plain_s'] * 1e3:.0f} / {a['ttft_dflash_s'] * 1e3:.0f} | {a['looping']} | {lf_cells} | "
                f"{a['identical']}/{a['prompts']} |"
            )
    for name, by_set in rep.get("paired", {}).items():
        arm, against = name.split("/")
        lines += [
            "",
            f"{arm} against {against}, prompt by prompt (decode speed ratio; mean +- one standard error):",
            "",
            f"| dataset | prompts | {arm} / {against} | geometric mean | prompts {arm} was faster |",
            "|---|---|---|---|---|",
        ]
        for d, p in by_set.items():
            if p["prompts"]:
                se = "" if p["standard_error"] is None else f" +- {p['standard_error']:.3f}"
                lines.append(
                    f"| {d} | {p['prompts']} | {p['mean']:.3f}{se} | {p['geometric_mean']:.3f} | {p['faster']} |"
                )
    return "\n".join(lines) + "\n"


def plot(rep: dict, out_prefix: Path) -> list[Path]:
    """Two PNGs: acceptance-length histograms and per-offset acceptance rates, one line per dataset."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    written = []
    blocks = list(next(iter(rep["table"].values())).keys())
    for kind, ylabel in (("histogram", "fraction of rounds"), ("offsets", "acceptance rate")):
        fig, axes = plt.subplots(1, len(blocks), figsize=(5.5 * len(blocks), 3.8), squeeze=False)
        for ax, b in zip(axes[0], blocks):
            for d, by_block in rep["table"].items():
                s = by_block[b]["all"]
                if not s["prompts"]:
                    continue
                if kind == "histogram":
                    h = np.asarray(s["acceptance_histogram"], float)
                    ax.plot(
                        np.arange(1, len(h) + 1), h / max(h.sum(), 1), marker="o", label=f"{d} (tau {s['tau']:.2f})"
                    )
                    ax.set_xlabel("tokens committed per round (acceptance length)")
                else:
                    r = s["offset_acceptance"]
                    ax.plot(np.arange(1, len(r) + 1), r, marker="o", label=d)
                    ax.set_xlabel("draft offset k")
            ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
            ax.set_title(f"DFlash, block size {b}" if b.isdigit() else f"{b}")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        fig.tight_layout()
        path = Path(f"{out_prefix}_{kind}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def write_outputs(rep: dict, records: Sequence[dict], settings: dict, json_out: Path) -> list[Path]:
    """``json_out`` (report + every per-turn record, output ids dropped), ``.md`` and the two PNGs."""
    json_out.parent.mkdir(parents=True, exist_ok=True)
    slim = [{k: v for k, v in r.items() if k != "output_ids"} for r in records]
    atomic_write_text(
        json_out,
        json.dumps(
            {**rep, "settings": settings, "created": time.strftime("%Y-%m-%d %H:%M:%S"), "records": slim}, indent=1
        ),
    )
    md = json_out.with_suffix(".md")
    md.write_text(markdown(rep))
    return [json_out, md, *plot(rep, json_out.with_suffix(""))]
