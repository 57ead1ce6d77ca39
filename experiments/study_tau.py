"""Greedy tau of drafters and of prompt lookup on the benchmark sets, from recorded plain answers.

A greedy speculative decode commits exactly the target's plain greedy output, so its rounds are
determined by that output: a round anchored at position p commits the acceptance length the
drafter's block at p reaches against the answer, and the next round is anchored where it ends.
This script walks the plain outputs a bench run recorded (``output_ids`` of
``<records>/t0_<set>.records.jsonl``, first turns, prompts re-encoded with the chat template) that
way: one target forward per answer for the drafter's context, then the drafter's training forward
(``loss.block_logits``, the decoder's draft step on the same context up to float rounding:
``tests/test_train.py::test_training_forward_equals_decoder_drafter_random``) at every anchor, at
each block size asked for; prompt lookup walks the same answers with the rule of SPEC "N-gram
(prompt-lookup) drafting" (``ngram_acceptance.propose``). The last round is cut where the answer
ends, as the length limit cuts a decode's; in that round the decoder also hides the block's
offsets past the limit from the drafter, which this walk does not, so the last round's draft (one
round per answer at most) can differ from the decoder's. No decoding, so it costs about a target forward plus a
drafter forward per block size per answer, where decoding costs a verify per round:
this is the study's measure of tau (``docs/BENCHMARKS.md``, "Fixed-budget study"); ``bench``
decodes, for speed.

Per (drafter, set, prompt, block) one line in ``--out`` (JSON lines): rerunning the command
skips what is there. Prints one table of tau per set and block.

    .venv/bin/python experiments/study_tau.py --per-set 20 --blocks 4 8 16 \\
        --drafter mask=runs/mix_mask/best copy=runs/mix_copy_lr/best --out docs/bench/issue20/study_tau.jsonl

``--draft-vocab N``: each drafter drafts over the first N tokens of its stored draft vocabulary
(``draft_vocab.json``) and its prompt-lookup tokens, as the decoder does with that list.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
from anchor_acceptance import acceptance_at_anchors, simulated_rounds
from ngram_acceptance import SETS, accepted, first_turns, propose


def drafter_lengths(ck, dparams, dcfg, full: list[int], start: int, vocab=None) -> np.ndarray:
    """This drafter's (and draft vocabulary ``vocab``'s, token ids or None) acceptance length at every
    anchor ``start .. len(full) - 2`` of ``full`` (prompt + answer; ``start`` its first answer token),
    each cut where ``full`` ends."""
    b, n = dcfg.block_size, len(full)
    tokens = np.asarray(full + [0] * b, np.int32)  # a whole block after every anchor; the padding is cut below
    mask = np.arange(len(tokens)) >= start
    a = acceptance_at_anchors(ck, dparams, dcfg, tokens, mask, vocab=vocab)[: n - 1 - start]  # anchors start .. n-2
    return np.minimum(a, n - 1 - (start + np.arange(len(a))))


def drafter_rounds(ck, dparams, dcfg, full: list[int], start: int, vocab=None) -> list[int]:
    """Acceptance lengths of the rounds of a greedy decode of ``full`` from its first answer token
    (index ``start``) with this drafter, the last cut where ``full`` ends (``drafter_lengths``)."""
    return simulated_rounds(drafter_lengths(ck, dparams, dcfg, full, start, vocab))


def at_block_size(dparams, dcfg, block: int):
    """The drafter as a block-``block`` drafter for the training forward, as the decoder runs it
    with ``block_size=block``: the same weights, the copy-bias table cut to the block's offsets."""
    if dcfg.copy_bias is not None:
        dparams = dict(dparams, copy_bias=dparams["copy_bias"][:, : block - 1])
    return dparams, dataclasses.replace(dcfg, block_size=block)


def ngram_rounds(full: list[int], start: int, block: int) -> list[int]:
    """The same for prompt lookup (n = 4 .. 1, at most ``block - 1`` tokens; ``ngram_acceptance.propose``)."""
    rounds, pos = [], start
    while pos < len(full) - 1:
        a = accepted(propose(full[: pos + 1], block - 1)[0], full, pos)
        rounds.append(a + 1)
        pos += a + 1
    return rounds


