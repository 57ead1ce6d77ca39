"""The DFlash training objective (SPEC "Training" 3-6): random anchors, blocks, decayed loss.

For every sequence of a batch:

1. the frozen target runs the clean sequence once; its tapped layer outputs are fused into
   one context vector per position (``Drafter.fuse``), whose K/V every drafter layer reads;
2. ``sample_anchors`` draws up to ``num_anchors`` anchor positions ``p`` (``p`` and ``p+1``
   supervised; uniform without replacement; sorted); block ``j`` is
   ``[x_p, MASK x (B-1)]`` at positions ``p .. p+B-1``;
3. block offset ``k >= 1`` predicts ``x_{p+k}``; the loss weight is
   ``w_k = exp(-(k-1)/gamma)``, zero for offset 0, padding blocks, labels past the end or
   outside the response;
4. the blocks go through the drafter a chunk of anchors at a time (``lax.map`` under
   ``jax.checkpoint``), with the masks of ``dflash_jax.masks``, so memory grows linearly
   with the number of anchors and no ``[queries, keys]`` mask over all blocks is built.

For a DFlash 2 drafter (SPEC "DFlash 2") every chunk also gives the selector's teacher-forced
k-way cross-entropy (``selector_loss``), weighted by the same ``w_k``; the trainer adds it times
``train.selector_alpha``.

``block_loss`` returns **sums** (weighted cross-entropy, weights, per-offset counts), so the
caller normalises by the weight sum of the whole global batch (all devices, all
accumulation steps), as SPEC 6 asks.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from dflash_jax import masks as masks_lib
from dflash_jax.drafter import (
    Drafter,
    DrafterConfig,
    block_embeddings,
    block_inputs,
    copy_prior,
    draft_logits,
    selector_candidates,
    selector_scores,
)
from dflash_jax.target import Target, TargetConfig

Array = jax.Array


# What a block offset is trained toward (``block_loss``'s ``objective``): the answer's token, the
# target's next-token distribution (forward KL), or that KL mixed with the total variation distance.
OBJECTIVES = ("ce", "kl", "kl_tv")
# How block offsets are weighted (``block_loss``'s ``position_weights``): the fixed decay (SPEC), or the
# decay times each block's chance of reaching the offset under the drafter as it is now.
POSITION_WEIGHTS = ("decay", "reach")
# DFlash 2's selector objectives (``block_loss``'s ``selector_objective``)
SELECTOR_OBJECTIVES = ("ce", "kl")


@dataclasses.dataclass(frozen=True)
class LossSettings:
    """The training objective's static settings, as ``block_loss`` takes them (the ``train`` fields of
    the same names, ``train_config.TrainSettings``; each is described in ``block_loss``). Frozen and
    hashable: a jitted step closes over one, and ``train_step`` / ``sharded_step`` / ``eval_stats``
    pass it on whole (``block_loss(..., **settings.kwargs())``). Its defaults are ``block_loss``'s: the
    keyword defaults there read them from here, so the two cannot drift apart."""

    gamma: float = 7.0
    anchor_chunk: int = 16
    loss_offsets: int = 0
    remat: bool = True
    objective: str = "ce"
    tv_weight: float = 0.5
    position_weights: str = "decay"
    selector_objective: str = "ce"
    selector_stop_grad: bool = False

    @classmethod
    def from_train(cls, t) -> LossSettings:
        """The settings of a run's ``train`` section (``train_config.TrainSettings`` or a ConfigDict)."""
        return cls(**{f.name: getattr(t, f.name) for f in dataclasses.fields(cls)})

    def kwargs(self) -> dict:
        """``block_loss``'s keyword arguments."""
        return dataclasses.asdict(self)


class Anchors(NamedTuple):
    positions: Array  # int32 [b, A], sorted; padding blocks repeat position 0
    valid: Array  # bool [b, A]; False = padding block (no valid position left)


