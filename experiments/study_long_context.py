"""Does the drafter's tau fall with context length? (issue 38, "long context")

Long prompts are built from the target's own answers in ``data/smollm2-mix`` (never a benchmark), of
two kinds (``--kinds``): ``notes``, a "document" of whole answers from held-out shards, cut to about
``L`` tokens, then a question about it (``QUESTIONS``), in one user turn; ``chat``, a multi-turn
conversation of about ``L`` tokens, its turns the training prompts of those shards and the target's
own answers to them, ending with one more prompt to answer; ``chat-paired``, the same but prompt ``i``
asks the same last question at every length (its history alone grows; length 0: the question alone), so
that a prompt's tau at each length compares with its own (``print_paired``). Each prompt is decoded
greedily with the drafter alone (no prompt lookup, which copies from long prompts and would hide the
drafter's own tokens), block ``--block-size``, every block token verified; every round's acceptance
length and start position is kept. Prints tau by prompt length and by where a round starts (tokens
of context before it).

    .venv/bin/python experiments/study_long_context.py --lengths 256 1024 2048 4096 --per-length 6 \\
        --max-new-tokens 128 --kinds notes chat --out docs/bench/long_context/pilot.jsonl

Resumable: records already in ``--out`` are kept and skipped (a record without a kind is ``notes``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

QUESTIONS = (
    "Summarize the notes above in three sentences.",
    "List the main topics the notes above cover.",
    "Which of the notes above is the most useful, and why?",
    "Write one quiz question about the notes above, and answer it.",
)
START_BUCKETS = (0, 512, 1024, 2048, 4096, 8192)


def exchanges(data: Path, shards: range, tok) -> list[tuple[str, str]]:
    """(user prompt, the target's answer) of every single-turn sequence of the given shards, decoded
    (the prompt read from the chat template's user turn)."""
    import re

    from dflash_jax.data import Shard

    out = []
    for k in shards:
        sh = Shard(data / f"shard_{k:05d}")
        off = np.asarray(sh.offsets)
        for i in range(len(off) - 1):
            ids = np.asarray(sh.tokens[off[i] : off[i + 1]])
            mask = np.asarray(sh.loss_mask[off[i] : off[i + 1]])
            users = re.findall(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", tok.decode(ids[~mask].tolist()), re.S)
            if len(users) == 1:  # a follow-up's sequence holds two turns: not a single exchange
                out.append((users[0].strip(), tok.decode(ids[mask].tolist(), skip_special_tokens=True).strip()))
    return out


def exchange_tokens(tok, user: str, answer: str) -> int:
    """About how many tokens a (prompt, answer) turn pair takes in a chat: their text and the template's ~10."""
    return len(tok.encode(user + answer, add_special_tokens=False)) + 10


def long_chat(tok, pairs: list[tuple[str, str]], length: int, rs, last: int | None = None) -> list[int]:
    """A conversation of about ``length`` tokens: (prompt, answer) turns drawn with ``rs``, then one more
    prompt, through the chat template (``tokens.chat_ids``). ``last``: that final prompt's pair (the
    ``chat-paired`` kind: the same question after any amount of history, down to none at ``length`` 0);
    None: the last of the draw, after at least one earlier turn."""
    from dflash_jax.tokens import chat_ids

    order = rs.permutation(len(pairs))
    history = order[:-1] if last is None else order[order != last]
    last = order[-1] if last is None else last
    messages, used = [], 0
    for j in history:
        user, answer = pairs[j]
        n = exchange_tokens(tok, user, answer)
        if used + n > length and (messages or length == 0):
            break
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
        used += n
    return chat_ids(tok, [*messages, {"role": "user", "content": pairs[last][0]}])


def long_prompt(tok, docs: list[str], length: int, question: str, rs) -> list[int]:
    """A user turn of about ``length`` tokens: numbered notes (whole answers, drawn with ``rs``), then the question."""
    from dflash_jax.tokens import encode

    notes, used = [], 0
    for j in rs.permutation(len(docs)):
        n = len(tok.encode(docs[j], add_special_tokens=False))
        if used + n > length and notes:
            break
        notes.append(docs[j])
        used += n
    text = "".join(f"Note {i + 1}:\n{d}\n\n" for i, d in enumerate(notes)) + question
    return encode(tok, text, chat=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", type=int, nargs="+", default=[256, 1024, 2048, 4096])
    ap.add_argument("--per-length", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--drafter", default="auto", help="as generate's --drafter")
    ap.add_argument("--data", type=Path, default=ROOT / "data" / "smollm2-mix")
    ap.add_argument("--shards", type=int, nargs=2, default=[30, 42], help="held-out shards the notes come from")
    ap.add_argument(
        "--kinds",
        nargs="+",
        default=["notes"],
        choices=["notes", "chat", "chat-paired"],
        help="prompt kinds (chat-paired: prompt i asks the same question at every length)",
    )
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    from dflash_jax import checkpoint, hub, speculation
    from dflash_jax.decode import Decoder
    from dflash_jax.tokens import stop_ids
    from dflash_jax.utils import enable_compilation_cache, log

    enable_compilation_cache()
    ck = checkpoint.load_target(hub.SMOLLM2)
    tok = ck.tokenizer()
    plan = speculation.plan_for(
        ck, args.drafter, tok, block_size=args.block_size, prompt_lookup=False, verify_lengths=None
    )
    dec, stops = Decoder(ck.params, ck.cfg, plan), stop_ids(tok)
    pairs = exchanges(args.data, range(*args.shards), tok)
    docs = [answer for _, answer in pairs]
    done = {}
    if args.out.exists():
        for line in args.out.read_text().splitlines():
            r = json.loads(line)
            done[(r.get("kind", "notes"), r["length"], r["index"])] = r
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "a") as f:
        for length in args.lengths:
            for kind in args.kinds:
                for i in range(args.per_length):
                    if (kind, length, i) in done:
                        continue
                    rs = np.random.RandomState(length * 1000 + i + {"notes": 0, "chat": 500, "chat-paired": 900}[kind])
                    if kind == "chat":
                        ids = long_chat(tok, pairs, length, rs)
                    elif kind == "chat-paired":  # the question fixed by i alone; only the history changes
                        last = np.random.RandomState(7000 + i).randint(len(pairs))
                        ids = long_chat(tok, pairs, length, rs, last=last)
                    else:
                        ids = long_prompt(tok, docs, length, QUESTIONS[i % len(QUESTIONS)], rs)
                    [r] = dec.generate([ids], args.max_new_tokens, stops)
                    starts = (len(ids) + np.concatenate([[0], np.cumsum(r.acceptance_lengths)[:-1]])).tolist()
                    rec = {"kind": kind, "length": length, "index": i, "prompt_tokens": len(ids), "tau": r.tau}
                    rec |= {"rounds": r.acceptance_lengths, "starts": starts, "output_tokens": r.num_output_tokens}
                    f.write(json.dumps(rec) + "\n")
                    f.flush()
                    done[(kind, length, i)] = rec
                    log(f"{kind} {length} #{i}: {len(ids)} prompt tokens, tau {r.tau:.2f}")
    for kind in args.kinds:
        print(f"\n{kind}:")
        print_table([r for r in done.values() if r.get("kind", "notes") == kind], args.lengths)
        if kind == "chat-paired":
            print_paired([r for r in done.values() if r.get("kind") == kind], args.lengths)


def print_paired(records: list[dict], lengths) -> None:
    """Each question's tau at every length, and the geometric mean over questions of its tau at a length
    over its tau at the shortest (questions measured at both)."""
    by = {(r["index"], r["length"]): r["tau"] for r in records}
    questions = sorted({i for i, _ in by})
    print("\n| question | " + " | ".join(f"~{n}" for n in lengths) + " |")
    print("|---|" + "---|" * len(lengths))
    for i in questions:
        print(f"| {i} | " + " | ".join(f"{by[i, n]:.2f}" if (i, n) in by else "" for n in lengths) + " |")
    cells = []
    for n in lengths:
        ratios = [by[i, n] / by[i, lengths[0]] for i in questions if (i, n) in by and (i, lengths[0]) in by]
        cells.append(f"{np.exp(np.mean(np.log(ratios))):.2f} ({len(ratios)})" if ratios else "")
    print(f"| geometric mean / ~{lengths[0]} | " + " | ".join(cells) + " |")


def print_table(records: list[dict], lengths) -> None:
    """Tau by prompt length (rounds pooled: committed tokens / rounds; and the median per prompt) and by
    round start."""
    print("| prompt length (tokens) | prompts | mean prompt tokens | tau (pooled) | median tau per prompt |")
    print("|---|---|---|---|---|")
    for length in lengths:
        rs = [r for r in records if r["length"] == length]
        if rs:
            rounds = [a for r in rs for a in r["rounds"]]
            mean = np.mean([r["prompt_tokens"] for r in rs])
            median = np.median([r["tau"] for r in rs])
            print(f"| ~{length} | {len(rs)} | {mean:.0f} | {np.mean(rounds):.2f} | {median:.2f} |")
    print("\n| round starts after (tokens of context) | rounds | tau |")
    print("|---|---|---|")
    pairs = [(s, a) for r in records for s, a in zip(r["starts"], r["rounds"])]
    for lo, hi in zip(START_BUCKETS, START_BUCKETS[1:]):
        sel = [a for s, a in pairs if lo <= s < hi]
        if sel:
            print(f"| {lo}-{hi} | {len(sel)} | {np.mean(sel):.2f} |")


if __name__ == "__main__":
    main()
