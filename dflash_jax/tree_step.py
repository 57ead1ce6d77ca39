"""The tree draft step: a draft tree per row and round, from the DFlash drafter and prompt lookup.

``TreeStep`` turns one drafter forward into a tree (SPEC "Tree verification" 1): the best-first
tree of the drafter's per-offset distributions (``tree.build_tree``), plus, where the last committed
tokens occurred before, prompt lookup's continuations as more branches (``tree.add_branch``): one
tree holding both drafts. The loop (``decode.decode_loop``) verifies the anchor and every node in
one target pass and walks the tree (``tree.accept_walk``), so it stays lossless at any temperature.
"""

from __future__ import annotations

import dataclasses
from functools import partial

import jax
import jax.numpy as jnp

from dflash_jax.ngram import NgramStep, ngram_matches
from dflash_jax.steps import Draft, OnDrafter
from dflash_jax.tree import Tree, add_branch, sort_tree

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class TreeStep(OnDrafter):
    """A draft step (``steps``) that drafts a tree of ``budget`` nodes per row and round.

    Fields:
      dflash: the drafter's step (``drafter.DraftStep``: its best-first ``tree``).
      budget: static, the tree's nodes (the verify is ``budget + 1`` tokens wide).
      ngram: optional prompt lookup (``NgramStep``); its continuation, where the last ``min_match``
        or more committed tokens occurred before, is merged in as a branch of up to ``ngram_nodes``
        nodes (tokens the drafter's tree already holds are not added twice, each scored by the
        n-gram confidence table), and the tree keeps the ``budget`` best of the drafter's ``budget``
        nodes and the branch's (``tree.sort_tree``).
      ngram_nodes: the branch's nodes (default: the block's draft offsets).
      lookup_branches: how many earlier occurrences give a branch each (``ngram.ngram_matches``: the
        longest match first, then the latest), each scored by the same confidence table; 1: the
        one prompt lookup alone would draft.
      periodic: prompt lookup's continuations go on with the match's period past the anchor
        (``ngram.ngram_matches(periodic=True)``, the shipped drafter's block input reads them so).
      skip_drafter: with ``ngram``, a row with a match takes prompt lookup's branches alone and the
        others the drafter's tree, as ``ngram.HybridStep`` takes chains, and a round where every row
        has a match skips the drafter's forward: cheaper where a drafter forward is a large part of
        a round (a CPU). Without it every row's tree holds both drafts.

    Raises:
      ValueError: a budget below 1, or a prompt-lookup branch of no node.
    """

    dflash: object
    budget: int
    ngram: NgramStep | None = None
    min_match: int = 2
    ngram_nodes: int | None = None
    skip_drafter: bool = False
    lookup_branches: int = 1
    periodic: bool = False

    def __post_init__(self):
        if self.budget < 1:
            raise ValueError(f"a draft tree needs a budget of at least 1 node, got {self.budget}")
        if self.lookup_branches < 1:
            raise ValueError(f"lookup_branches must be at least 1, got {self.lookup_branches}")
        if self.ngram is not None and self.branch_nodes < 1:
            raise ValueError(f"the prompt-lookup branch needs at least 1 node (ngram_nodes), got {self.branch_nodes}")

    @property
    def branch_nodes(self) -> int:
        """Nodes of the prompt-lookup branch (0 without prompt lookup)."""
        if self.ngram is None:
            return 0
        if self.ngram_nodes is not None:
            return self.ngram_nodes
        return self.dflash.max_block_size - 1

    @property
    def tree_size(self) -> int:
        return self.budget

    @property
    def default_block_size(self) -> int:
        return self.dflash.max_block_size

    def propose(self, params, target_params, cache, anchor, start, block_valid, block_len, *, tokens, key, sampling):
        """The round's ``Draft`` with its ``tree``: the drafter's best-first tree of ``budget`` nodes
        over offsets ``1 .. block_len - 1`` (``DraftStep.tree``; tempered under sampling, where the
        tree's shape, not a draw, is what the walk needs) and the prompt-lookup branch (each token
        scored by the n-gram confidence table, ``NgramStep.token_confidence``), sorted best first
        (``tree.sort_tree``) and cut to the best ``budget``. Its ``tokens``, ``num`` and ``confidence`` are zeros:
        the loop reads the tree."""
        k = block_len - 1
        args = (params, target_params, cache, anchor, start, block_valid, block_len, self.budget)
        drafted = partial(self.dflash.tree, *args, tokens=tokens, sampling=sampling)
        if self.ngram is None:
            return self._draft(drafted(), anchor, k)
        cont, num, matched = self.lookup(tokens, start, k)
        use = num[:, 0] > 0  # the best occurrence is long enough (the others are no longer)
        if self.skip_drafter:  # every row has a match (or is finished): prompt lookup's branches alone
            idle = jnp.all(use | (block_valid <= 1))
            nothing = lambda: jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), jax.eval_shape(drafted))  # noqa: E731
            tree = jax.lax.cond(idle, nothing, drafted)  # a Tree of zeros: no valid node
            # a row with a match takes its branch alone whether or not the drafter ran for the others,
            # so its tree (and, sampled, its output) never depends on the rest of the batch
            tree = tree._replace(valid=tree.valid & ~use[:, None])
        else:
            tree = drafted()
        return self._draft(self.with_branch(tree, cont, num, matched, k), anchor, k)

    def lookup(self, tokens: Array, start: Array, k: int) -> tuple[Array, Array, Array]:
        """Prompt lookup's continuations over the committed ``tokens [B, L]`` up to ``start [B]``, one
        per branch: int32 ``(cont [B, lookup_branches, k], num [B, lookup_branches], matched [B,
        lookup_branches])`` (``ngram.ngram_matches``), ``num`` 0 where a match is shorter than
        ``min_match``. The first is prompt lookup's own draft."""
        cont, num, matched = ngram_matches(
            tokens, start, k, self.ngram.ngram_max, self.ngram.ngram_min, self.lookup_branches, periodic=self.periodic
        )
        return cont, jnp.where(matched >= self.min_match, num, 0), matched

    def with_branch(self, tree: Tree, cont: Array, num: Array, matched: Array, k: int) -> Tree:
        """``tree`` with ``lookup``'s continuations merged in as branches (``tree.add_branch``, each
        token scored by the n-gram confidence table), unsorted; ``_draft`` sorts and cuts it."""
        for m in range(cont.shape[1]):
            logp = jnp.log(jnp.maximum(self.ngram.token_confidence(matched[:, m], num[:, m], k), 1e-30))
            tree = add_branch(tree, cont[:, m], num[:, m], self.branch_nodes, logp)
        return tree

    def best(self, tree: Tree) -> Tree:
        """``tree`` best first, cut to ``budget``: the first n nodes of a sorted tree are its best n-node
        tree (a prefix of it holds every node's parent), what a verify of n nodes checks."""
        return Tree(*(x[:, : self.budget] for x in sort_tree(tree)))

    def _draft(self, tree, anchor, k: int) -> Draft:
        tree = self.best(tree)
        unused = jnp.zeros((anchor.shape[0], k), jnp.int32)
        return Draft(unused, jnp.zeros_like(anchor), unused.astype(jnp.float32), None, tree)
