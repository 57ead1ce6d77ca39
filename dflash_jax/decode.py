"""The speculative decoding loop: prefill, then one jit-compiled ``lax.while_loop``.

Each round of the loop (SPEC "Inference loop"), for every sequence of the batch at once:

1. **draft**: the block ``[x_start, MASK x (B-1)]`` at positions ``start .. start+B-1``
   goes through the drafter, whose argmax fills offsets ``1 .. B-1``;
2. **verify**: the target runs the block causally on top of its KV cache;
   ``posterior = argmax(logits)``;
3. **accept**: ``a`` = longest prefix with ``draft[k] == posterior[k-1]``; the round
   commits ``block[1..a]`` plus the bonus token ``posterior[a]``;
4. **commit**: ``start += a + 1`` (cut at a stop token or the length limit); the
   target features of the committed positions become drafter context.

Block size 1 (no drafter) is plain autoregressive decoding in the same loop. What step 1 runs
is a speculation plan (``speculation.Plan``: a draft step, the block size, the verify lengths);
every draft step answers with one ``steps.Draft`` (tokens, how many are real, confidence, and
under sampling ``q``), so step 3 never accepts padding and the loop never asks what drafted.

With ``Sampling(temperature > 0, ...)`` the step samples its block from its tempered
distribution ``q`` and step 3 becomes speculative rejection sampling against the target's
``p`` (``dflash_jax.sampling``); every sequence has its own PRNG key (from its seed), folded
with the round number, so a request's output does not depend on the batch it is in.

Static shapes throughout: a token buffer ``[B, S + block]`` indexed by absolute
position, KV caches (target and drafter context) of length ``S`` whose slot is the
absolute position, so "truncating the cache to the committed length" is free:
slots past ``start`` are simply overwritten by the next block before anything
reads them. A target with linear-attention layers (Qwen3.5's Gated DeltaNet) has a recurrent
state instead, which cannot be truncated: its verify pass returns the state before the block
and the block's inputs, and the commit replays only the committed tokens into it
(``target.commit_cache``; the rejected draft tokens never enter it). Each sequence keeps its
own ``start``, stops on its own, and records its own per-round acceptance lengths.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import platform
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.experimental
import jax.numpy as jnp
import numpy as np

from dflash_jax.sampling import GREEDY, Sampling, accept, probs, sample
from dflash_jax.sharding import axis_rules
from dflash_jax.speculation import Plan
from dflash_jax.target import Target, TargetConfig, commit_cache, compact_cache, init_cache, pad_pending
from dflash_jax.tree import Tree, accept_walk, ancestor_mask, node_probability, on_path, path_probability
from dflash_jax.utils import atomic_write_text, home, json_sha256

Array = jax.Array


def bucket(n: int, minimum: int = 16) -> int:
    """Round ``n`` up to a power of two (at least ``minimum``): the shapes we compile for."""
    return max(minimum, 1 << max(0, int(n) - 1).bit_length())


@dataclasses.dataclass(frozen=True)
class LoopShape:
    """Static shapes of one compiled decoder (the compilation cache key)."""

    batch: int  # padded batch size
    prompt_len: int  # padded prompt length P
    cache_len: int  # S: KV-cache length, >= longest prompt + max_new_tokens + block_size
    block_size: int
    max_rounds: int  # size of the per-round acceptance record
    verify_lengths: tuple[int, ...] = ()  # compiled verify lengths to choose from per round (() = block_size)
    calibrate: bool = True  # with verify_lengths: correct the step's confidence per row online (``calibrate``)
    draft_gate: bool = False  # a row drafts only while its drafted rounds pay for their cost (``gate_drafts``)


class LoopState(NamedTuple):
    tokens: Array  # [B, S + block] int32, by absolute position
    start: Array  # [B] position of the pending anchor (last committed token, not yet in the target cache)
    limit: Array  # [B] prompt_len + max_new_tokens: no token at positions >= limit
    done: Array  # [B] bool
    target_cache: Any
    drafter_cache: Any
    rounds: Array  # [B] rounds run so far
    accepted: Array  # [B, max_rounds] tokens committed per round
    key: Array  # [B] PRNG keys (used only when sampling)
    calibration: Array  # [B, CALIBRATION_BINS, 2] float32: draft tokens checked / accepted (``calibrate``)
    verified: Array  # [B, max_rounds] positions the target verified per round (the batch's verify width)
    gate: Array  # [B, 3] float32: the draft gate's record (``gate_drafts``; unused without ``draft_gate``)


def _row_slice(x: Array, start: Array, size: int) -> Array:
    """``x[b, start[b] : start[b] + size]`` for every row."""
    return jax.vmap(lambda r, s: jax.lax.dynamic_slice_in_dim(r, s, size, axis=0))(x, start)


def _row_write(x: Array, start: Array, values: Array) -> Array:
    return jax.vmap(lambda r, s, v: jax.lax.dynamic_update_slice_in_dim(r, v, s, axis=0))(x, start, values)


def _is_stop(tokens: Array, stop_ids: Array) -> Array:
    return jnp.any(tokens[..., None] == stop_ids, axis=-1)


def _row_keys(key: Array, salt: Array) -> tuple[Array, Array]:
    """Two fresh keys per row from the row's key folded with ``salt [B]``."""
    k = jax.vmap(lambda k, s: jax.random.split(jax.random.fold_in(k, s)))(key, salt)
    return k[:, 0], k[:, 1]


def choose_verify_length(conf: Array, num_valid: Array, active: Array, lengths, costs) -> tuple[Array, Array]:
    """Per row, the verify length that commits most tokens per unit of cost; and the batch's.

    With ``conf [B, K]`` read as per-offset acceptance probabilities (offset ``k``'s given the
    earlier ones), verifying ``L`` tokens (the anchor and ``L - 1`` draft tokens) commits
    ``1 + sum_{k=1}^{L-1} prod_{j=1}^{k} conf_j`` tokens in expectation (``conf_j``: offset ``j``'s,
    column ``j - 1``; offsets past ``num_valid`` count 0); ``costs [len(lengths)]`` is a round's cost
    at each of ``lengths`` (ascending). Each row picks its own best length from its own draft
    alone, so a row's output never depends on the rest of the batch; the batch then verifies the
    longest of the active rows' picks. Lossless whatever it picks, provided ``conf`` is fixed
    before the draft is drawn (greedy: always; sampled: the rejection rule is exact for a length
    that does not depend on the drawn tokens, so a step that samples its own draft, DFlash 2's
    walk, gives a confidence from its head, not from the walk's q): it only decides how many draft
    tokens the target checks.

    Returns:
      ``(index, row_lengths)``: int32 scalar index into ``lengths`` of the batch's verify length,
      and int32 ``[B]`` each row's own pick (its draft is checked only that far).
    """
    k = conf.shape[1]
    survive = jnp.cumprod(conf, axis=1) * (jnp.arange(1, k + 1) <= num_valid[:, None])
    return choose_tree_width(survive, active, lengths, costs)  # a chain is a tree of one branch


def choose_tree_width(path_p: Array, active: Array, widths, costs) -> tuple[Array, Array]:
    """Per row, the verify width (the anchor and the first ``width - 1`` nodes of its best-first tree,
    ``tree.sort_tree``) that commits most tokens per unit of cost; and the batch's.

    A verify of the first ``n`` nodes commits ``1 + sum_{i < n} path_p[i]`` tokens in expectation
    (``path_p [B, N]``: each node's probability of being accepted, ``tree.path_probability``; the first
    ``n`` nodes of a best-first tree are the best ``n``-node tree it holds, so a chain of ``n`` is never
    better by this count). ``costs [len(widths)]``: a round's cost at each width (ascending). As
    ``choose_verify_length``: each row picks from its own tree alone, the batch verifies the widest
    pick of its active rows, and a row's tree is cut to its own pick (lossless whatever it picks).

    Returns:
      ``(index, row_widths)``: int32 scalar index into ``widths``, int32 ``[B]`` each row's pick.
    """
    cum = jnp.concatenate([jnp.zeros_like(path_p[:, :1]), jnp.cumsum(path_p, axis=1)], axis=1)  # [B, N + 1]
    expected = jnp.stack([1.0 + cum[:, w - 1] for w in widths], axis=1)  # [B, len(widths)]
    row = jnp.argmax(expected / costs.astype(jnp.float32), axis=1)
    index = jnp.max(jnp.where(active, row, 0)).astype(jnp.int32)
    return index, jnp.asarray(widths, jnp.int32)[row]


