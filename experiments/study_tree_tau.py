"""Greedy tau of draft trees against one chain, from recorded plain answers (no decoding).

A greedy speculative decode commits exactly the target's plain greedy output, so its rounds follow
from that output (``study_tau.py``): a round anchored at position ``p`` commits ``1 + a`` tokens,
``a`` the accepted draft tokens. For a chain, ``a`` is how many of the drafter's argmax tokens at
offsets 1, 2, ... match the answer; for a tree of ``N`` nodes (``tree.build_tree``: the ``N`` best
prefixes of the drafter's per-offset distributions, best first) it is the depth of the deepest
answer prefix the tree holds (the accept walk of SPEC "Tree verification" 3, greedy). Since a
best-first tree of ``n`` nodes is the first ``n`` nodes of a larger one, one tree of the largest
budget per anchor gives every budget: the answer prefix of depth ``d`` is in the ``n``-node tree iff
the node holding it was added before the ``n``-th.

The drafter runs its training forward at every anchor (``anchor_acceptance``: the decoder's draft
step on the same context, up to float rounding), with its draft vocabulary and prompt-lookup copy
column as the decoder drafts with them; a DFlash 2 drafter's chain is its selector's greedy walk and
its tree is scored by the selector (``drafter.selector_tree``), as ``DraftStep.tree``. The tree here
is the drafter's alone, or with ``--lookup-branch`` the tree of ``generate --tree N`` on an accelerator
(``tree_step.TreeStep`` with every row holding both drafts): prompt lookup's continuation merged in as
a branch where the last two or more tokens occurred before (``tree.add_branch``, scored by the n-gram
confidence table), sorted best first and cut to ``N``, built per budget. The last round is cut where
the answer ends.

    .venv/bin/python experiments/study_tree_tau.py --per-set 100 --budgets 8 16 32 64 \\
        --out docs/bench/tree/study_tree_tau.jsonl

Per (set, prompt) one line in ``--out`` (JSON lines: chain rounds and each budget's rounds); a rerun
skips what is there. Prints tau per set: the chain at the drafter's block, each tree, and the ratio.
"""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path

import numpy as np
from anchor_acceptance import simulated_rounds
from ngram_acceptance import SETS, first_turns


@functools.cache
def _compiled(
    tcfg,
    dcfg,
    budget: int,
    variants=((1.0, 0.0),),
    lookup: tuple[int, ...] = (),
    branches: int = 1,
    tree_settings=None,
):
    """Jitted (context K/V of a sequence; at each anchor of a chunk, the drafter's argmax chain and,
    per variant, the order in which a ``budget``-node tree added each node (tokens, parents, depths)).

    ``variants``: (temperature, log-probability added per depth) of the tree's scores; (the drafter's
    ``tree_temperature``, 0) is the decoder's (``DraftStep.tree``); others are what ``tune_tree_scores.py``
    tries. ``lookup``: budgets
    instead, one tree each with prompt lookup's ``branches`` branches (``_with_branch``), in place of the
    variants (the chain is returned either way), built as ``tree_settings`` says (``_with_branch``)."""
    import jax
    import jax.numpy as jnp

    from dflash_jax import loss
    from dflash_jax.drafter import block_inputs, select, selector_tree
    from dflash_jax.tree import build_tree

    @jax.jit
    def context(target_params, dparams, toks):
        feats = loss.target_features(target_params, toks, tcfg=tcfg, layer_ids=dcfg.target_layer_ids)
        return loss.context_kv(dparams, feats, dcfg)

    @jax.jit
    def trees(dparams, target_params, ctx, toks, pos, valid, allowed):
        logits, hidden = loss.block_logits(
            dparams, target_params, ctx, toks, loss.Anchors(pos, valid), tcfg=tcfg, cfg=dcfg, with_hidden=True
        )
        logits, keep = logits[0], allowed  # [chunk, K, V]; the draft vocabulary and the copy tokens
        if dcfg.copy_bias is not None:
            bs, k = dcfg.block_size, logits.shape[-2]
            context = jnp.repeat(jnp.pad(toks, ((0, 0), (0, bs))), pos.shape[1], axis=0)
            block, num, _ = block_inputs(dcfg, toks[0, pos[0]], pos[0], bs, context)
            copy = (jnp.arange(k) < num[:, None])[..., None] & (
                block[:, 1 : k + 1, None] == jnp.arange(logits.shape[-1])
            )
            keep = keep | copy
        logits = jnp.where(keep, logits, -jnp.inf)
        anchor = toks[0, pos[0]]
        if dcfg.dflash2:  # the selector's greedy walk
            best = select(dparams, dcfg, hidden[0], logits, anchor, 0.0)[0]
        else:
            best = jnp.argmax(logits, -1)
        if lookup:
            return best, [
                _with_branch(dparams, dcfg, tcfg, hidden[0], logits, anchor, m, toks, pos[0], branches, tree_settings)
                for m in lookup
            ]
        out = []
        for temperature, per_depth in variants:
            if per_depth == 0.0:  # DraftStep.tree's at this temperature (the decoder's at the drafter's own)
                if dcfg.dflash2:
                    tree = selector_tree(dparams, dcfg, hidden[0], logits, anchor, budget, temperature)
                else:
                    tree = build_tree(jax.nn.log_softmax(logits / temperature, -1), budget)
            else:
                tree = _variant_tree(dparams, dcfg, hidden[0], logits, anchor, budget, temperature, per_depth)
            out.append((tree.tokens, tree.parent, tree.depth, tree.valid))
        return best, out

    return context, trees


