"""Offline throughput: rows refilled as they finish (``Decoder.as_completed``) against batches that
run until their longest answer ends (sorted by prompt length, as ``prepare-data`` did before).

The prompts are ``prepare-data``'s: the training prompt files, chat template, shuffled with seed 0,
the first ``--num-prompts`` (the prompts of the first shards of ``data/smollm2-mix``), each arm over
all of them in one go (run it with nothing else on the machine). Every answer of one arm should
equal the other's (greedy; SPEC "token-identical": a divergence is reported with the target's top-2
logit gap there), and the stored shards' answers. Compilation is timed apart. Resumable: a finished
arm is kept in ``--json-out`` and skipped by a rerun.

    python launch/bench_refill.py --json-out docs/bench/refill/refill256.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dflash_jax import checkpoint, hub, prompts, tokens  # noqa: E402
from dflash_jax.data import Shard  # noqa: E402
from dflash_jax.decode import Decoder  # noqa: E402
from dflash_jax.utils import atomic_write_text, enable_compilation_cache, log  # noqa: E402

TRAIN = ROOT.parent / "shared" / "data" / "train"
FILES = ["gsm8k_train.jsonl", "alpaca_en_1k.json", "alpaca_5000.json", "code_alpaca_2k.json", "new_codealpaca.json"]


def batched(dec, ids, max_new, stops, batch):
    """Today's batching before refills: prompts sorted by length, ``batch`` at a time, each batch
    until its longest answer ends. Returns ``(answers, compile_s)``."""
    order = np.argsort([len(p) for p in ids], kind="stable")
    out, compile_s = [None] * len(ids), 0.0
    for i in range(0, len(order), batch):
        idx = order[i : i + batch]
        results = dec.generate([ids[j] for j in idx], max_new, stops)
        compile_s += results[0].compile_s
        for j, r in zip(idx, results):
            out[j] = r.token_ids
    return out, compile_s


def refilled(dec, ids, max_new, stops, batch):
    """Rows refilled as their answers finish. Returns ``(answers, compile_s)``."""
    out, compile_s = [None] * len(ids), 0.0
    for j, r in dec.as_completed(ids, max_new, stops, batch_size=batch):
        out[j], compile_s = r.token_ids, compile_s + r.compile_s
    return out, compile_s


def top2_gap(ck, seq) -> float:
    """The target's top-2 logit gap at the position after ``seq``, from a plain forward over it."""
    from dflash_jax.target import Target

    model = Target(ck.cfg)
    hidden, _, _ = model.apply({"params": ck.params}, np.array([seq]), np.arange(len(seq))[None])
    top2 = np.sort(np.asarray(model.apply({"params": ck.params}, hidden[:, -1], method="logits"))[0])[-2:]
    return float(top2[1] - top2[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-prompts", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--data", default=str(ROOT / "data" / "smollm2-mix"), help="stored shards to compare with")
    ap.add_argument("--json-out", required=True)
    args = ap.parse_args()
    enable_compilation_cache()
    ck = checkpoint.load_target(hub.SMOLLM2)
    tok = ck.tokenizer()
    items = [p for f in FILES for p in prompts.read_prompts(TRAIN / f, "auto")]
    order = np.random.RandomState(0).permutation(len(items))[: args.num_prompts]  # prepare-data's shuffle
    ids = [tokens.encode(tok, items[i].text, chat=True) for i in order]
    stops = tokens.stop_ids(tok)
    dec = Decoder(ck.params, ck.cfg)
    out = Path(args.json_out)
    runs = json.loads(out.read_text())["runs"] if out.exists() else {}
    for arm in ("batched", "refilled"):
        if arm not in runs:
            fn = batched if arm == "batched" else refilled
            t0 = time.perf_counter()
            got, compile_s = fn(dec, ids, args.max_new_tokens, stops, args.batch_size)
            wall = time.perf_counter() - t0
            runs[arm] = {"wall_s": wall, "compile_s": compile_s, "tokens": sum(map(len, got)), "answers": got}
            out.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(out, json.dumps({"runs": runs}))
        r = runs[arm]
        log(f"{arm}: {r['tokens']} tokens in {r['wall_s']:.0f} s ({r['compile_s']:.0f} s compiling)")
    answers = {arm: runs[arm]["answers"] for arm in runs}
    same = sum(a == b for a, b in zip(answers["batched"], answers["refilled"]))
    divergences = []
    for n, (a, b) in enumerate(zip(answers["batched"], answers["refilled"])):
        if a != b:  # SPEC: allowed only where the plain computation's top-2 gap is a near-tie
            k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            divergences.append({"prompt": n, "token": k, "top2_gap": top2_gap(ck, ids[n] + a[:k])})
    stored = {}
    for shard in sorted(Path(args.data).glob("shard_*")):
        sh = Shard(shard)
        off = np.asarray(sh.offsets)
        for where, k in zip(sh.meta.get("prompts", []), range(len(off) - 1)):
            stored[Path(where).name] = np.asarray(sh.tokens[off[k] : off[k + 1]]).tolist()
    checked = agree = 0
    for n, i in enumerate(order):
        seq = stored.get(Path(items[i].where).name)
        if seq is not None:
            checked += 1
            agree += seq == ids[n] + answers["refilled"][n]
    summary = {}
    for arm, r in runs.items():
        decode_s = r["wall_s"] - r["compile_s"]
        summary[arm] = {"tokens": r["tokens"], "decode_s": decode_s, "compile_s": r["compile_s"]}
        summary[arm]["tokens_per_s"] = r["tokens"] / decode_s
    summary["speedup"] = summary["refilled"]["tokens_per_s"] / summary["batched"]["tokens_per_s"]
    summary["identical"] = f"{same}/{args.num_prompts}"
    summary["divergences"] = divergences
    summary["equal_to_stored_shards"] = f"{agree}/{checked}"
    summary["settings"] = vars(args)
    atomic_write_text(out, json.dumps({"runs": runs, "summary": summary}))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