# Online calibration of a draft step's confidence, per row (``calibrate``): confidences fall in
# CALIBRATION_BINS equal bins of [0, 1]; each bin starts from CALIBRATION_PRIOR pseudo-verifications
# at the step's own estimate, and every draft token the target checks adds one observation.
CALIBRATION_BINS = 10
CALIBRATION_PRIOR = 4.0


def _conf_bins(conf: Array) -> Array:
    return jnp.clip((conf * CALIBRATION_BINS).astype(jnp.int32), 0, CALIBRATION_BINS - 1)


def calibrate(conf: Array, stats: Array) -> Array:
    """A draft step's per-offset confidence ``conf [B, K]`` corrected by what this row's earlier
    rounds showed: in the bin of each confidence, ``(accepted + prior * conf) / (checked + prior)``.

    ``stats`` float32 ``[B, CALIBRATION_BINS, 2]``: per row and confidence bin, the draft tokens the
    target checked and how many of them it accepted (``update_calibration``). A row's estimate
    reads its own history only, so its output never depends on the batch; and it only steers the
    verify length (``choose_verify_length``), so decoding stays lossless. (A step's confidence
    table is an average over prompt sets; on a row that repeats itself less, such as an MBPP
    answer, it over-trusts the draft: docs/JOURNAL.md "Prompt lookup and the default settings".)
    """
    bins = _conf_bins(conf)
    checked = jnp.take_along_axis(stats[..., 0], bins, axis=1)
    accepted = jnp.take_along_axis(stats[..., 1], bins, axis=1)
    return (accepted + CALIBRATION_PRIOR * conf) / (checked + CALIBRATION_PRIOR)


def update_calibration(stats: Array, conf: Array, accepted: Array, checked: Array) -> Array:
    """``stats`` after a round in which each row's target checked draft offsets ``1 .. checked [B]``
    and accepted the first ``accepted [B]`` of them: offset ``k`` counts as checked when every
    earlier one was accepted (its acceptance is conditional on theirs, as ``conf`` is), and as
    accepted when ``k <= accepted``. ``conf [B, K]``: the step's uncalibrated confidence."""
    k = jnp.arange(1, conf.shape[1] + 1)
    seen = k <= jnp.minimum(accepted + 1, checked)[:, None]
    return update_node_calibration(stats, conf, seen, k <= accepted[:, None])


def update_node_calibration(stats: Array, node_p: Array, checked: Array, accepted: Array) -> Array:
    """``update_calibration`` for a tree round: ``node_p [B, N]`` each node's probability given its
    parent (uncalibrated), ``checked`` bool ``[B, N]`` the nodes the target checked with their parent
    accepted, ``accepted`` bool ``[B, N]`` those on the accepted path."""
    onehot = jax.nn.one_hot(_conf_bins(node_p), CALIBRATION_BINS, dtype=jnp.float32)  # [B, N, bins]
    seen, hit = checked.astype(jnp.float32), (checked & accepted).astype(jnp.float32)
    return stats + jnp.stack([jnp.einsum("bkn,bk->bn", onehot, seen), jnp.einsum("bkn,bk->bn", onehot, hit)], -1)


# The draft gate (``LoopShape.draft_gate``): per row, a decayed record of what its drafted rounds
# committed and cost, in plain steps (a verify of one token). A round drafts for a row while that
# record shows at least one token per plain step, and after GATE_EXPLORE plain rounds in a row
# anyway, so that the record follows the text (a loop starting late in an answer). The record starts
# at GATE_PRIOR (tokens, cost): a new row drafts.
GATE_DECAY = 0.9
GATE_EXPLORE = 8
GATE_PRIOR = (2.0, 1.0)


def initial_gate(batch: int) -> Array:
    """float32 ``[batch, 3]``: a new row's draft-gate record (tokens, cost, plain rounds since it drafted)."""
    return jnp.broadcast_to(jnp.asarray([*GATE_PRIOR, 0.0], jnp.float32), (batch, 3))


def gate_drafts(gate: Array, active: Array) -> Array:
    """bool ``[B]``: the rows that draft this round (``LoopShape.draft_gate``): active rows whose
    drafted rounds committed at least one token per plain step of cost (``gate [B, 3]``: decayed
    tokens, decayed cost, plain rounds since the row last drafted), or that took ``GATE_EXPLORE``
    plain rounds in a row. A row's record holds its own rounds only, so its choice (and output)
    never depends on the batch; a row that does not draft commits one token from the target, so
    the output stays lossless whatever the gate chooses (greedy: identical to plain decoding)."""
    return active & ((gate[:, 0] >= gate[:, 1]) | (gate[:, 2] >= GATE_EXPLORE))


def update_gate(gate: Array, drafted: Array, active: Array, produced: Array, cost: Array) -> Array:
    """``gate`` after a round: a row that ``drafted`` adds the tokens it committed (``produced [B]``)
    and the round's cost for it (``cost [B]``, plain steps: the draft and its own verify width) to its
    decayed record (``GATE_DECAY``) and resets its plain-round count; an active row that did not draft
    counts one more plain round."""
    decayed = GATE_DECAY * gate[:, :2] + jnp.stack([produced.astype(jnp.float32), cost], axis=1)
    record = jnp.where(drafted[:, None], decayed, gate[:, :2])
    streak = jnp.where(drafted, 0.0, gate[:, 2] + active)
    return jnp.concatenate([record, streak[:, None]], axis=1)


def prefill(
    target_params,
    drafter_params,
    prompts: Array,
    prompt_lens: Array,
    max_new: Array,
    stop_ids: Array,
    seeds: Array,
    *,
    cfg: TargetConfig,
    shape: LoopShape,
    drafter=None,
    sampling: Sampling = GREEDY,
) -> LoopState:
    """Run the padded prompts through the target and pick the first new token.

    Args:
      target_params, drafter_params: parameter pytrees (``drafter_params`` is None without a drafter).
      prompts: int32 ``[B, P]``, right-padded; ``prompt_lens`` ``[B]`` (>= 1).
      max_new: int32 ``[B]`` new-token budget per sequence (>= 1).
      stop_ids: int32 ``[K]`` stop tokens (``K >= 1``; pad with -1).
      seeds: int32 ``[B]`` one PRNG seed per sequence (used only when sampling).
    """
    b, p = prompts.shape
    positions = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (b, p))
    taps = drafter.tap_layers if drafter is not None else ()
    hidden, feats, cache = Target(cfg).apply(  # recurrent layers: each row's state at its own length
        {"params": target_params}, prompts, positions, init_cache(cfg, b, shape.cache_len), taps, prompt_lens
    )
    last = jnp.take_along_axis(hidden, (prompt_lens - 1)[:, None, None], axis=1)[:, 0]
    logits = Target(cfg).apply({"params": target_params}, last, method="logits")
    key = jax.vmap(jax.random.key)(seeds)
    if sampling.greedy:
        first = jnp.argmax(logits, -1).astype(jnp.int32)
    else:
        first = jax.vmap(sample)(_row_keys(key, jnp.zeros_like(seeds))[0], probs(logits, sampling))
    tokens = jnp.zeros((b, shape.cache_len + shape.block_size), jnp.int32)
    tokens = tokens.at[:, :p].set(prompts)
    tokens = _row_write(tokens, prompt_lens, first[:, None])
    limit = prompt_lens + max_new
    done = _is_stop(first, stop_ids) | (prompt_lens + 1 >= limit)
    dcache = None
    if drafter is not None:
        dcache = drafter.write_context(
            drafter_params, drafter.init_cache(b, shape.cache_len), feats, jnp.zeros((b,), jnp.int32)
        )
    return LoopState(
        tokens,
        prompt_lens,
        limit,
        done,
        cache,
        dcache,
        jnp.zeros((b,), jnp.int32),
        jnp.zeros((b, shape.max_rounds), jnp.int32),
        key,
        jnp.zeros((b, CALIBRATION_BINS, 2), jnp.float32),
        jnp.zeros((b, shape.max_rounds), jnp.int32),
        initial_gate(b),
    )