def sample_anchors(rng: Array, loss_mask: Array, num_anchors: int) -> Anchors:
    """Up to ``num_anchors`` anchors per row, uniform without replacement among positions ``p``
    with ``loss_mask[p] & loss_mask[p + 1]``, sorted ascending (SPEC "Training" 3).

    Args:
      rng: a PRNG key (fresh every step).
      loss_mask: bool ``[b, T]``, True on supervised (response) tokens.
      num_anchors: static ``A``; rows with fewer valid positions get padding blocks.
    Returns:
      ``Anchors`` with ``[b, A]`` arrays.
    """
    b, t = loss_mask.shape
    ok = loss_mask[:, :-1] & loss_mask[:, 1:]  # [b, T-1]: p and p+1 supervised
    keys = jax.random.uniform(rng, ok.shape)
    keys = jnp.where(ok, keys, 2.0)  # invalid positions sort last
    k = min(num_anchors, t - 1)
    _, idx = jax.lax.top_k(-keys, k)  # the k smallest keys: a uniform sample without replacement
    valid = jnp.take_along_axis(ok, idx, axis=1)
    pos = jnp.where(valid, idx, t)  # padding sorts after every real anchor
    order = jnp.argsort(pos, axis=1)
    pos, valid = jnp.take_along_axis(pos, order, 1), jnp.take_along_axis(valid, order, 1)
    pos = jnp.where(valid, pos, 0).astype(jnp.int32)
    if k < num_anchors:  # sequences shorter than A: pad to the static size
        pad = num_anchors - k
        pos = jnp.pad(pos, ((0, 0), (0, pad)))
        valid = jnp.pad(valid, ((0, 0), (0, pad)))
    return Anchors(pos, valid)


def offset_weights(block_size: int, gamma: float, loss_offsets: int = 0) -> Array:
    """``w_k = exp(-(k-1)/gamma)`` for offsets ``k = 1..K``, ``K = loss_offsets`` (0: all ``B-1``);
    ``w_0 = 0`` and ``w_k = 0`` past ``K`` (float32 ``[B]``)."""
    k = jnp.arange(block_size, dtype=jnp.float32)
    last = loss_offsets or block_size - 1
    return jnp.where((k >= 1) & (k <= last), jnp.exp(-(k - 1) / gamma), 0.0)


def block_labels(tokens: Array, loss_mask: Array, anchors: Anchors, block_size: int) -> tuple[Array, Array]:
    """Labels ``x_{p+k}`` ``[b, A, B]`` and where they count (offset >= 1, inside the sequence,
    a response token, a real block)."""
    t = tokens.shape[1]
    pos = anchors.positions[:, :, None] + jnp.arange(block_size)  # [b, A, B]
    inside = pos < t
    safe = jnp.minimum(pos, t - 1)
    labels = jnp.take_along_axis(tokens[:, None, :], safe, axis=2)
    supervised = jnp.take_along_axis(loss_mask[:, None, :], safe, axis=2)
    use = inside & supervised & anchors.valid[:, :, None] & (jnp.arange(block_size) >= 1)
    return labels, use


class BlockStats(NamedTuple):
    """Sums over a batch (normalise by ``weight``): all float32. The selector fields are DFlash 2's
    (``selector_loss``) and stay 0 for a DFlash drafter."""

    loss: Array  # scalar: sum of w_k * CE over counted labels
    weight: Array  # scalar: sum of w_k over counted labels
    count: Array  # [B]: counted labels per offset
    correct: Array  # [B]: argmax == label per offset
    prefix: Array  # scalar: sum over real blocks of the number of leading correct offsets
    blocks: Array  # scalar: real blocks
    selector_loss: Array  # scalar: sum of w_k * the selector's k-way CE over counted labels
    selector_correct: Array  # scalar: counted labels where the teacher-forced selector picks the gold token
    covered: Array  # scalar: counted labels whose gold token is among the head's top k

    @classmethod
    def zeros(cls, block_size: int) -> BlockStats:
        """All-zero sums (the start of an accumulation)."""
        z, per_offset = jnp.zeros((), jnp.float32), jnp.zeros((block_size,), jnp.float32)
        return cls(z, z, per_offset, per_offset, z, z, z, z, z)


