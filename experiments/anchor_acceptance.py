"""A drafter's greedy acceptance at every anchor of a dataset's answers, as the training loss sees it.

For each chosen sequence of a token dataset (``prepare-data``), runs the target once, then the
drafter's training forward (``loss.block_logits``) with an anchor at every answer position, and
counts how many of the block's greedy guesses match the answer (the acceptance length that
anchor would give, the bonus token included). Prints, per sequence: whether it loops, the mean
acceptance over all anchors and over the first 64, and the tau of rounds simulated from them (a
round at anchor p commits its acceptance length a and the next starts at p + a), which is what
a decode of that answer would measure if the target had produced it. No decoding, so any
sequence of the data (held-out ones included) can be checked.

    .venv/bin/python experiments/anchor_acceptance.py --drafter runs/smollm2_v3/best \\
        --data data/smollm2-gsm8k-alpaca --shard 12 --count 6
"""

import argparse
import functools
import sys

import numpy as np


def acceptance_at_anchors(ck, dparams, dcfg, tokens: np.ndarray, loss_mask: np.ndarray, chunk: int = 32, vocab=None):
    """Acceptance length (1..block_size) at each anchor ``p`` from the first answer token (the
    anchor of a decode's first round: the prefill commits that token) to the last position with a
    whole block after it: int array of length ``T - B - first + 1``. ``tokens`` int [T],
    ``loss_mask`` bool [T] (answer tokens). Compiled once per configuration, length bucket (128)
    and ``chunk`` (anchors per drafter call; the last call is padded with invalid anchors).
    ``vocab``: a draft vocabulary (token ids), drafting as ``DraftStep`` does with it
    (``drafter.with_draft_vocab``): only those tokens and each offset's prompt-lookup token."""
    import jax.numpy as jnp

    b, t = dcfg.block_size, len(tokens)
    padded = -(-t // 128) * 128  # causal: what follows position t - 1 changes nothing before it
    toks = jnp.asarray(np.pad(tokens, (0, padded - t))[None])
    context, guesses = _compiled(ck.cfg, dcfg)
    ctx = context(ck.params, dparams, toks)
    allowed = None if vocab is None else np.isin(np.arange(ck.cfg.vocab_size), vocab)
    first = int(np.argmax(loss_mask))
    anchors = list(range(first, t - b + 1))
    out = []
    for c in range(0, len(anchors), chunk):
        part = anchors[c : c + chunk]
        pos = np.asarray(part + [part[-1]] * (chunk - len(part)), np.int32)[None]
        valid = (np.arange(chunk) < len(part))[None]
        guess = np.asarray(guesses(dparams, ck.params, ctx, toks, jnp.asarray(pos), jnp.asarray(valid), allowed))
        for j, p in enumerate(part):
            hit = guess[j] == tokens[p + 1 : p + b]
            out.append(1 + int(np.cumprod(hit).sum()))
    return np.asarray(out)


@functools.cache
def _compiled(tcfg, dcfg):
    """Jitted (context K/V of a sequence, greedy block guesses at anchors) for these configs."""
    import jax
    import jax.numpy as jnp

    from dflash_jax import loss
    from dflash_jax.drafter import DraftScores, block_inputs, select

    @jax.jit
    def context(target_params, dparams, toks):
        feats = loss.target_features(target_params, toks, tcfg=tcfg, layer_ids=dcfg.target_layer_ids)
        return loss.context_kv(dparams, feats, dcfg)

    @jax.jit
    def guesses(dparams, target_params, ctx, toks, pos, valid, allowed=None):
        anchors = loss.Anchors(pos, valid)
        logits, hidden = loss.block_logits(
            dparams, target_params, ctx, toks, anchors, tcfg=tcfg, cfg=dcfg, with_hidden=True
        )
        logits, keep = logits[0], allowed  # keep [V]: the draft vocabulary (None: every token) ...
        if allowed is not None and dcfg.copy_bias is not None:  # ... and each offset's prompt-lookup token
            bs, k = dcfg.block_size, logits.shape[-2]
            context = jnp.repeat(jnp.pad(toks, ((0, 0), (0, bs))), pos.shape[1], axis=0)
            block, num, _ = block_inputs(dcfg, toks[0, pos[0]], pos[0], bs, context)
            copy = (jnp.arange(k) < num[:, None])[..., None] & (
                block[:, 1 : k + 1, None] == jnp.arange(logits.shape[-1])
            )
            keep = keep | copy
        logits = logits if keep is None else jnp.where(keep, logits, -jnp.inf)
        if dcfg.dflash2:  # the selector's greedy walk from each anchor, as DraftStep.draft
            return select(dparams, dcfg, hidden[0], DraftScores(logits), toks[0, pos[0]], 0.0)[0]
        return jnp.argmax(logits, -1)  # [chunk, B - 1]

    return context, guesses


def simulated_rounds(lengths: np.ndarray) -> list[int]:
    """The acceptance lengths of a greedy decode's rounds that meets these per-anchor lengths
    (index 0 = the first answer token): a round at anchor k commits ``lengths[k]`` tokens."""
    k, out = 0, []
    while k < len(lengths):
        out.append(int(lengths[k]))
        k += out[-1]
    return out


def main():
    from dflash_jax import checkpoint, data
    from dflash_jax.drafter_io import load_drafter
    from dflash_jax.tokens import loops

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--drafter", required=True, help="a drafter folder (run's best/ or released format)")
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--data", required=True, help="token dataset folder (prepare-data)")
    ap.add_argument("--shard", type=int, default=0, help="first sequence = this shard's first")
    ap.add_argument("--count", type=int, default=6, help="sequences: the first N looping and N loop-free from there")
    args = ap.parse_args()

    ck = checkpoint.load_target(args.target)
    dparams, dcfg, _ = load_drafter(args.drafter)
    ds = data.TokenDataset(args.data)
    if not 0 <= args.shard < len(ds.shards):
        sys.exit(f"--shard {args.shard}: {args.data} has shards 0..{len(ds.shards) - 1}")
    picked = {True: [], False: []}  # looping or not -> [(index, tokens, answer mask)]
    for i in range(ds.shard_start(args.shard), len(ds)):
        tokens, mask = (np.asarray(x) for x in ds[i])
        mask = mask.astype(bool)
        kind = loops(tokens[mask].tolist())
        if len(picked[kind]) < args.count:
            picked[kind].append((i, tokens, mask))
        if all(len(v) >= args.count for v in picked.values()):
            break
    print("sequence  looping  anchors  mean  first-64  simulated-tau")
    for kind in (True, False):
        for i, tokens, mask in picked[kind]:
            a = acceptance_at_anchors(ck, dparams, dcfg, tokens, mask)
            tau = np.mean(simulated_rounds(a))
            print(f"{i:8d}  {str(kind):7s}  {len(a):7d}  {a.mean():4.2f}  {a[:64].mean():8.2f}  {tau:13.2f}")


if __name__ == "__main__":
    main()