def insert(
    target_params,
    drafter_params,
    state: LoopState,
    slots: Array,
    prompts: Array,
    prompt_lens: Array,
    max_new: Array,
    stop_ids: Array,
    seeds: Array,
    *,
    cfg: TargetConfig,
    shape: LoopShape,
    drafter=None,
    sampling: Sampling = GREEDY,
) -> LoopState:
    """New requests into rows of a running batch (continuous batching, ``Decoder.as_completed``).

    ``prefill`` of ``prompts`` int32 ``[R, P]`` (with ``prompt_lens``, ``max_new``, ``seeds`` int32
    ``[R]``, as ``prefill`` takes them), written over rows ``slots`` int32 ``[R]`` of ``state``: every
    field of those rows is replaced (token buffer, target and drafter caches, position, limit,
    round record, PRNG key, calibration, draft-gate record), so a request starts as it would in a batch of its own and
    the other rows are untouched. A slot >= the batch size drops its row (padding of ``R``).
    """
    new = prefill(
        target_params,
        drafter_params,
        prompts,
        prompt_lens,
        max_new,
        stop_ids,
        seeds,
        cfg=cfg,
        shape=shape,
        drafter=drafter,
        sampling=sampling,
    )
    return jax.tree.map(lambda old, row: old.at[slots].set(row, mode="drop"), state, new)


def verify_block(
    target_params, block: Array, start: Array, cache, length: int, *, cfg: TargetConfig, taps=(), sampling=GREEDY
):
    """A round's verify (SPEC "Inference loop", step 2): the target on the first ``length`` tokens
    of ``block`` (int32 ``[B, bs]``, row ``b`` at positions ``start[b] ..``) on top of its cache.

    Outputs are padded back to the block, so that verifies of every length have one shape (the
    loop's ``lax.switch`` over verify lengths): greedy, the posterior int32 ``[B, bs]`` (-1 past
    ``length``); sampling, ``p`` float32 ``[B, bs, V]`` (0 past it); the concatenated features of
    layers ``taps`` ``[B, bs, len(taps) * d]`` (0 past ``length``; None without taps); the cache
    (linear-attention layers pending, padded to ``bs``: ``target.pad_pending``)."""
    bs = block.shape[1]
    model, pad = Target(cfg), bs - length
    positions = start[:, None] + jnp.arange(length, dtype=jnp.int32)
    hidden, feats, cache = model.apply({"params": target_params}, block[:, :length], positions, cache, taps)
    logits = model.apply({"params": target_params}, hidden, method="logits")
    if sampling.greedy:
        out = jnp.pad(jnp.argmax(logits, -1).astype(jnp.int32), ((0, 0), (0, pad)), constant_values=-1)
    else:
        out = jnp.pad(probs(logits, sampling), ((0, 0), (0, pad), (0, 0)))
    if feats is not None and pad:
        feats = jnp.pad(feats, ((0, 0), (0, pad), (0, 0)))
    return out, feats, pad_pending(cache, bs)


def verify_tree(target_params, anchor: Array, tree, start: Array, cache, keys: Array, *, cfg, taps=(), sampling=GREEDY):
    """A tree round's verify (SPEC "Tree verification" 2-3): the target on the anchor and the tree's
    ``N`` nodes (``tree.Tree``) as one block on top of its cache, node ``i`` at slot ``start + 1 + i``
    and position ``start + depth``, each seeing the cache, its ancestors and itself.

    Returns ``(target_tokens, feats, cache)``: int32 ``[B, N + 1]``, the target's token at each
    block slot (greedy its argmax; sampling one draw from its tempered ``p`` there, key
    ``fold_in(keys[b], slot)``, what the accept walk compares with the children); the features of
    layers ``taps`` ``[B, N + 1, len(taps) * d]`` (None without taps); the cache with every slot's
    keys and values written (``target.compact_cache`` keeps the accepted path)."""
    model = Target(cfg)
    block = jnp.concatenate([anchor[:, None], tree.tokens], axis=1)
    positions = start[:, None] + jnp.concatenate([jnp.zeros_like(start)[:, None], tree.depth], axis=1)
    mask = ancestor_mask(tree)
    hidden, feats, cache = model.apply({"params": target_params}, block, positions, cache, taps, tree=mask)
    logits = model.apply({"params": target_params}, hidden, method="logits")
    if sampling.greedy:
        return jnp.argmax(logits, -1).astype(jnp.int32), feats, cache
    p = probs(logits, sampling)
    slots = jnp.arange(block.shape[1])
    draw = jax.vmap(lambda k, row: jax.vmap(lambda i, pi: sample(jax.random.fold_in(k, i), pi))(slots, row))
    return draw(keys, p), feats, cache


def verify_tree_width(target_params, anchor, tree, start, cache, keys, width: int, **kw):
    """``verify_tree`` of the anchor and the tree's first ``width - 1`` nodes (parents come first, so
    their ancestors are among them), its outputs padded back to the whole tree (target tokens -1,
    features 0) so that verifies of every width have one shape (the loop's ``lax.switch``)."""
    n = tree.tokens.shape[1]
    part = Tree(*(x[:, : width - 1] for x in tree))
    target_tok, feats, cache = verify_tree(target_params, anchor, part, start, cache, keys, **kw)
    pad = n + 1 - width
    target_tok = jnp.pad(target_tok, ((0, 0), (0, pad)), constant_values=-1)
    if feats is not None:
        feats = jnp.pad(feats, ((0, 0), (0, pad), (0, 0)))
    return target_tok, feats, cache