def target_features(target_params, tokens: Array, *, tcfg: TargetConfig, layer_ids, with_hidden: bool = False):
    """The frozen target's tapped features ``[b, T, len(layer_ids) * d]`` (compute dtype) of
    ``tokens`` ``[b, T]`` at positions ``0..T-1``, no KV cache: what the drafter is conditioned on
    (SPEC "Training"); the training step and ``data.write_features`` both call this. With
    ``with_hidden``: ``(features, hidden)``, ``hidden`` ``[b, T, d]`` the target's last hidden state
    (its LM head gives the next-token logits; the ``kl`` objectives read them)."""
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    hidden, feats, _ = Target(tcfg).apply({"params": target_params}, tokens, positions, None, tuple(layer_ids))
    return (feats, hidden) if with_hidden else feats


def distribution_loss(logits: Array, target_logits: Array, objective: str, tv_weight: float) -> Array:
    """Per position, how far the drafter's distribution ``q = softmax(logits)`` is from the target's
    ``p = softmax(target_logits)`` (both float32 ``[..., V]``): ``kl`` the forward KL(p || q) = sum
    p (log p - log q) (distillation to the target's distribution); ``kl_tv`` ``(1 - tv_weight) KL +
    tv_weight TV`` with TV(p, q) = sum |p - q| / 2, since a sampled draft token is accepted with
    probability 1 - TV (SPEC "Sampling"; the LK losses of SpecForge PR 823 mix the two). No gradient
    reaches ``target_logits``. Returns float32 ``[...]``."""
    logp = jax.nn.log_softmax(jax.lax.stop_gradient(target_logits).astype(jnp.float32), axis=-1)
    logq = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    p = jnp.exp(logp)
    kl = jnp.sum(p * (logp - logq), axis=-1)
    if objective == "kl":
        return kl
    tv = 0.5 * jnp.sum(jnp.abs(p - jnp.exp(logq)), axis=-1)
    return (1.0 - tv_weight) * kl + tv_weight * tv


def context_kv(drafter_params, feats: Array, cfg: DrafterConfig):
    """Per-layer context K/V ``[b, T, KV, D]`` of target features ``[b, T, n_taps * d]`` at 0..T-1."""
    model = Drafter(cfg)
    ctx = model.apply({"params": drafter_params}, feats, method=Drafter.fuse)
    positions = jnp.broadcast_to(jnp.arange(feats.shape[1]), feats.shape[:2])
    return model.apply({"params": drafter_params}, ctx, positions, method=Drafter.context_kv)


def block_logits(
    drafter_params,
    target_params,
    ctx_kv,
    tokens: Array,
    anchors: Anchors,
    *,
    tcfg: TargetConfig,
    cfg: DrafterConfig,
    loss_offsets: int = 0,
    with_hidden: bool = False,
):
    """Draft logits ``[b, A, K, V]`` (float32) at block offsets ``1..K`` of the blocks at ``anchors``
    (``K = loss_offsets``, 0: all ``B-1``; offset 0, the anchor itself, is never predicted, and
    the LM head, most of the cost, runs only where the loss looks); with ``with_hidden``,
    ``(logits, hidden [b, A, K, d])``, the drafter's final hidden states there (DFlash 2's selector
    reads them).

    This is the training forward for a group of blocks; ``block_loss`` calls it per chunk.
    """
    b, a = anchors.positions.shape
    bs, t = cfg.block_size, tokens.shape[1]
    first = jnp.take_along_axis(tokens, anchors.positions, axis=1)  # x_p
    # each block as the draft step builds it, from the tokens up to its anchor (the rest padded away)
    context = None if cfg.block_input == "mask" else jnp.repeat(jnp.pad(tokens, ((0, 0), (0, bs))), a, axis=0)
    block, num, matched = block_inputs(cfg, first.reshape(-1), anchors.positions.reshape(-1), bs, context)
    emb = block_embeddings(block.reshape(b, a * bs), target_params, tcfg, cfg)
    positions = (anchors.positions[:, :, None] + jnp.arange(bs)).reshape(b, a * bs)
    layer_masks = masks_lib.training_masks(cfg.layer_types, cfg.sliding_window, t, anchors.positions, anchors.valid, bs)
    hidden = Drafter(cfg).apply({"params": drafter_params}, emb, positions, ctx_kv, layer_masks, bs)  # blocks of bs
    k = loss_offsets or bs - 1
    hidden = hidden.reshape(b, a, bs, -1)[:, :, 1 : k + 1]
    logits = draft_logits(hidden, target_params, tcfg, cfg)
    logits = copy_prior(logits, drafter_params, cfg, block.reshape(b, a, bs), num.reshape(b, a), matched.reshape(b, a))
    return (logits, hidden) if with_hidden else logits


