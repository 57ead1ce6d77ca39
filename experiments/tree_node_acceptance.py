"""How often a draft tree's nodes are accepted against the drafter's own score for them, by kind of node.

Decodes training prompts (never the benchmark sets: 2 GSM8K-train and 12 Alpaca prompts, 256 new tokens, greedy)
with the shipped drafter's ``--tree N`` plan (N the first argument, default 7: the tree ``--tree auto`` verified
on a CPU until 2026-12-06), and records, every tree round, each checked node's probability given its parent
(``tree.node_probability``, before the online calibration) and whether the walk took it. Kinds: ``spine`` (a
best child of a spine node, from the anchor), ``first`` (a best child off the spine), ``sibling`` (any other
child); ``L-``: a round of prompt lookup's branches alone (every score one of the n-gram confidence table's),
``D-``: the drafter's tree. Prints (kind, tenth of the score): checked nodes, accepted share, mean score. It
wraps ``decode.path_probability`` and ``decode.update_node_calibration`` to read the tree inside the loop.

    .venv/bin/python experiments/tree_node_acceptance.py 7
"""

from __future__ import annotations

import sys

import numpy as np


def node_kinds(parent: np.ndarray, score: np.ndarray) -> list[str]:
    """Each node's kind (``spine`` / ``first`` / ``sibling``) from one row's parents and scores."""
    n, valid = len(parent), np.isfinite(score)
    first = np.zeros(n, bool)
    for i in np.flatnonzero(valid):
        siblings = valid & (parent == parent[i])
        first[i] = score[i] >= score[siblings].max()
    spine = first.copy()
    for i in range(n):  # parents come before children
        if parent[i] >= 0:
            spine[i] = first[i] and spine[parent[i]]
    return ["spine" if s else "first" if f else "sibling" for s, f in zip(spine, first)]


def main() -> None:
    import jax

    from dflash_jax import checkpoint, decode, speculation
    from dflash_jax.prompts import read_prompts
    from dflash_jax.tokens import encode, stop_ids

    rounds, seen = [], {}
    path_probability, update = decode.path_probability, decode.update_node_calibration

    def spy_path(tree, node_p):  # the round's tree, for the update below (traced in the same round)
        seen["tree"] = tree
        return path_probability(tree, node_p)

    def spy_update(stats, node_p, checked, accepted):
        tree = seen["tree"]
        keep = lambda *xs: rounds.append([np.asarray(x) for x in xs])  # noqa: E731
        jax.debug.callback(keep, tree.parent, tree.score, node_p, checked, accepted)
        return update(stats, node_p, checked, accepted)

    decode.path_probability, decode.update_node_calibration = spy_path, spy_update
    budget = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    ck = checkpoint.load_target("smollm2-135m-instruct")
    tok = ck.tokenizer()
    plan = speculation.plan_for(ck, "auto", tok, tree=budget)
    print(plan.describe())
    train = "../shared/data/train/"
    prompts = read_prompts(train + "gsm8k_train.jsonl", limit=2)
    prompts += read_prompts(train + "alpaca_5000.json", limit=20)[8:]
    dec = decode.Decoder(ck.params, ck.cfg, plan)
    for p in prompts:
        [out] = dec.generate([encode(tok, p.text, chat=True)], max_new_tokens=256, stop_token_ids=stop_ids(tok))
        print(f"{len(out.token_ids)} tokens, tau {out.tau:.2f}", flush=True)
    lookup = np.asarray([c for pair in speculation.NGRAM_CONFIDENCE for c in pair])
    stat: dict[tuple[str, int], list[float]] = {}
    for parent, score, node_p, checked, accepted in rounds:
        for b in range(parent.shape[0]):
            valid = np.isfinite(score[b])
            scores = node_p[b][valid]
            from_lookup = len(scores) > 0 and bool(np.all(np.min(np.abs(scores[:, None] - lookup), 1) < 1e-4))
            for i, kind in enumerate(node_kinds(parent[b], score[b])):
                if checked[b, i]:
                    key = (("L-" if from_lookup else "D-") + kind, min(int(node_p[b, i] * 10), 9))
                    s = stat.setdefault(key, [0, 0, 0])
                    s[0], s[1], s[2] = s[0] + 1, s[1] + int(accepted[b, i]), s[2] + float(node_p[b, i])
    for (kind, tenth), (n, a, p) in sorted(stat.items()):
        share = f"{n:4d} checked, accepted {a / n:.3f}, mean score {p / n:.3f}"
        print(f"{kind:10s} {tenth / 10:.1f}-{(tenth + 1) / 10:.1f}: {share}")


if __name__ == "__main__":
    main()