def decode_loop(
    target_params,
    drafter_params,
    state: LoopState,
    stop_ids: Array,
    verify_costs: Array,
    exit_at: Array | None = None,
    *,
    cfg: TargetConfig,
    shape: LoopShape,
    drafter=None,
    sampling: Sampling = GREEDY,
    on_round=None,
) -> LoopState:
    """Speculative rounds until every sequence is done: one ``lax.while_loop``.

    ``verify_costs``: float32 ``[len(shape.verify_lengths)]`` (``[1]`` with one length), a round's
    cost at each verify length; with ``shape.draft_gate`` one more entry, the draft's cost, all in
    units of the shortest verify (``Decoder.costs_for``).

    ``exit_at``: optional int32 scalar: return as soon as ``exit_at`` rows are done (finished or
    empty), so that the host can hand their slots new prompts (``insert``, ``Decoder.as_completed``);
    rows carry on where they stopped when the loop is called again. None (or more than the batch):
    run until every row is done.

    ``on_round``: optional host function ``(new [B, block] int32, produced [B] int32) -> None``
    called after every round through an ordered ``io_callback`` (streaming): row ``b``
    committed ``new[b, :produced[b]]`` this round.

    With ``shape.draft_gate`` a round drafts only for the rows ``gate_drafts`` picks; when it picks
    none, the round is a plain step (``lax.cond``): the target on the anchor alone, no draft.
    """
    bs = shape.block_size
    offsets = jnp.arange(bs, dtype=jnp.int32)
    lengths = shape.verify_lengths or (bs,)
    taps = drafter.tap_layers if drafter is not None else ()
    gated = shape.draft_gate and drafter is not None
    if gated and (len(lengths) < 2 or lengths[0] != 1):
        raise ValueError(f"a draft gate needs verify lengths starting at 1 (a plain step); got {lengths}")
    draft_cost = verify_costs[-1] if gated else None
    verify_costs = verify_costs[: len(lengths)]

    verify_kw = dict(cfg=cfg, taps=taps, sampling=sampling)

    def verify(length: int, block: Array, start: Array, cache):
        return verify_block(target_params, block, start, cache, length, **verify_kw)

    def commit(s: LoopState, block, a, bonus, feats, tcache, calibration, width, gate) -> LoopState:
        """Step 4: write ``block[1..a]`` and the bonus token ``bonus [B, 1]`` after each anchor, stop at a
        stop token or the length limit, and move the drafter's context and the round records on."""
        active = ~s.done
        new = jnp.where(offsets < a[:, None], jnp.roll(block, -1, axis=1), bonus)  # positions start+1 ..
        produced = jnp.minimum(a + 1, s.limit - s.start - 1)
        stops = _is_stop(new, stop_ids) & (offsets < produced[:, None])
        first_stop = jnp.argmax(stops, axis=1)
        hit = jnp.any(stops, axis=1)
        produced = jnp.where(hit, first_stop + 1, produced)
        produced = jnp.where(active, produced, 0)
        tokens = _row_write(
            s.tokens, s.start + 1, jnp.where(active[:, None], new, _row_slice(s.tokens, s.start + 1, bs))
        )
        dcache = s.drafter_cache
        if drafter is not None:  # slots >= the new start are masked later
            dcache = drafter.write_context(drafter_params, dcache, feats, s.start)
        if on_round is not None:
            jax.experimental.io_callback(on_round, None, new, produced, ordered=True)
        tcache = commit_cache(tcache, produced)  # recurrent layers keep the committed tokens only (rollback)
        start = s.start + produced
        done = s.done | hit | (start + 1 >= s.limit)
        this_round = active[:, None] & (jnp.arange(shape.max_rounds) == s.rounds[:, None])
        accepted = jnp.where(this_round, produced[:, None], s.accepted)
        verified = jnp.where(this_round, width, s.verified)
        rounds = s.rounds + active
        if gated:
            drafted, cost = gate
            gate = update_gate(s.gate, drafted, active, produced, cost)
        else:
            gate = s.gate
        return LoopState(
            tokens, start, s.limit, done, tcache, dcache, rounds, accepted, s.key, calibration, verified, gate
        )

    def plain_round(s: LoopState, drafts: Array) -> LoopState:
        """A round in which no row drafts (``gate_drafts``): the target on each anchor, one token each,
        drawn as a drafted round draws a row's token when it checks no draft (so a row's output does
        not depend on whether the rest of its batch drafted)."""
        del drafts
        block = _row_slice(s.tokens, s.start, bs)
        out, feats, tcache = verify(1, block, s.start, s.target_cache)
        if sampling.greedy:
            bonus = out[:, :1]
        else:
            _, k_accept = _row_keys(s.key, s.rounds + 1)
            if getattr(drafter, "tree_size", 0):  # as verify_tree draws the anchor's slot
                keys = jax.vmap(lambda k: jax.random.fold_in(k, 0))(k_accept)
            else:  # as sampling.accept draws the bonus token after no draft token
                keys = jax.vmap(lambda k: jax.random.split(k)[1])(k_accept)
            bonus = jax.vmap(sample)(keys, out[:, 0])[:, None]
        if feats is not None:
            feats = feats[:, :1]
        a = jnp.zeros_like(s.start)
        no_draft = (jnp.zeros_like(s.done), jnp.zeros(s.start.shape, jnp.float32))
        return commit(s, block, a, bonus, feats, tcache, s.calibration, jnp.int32(1), no_draft)

    def draft_round(s: LoopState, drafts: Array) -> LoopState:
        """Steps 1-4 with rows ``drafts [B]`` drafting (the others check no draft token)."""
        active = ~s.done
        block = _row_slice(s.tokens, s.start, bs)  # anchor, then stale slots the draft overwrites
        verify_size = jnp.minimum(bs, s.limit - s.start)  # the last block shrinks at the length limit
        k_draft, k_accept = _row_keys(s.key, s.rounds + 1)
        q, conf, num_valid, tree = None, None, verify_size - 1, None  # draft offsets 1 .. num_valid can be accepted
        if drafter is not None:
            # a finished (or padding) row drafts nothing: block_valid 1 (the anchor alone) lets a step skip it
            valid = jnp.where(drafts, verify_size, 1)
            draft = drafter.propose(
                drafter_params,
                target_params,
                s.drafter_cache,
                block[:, 0],
                s.start,
                valid,
                bs,
                tokens=s.tokens,
                key=k_draft,
                sampling=sampling,
            )
            if not sampling.greedy and draft.q is None and draft.tree is None:  # a tree's walk needs no q
                raise ValueError(
                    f"{type(drafter).__name__}.propose returned no q under sampling; it drafts greedily only"
                )
            q, conf = draft.q, draft.confidence
            num_valid = jnp.minimum(num_valid, draft.num)  # the step may have fewer real tokens than the block
            num_valid = jnp.where(drafts, num_valid, 0)  # a row the gate stops checks no draft token
            block = block.at[:, 1:].set(draft.tokens)
            tree = draft.tree
        calibration = s.calibration
        row_index = jnp.zeros_like(s.start)  # each row's own verify length or width, as an index into lengths
        if tree is not None:  # verify the tree (or its best part), walk it, move the accepted path into place
            tree = tree._replace(valid=tree.valid & drafts[:, None])  # a row that does not draft: its anchor only
            if len(lengths) > 1:  # verify as many of the best nodes as pay for themselves (choose_tree_width)
                node_p = node_probability(tree)
                trusted = calibrate(node_p, calibration) if shape.calibrate else node_p
                choice, row_widths = choose_tree_width(path_probability(tree, trusted), active, lengths, verify_costs)
                row_index = jnp.searchsorted(jnp.asarray(lengths, jnp.int32), row_widths)
                tree = tree._replace(valid=tree.valid & (jnp.arange(tree.tokens.shape[1]) < row_widths[:, None] - 1))
                args = (target_params, block[:, 0], tree, s.start, s.target_cache, k_accept)
                branches = [partial(verify_tree_width, width=w, **verify_kw) for w in lengths]
                target_tok, feats, tcache = jax.lax.switch(choice, branches, *args)
                width = jnp.asarray(lengths, jnp.int32)[choice]
            else:
                args = (target_params, block[:, 0], tree, s.start, s.target_cache, k_accept)
                target_tok, feats, tcache = verify_tree(*args, **verify_kw)
                width = jnp.int32(tree.tokens.shape[1] + 1)  # the anchor and every node
            walk = accept_walk(tree, target_tok, bs - 1)
            if len(lengths) > 1 and shape.calibrate:  # a node counts as checked when its parent was accepted
                took = on_path(walk, tree.tokens.shape[1])
                took_parent = jnp.where(
                    tree.parent >= 0, jnp.take_along_axis(took, jnp.maximum(tree.parent, 0), axis=1), True
                )
                calibration = update_node_calibration(calibration, node_p, tree.valid & took_parent, took)
            a, bonus = walk.length, walk.bonus[:, None]
            slots = jnp.concatenate([block[:, :1], tree.tokens], axis=1)
            block = jnp.take_along_axis(slots, walk.path, axis=1)  # the anchor, then the accepted path
            tcache = compact_cache(tcache, s.start, walk.path)
            if feats is not None:
                feats = jnp.take_along_axis(feats, walk.path[:, :, None], axis=1)
        elif len(lengths) > 1:  # verify only as many tokens as pay for themselves (choose_verify_length)
            trusted = calibrate(conf, calibration) if shape.calibrate else conf
            choice, row_lengths = choose_verify_length(trusted, num_valid, active, lengths, verify_costs)
            row_index = jnp.searchsorted(jnp.asarray(lengths, jnp.int32), row_lengths)
            num_valid = jnp.minimum(num_valid, row_lengths - 1)
            branches = [partial(verify, length) for length in lengths]
            out, feats, tcache = jax.lax.switch(choice, branches, block, s.start, s.target_cache)
            width = jnp.asarray(lengths, jnp.int32)[choice]
        else:
            out, feats, tcache = verify(lengths[0], block, s.start, s.target_cache)
            width = jnp.int32(lengths[0])
        if tree is not None:
            pass  # walked above
        elif sampling.greedy:
            posterior = out
            match = (block[:, 1:] == posterior[:, :-1]) & (offsets[1:] <= num_valid[:, None])
            a = jnp.sum(jnp.cumprod(match.astype(jnp.int32), axis=1), axis=1)  # accepted draft tokens
            bonus = jnp.take_along_axis(posterior, a[:, None], axis=1)
        elif drafter is None:  # plain sampling
            a, bonus = jnp.zeros_like(s.start), jax.vmap(sample)(k_accept, out[:, 0])[:, None]
        else:
            a, bonus = accept(k_accept, block[:, 1:], q, out, num_valid)
            bonus = bonus[:, None]
        if tree is None and len(lengths) > 1 and shape.calibrate:
            checked = jnp.where(active, num_valid, 0)
            calibration = update_calibration(calibration, conf, a, jnp.maximum(checked, 0))
        # each row's own round in plain steps (a verify of one token, lengths[0])
        cost = (draft_cost + verify_costs[row_index]) / verify_costs[0] if gated else None
        return commit(s, block, a, bonus, feats, tcache, calibration, width, (drafts, cost))

    def round_(s: LoopState) -> LoopState:
        if not gated:
            return draft_round(s, ~s.done)
        drafts = gate_drafts(s.gate, ~s.done)
        return jax.lax.cond(jnp.any(drafts), draft_round, plain_round, s, drafts)

    def cond(s: LoopState):
        go = jnp.any(~s.done) & jnp.all(s.rounds < shape.max_rounds)
        if exit_at is not None:
            go &= jnp.sum(s.done) < exit_at
        return go

    return jax.lax.while_loop(cond, round_, state)