def selector_loss(
    drafter_params,
    cfg: DrafterConfig,
    hidden: Array,
    logits: Array,
    labels: Array,
    predecessors: Array,
    target_logits: Array | None = None,
) -> tuple[Array, Array, Array]:
    """DFlash 2's selector objective per label (SPEC "DFlash 2", training): the k-way cross-entropy
    of the selector scores over the head's top ``selector_top_k`` candidates, with the gold previous
    token as predecessor (teacher forcing); a gold token outside the top k joins its offset's
    candidate set, for the loss only, as a (k+1)-th candidate scored like the rest.

    With ``target_logits`` (the ``kl`` selector objective): instead the forward KL from the target's
    next-token distribution restricted to the k candidates and renormalised, ``p_c / sum p``, to the
    selector's softmax over them. A sampled draft token is accepted with chance ``sum_c min(p_c,
    q_c)`` (SPEC "Sampling"), at most ``sum_c p_c``, which ``q`` proportional to ``p`` on the
    candidates reaches; its argmax is the target's among the candidates, the greedy draft's goal.

    Args:
      hidden: ``[..., K, d]`` the drafter's final hidden states at offsets 1..K.
      logits: ``[..., K, V]`` float32, the head's logits there (the unary scores).
      labels: int32 ``[..., K]`` the gold tokens; predecessors: int32 ``[..., K]`` the gold token
        before each (the anchor at offset 1).
      target_logits: ``[..., K, V]`` the target's logits of the token at each offset, or None (no
        gradient reaches them).
    Returns:
      ``(loss, picked, covered)``, each ``[..., K]``: the cross-entropy or KL (float32); whether the
      selector's best among the top k is the gold token (bool; its greedy choice with a correct
      prefix); whether the gold token is among the top k (bool).
    """
    unary, candidates = selector_candidates(logits, cfg)  # [..., K, k]
    hit = candidates == labels[..., None]
    covered = hit.any(-1)
    gold_unary = jnp.take_along_axis(logits, labels[..., None], axis=-1)
    scores = selector_scores(
        drafter_params,
        hidden,
        jnp.concatenate([unary, gold_unary], axis=-1),
        jnp.concatenate([candidates, labels[..., None]], axis=-1),
        predecessors,
    )  # [..., K, k + 1]; the last slot only counts when the gold token is not already a candidate
    scores = scores.at[..., -1].set(jnp.where(covered, -jnp.inf, scores[..., -1]))
    gold = jnp.where(covered, jnp.argmax(hit, axis=-1), cfg.selector_top_k)
    ce = jax.nn.logsumexp(scores, axis=-1) - jnp.take_along_axis(scores, gold[..., None], axis=-1)[..., 0]
    picked = covered & (jnp.argmax(scores[..., :-1], axis=-1) == gold)
    if target_logits is not None:
        mine = jax.lax.stop_gradient(target_logits).astype(jnp.float32)
        logp = jax.nn.log_softmax(jnp.take_along_axis(mine, candidates, axis=-1), axis=-1)
        logq = jax.nn.log_softmax(scores[..., :-1], axis=-1)
        p = jnp.exp(logp)
        ce = jnp.sum(jnp.where(p > 0, p * (logp - logq), 0.0), axis=-1)  # a candidate p gives 0 adds 0
    return ce, picked, covered


