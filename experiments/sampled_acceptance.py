"""Expected tokens per round of sampled speculative decoding, from recorded sampled answers, for
several draft temperatures (the temperature the drafter's block is sampled at; the target's stays 1).

Rejection sampling (SPEC "Sampling") is lossless for any draft distribution q as long as the
verify uses the q the token was drawn from; the chance of accepting a drafted token at one offset is
``sum_x min(p(x), q(x))`` (one minus the total variation), and for a greedy draft (q one-hot on the
drafter's best token ``x*``) it is ``p(x*)``. Which draft temperature accepts the most depends on how
the drafter's q compares with the target's p, so this script measures it: along the target's own
sampled answers (``output_ids`` of ``<records>/t1_<set>.records.jsonl``), at every anchor, the
drafter's block (its training forward ``loss.block_logits``; a DFlash 2 drafter's selector scored
with the answer's tokens as predecessors, as its training objective does) and the target's p at
each offset, then ``E = 1 + sum_k prod_{j<=k} alpha_j`` (the bonus token plus the expected accepted
prefix). The predecessors and the target's p follow the recorded answer, not the accepted draft, so
this is an estimate: the decoded tau at draft temperature 1 beside it (``bench --temperature 1``)
says how close.

    .venv/bin/python experiments/sampled_acceptance.py --per-set 10 --draft-temperatures 1 0.7 0.5 0.3 0
"""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path

import numpy as np
from ngram_acceptance import SETS


@functools.cache
def _compiled(tcfg, dcfg, temperatures: tuple[float, ...]):
    """Jitted (target logits and drafter context of a sequence; per anchor of a chunk, the chance alpha
    [chunk, K] of accepting each offset's draft given the answer's prefix: with the head's softmax as q,
    with q = p over the candidates (DFlash 2: the selector's; else every token: 1), then per draft
    temperature)."""
    import jax
    import jax.numpy as jnp

    from dflash_jax import loss
    from dflash_jax.drafter import selector_candidates, selector_scores
    from dflash_jax.target import Target

    @jax.jit
    def context(target_params, dparams, toks):
        feats, hidden = loss.target_features(
            target_params, toks, tcfg=tcfg, layer_ids=dcfg.target_layer_ids, with_hidden=True
        )
        logp = jax.nn.log_softmax(Target(tcfg).apply({"params": target_params}, hidden, method="logits"), -1)
        return loss.context_kv(dparams, feats, dcfg), logp[0].astype(jnp.float32)

    @jax.jit
    def alphas(dparams, target_params, ctx, logp, toks, pos, valid):
        logits, hidden = loss.block_logits(
            dparams, target_params, ctx, toks, loss.Anchors(pos, valid), tcfg=tcfg, cfg=dcfg, with_hidden=True
        )
        logits, hidden = logits[0], hidden[0]  # [chunk, K, V], [chunk, K, d]
        k = logits.shape[1]
        at = pos[0][:, None] + jnp.arange(k)  # the target's p at offset j is its prediction at p + j - 1
        p = jnp.exp(logp[at])  # [chunk, K, V]
        if dcfg.dflash2:
            unary, cand = selector_candidates(logits, dcfg)  # [chunk, K, c]
            scores = selector_scores(dparams, hidden, unary, cand, toks[0, at])  # the answer's predecessors
            p_cand = jnp.take_along_axis(p, cand, axis=-1)
        else:
            scores, p_cand = logits, p
        out = [
            jnp.minimum(p, jax.nn.softmax(logits, -1)).sum(-1),  # the head's own q at 1, no selector
            p_cand.sum(-1),  # the best any q over these candidates can do: q = p there
        ]
        for t in temperatures:
            if t == 0:
                out.append(jnp.take_along_axis(p_cand, jnp.argmax(scores, -1)[..., None], -1)[..., 0])
            else:
                out.append(jnp.minimum(p_cand, jax.nn.softmax(scores / t, -1)).sum(-1))
        return jnp.stack(out)  # [2 + temperatures, chunk, K]

    return context, alphas