_RUN_TO_END = np.int32(np.iinfo(np.int32).max)  # decode_loop's exit_at: return only when every row is done

# Verify costs measured on this machine, kept across processes (``Decoder.measure_verify_costs``).
VERIFY_COSTS_FILE = "verify_costs.json"


def verify_costs_path() -> Path:
    """Where measured verify costs are kept: ``$DFLASH_JAX_VERIFY_COSTS``, else ``verify_costs.json``
    in the cache folder (``utils.home()``). The test-suite points the variable at its own file."""
    return Path(os.environ.get("DFLASH_JAX_VERIFY_COSTS") or home() / VERIFY_COSTS_FILE)


def read_verify_costs() -> dict:
    """The verify costs kept, by ``Decoder.cost_key`` ({} if none or unreadable)."""
    try:
        stored = json.loads(verify_costs_path().read_text())
    except (OSError, ValueError):
        return {}
    return stored if isinstance(stored, dict) else {}


def write_verify_costs(key: str, costs: Sequence[float]) -> None:
    """Keep ``costs`` under ``key`` (atomic; a failed write, or an entry another process wrote at the
    same moment, only costs a timing next time)."""
    path = verify_costs_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps({**read_verify_costs(), key: list(costs)}))
    except OSError:
        pass


def _median_times(runs: Sequence, repeats: int) -> list[float]:
    """Each callable of ``runs`` timed (seconds, to the end of its computation) in turns, ``repeats`` passes
    after a warm-up one, so that a slow spell of the machine falls on all of them alike; their medians."""
    times = np.zeros((repeats + 1, len(runs)))
    for r in range(repeats + 1):
        for i, run in enumerate(runs):
            t0 = time.perf_counter()
            jax.block_until_ready(run())
            times[r, i] = time.perf_counter() - t0
    return np.median(times[1:], axis=0).tolist()  # the first pass warms up


def _valid_costs(stored, n: int) -> tuple[float, ...] | None:
    """``stored`` as ``n`` finite positive costs, or None (absent or damaged: timed again)."""
    try:
        costs = tuple(float(c) for c in stored)
    except (TypeError, ValueError):
        return None
    ok = len(costs) == n and all(0 < c < float("inf") for c in costs)
    return costs if ok else None


def _processor() -> str:
    """The CPU model (``/proc/cpuinfo``'s "model name"), else ``platform.processor()`` or the machine."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@dataclasses.dataclass
class GenerationResult:
    """One sequence's output. ``token_ids`` are the new tokens only (stop token included)."""

    token_ids: list[int]
    acceptance_lengths: list[int]
    prefill_s: float
    decode_s: float
    compile_s: float
    verify_widths: list[int] = dataclasses.field(default_factory=list)  # per round: positions the target verified

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def tau(self) -> float:
        """Mean tokens committed per verify round (the first token, from prefill, is not a round)."""
        return float(np.mean(self.acceptance_lengths)) if self.acceptance_lengths else 0.0


# Compiled (prefill, loop) pairs shared by every Decoder of this process with the same static settings
# (``Decoder._shared_key``), so that a new Decoder for the same target and plan (a bench arm, a test)
# neither traces nor compiles again. The oldest are dropped past MAX_SHARED_EXECUTABLES.
_EXECUTABLES: dict = {}
MAX_SHARED_EXECUTABLES = 64


def clear_shared_executables() -> None:
    """Drop the compiled code shared between Decoders (Decoders keep their own). The next new Decoder
    compiles again (or reads JAX's persistent cache). For long processes that compile thousands of
    shapes (a test worker: every XLA:CPU executable holds memory mappings of its own, and the kernel
    allows 65530 a process), and for code that patches what a Decoder compiles."""
    _EXECUTABLES.clear()


def _signature(tree) -> tuple:
    """A parameter pytree's structure and its leaves' shapes, dtypes and shardings (what compiled code
    was specialised to; the values are arguments)."""
    leaves, treedef = jax.tree.flatten(tree)
    return str(treedef), tuple((np.shape(x), str(x.dtype), getattr(x, "sharding", None)) for x in leaves)


def _on_device(tree):
    """``tree`` with numpy leaves moved to the default device (jax arrays are left where they are)."""
    return jax.tree.map(lambda x: jax.device_put(x) if isinstance(x, np.ndarray) else x, tree)