def block_loss(
    drafter_params,
    target_params,
    tokens: Array,
    loss_mask: Array,
    anchors: Anchors,
    *,
    tcfg: TargetConfig,
    cfg: DrafterConfig,
    gamma: float,
    anchor_chunk: int = LossSettings.anchor_chunk,
    loss_offsets: int = LossSettings.loss_offsets,
    remat: bool = LossSettings.remat,
    feats: Array | None = None,
    selector_stop_grad: bool = LossSettings.selector_stop_grad,
    objective: str = LossSettings.objective,
    tv_weight: float = LossSettings.tv_weight,
    position_weights: str = LossSettings.position_weights,
    selector_objective: str = LossSettings.selector_objective,
) -> BlockStats:
    """Weighted cross-entropy sums and metrics of the drafter on a batch (SPEC "Training").

    Args:
      drafter_params: the drafter's trainable parameters.
      target_params: the frozen target's parameters (features, shared embedding and LM head).
      tokens: int32 ``[b, T]``; loss_mask: bool ``[b, T]`` (response tokens).
      anchors: from ``sample_anchors``; ``A`` must be a multiple of ``anchor_chunk``.
      gamma: loss decay (SPEC: 7 for block size 16).
      anchor_chunk: anchors processed together; bounds activation memory.
      loss_offsets: supervise offsets ``1..loss_offsets`` only (0: all ``B-1``, SPEC); a cheaper
        objective for small budgets (the LM head runs on those offsets only).
      remat: recompute each chunk's drafter and LM-head activations in the backward pass
        (``jax.checkpoint``): activation memory stays at one chunk's. ``False`` keeps them all
        (about ``A x k x V x 4`` bytes of logits per sequence) and skips the recomputation: the same
        loss and gradients, faster when memory allows (15% per step for the SmolLM2 CPU recipe).
      feats: the target's tapped features ``[b, T, n_taps * d]`` of ``tokens`` if already known
        (stored by ``data.write_features``); ``None``: computed here by the frozen target.
      selector_stop_grad: DFlash 2 only: the selector loss trains the selector's own parameters
        only (no gradient into the unary logits and the backbone).
      objective: ``OBJECTIVES``: ``ce`` the cross-entropy with the answer's token at each offset
        (SPEC); ``kl`` / ``kl_tv`` ``distribution_loss`` against the target's next-token
        distribution at the label's position (its LM head on the hidden state one position
        before), weighted alike; ``tv_weight``: ``kl_tv``'s share of TV.
      position_weights: ``POSITION_WEIGHTS``: ``decay`` the fixed ``w_k`` (SPEC); ``reach`` ``w_k``
        times the block's chance of reaching offset ``k``, the product of the drafter's probabilities
        of the answer's tokens at offsets ``1 .. k-1`` (no gradient through it; acceptance-adaptive
        weights in the manner of D-PACE, arXiv 2605.18810): the later offsets count where the
        drafter already gets the earlier ones right. The returned ``weight`` is that weighted
        count (so ``loss / weight`` stays an average), while a trainer normalises the gradient by
        the fixed weights' sum (``train_step``), as for ``decay``.
      selector_objective: DFlash 2, ``SELECTOR_OBJECTIVES``: ``ce`` the answer's token among the
        candidates (SPEC); ``kl`` the target's distribution over them (``selector_loss``; it runs the
        target's LM head, as the ``kl`` objective does).
    Returns:
      ``BlockStats`` of **sums**; the loss to minimise is ``loss / weight`` with the global weight.
    """
    b, t = tokens.shape
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    if position_weights not in POSITION_WEIGHTS:
        raise ValueError(f"position_weights must be one of {POSITION_WEIGHTS}, got {position_weights!r}")
    if selector_objective not in SELECTOR_OBJECTIVES:
        raise ValueError(f"selector_objective must be one of {SELECTOR_OBJECTIVES}, got {selector_objective!r}")
    target_hidden = None
    selector_kl = cfg.dflash2 and selector_objective == "kl"
    if objective != "ce" or selector_kl:
        if feats is not None:
            raise ValueError(
                f"objective {objective!r} / selector_objective {selector_objective!r} needs the target's forward; "
                "stored features do not hold it"
            )
        feats, target_hidden = target_features(
            target_params, tokens, tcfg=tcfg, layer_ids=cfg.target_layer_ids, with_hidden=True
        )
        target_hidden = jax.lax.stop_gradient(target_hidden)
    elif feats is None:
        feats = target_features(target_params, tokens, tcfg=tcfg, layer_ids=cfg.target_layer_ids)
    feats = jax.lax.stop_gradient(feats.astype(tcfg.compute_dtype))  # stored features are float32
    ctx_kv = context_kv(drafter_params, feats, cfg)
    labels, use = block_labels(tokens, loss_mask, anchors, cfg.block_size)
    w = offset_weights(cfg.block_size, gamma, loss_offsets)
    k = loss_offsets or cfg.block_size - 1
    a = anchors.positions.shape[1]
    if a % anchor_chunk:
        raise ValueError(f"num_anchors ({a}) must be a multiple of anchor_chunk ({anchor_chunk})")
    n = a // anchor_chunk

    def split(x):  # [b, A, ...] -> [n, b, chunk, ...]
        return jnp.moveaxis(x.reshape(b, n, anchor_chunk, *x.shape[2:]), 1, 0)

    def chunk(args):
        pos, valid, lab, u = args
        logits, hidden = block_logits(
            drafter_params,
            target_params,
            ctx_kv,
            tokens,
            Anchors(pos, valid),
            tcfg=tcfg,
            cfg=cfg,
            loss_offsets=k,
            with_hidden=True,
        )  # offsets 1..k
        prev, lab, u = lab[..., :k], lab[..., 1 : k + 1], u[..., 1 : k + 1]  # the gold token before each offset
        target_logits = None
        if target_hidden is not None:  # the target's distribution of the token at offset j: its state at pos + j - 1
            before = jnp.minimum(pos[..., None] + jnp.arange(k), t - 1)  # [b, chunk, k]
            h = jax.vmap(lambda hs, idx: hs[idx])(target_hidden, before)  # [b, chunk, k, d]
            target_logits = Target(tcfg).apply({"params": target_params}, h, method="logits")
        if objective == "ce":
            logz = jax.nn.logsumexp(logits, axis=-1)
            ce = logz - jnp.take_along_axis(logits, lab[..., None], axis=-1)[..., 0]
        else:
            ce = distribution_loss(logits, target_logits, objective, tv_weight)
        uf = u.astype(jnp.float32)
        wk = jnp.broadcast_to(w[1 : k + 1], uf.shape)
        if position_weights == "reach":  # the chance of reaching offset j: the earlier labels' probabilities
            logq = jax.nn.log_softmax(jax.lax.stop_gradient(logits).astype(jnp.float32), axis=-1)
            hit = jnp.take_along_axis(logq, lab[..., None], axis=-1)[..., 0]  # log q(label) per offset
            wk = wk * jnp.exp(jnp.cumsum(hit, axis=-1) - hit)  # offsets 1 .. j-1 (offset 1: 1)
        right = (jnp.argmax(logits, -1) == lab) & u
        # leading correct offsets (1..k) of each real block: its acceptance length minus the bonus
        lead = jnp.cumprod(right.astype(jnp.int32), axis=-1).sum(-1)
        pad = (1, cfg.block_size - 1 - k)  # per-offset sums back to [B]: offset 0 and offsets past k are 0
        zero = jnp.zeros((), jnp.float32)
        selector = (zero, zero, zero)
        if cfg.dflash2:
            sg = jax.lax.stop_gradient if selector_stop_grad else (lambda x: x)
            sce, picked, covered = selector_loss(
                drafter_params, cfg, sg(hidden), sg(logits), lab, prev, target_logits if selector_kl else None
            )
            selector = (jnp.sum(jnp.where(u, sce, 0.0) * w[1 : k + 1]), jnp.sum(picked & u), jnp.sum(covered & u))
        return (
            jnp.sum(ce * uf * wk),
            jnp.sum(uf * wk),
            jnp.pad(uf.sum((0, 1)), pad),
            jnp.pad(right.astype(jnp.float32).sum((0, 1)), pad),
            jnp.sum(jnp.where(valid, lead, 0)).astype(jnp.float32),
            valid.sum().astype(jnp.float32),
            *(x.astype(jnp.float32) for x in selector),
        )

    parts = jax.lax.map(
        jax.checkpoint(chunk) if remat else chunk,
        (split(anchors.positions), split(anchors.valid), split(labels), split(use)),
    )
    return BlockStats(*(x.sum(0) for x in parts))


def tau_estimate(count: Array, correct: Array) -> Array:
    """Acceptance length implied by per-offset accuracies: ``1 + sum_k prod_{j<=k} acc_j``
    (independence assumption; offsets 1..B-1, offset 0 ignored)."""
    acc = jnp.where(count[1:] > 0, correct[1:] / jnp.maximum(count[1:], 1), 0.0)
    return 1.0 + jnp.sum(jnp.cumprod(acc))