def _with_branch(dparams, dcfg, tcfg, hidden, logits, anchor, budget, toks, pos, branches: int, tree_settings):
    """The tree of ``plan_for(tree=budget, skip_drafter=False)`` (``tree_step.TreeStep`` with every row
    holding both drafts): the drafter's ``budget``-node tree, prompt lookup's continuation over the
    committed tokens ``toks[0, :pos + 1]`` merged in (``TreeStep.lookup`` / ``with_branch``), best first,
    cut to ``budget`` (``TreeStep.best``); ``branches`` > 1: as many earlier occurrences, a branch each
    (``TreeStep.lookup_branches``). ``tree_settings``: (the longest suffix the branches match, ``TreeStep.periodic``,
    the temperature of the drafter's tree scores: ``selector_tree``'s), as ``acceptance`` resolves them."""
    import jax
    import jax.numpy as jnp

    from dflash_jax.drafter import DraftStep, selector_tree
    from dflash_jax.ngram import NgramStep
    from dflash_jax.speculation import ngram_confidence
    from dflash_jax.tree import build_tree
    from dflash_jax.tree_step import TreeStep

    nmax, periodic, temperature = tree_settings
    if dcfg.dflash2:
        tree = selector_tree(dparams, dcfg, hidden, logits, anchor, budget, temperature)
    else:
        tree = build_tree(jax.nn.log_softmax(logits / temperature, -1), budget)
    ngram = NgramStep(nmax, 1, dcfg.block_size, confidence=ngram_confidence(nmax))
    step = TreeStep(DraftStep(dcfg, tcfg), budget, ngram, min_match=2, lookup_branches=branches, periodic=periodic)
    k = dcfg.block_size - 1
    rows = jnp.broadcast_to(toks[0], (pos.shape[0], toks.shape[1]))  # positions past pos are never read
    tree = step.best(step.with_branch(tree, *step.lookup(rows, pos, k), k))
    return tree.tokens, tree.parent, tree.depth, tree.valid


def _variant_tree(dparams, dcfg, hidden, logits, anchor, budget, temperature, per_depth):
    """The decoder's tree (``drafter.selector_tree`` / ``tree.build_tree``) with its log-probabilities
    divided by ``temperature`` and ``per_depth`` added to each node's own (a depth discount)."""
    import jax
    import jax.numpy as jnp

    from dflash_jax.drafter import DraftScores, selector_candidates, selector_scores
    from dflash_jax.tree import build_tree_with

    rows = jnp.arange(logits.shape[0])
    if dcfg.dflash2:
        scores = DraftScores(logits)
        unary, columns = selector_candidates(scores.logits, dcfg)
        candidates = scores.tokens(columns)
        width = min(budget, candidates.shape[2])

        def children(token, depth):
            d = jnp.minimum(depth, candidates.shape[1] - 1)
            c = candidates[rows, d]
            logq = jax.nn.log_softmax(selector_scores(dparams, hidden[rows, d], unary[rows, d], c, token) / temperature)
            v, index = jax.lax.top_k(logq, width)
            return v + per_depth, jnp.take_along_axis(c, index, axis=1)
    else:
        vals, ids = jax.lax.top_k(jax.nn.log_softmax(logits / temperature, -1), min(budget, logits.shape[-1]))

        def children(token, depth):
            d = jnp.minimum(depth, vals.shape[1] - 1)
            return vals[rows, d] + per_depth, ids[rows, d]

    return build_tree_with(children, budget, logits.shape[1], anchor)