def main() -> None:
    from tqdm import tqdm
    from transformers import AutoTokenizer

    from dflash_jax import checkpoint
    from dflash_jax.bench import drafter_fingerprint
    from dflash_jax.drafter_io import load_drafter, read_draft_vocab

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafter", nargs="*", default=[], help="label=folder (a run's best/ or a released drafter)")
    ap.add_argument(
        "--records",
        type=Path,
        default=Path("docs/bench/full"),
        help="folder of t0_<set>.records.jsonl, or one bench run's .records.jsonl holding every set",
    )
    ap.add_argument("--sets", nargs="+", default=list(SETS), choices=SETS)
    ap.add_argument("--per-set", type=int, default=20, help="first turns per set")
    ap.add_argument(
        "--skip", type=int, default=0, help="leave out each set's first SKIP first turns (a held-out split to tune on)"
    )
    ap.add_argument("--blocks", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--ngram", choices=("on", "off"), default="on", help="also prompt lookup (n = 4 .. 1)")
    ap.add_argument("--out", type=Path, required=True, help="JSON lines, one per (drafter, set, prompt, block)")
    ap.add_argument(
        "--draft-vocab",
        type=int,
        default=0,
        metavar="N",
        help="draft over the first N tokens of each drafter's draft_vocab.json (0: all)",
    )
    args = ap.parse_args()
    arms = {}  # label -> (params, config, fingerprint): records are keyed by the weights, not the folder
    for spec in args.drafter:
        label, sep, folder = spec.partition("=")
        if not sep or not label or label == "ngram" or not Path(folder).is_dir():
            sys.exit(f"--drafter {spec!r}: give label=folder with an existing folder (label not 'ngram')")
        dparams, dcfg, _ = load_drafter(folder)
        vocab = None
        if args.draft_vocab:
            vocab = read_draft_vocab(folder)
            if vocab is None or len(vocab) < args.draft_vocab:
                sys.exit(f"--draft-vocab {args.draft_vocab}: {folder} stores no draft vocabulary that long")
            vocab = vocab[: args.draft_vocab]
        fp = drafter_fingerprint(dparams if vocab is None else {**dparams, "draft_vocab": vocab}, dcfg)
        arms[label] = (dparams, dcfg, fp, vocab)
    ck = checkpoint.load_target("smollm2-135m-instruct")
    tok = AutoTokenizer.from_pretrained(str(checkpoint.resolve_target("smollm2-135m-instruct")))
    answers = [
        (name, *turn) for name in args.sets for turn in first_turns(args.records, name, tok, args.skip, args.per_set)
    ]
    done = set()
    if args.out.exists():
        for line in args.out.read_text().splitlines():
            r = json.loads(line)
            done.add((r["arm"], r["drafter"], r["set"], r["id"], r["block"]))
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def record(arm, drafter, name, pid, block, rounds):
        with args.out.open("a") as f:  # one whole line per append: an interruption loses at most it
            f.write(json.dumps(dict(arm=arm, drafter=drafter, set=name, id=pid, block=block, rounds=rounds)) + "\n")

    if args.ngram == "on":
        for name, pid, full, start in answers:
            for b in args.blocks:
                if ("ngram", "", name, pid, b) not in done:
                    record("ngram", "", name, pid, b, ngram_rounds(full, start, b))
    for label, (dparams, dcfg, fp, vocab) in arms.items():
        for b in args.blocks:
            params_b, cfg_b = at_block_size(dparams, dcfg, b)
            for name, pid, full, start in tqdm(answers, desc=f"{label} @{b}", leave=False):
                if (label, fp, name, pid, b) not in done:
                    record(label, fp, name, pid, b, drafter_rounds(ck, params_b, cfg_b, full, start, vocab))
    want = {"ngram": ""} if args.ngram == "on" else {}
    print_table(args.out, args.sets, args.blocks, {**want, **{k: v[2] for k, v in arms.items()}})


def print_table(path: Path, sets, blocks, want: dict) -> None:
    """A Markdown table of tau per set (rows) and arm and block (columns) from the records of the
    arms ``want`` (label -> drafter fingerprint, "" for prompt lookup)."""
    rows = [r for r in map(json.loads, path.read_text().splitlines()) if want.get(r["arm"]) == r["drafter"]]
    labels = list(want)
    print("tau = tokens committed / rounds over the set's answers")
    print("| set (answers) | " + " | ".join(f"{a} @{b}" for a in labels for b in blocks) + " |")
    print("|---|" + "---|" * (len(labels) * len(blocks)))
    for name in sets:
        cells, count = [], 0
        for a in labels:
            for b in blocks:
                mine = [r for r in rows if r["arm"] == a and r["set"] == name and r["block"] == b]
                count = max(count, len(mine))
                t = sum(sum(r["rounds"]) for r in mine) / max(sum(len(r["rounds"]) for r in mine), 1)
                cells.append(f"{t:.2f}" if mine else "-")
        print(f"| {name} ({count}) | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
