"""Drafter attention masks, from segment ids and positions (SPEC "Drafter architecture" 3,
"Training" 4). One rule serves training and decoding, so the two cannot disagree.

Every query and key carries a **segment id** and an absolute **position**:

- context keys (fused target features) have segment ``CONTEXT`` and the position of their token;
- block tokens (queries and keys) have the id of their block (``>= 0``) and position
  ``anchor + offset``; each query also knows its block's **anchor** position;
- padding blocks (training) and the unused tail of a shrunken last block (decoding) have
  segment ``PADDING``: they see nothing and nobody sees them.

A query may see a key iff the query is not padding and

- the key is context at a position **strictly before the query's anchor** (the anchor's own
  target feature does not exist yet at inference time), or
- the key is in the query's own block;

and, in a ``sliding_attention`` layer of window ``W``, additionally ``key_pos <= query_pos``
for block keys (causal) and ``key_pos > query_pos - W`` for all keys. ``full_attention``
layers see their whole block (bidirectional) and all earlier context.
"""

from __future__ import annotations

import jax.numpy as jnp

Array = jnp.ndarray

CONTEXT = -2  # segment id of context (target-feature) keys
PADDING = -1  # segment id of padding queries / keys


def visible(
    q_seg: Array, q_pos: Array, q_anchor: Array, k_seg: Array, k_pos: Array, *, sliding: bool, window: int | None = None
) -> Array:
    """The SPEC visibility rule, elementwise over broadcastable int arrays; True = may attend.

    Args:
      q_seg, q_pos, q_anchor: query segment id, absolute position, and its block's anchor position.
      k_seg, k_pos: key segment id (``CONTEXT``, a block id, or ``PADDING``) and absolute position.
      sliding: the layer is ``sliding_attention`` (causal within the block, windowed); else full.
      window: the sliding window ``W`` (required when ``sliding``).

    Returns:
      bool array of the broadcast shape.
    """
    ctx = (k_seg == CONTEXT) & (k_pos < q_anchor)
    blk = (k_seg == q_seg) & (k_seg >= 0)
    if sliding:
        if window is None:
            raise ValueError("a sliding_attention layer needs its window")
        blk = blk & (k_pos <= q_pos)
        in_window = k_pos > q_pos - window
        ctx, blk = ctx & in_window, blk & in_window
    return (q_seg >= 0) & (ctx | blk)


def layer_masks(layer_types, sliding_window, q_seg, q_pos, q_anchor, k_seg, k_pos) -> list[Array]:
    """``visible`` for every drafter layer (full and sliding layers differ); shapes broadcast."""
    cache: dict[str, Array] = {}
    out = []
    for kind in layer_types:
        if kind not in cache:
            cache[kind] = visible(
                q_seg, q_pos, q_anchor, k_seg, k_pos, sliding=kind == "sliding_attention", window=sliding_window
            )
        out.append(cache[kind])
    return out


def decode_masks(
    layer_types, sliding_window, cache_len: int, start: Array, block_len: int, block_valid: Array
) -> list[Array]:
    """Per-layer masks ``[B, T, S + T]`` for drafting one block at ``start`` (int32 ``[B]``) over a
    context cache of ``S = cache_len`` slots (slot = absolute position).

    Keys are the ``S`` cache slots (context; slots ``>= start`` are stale and hidden by the rule),
    then the block's ``T = block_len`` tokens; block offsets ``>= block_valid`` (the part of the
    last block past the length limit, ``[B]``) are padding.
    """
    k = jnp.arange(block_len)
    q_pos = start[:, None] + k  # [B, T]
    q_seg = jnp.zeros_like(q_pos)
    blk_seg = jnp.where(k[None, :] < block_valid[:, None], 0, PADDING)  # [B, T]
    k_seg = jnp.concatenate([jnp.full((start.shape[0], cache_len), CONTEXT), blk_seg], axis=1)
    k_pos = jnp.concatenate([jnp.broadcast_to(jnp.arange(cache_len), (start.shape[0], cache_len)), q_pos], axis=1)
    return layer_masks(
        layer_types,
        sliding_window,
        q_seg[:, :, None],
        q_pos[:, :, None],
        start[:, None, None],
        k_seg[:, None, :],
        k_pos[:, None, :],
    )


def training_masks(
    layer_types, sliding_window, seq_len: int, anchors: Array, valid: Array, block_size: int
) -> list[Array]:
    """Per-layer masks ``[b, N, T + N]`` for a group of blocks trained together, ``N = A * block_size``.

    Queries are the ``A`` blocks' tokens (block-major); keys are the ``T = seq_len`` context
    positions of the sequence, then the same block tokens. ``anchors`` int32 ``[b, A]``, ``valid``
    bool ``[b, A]`` (False = padding block). The trainer calls this on a chunk of anchors at a
    time, so memory grows linearly with the number of anchors.
    """
    b, a = anchors.shape
    offsets = jnp.arange(block_size)
    ids = jnp.broadcast_to(jnp.arange(a), (b, a))
    seg = jnp.where(valid, ids, PADDING)[:, :, None].repeat(block_size, 2).reshape(b, a * block_size)
    pos = (anchors[:, :, None] + offsets).reshape(b, a * block_size)
    anchor = anchors[:, :, None].repeat(block_size, 2).reshape(b, a * block_size)
    k_seg = jnp.concatenate([jnp.full((b, seq_len), CONTEXT), seg], axis=1)
    k_pos = jnp.concatenate([jnp.broadcast_to(jnp.arange(seq_len), (b, seq_len)), pos], axis=1)
    return layer_masks(
        layer_types,
        sliding_window,
        seg[:, :, None],
        pos[:, :, None],
        anchor[:, :, None],
        k_seg[:, None, :],
        k_pos[:, None, :],
    )