def acceptance(
    ck,
    dparams,
    dcfg,
    full: list[int],
    start: int,
    budgets,
    vocab,
    chunk: int = 16,
    variants=None,
    lookup=0,
    tree_settings=None,
):
    """Per anchor ``start .. len(full) - 2``: the chain's accepted tokens and, per budget, the tree's
    (with ``variants``: per variant, per budget; with ``lookup`` M > 0: the trees with prompt lookup's M
    best continuations as branches, per budget). ``tree_settings``: (the longest suffix the branches match,
    periodic branches, the temperature of the drafter's tree scores); default ``generate --tree N``'s: (4,
    False, the drafter's ``tree_temperature``)."""
    import jax.numpy as jnp

    b, n = dcfg.block_size, len(full)
    tokens = np.asarray(full + [0] * b, np.int32)
    padded = -(-len(tokens) // 128) * 128
    toks = jnp.asarray(np.pad(tokens, (0, padded - len(tokens)))[None])
    allowed = np.ones(ck.cfg.vocab_size, bool) if vocab is None else np.isin(np.arange(ck.cfg.vocab_size), vocab)
    tree_settings = (4, False, dcfg.tree_temperature) if tree_settings is None else tuple(tree_settings)
    keys = tuple(variants) if variants else ((tree_settings[2], 0.0),)  # the decoder's tree at its temperature
    looks = tuple(budgets) if lookup else ()
    context, trees = _compiled(ck.cfg, dcfg, max(budgets), keys, looks, max(lookup, 1), tree_settings)
    ctx = context(ck.params, dparams, toks)
    looked = {m: [] for m in budgets}
    anchors = list(range(start, n - 1))
    chain, tree = [], {v: {m: [] for m in budgets} for v in keys}
    for c in range(0, len(anchors), chunk):
        part = anchors[c : c + chunk]
        pos = np.asarray(part + [part[-1]] * (chunk - len(part)), np.int32)[None]
        valid = (np.arange(chunk) < len(part))[None]
        best, out = trees(dparams, ck.params, ctx, toks, pos, valid, allowed)
        best = np.asarray(best)
        for j, p in enumerate(part):
            answer = tokens[p + 1 : p + b]
            left = n - 1 - p  # the answer ends: no round commits past it
            chain.append(min(int(np.cumprod(best[j] == answer).sum()), left - 1))
            for v, arrays in zip(keys, [] if lookup else out):
                tok, par, dep, ok = (np.asarray(x)[j] for x in arrays)
                # added[d]: the order in which the tree added the answer's prefix of depth d + 1
                added, at = [], -1
                for d in range(b - 1):
                    hit = np.flatnonzero(ok & (par == at) & (tok == answer[d]) & (dep == d + 1))
                    if not len(hit):
                        break
                    at = int(hit[0])
                    added.append(at)
                for m in budgets:
                    depth = int(np.sum(np.cumprod(np.asarray(added) < m))) if added else 0
                    tree[v][m].append(min(depth, left - 1))
            if lookup:  # the greedy accept walk down each budget's own tree
                for m, arrays in zip(budgets, out):
                    tok, par, dep, ok = (np.asarray(x)[j] for x in arrays)
                    at, depth = -1, 0
                    for d in range(b - 1):
                        hit = np.flatnonzero(ok & (par == at) & (tok == answer[d]))
                        if not len(hit):
                            break
                        at, depth = int(hit[0]), d + 1
                    looked[m].append(min(depth, left - 1))
    if lookup:
        return chain, looked
    return chain, (tree if variants else tree[keys[0]])


def main() -> None:
    from tqdm import tqdm
    from transformers import AutoTokenizer

    from dflash_jax import checkpoint
    from dflash_jax.drafter_io import load_drafter, read_draft_vocab, resolve_drafter
    from dflash_jax.speculation import TREE_LOOKUP_BRANCHES

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafter", default="auto", help="a drafter folder, or auto (the shipped one)")
    ap.add_argument(
        "--records",
        type=Path,
        default=Path("docs/bench/issue20/table100.records.jsonl"),
        help="a bench records file (every set), or a folder of t0_<set>.records.jsonl",
    )
    ap.add_argument("--sets", nargs="+", default=list(SETS), choices=SETS)
    ap.add_argument("--per-set", type=int, default=40, help="first turns per set")
    ap.add_argument("--budgets", type=int, nargs="+", default=[8, 16, 32, 64], help="tree node budgets")
    ap.add_argument("--out", type=Path, required=True, help="JSON lines, one per (set, prompt)")
    ap.add_argument(
        "--lookup-branch",
        action="store_true",
        help="trees with prompt lookup's continuation as a branch (generate --tree N's; default: the drafter's alone)",
    )
    ap.add_argument(
        "--lookup-branches",
        type=int,
        default=TREE_LOOKUP_BRANCHES,
        metavar="M",
        help="with --lookup-branch: the M best earlier occurrences, a branch each (TreeStep.lookup_branches; "
        f"default {TREE_LOOKUP_BRANCHES}, generate --tree N's)",
    )
    ap.add_argument(
        "--lookup-reach",
        type=int,
        default=4,
        metavar="N",
        help="with --lookup-branch: the longest suffix the branches match (plan_for's: 4)",
    )
    ap.add_argument(
        "--periodic",
        action="store_true",
        help="with --lookup-branch: the branches go on with the match's period (TreeStep.periodic)",
    )
    ap.add_argument(
        "--tree-temperature",
        type=float,
        metavar="T",
        help="the drafter's tree scores at temperature T (default: its own tree_temperature, as it decodes)",
    )
    args = ap.parse_args()

    ck = checkpoint.load_target("smollm2-135m-instruct")
    tok = AutoTokenizer.from_pretrained(str(checkpoint.resolve_target("smollm2-135m-instruct")))
    folder = resolve_drafter(args.drafter, ck)
    dparams, dcfg, _ = load_drafter(folder)
    vocab = read_draft_vocab(folder)
    temperature = dcfg.tree_temperature if args.tree_temperature is None else args.tree_temperature
    done = set()
    if args.out.exists():
        done = {(r["set"], r["id"]) for r in map(json.loads, args.out.read_text().splitlines())}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for name in args.sets:
        for pid, full, start in tqdm(first_turns(args.records, name, tok, 0, args.per_set), desc=name, leave=False):
            if (name, pid) in done:
                continue
            branches = args.lookup_branches if args.lookup_branch else 0
            chain, tree = acceptance(
                ck,
                dparams,
                dcfg,
                full,
                start,
                args.budgets,
                vocab,
                lookup=branches,
                tree_settings=(args.lookup_reach, args.periodic, temperature),
            )
            rec = {"set": name, "id": pid, "block": dcfg.block_size, "chain": simulated_rounds(np.add(chain, 1))}
            rec["trees"] = {str(m): simulated_rounds(np.add(a, 1)) for m, a in tree.items()}
            with args.out.open("a") as f:  # one whole line per append: an interruption loses at most it
                f.write(json.dumps(rec) + "\n")
    print_table(args.out, args.sets, args.budgets)


def print_table(path: Path, sets, budgets) -> None:
    """tau per set: the chain, each tree budget, and the tree's tau over the chain's."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    tau = lambda rounds: sum(map(sum, rounds)) / max(sum(map(len, rounds)), 1)  # noqa: E731
    print("| set (answers) | chain @" + str(rows[0]["block"]) + " | " + " | ".join(f"tree {m}" for m in budgets) + " |")
    print("|---|---|" + "---|" * len(budgets))
    for name in sets:
        mine = [r for r in rows if r["set"] == name]
        if not mine:
            continue
        c = tau([r["chain"] for r in mine])
        cells = [
            f"{tau([r['trees'][str(m)] for r in mine]):.2f} ({tau([r['trees'][str(m)] for r in mine]) / c:.2f}x)"
            for m in budgets
        ]
        print(f"| {name} ({len(mine)}) | {c:.2f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