class Decoder:
    """Compiles and runs the loop for a target (and optional drafter), caching executables by shape.

    Prompt lengths and batch sizes are padded to powers of two (``bucket``) and the cache
    length to a multiple of 256, so a new prompt reuses an executable compiled earlier.
    """

    def __init__(
        self, target_params, cfg: TargetConfig, plan: Plan | None = None, *, sampling: Sampling = GREEDY, mesh=None
    ):
        """Args:
        target_params, cfg: the target (``Target`` parameters and config).
        plan: what each round drafts and verifies (``speculation.make_plan`` / ``plan_for``);
          ``None``: plain decoding (block size 1).
        sampling: ``Sampling`` settings (default greedy); lossless in distribution (SPEC "Sampling").
        mesh: optional ``(data, fsdp, tensor)`` mesh; pass target parameters placed on it
          (``load_target(..., mesh=mesh)``). The loop is compiled under the logical-axis table,
          so the KV cache is split over heads (``tensor``) and the batch over ``data`` x ``fsdp``.
        """
        # Host (numpy) parameters would be copied to the device on every call: place them once.
        self.params, self.cfg, self.mesh, self.sampling = _on_device(target_params), cfg, mesh, sampling
        self.plan = plan
        self.drafter = plan.step if plan is not None else None
        self.drafter_params = _on_device(plan.params) if plan is not None else None
        self.block_size = plan.block_size if plan is not None else 1
        self.tree_size = getattr(self.drafter, "tree_size", 0)
        if self.tree_size and cfg.has_linear_layers:
            raise ValueError(
                "tree verification is not supported with linear-attention (Gated DeltaNet) layers: their recurrent "
                "state has no per-node copy for the branches; verify one chain (--tree off)"
            )
        self.verify_lengths = plan.verify_lengths if plan is not None else ()
        self.calibrate = plan.calibrate if plan is not None else True
        self.draft_gate = plan.draft_gate if plan is not None else False
        self._measure = bool(self.verify_lengths) and plan.verify_costs is None
        self.verify_costs = (plan.verify_costs or ()) if plan is not None else ()
        self.draft_cost = plan.draft_cost if plan is not None else None
        self._compiled: dict[tuple, tuple] = {}
        self._measured: dict[tuple, tuple[float, ...]] = {}
        self._sink = None  # where the streaming callback sends each round's tokens (one stream at a time)
        self._stream_lock = threading.Lock()

    def shape_for(self, prompt_lens: Sequence[int], max_new_tokens: int) -> LoopShape:
        """The static shapes for prompts of these lengths: the prompt length (the longest, rounded up
        to a power of two), the cache (the longest prompt + ``max_new_tokens`` + a block or a tree,
        rounded up to 256 slots, at least the prompt length: a decode step reads the whole cache)."""
        p = bucket(max(prompt_lens))
        need = max(prompt_lens) + max_new_tokens + max(self.block_size, self.tree_size + 1)  # a round writes a block
        cache_len = max(-(-need // 256) * 256, p)
        max_rounds = max_new_tokens  # every round commits at least one token
        return LoopShape(
            bucket(len(prompt_lens), 1),
            p,
            cache_len,
            self.block_size,
            max_rounds,
            self.verify_lengths,
            self.calibrate,
            self.draft_gate,
        )

    def costs_for(self, shape: LoopShape) -> np.ndarray:
        """float32 ``[len(verify_lengths)]`` (``[1]`` when there is one length): the round costs the
        loop chooses with, an argument of the compiled loop (so new timings never recompile it); with
        a draft gate (``Plan.draft_gate``) one more, the draft's cost, in the same unit."""
        if not self.verify_lengths:
            return np.ones((1,), np.float32)
        costs = self.measure_verify_costs(shape.batch, shape.cache_len) if self._measure else self.verify_costs
        if self.draft_gate:  # measured in length-1 verifies, the unit of measured costs (lengths start at 1)
            draft = self.draft_cost or self.measure_draft_cost(shape.batch, shape.cache_len) * costs[0]
            costs = (*costs, draft)
        return np.asarray(costs, np.float32)

    def measure_verify_costs(self, batch: int, cache_len: int, repeats: int = 5) -> tuple[float, ...]:
        """The target's verify (forward and LM head, ``batch`` rows on a ``cache_len`` cache) timed at
        each of ``verify_lengths``, in units of the shortest; measured once per machine and shape and
        kept, in this object and in a file (``verify_costs_path``, keyed by ``cost_key``: the next
        process reads them instead of timing again; an entry that is not one finite positive cost
        per length is timed again), and never part of what is compiled (``costs_for``). Delete the
        file (``make clean-cache``) to time afresh, for example after timing on a busy machine.

        Timed as the loop runs it: one compiled ``lax.switch`` over the lengths (``verify_block``,
        outputs padded to the block), then the commit; the lengths take turns, ``repeats`` passes
        after a warm-up one, and each gets its median, so a slow spell of the machine (a plain step
        took 34 ms in one run and 41 ms in another on the 2-core CPU here) falls on every length
        alike."""
        key = (batch, cache_len)
        if key in self._measured:
            return self._measured[key]
        stored = _valid_costs(read_verify_costs().get(self.cost_key(batch, cache_len)), len(self.verify_lengths))
        if stored is not None:
            self._measured[key] = stored
            return stored
        times = _median_times(self._verify_timers(batch, cache_len), repeats)
        costs = [round(t / times[0], 2) for t in times]
        for i in range(1, len(costs)):  # never cheaper when longer (timing noise)
            costs[i] = max(costs[i], costs[i - 1])
        self._measured[key] = tuple(costs)
        write_verify_costs(self.cost_key(batch, cache_len), self._measured[key])
        return self._measured[key]

    def measure_draft_cost(self, batch: int, cache_len: int, repeats: int = 5) -> float:
        """A draft's cost (``_timed_draft``: the step's proposal and, sampling a chain, the rejection rule) in
        verifies of one token, timed in turns with one, as ``measure_verify_costs`` times the lengths (at least
        0.01); kept the same way, under its own key (``cost_key`` and the draft step's), so that the verify costs
        are shared with the same plan without a draft gate."""
        key = (batch, cache_len, "draft")
        if key in self._measured:
            return self._measured[key][0]
        file_key = json_sha256((self.cost_key(batch, cache_len), self._draft_signature()), 32)
        stored = _valid_costs(read_verify_costs().get(file_key), 1)
        if stored is None:
            plain = self._verify_timers(batch, cache_len)[0]  # verify lengths start at 1 under a gate
            times = _median_times([plain, self._timed_draft(batch, cache_len)], repeats)
            stored = (max(0.01, round(times[1] / times[0], 2)),)
            write_verify_costs(file_key, stored)
        self._measured[key] = stored
        return stored[0]

    def _draft_signature(self) -> tuple:
        """What a draft's measured cost depends on besides ``cost_key``: the step, the block and the shapes of
        its parameters (a draft vocabulary's length among them)."""
        return (repr(self.drafter), self.block_size, _signature(self.drafter_params))

    def _verify_timers(self, batch: int, cache_len: int) -> list:
        """One callable per verify length running it as a round does: one compiled ``lax.switch`` over the
        lengths (``verify_block``, outputs padded to the block), then the commit. Not kept: the cache it runs
        on is as large as the loop's."""
        taps = self.drafter.tap_layers if self.drafter is not None else ()
        kw = dict(cfg=self.cfg, taps=taps, sampling=self.sampling)

        def verify(params, cache, block, index):  # as a round runs it: one lax.switch over the lengths, the commit
            start = jnp.zeros(block.shape[:1], jnp.int32)
            if self.tree_size:  # a chain-shaped tree of every width: the mask and compaction cost the same
                n = self.tree_size
                nodes = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (block.shape[0], n))
                tree = Tree(nodes * 0, nodes - 1, nodes + 1, jnp.zeros(nodes.shape), nodes >= 0)
                branches = [partial(verify_tree_width, width=w, **kw) for w in self.verify_lengths]
                keys = jax.vmap(jax.random.key)(start)
                out, feats, cache = jax.lax.switch(index, branches, params, block[:, 0], tree, start, cache, keys)
                path = jnp.broadcast_to(jnp.arange(self.block_size, dtype=jnp.int32), block.shape)
                return out, feats, compact_cache(cache, start, path)
            branches = [partial(verify_block, params, length=n, **kw) for n in self.verify_lengths]
            out, feats, cache = jax.lax.switch(index, branches, block, start, cache)
            return out, feats, commit_cache(cache, jnp.ones_like(start))

        cache, block = init_cache(self.cfg, batch, cache_len), jnp.zeros((batch, self.block_size), jnp.int32)
        fn = jax.jit(verify).lower(self.params, cache, block, jnp.int32(0)).compile()
        return [partial(fn, self.params, cache, block, jnp.int32(i)) for i in range(len(self.verify_lengths))]

    def _timed_draft(self, batch: int, cache_len: int):
        """A compiled draft as a round runs it, ready to time: ``propose`` on ``batch`` rows at position 0
        (with nothing before it to match, a step that reads prompt lookup runs its drafter too) and,
        sampling a chain, ``accept`` against uniform target probabilities."""
        bs, v = self.block_size, self.cfg.vocab_size
        step, sampling = self.drafter, self.sampling
        start = jnp.zeros((batch,), jnp.int32)
        tokens = jnp.broadcast_to(
            (jnp.arange(cache_len + bs, dtype=jnp.int32) * 7919 + 13) % v, (batch, cache_len + bs)
        )
        keys = jax.vmap(jax.random.key)(start)
        p = None if sampling.greedy or self.tree_size else jnp.full((batch, bs, v), 1.0 / v, jnp.float32)

        def draft(params, target_params, cache, tokens, keys, p):
            valid = jnp.full((batch,), bs, jnp.int32)
            d = step.propose(
                params, target_params, cache, tokens[:, 0], start, valid, bs, tokens=tokens, key=keys, sampling=sampling
            )
            return d if p is None else (d, accept(keys, d.tokens, d.q, p, d.num))

        args = (self.drafter_params, self.params, step.init_cache(batch, cache_len), tokens, keys, p)
        return partial(jax.jit(draft).lower(*args).compile(), *args)

    def cost_key(self, batch: int, cache_len: int) -> str:
        """What a verify's measured cost depends on, as one string: the machine (backend, device kind
        and count, processor model, the CPUs this process may use, XLA's flags, the jax version), the
        target's config, the mesh, the taps, the sampling settings, the shape and the verify lengths."""
        device = jax.devices()[0]
        machine = (
            jax.default_backend(),
            device.device_kind,
            len(jax.devices()),
            _processor(),
            len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            os.environ.get("XLA_FLAGS", ""),
            jax.__version__,
        )
        taps = self.drafter.tap_layers if self.drafter is not None else ()
        shape = (repr(self.mesh), batch, cache_len, self.verify_lengths) + (("tree", self.tree_size),) * bool(
            self.tree_size
        )
        what = (machine, repr(self.cfg), taps, repr(self.sampling), shape)
        return json_sha256(what, 32)

    def compile(self, shape: LoopShape, num_stop: int, stream: bool = False):
        """AOT-compile prefill and loop for ``shape``; returns (prefill, loop, seconds spent).

        ``stream``: the loop calls back to the host after every round (``Decoder.stream``)."""
        key = (shape, num_stop, stream)
        if key in self._compiled:
            return (*self._compiled[key], 0.0)
        shared = None if stream else self._shared_key(shape, num_stop)  # a stream's loop calls back to self
        if shared is not None and shared in _EXECUTABLES:
            self._compiled[key] = _EXECUTABLES[shared]
            return (*self._compiled[key], 0.0)
        with self._on_mesh():
            out = self._compile(shape, num_stop, key)
        if shared is not None:
            _EXECUTABLES[shared] = self._compiled[key]
            while len(_EXECUTABLES) > MAX_SHARED_EXECUTABLES:
                _EXECUTABLES.pop(next(iter(_EXECUTABLES)))  # the oldest first
        return out

    def _on_mesh(self):
        """The context code for this decoder is traced in: the logical-axis table and the mesh (none
        without a mesh)."""
        if self.mesh is None:
            return contextlib.nullcontext()
        stack = contextlib.ExitStack()
        stack.enter_context(axis_rules())
        stack.enter_context(jax.set_mesh(self.mesh))
        return stack

    def _shared_key(self, shape: LoopShape, num_stop: int):
        """What the compiled prefill and loop depend on, as a hashable key: every ``Decoder`` of equal
        static settings (target config, draft step, sampling, mesh, shape, JAX's configuration as
        ``jit`` keys on it) and parameter signatures shares one compilation. None (no sharing) for a
        draft step that is not a frozen dataclass (a step that can change after it was compiled) or
        a key that cannot be hashed."""
        step = self.drafter
        if step is not None and not (dataclasses.is_dataclass(step) and step.__dataclass_params__.frozen):
            return None
        try:
            context = jax._src.config.trace_context()  # what jit's own cache keys on (precision, PRNG, ...)
        except AttributeError:
            return None
        key = (self.cfg, step, self.sampling, self.mesh, shape, num_stop, context)
        key += (_signature(self.params), _signature(self.drafter_params))
        try:
            hash(key)
        except TypeError:
            return None
        return key

    def _compile(self, shape: LoopShape, num_stop: int, key):
        t0 = time.perf_counter()
        b, p = shape.batch, shape.prompt_len
        i32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.int32)  # noqa: E731
        pre = jax.jit(partial(prefill, cfg=self.cfg, shape=shape, drafter=self.drafter, sampling=self.sampling))
        args = (self.params, self.drafter_params, i32(b, p), i32(b), i32(b), i32(num_stop), i32(b))
        lowered = pre.lower(*args)
        pre_c = lowered.compile()
        # the loop takes the state exactly as the compiled prefill lays it out (matters on a mesh);
        # its shapes come from the lowering, not from tracing prefill a second time
        state_abstract = jax.tree.map(
            lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh), lowered.out_info, pre_c.output_shardings
        )
        on_round = self._on_round if key[2] else None
        loop = jax.jit(
            partial(
                decode_loop, cfg=self.cfg, shape=shape, drafter=self.drafter, sampling=self.sampling, on_round=on_round
            ),
            donate_argnums=(2,),
            out_shardings=pre_c.output_shardings,  # the state as it came in: the loop can be called on it again
        )  # its arguments: params, drafter params, state, stop ids, verify costs, exit_at
        costs = jax.ShapeDtypeStruct((max(len(shape.verify_lengths), 1) + shape.draft_gate,), jnp.float32)
        loop_c = loop.lower(self.params, self.drafter_params, state_abstract, i32(num_stop), costs, i32()).compile()
        self._compiled[key] = (pre_c, loop_c)
        return pre_c, loop_c, time.perf_counter() - t0

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        stop_token_ids: Sequence[int] = (),
        seed: int | Sequence[int] = 0,
        *,
        _stream: bool = False,
    ):
        """(Speculative) decoding of a batch of token-id prompts, greedy or with ``self.sampling``.

        Args:
          prompts: list of non-empty token-id lists.
          max_new_tokens: new tokens per prompt, >= 1 (the stop token counts).
          stop_token_ids: decoding of a sequence stops right after any of these.
          seed: PRNG seed of every request, or one per prompt (sampling only): a request's
            output depends on its prompt, seed and settings, not on the rest of the batch.

        Returns:
          list of ``GenerationResult``, one per prompt, in order.

        Raises:
          ValueError: an empty prompt, ``max_new_tokens < 1``, a stop id outside the vocabulary,
            or prompt + ``max_new_tokens`` beyond the target's ``max_position_embeddings``;
            raised before anything is compiled.
        """
        prompts = self._checked(prompts, max_new_tokens, stop_token_ids)
        shape = self.shape_for([len(p) for p in prompts], max_new_tokens)
        stops = np.asarray(list(stop_token_ids) or [-1], np.int32)
        pre, loop, compile_s = self.compile(shape, len(stops), _stream)
        costs = self.costs_for(shape)  # measured (once per shape) before the clock starts

        n = len(prompts)
        tok = np.zeros((shape.batch, shape.prompt_len), np.int32)
        lens = np.ones((shape.batch,), np.int32)
        for i, p in enumerate(prompts):
            tok[i, : len(p)], lens[i] = p, len(p)
        budget = np.full((shape.batch,), max_new_tokens, np.int32)
        budget[n:] = 1  # padding rows finish at once
        seeds = np.zeros((shape.batch,), np.int32)
        seeds[:n] = np.broadcast_to(np.asarray(seed, np.int64), (n,)) % (2**31)
        t0 = time.perf_counter()
        state = jax.block_until_ready(pre(self.params, self.drafter_params, tok, lens, budget, stops, seeds))
        t1 = time.perf_counter()
        if _stream:
            first = jax.device_get(_row_slice(state.tokens, state.start, 1))[:n, 0]
            self._sink([[int(t)] for t in first])
        state = jax.block_until_ready(loop(self.params, self.drafter_params, state, stops, costs, _RUN_TO_END))
        t2 = time.perf_counter()
        tokens, start, limit, rounds, accepted, verified = jax.device_get(
            (state.tokens, state.start, state.limit, state.rounds, state.accepted, state.verified)
        )
        results = []
        for i in range(n):
            end = min(int(start[i]) + 1, int(limit[i]))
            results.append(
                GenerationResult(
                    token_ids=tokens[i, lens[i] : end].tolist(),
                    acceptance_lengths=accepted[i, : rounds[i]].tolist(),
                    verify_widths=verified[i, : rounds[i]].tolist(),
                    prefill_s=t1 - t0,
                    decode_s=t2 - t1,
                    compile_s=compile_s,
                )
            )
        return results

    def _checked(self, prompts, max_new_tokens: int, stop_token_ids) -> list[list[int]]:
        """``prompts`` as lists of ints, after the checks ``generate`` documents (ValueError)."""
        prompts = [list(map(int, p)) for p in prompts]
        if not prompts:
            raise ValueError("no prompts given")
        if any(len(p) == 0 for p in prompts):
            raise ValueError("empty prompt: every prompt needs at least one token")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        vocab = self.cfg.vocab_size
        bad = [t for t in stop_token_ids if not 0 <= int(t) < vocab]
        if bad:
            raise ValueError(f"stop token ids {bad} are outside the vocabulary [0, {vocab})")
        if any(not 0 <= t < vocab for p in prompts for t in p):
            raise ValueError(f"prompt token ids must be in [0, {vocab})")
        longest = max(map(len, prompts))
        if longest + max_new_tokens > self.cfg.max_position_embeddings:
            raise ValueError(
                f"prompt ({longest} tokens) + max_new_tokens ({max_new_tokens}) exceeds the target's "
                f"context of {self.cfg.max_position_embeddings} positions; shorten one of them"
            )
        return prompts

    def as_completed(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        stop_token_ids: Sequence[int] = (),
        seed: int | Sequence[int] = 0,
        *,
        batch_size: int = 16,
        refill_at: int = 1,
    ) -> Iterator[tuple[int, GenerationResult]]:
        """Decode many prompts on ``batch_size`` rows that are refilled as their requests finish
        (continuous batching, as vLLM's and SGLang's offline engines do); yields ``(index,
        result)`` for every prompt, in the order they finish.

        The compiled loop returns to the host as soon as ``refill_at`` more rows are done (a stop
        token or the length limit; ``decode_loop``'s ``exit_at``); their results are read, and their
        rows take the next prompts (``insert``: a prefill of just those rows, the others untouched)
        without recompiling (one ``insert`` executable per power-of-two count of new rows). Every
        request starts as it would alone (its own caches, PRNG key from its seed, round count,
        calibration and draft-gate record), so its output does not depend on its neighbours or on when it entered
        (greedy: the tokens ``generate`` gives it; sampling: the same draws for the same seed).

        A result's ``prefill_s`` is the prefill (or insert) call it entered with, ``decode_s`` the
        wall time from then until it was read (shared with the rows beside it), ``compile_s`` the
        compilation done to admit it (charged to the first request a call admits, so that the sum
        over results is the compilation time of the job).

        Args:
          prompts, max_new_tokens, stop_token_ids, seed: as ``generate`` (every prompt is checked
            before anything is compiled; the cache fits the longest; each prefill pads its prompts
            to their own longest, rounded up to a power of two).
          batch_size: rows decoded together (rounded up to a power of two).
          refill_at: how many rows must be done before the loop stops to refill them (1: at once).

        Raises:
          ValueError: as ``generate``, or ``batch_size`` / ``refill_at`` below 1.
        """
        if batch_size < 1 or refill_at < 1:
            raise ValueError(f"batch_size and refill_at must be >= 1, got {batch_size} and {refill_at}")
        prompts = self._checked(prompts, max_new_tokens, stop_token_ids)
        n = len(prompts)
        seeds = np.broadcast_to(np.asarray(seed, np.int64), (n,)) % (2**31)
        b = bucket(min(batch_size, n), 1)
        shape = self.shape_for([len(p) for p in prompts], max_new_tokens)  # the cache fits the longest prompt
        shape = dataclasses.replace(shape, batch=b, prompt_len=bucket(max(len(p) for p in prompts[:b])))
        stops = np.asarray(list(stop_token_ids) or [-1], np.int32)
        pre, loop, compile_s = self.compile(shape, len(stops))
        costs = self.costs_for(shape)

        def rows_of(requests: Sequence[int], rows: int, length: int):
            tok = np.zeros((rows, length), np.int32)
            lens, budget, row_seeds = (np.ones((rows,), np.int32) for _ in range(3))  # padding rows: done at once
            for r, i in enumerate(requests):
                tok[r, : len(prompts[i])], lens[r], budget[r] = prompts[i], len(prompts[i]), max_new_tokens
                row_seeds[r] = seeds[i]
            return tok, lens, budget, stops, row_seeds

        request = np.full((b,), -1)  # the request each row holds (-1: none)
        entered, prefill_s, charged = np.zeros((b,)), np.zeros((b,)), np.zeros((b,))
        first = list(range(min(b, n)))
        t0 = time.perf_counter()
        state = jax.block_until_ready(pre(self.params, self.drafter_params, *rows_of(first, b, shape.prompt_len)))
        request[first], entered[first], prefill_s[first] = first, time.perf_counter(), time.perf_counter() - t0
        charged[0] = compile_s  # compilation is charged to the first request a call admits
        admitted = len(first)
        while True:
            done = np.asarray(jax.device_get(state.done))
            finished = np.flatnonzero(done & (request >= 0))
            if finished.size:
                now = time.perf_counter()
                tokens, start, limit, rounds, accepted, verified = jax.device_get(
                    (state.tokens, state.start, state.limit, state.rounds, state.accepted, state.verified)
                )
                for r in finished:
                    i = int(request[r])
                    end = min(int(start[r]) + 1, int(limit[r]))
                    yield (
                        i,
                        GenerationResult(
                            token_ids=tokens[r, len(prompts[i]) : end].tolist(),
                            acceptance_lengths=accepted[r, : rounds[r]].tolist(),
                            verify_widths=verified[r, : rounds[r]].tolist(),
                            prefill_s=float(prefill_s[r]),
                            decode_s=now - float(entered[r]),
                            compile_s=float(charged[r]),
                        ),
                    )
                    request[r] = -1
            free = np.flatnonzero(request < 0)
            take = free[: n - admitted]
            if take.size:
                new = list(range(admitted, admitted + take.size))
                rows, length = self._insert_rows(take.size), bucket(max(len(prompts[i]) for i in new))
                ins, spent = self._insert_fn(shape, len(stops), rows, length, state)
                slots = np.full((rows,), b, np.int32)  # b: dropped (padding rows)
                slots[: take.size] = take
                t0 = time.perf_counter()
                state = jax.block_until_ready(
                    ins(self.params, self.drafter_params, state, slots, *rows_of(new, rows, length))
                )
                t1 = time.perf_counter()
                request[take], entered[take], prefill_s[take], charged[take] = new, t1, t1 - t0, 0.0
                charged[take[0]] = spent
                admitted += take.size
            live = int(np.sum(request >= 0))
            if live == 0:
                return
            exit_at = np.int32(b - live + min(refill_at, live))  # the rows done now (free or finished at once) + more
            state = loop(self.params, self.drafter_params, state, stops, costs, exit_at)

    def _insert_rows(self, count: int) -> int:
        """Rows of an ``insert`` for ``count`` new requests: a power of two (one executable per size),
        a multiple of the mesh's batch split."""
        rows = bucket(count, 1)
        if self.mesh is not None:
            split = self.mesh.shape.get("data", 1) * self.mesh.shape.get("fsdp", 1)
            rows = -(-rows // split) * split
        return rows

    def _insert_fn(self, shape: LoopShape, num_stop: int, rows: int, length: int, state):
        """The compiled ``insert`` of ``rows`` new requests of prompts padded to ``length`` into
        ``state`` (donated); compiled once per shape, row count and length. Returns ``(executable,
        seconds spent compiling it now)``."""
        key = ("insert", shape, num_stop, rows, length)
        if key in self._compiled:
            return self._compiled[key], 0.0
        t0 = time.perf_counter()
        fn = jax.jit(  # the state keeps the layout the compiled loop takes (matters on a mesh)
            partial(insert, cfg=self.cfg, shape=shape, drafter=self.drafter, sampling=self.sampling),
            donate_argnums=(2,),
            out_shardings=jax.tree.map(lambda x: x.sharding, state),
        )
        i32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.int32)  # noqa: E731
        args = (self.params, self.drafter_params, state, i32(rows), i32(rows, length))
        args += (i32(rows), i32(rows), i32(num_stop), i32(rows))
        with self._on_mesh():
            self._compiled[key] = fn.lower(*args).compile()
        return self._compiled[key], time.perf_counter() - t0

    def _on_round(self, new, produced) -> None:
        if self._sink is not None:
            new, produced = np.asarray(new), np.asarray(produced)
            rows = [new[b, : produced[b]].tolist() for b in range(len(produced))]
            if any(rows):
                self._sink(rows)

    def stream(
        self, prompt: Sequence[int], max_new_tokens: int, stop_token_ids: Sequence[int] = (), seed: int = 0
    ) -> Iterator[list[int]]:
        """Decode one prompt and yield its new token ids as they are committed (one list per round;
        the first holds the token from prefill). The concatenation equals ``generate``'s output.

        The loop stays one compiled ``while_loop``; an ordered host callback after every round
        hands the committed tokens to this iterator (a separate executable from ``generate``'s,
        not kept in the persistent compilation cache). The compiled loop cannot be interrupted:
        leaving the iteration early waits for the generation to finish.

        Raises:
          RuntimeError: another stream of this ``Decoder`` is still running (one at a time;
            use a second ``Decoder`` for concurrent streams).
          ValueError: as ``generate``.
        """
        items: queue.Queue = queue.Queue()
        done = object()
        with self._stream_lock:
            if self._sink is not None:
                raise RuntimeError("this Decoder is already streaming; finish that stream first or use another Decoder")
            self._sink = lambda rows: items.put(rows[0])

        def work():
            try:
                self.generate([prompt], max_new_tokens, stop_token_ids, seed, _stream=True)
                items.put(done)
            except BaseException as e:  # re-raised in the caller's thread
                items.put(e)

        thread = threading.Thread(target=work, daemon=True)
        thread.start()
        try:
            while (item := items.get()) is not done:
                if isinstance(item, BaseException):
                    raise item
                if item:
                    yield item
        finally:
            thread.join()
            self._sink = None