def expected_lengths(ck, dparams, dcfg, full: list[int], start: int, temperatures, chunk: int = 32) -> np.ndarray:
    """Per q (the head's, q = p over the candidates, then each draft temperature's) and anchor ``start ..
    len(full) - 2``: the expected tokens of a round anchored there (float [2 + temperatures, anchors]);
    a round never passes the answer's end."""
    import jax.numpy as jnp

    b, n = dcfg.block_size, len(full)
    tokens = np.asarray(full + [0] * b, np.int32)
    padded = -(-len(tokens) // 128) * 128
    toks = jnp.asarray(np.pad(tokens, (0, padded - len(tokens)))[None])
    context, alphas = _compiled(ck.cfg, dcfg, tuple(temperatures))
    ctx, logp = context(ck.params, dparams, toks)
    anchors = list(range(start, n - 1))
    out = []
    for c in range(0, len(anchors), chunk):
        part = anchors[c : c + chunk]
        pos = np.asarray(part + [part[-1]] * (chunk - len(part)), np.int32)[None]
        valid = (np.arange(chunk) < len(part))[None]
        a = np.asarray(alphas(dparams, ck.params, ctx, logp, toks, pos, valid))[:, : len(part)]  # [T, n, K]
        left = n - 1 - np.asarray(part)  # answer tokens after each anchor
        reach = np.cumprod(a, axis=-1) * (np.arange(1, a.shape[-1] + 1) < left[:, None])  # offsets past the end: 0
        out.append(1 + reach.sum(-1))
    return np.concatenate(out, axis=1)


def main() -> None:
    from tqdm import tqdm
    from transformers import AutoTokenizer

    from dflash_jax import checkpoint, prompts
    from dflash_jax.drafter_io import load_drafter
    from dflash_jax.tokens import chat_ids

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafter", default="dflash_jax/assets/smollm2-135m-instruct-dflash", help="a drafter folder")
    ap.add_argument("--records", type=Path, default=Path("docs/bench/full"), help="folder of t1_<set>.records.jsonl")
    ap.add_argument("--sets", nargs="+", default=list(SETS), choices=SETS)
    ap.add_argument("--per-set", type=int, default=10, help="first turns per set")
    ap.add_argument("--draft-temperatures", type=float, nargs="+", default=[1.0, 0.7, 0.5, 0.3, 0.0])
    ap.add_argument("--out", type=Path, help="JSON lines, one per (set, prompt): mean expected tokens per anchor")
    args = ap.parse_args()
    dparams, dcfg, _ = load_drafter(args.drafter)
    ck = checkpoint.load_target("smollm2-135m-instruct")
    tok = AutoTokenizer.from_pretrained(str(checkpoint.resolve_target("smollm2-135m-instruct")))
    temps = args.draft_temperatures
    cols = ["head's q", "q = p on candidates", *(f"q at {t:g}" for t in temps)]
    table = {}
    for name in args.sets:
        items = {p.id: p for p in prompts.load_eval_prompts(name, max_turns=1)}
        rows = [json.loads(line) for line in (args.records / f"t1_{name}.records.jsonl").read_text().splitlines()[1:]]
        rows = [r for r in rows if r["turn"] == 0 and r["id"] in items][: args.per_set]
        per = []
        for r in tqdm(rows, desc=name, leave=False):
            ids = chat_ids(tok, [{"role": "user", "content": items[r["id"]].turns[0]}])
            e = expected_lengths(ck, dparams, dcfg, ids + r["output_ids"], len(ids), temps)
            per.append(e)
            if args.out:
                with args.out.open("a") as f:
                    f.write(json.dumps(dict(set=name, id=r["id"], columns=cols, mean=e.mean(1).tolist())) + "\n")
        table[name] = np.concatenate(per, axis=1).mean(1)
    print("expected tokens per round (mean over anchors), per draft temperature (0: greedy draft)")
    print("| set | " + " | ".join(cols) + " |")
    print("|---|" + "---|" * len(cols))
    for name, v in table.items():
        print(f"| {name} | " + " | ".join(f"{x:.2f}" for x in v) + " |")


if __name__ == "__main__":
    main()
