"""The DFlash drafter (SPEC "Drafter architecture"), in Flax linen.

Context features (the target's tapped layer outputs, concatenated) are fused by
``fc`` + ``hidden_norm`` into one vector per target position; every drafter layer
projects them with **its own** ``k_proj`` / ``v_proj`` (plus ``k_norm`` and RoPE at
their absolute positions) and appends them in front of the block's keys and values
("KV injection"). Queries come from the block only. In a ``full_attention`` layer the
block sees itself bidirectionally; in a ``sliding_attention`` layer causally and
within the window. The block's input is the **target's** embedding of
``[anchor, MASK, ..., MASK]`` (times ``input_embedding_scale``); its output goes
through the final norm and the **target's** LM head. Embedding and head are passed
in, never copied into the drafter's parameters.

Masks are passed in explicitly (``[B, T, S_ctx + T]`` booleans) so that decoding and
training share every line of the layer code and differ only in the mask they build.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from dflash_jax import masks
from dflash_jax.errors import ConfigError
from dflash_jax.layers import RMSNorm, SwiGLU, apply_rope, attend, param, rope_inv_freq
from dflash_jax.ngram import ngram_match
from dflash_jax.sampling import probs
from dflash_jax.steps import Draft, all_real, sampled
from dflash_jax.target import Target, TargetConfig, write_block
from dflash_jax.tree import Tree, build_tree, build_tree_with

Array = jax.Array


def default_target_layer_ids(num_target_layers: int, num_drafter_layers: int) -> tuple[int, ...]:
    """SPEC default: ``[L_t // 2]`` for one layer, else ``round(1 + i * (L_t - 4) / (L_d - 1))``.

    Python's ``round`` (halves to even), as the reference: 35 target and 3 drafter layers
    give ``(1, 16, 32)``.
    """
    if num_drafter_layers == 1:
        return (num_target_layers // 2,)
    span = num_target_layers - 4
    return tuple(round(1 + i * span / (num_drafter_layers - 1)) for i in range(num_drafter_layers))


BLOCK_INPUTS = ("mask", "ngram")


@dataclasses.dataclass(frozen=True)
class DrafterConfig:
    """Static description of a drafter (hashable). Field names follow the released ``config.json``
    (``dflash_format`` reads and writes it)."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    num_target_layers: int
    target_layer_ids: tuple[int, ...]
    block_size: int = 16
    mask_token_id: int = 0
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1e6
    rope_scaling: tuple[tuple[str, float], ...] | None = None
    layer_types: tuple[str, ...] = ()
    sliding_window: int | None = None
    attention_bias: bool = False
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None
    max_position_embeddings: int = 40960
    dtype: str = "float32"
    # What fills a block after its anchor (a dflash-jax extension, ``block_tokens``): "mask" (DFlash:
    # mask tokens) or "ngram" (the prompt-lookup continuation of the committed tokens, n-gram
    # lengths ngram_max .. ngram_min, mask tokens where it ends)
    block_input: str = "mask"
    ngram_max: int = 4
    ngram_min: int = 1
    # With "ngram": a continuation that reaches the anchor goes on with the match's period (a loop
    # continued; ``ngram.ngram_matches``' ``periodic``) instead of mask tokens after it
    ngram_periodic: bool = False
    # With "ngram": a learned logit bonus for the token the block input holds at each offset, one
    # per matched n-gram length and offset, all starting at this value (``copy_prior``); None: none
    copy_bias: float | None = None
    # DFlash 2 (SPEC "DFlash 2"; dflash==0.1.0's DFlash2DraftModel): grouped dynamic causal
    # convolutions of this kernel size around each sublayer (0: DFlash, none) over channel groups of
    # conv_group_size, and a candidate selector of rank selector_rank over the head's top
    # selector_top_k tokens per offset
    conv_kernel_size: int = 0
    conv_group_size: int = 16
    selector_rank: int = 0
    selector_top_k: int = 16
    # A greedy draft tree's scores (``DraftStep.tree``) are the drafter's log-probabilities at this
    # temperature (a dflash-jax read-time setting, tuned per drafter on held-out answers: a drafter
    # over-confident deep in its block wants > 1, so its tree holds more second choices near the
    # anchor). Trees only: the chain (an argmax) and sampled drafts never read it. A tree's node probabilities
    # (its verify-width choice and calibration, ``decode``) are then the tempered ones, which the calibration
    # corrects online.
    tree_temperature: float = 1.0

    def __post_init__(self):
        if self.block_input not in BLOCK_INPUTS:
            raise ConfigError(f"block_input {self.block_input!r} is not one of {', '.join(BLOCK_INPUTS)}")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ConfigError(f"need 1 <= ngram_min <= ngram_max, got {self.ngram_min} and {self.ngram_max}")
        if self.ngram_periodic and self.block_input != "ngram":
            raise ConfigError(
                'ngram_periodic continues the n-gram block input: set block_input="ngram" or leave it off'
            )
        if self.copy_bias is not None and self.block_input != "ngram":
            raise ConfigError(
                'copy_bias rewards copying the n-gram block input: set block_input="ngram" or copy_bias None'
            )
        if self.dflash2:
            if self.conv_group_size < 1 or self.hidden_size % self.conv_group_size:
                raise ConfigError(
                    f"conv_group_size {self.conv_group_size} must divide hidden_size {self.hidden_size} (DFlash 2)"
                )
            if self.selector_rank < 1 or not 1 <= self.selector_top_k <= self.vocab_size:
                raise ConfigError(
                    f"DFlash 2 needs selector_rank >= 1 and 1 <= selector_top_k <= vocab_size, got "
                    f"{self.selector_rank} and {self.selector_top_k}"
                )
        elif self.conv_kernel_size < 0:
            raise ConfigError(f"conv_kernel_size must be >= 0 (0: DFlash), got {self.conv_kernel_size}")
        if not self.layer_types:
            object.__setattr__(self, "layer_types", ("full_attention",) * self.num_layers)
        if len(self.layer_types) != self.num_layers:
            raise ConfigError(f"layer_types has {len(self.layer_types)} entries for {self.num_layers} drafter layers")
        bad = set(self.layer_types) - {"full_attention", "sliding_attention"}
        if bad:
            raise ConfigError(f"unknown layer_types {sorted(bad)}; expected full_attention or sliding_attention")
        if "sliding_attention" in self.layer_types and not self.sliding_window:
            raise ConfigError("sliding_attention layers need a positive sliding_window")
        if self.block_size < 2:
            raise ConfigError(f"block_size must be >= 2, got {self.block_size}")
        t = self.tree_temperature
        if isinstance(t, bool) or not (isinstance(t, (int, float)) and 0 < t < float("inf")):
            raise ConfigError(f"tree_temperature must be a positive number, got {self.tree_temperature!r}")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ConfigError(f"mask_token_id {self.mask_token_id} outside the vocabulary [0, {self.vocab_size})")
        if not self.target_layer_ids or any(not 0 <= i < self.num_target_layers for i in self.target_layer_ids):
            raise ConfigError(
                f"target_layer_ids {list(self.target_layer_ids)} must be non-empty and in [0, {self.num_target_layers})"
            )
        if self.num_target_layers - 1 in self.target_layer_ids:
            warnings.warn(
                f"target_layer_ids taps the last target layer ({self.num_target_layers - 1}); dflash-jax feeds its raw "
                "output (SPEC), but dflash==0.1.0 reads Hugging Face hidden_states[L], which is after the final "
                "norm, so this drafter will not behave the same there; the default ids never tap it",
                stacklevel=2,
            )

    @property
    def dflash2(self) -> bool:
        """A DFlash 2 drafter (convolutions and a candidate selector; SPEC "DFlash 2")."""
        return self.conv_kernel_size > 0

    @property
    def compute_dtype(self):
        return jnp.dtype(self.dtype)

    @classmethod
    def for_target(
        cls, target: TargetConfig, num_layers: int, block_size: int, mask_token_id: int, **kw
    ) -> DrafterConfig:
        """A drafter shaped like ``target`` (its heads, head_dim, MLP width and RoPE), ``num_layers`` deep."""
        ids = kw.pop("target_layer_ids", None) or default_target_layer_ids(target.num_layers, num_layers)
        base = dict(
            hidden_size=target.hidden_size,
            intermediate_size=target.intermediate_size,
            num_layers=num_layers,
            num_heads=target.num_heads,
            num_kv_heads=target.num_kv_heads,
            head_dim=target.head_dim,
            vocab_size=target.vocab_size,
            num_target_layers=target.num_layers,
            target_layer_ids=tuple(ids),
            block_size=block_size,
            mask_token_id=mask_token_id,
            rms_norm_eps=target.rms_norm_eps,
            rope_theta=target.rope_theta,
            rope_scaling=target.rope_scaling,
            max_position_embeddings=target.max_position_embeddings,
        )
        base.update(kw)
        return cls(**base)


def block_tokens(cfg: DrafterConfig, anchor: Array, start: Array, block_len: int, tokens: Array | None) -> Array:
    """``block_inputs`` without the match: the drafter's input block int32 ``[B, block_len]``."""
    return block_inputs(cfg, anchor, start, block_len, tokens)[0]


def block_inputs(
    cfg: DrafterConfig, anchor: Array, start: Array, block_len: int, tokens: Array | None
) -> tuple[Array, Array, Array]:
    """The drafter's input block int32 ``[B, block_len]``: the anchor, then mask tokens (DFlash, SPEC
    "Drafting"); with ``cfg.block_input == "ngram"`` offsets ``1 .. num`` hold the prompt-lookup
    continuation of each row's committed tokens (``ngram.ngram_propose`` over ``tokens[b, :start[b]+1]``,
    the rule of SPEC "N-gram (prompt-lookup) drafting"; with ``cfg.ngram_periodic`` continued past the
    anchor with the match's period, ``ngram.ngram_matches``) and mask tokens follow it.

    Args:
      anchor: int32 ``[B]`` the last committed token of each row (at position ``start``).
      start: int32 ``[B]`` its position.
      tokens: int32 ``[B, L]`` tokens by absolute position, ``L > start + block_len - 1`` (the
        decoding loop's buffer; in training the sequence, padded); read only for "ngram".
    The training forward (``loss.block_logits``) and the draft step (``DraftStep``) both build
    their blocks here, so a drafter sees at decoding exactly the inputs it was trained on.

    Returns:
      ``(block, num, matched)``: the block, int32 ``[B]`` how many offsets after the anchor hold
      proposed tokens, and int32 ``[B]`` the length of the n-gram that matched (0: none; both 0
      for "mask").
    """
    block = jnp.full((anchor.shape[0], block_len), cfg.mask_token_id, jnp.int32).at[:, 0].set(anchor)
    num = matched = jnp.zeros_like(anchor)
    if cfg.block_input == "ngram":
        draft, num, matched = ngram_match(
            tokens, start, block_len - 1, cfg.ngram_max, cfg.ngram_min, periodic=cfg.ngram_periodic
        )
        proposed = jnp.where(jnp.arange(block_len - 1) < num[:, None], draft, cfg.mask_token_id)
        block = block.at[:, 1:].set(proposed)
    return block, num, matched


def copy_prior(logits: Array, params, cfg: DrafterConfig, block: Array, num: Array, matched: Array) -> Array:
    """``logits [..., K, V]`` (offsets ``1 .. K`` of blocks ``block [..., >= K + 1]``) plus, where
    offset ``k <= num`` holds a proposed n-gram token, the learned bonus ``copy_bias[matched - 1,
    k - 1]`` on that token's logit; unchanged when ``cfg.copy_bias`` is None (a dflash-jax
    extension: the drafter starts out trusting prompt lookup as far as the bonus says and learns
    per matched length and offset how far to). ``num``, ``matched``: int ``[...]`` (``block_inputs``)."""
    if cfg.copy_bias is None:
        return logits
    k = logits.shape[-2]
    bonus, proposed = copy_bonus(params, num, matched, k)
    hit = jnp.arange(logits.shape[-1]) == block[..., 1 : k + 1, None]
    return logits + jnp.where(hit, jnp.where(proposed, bonus, 0.0)[..., None], 0.0).astype(logits.dtype)


def grow_copy_bias(table, ngram_max: int, value) -> np.ndarray:
    """A copy-bias table ``[n, block_size - 1]`` (``copy_bonus``) for matches up to ``ngram_max >= n``
    tokens: its rows as they are, then a row per longer match length, each ``value`` (logits: a number
    for every entry, as a training run's ``init_from`` passes ``drafter.copy_bias``, the value a table
    it lacks starts at; or one row ``[block_size - 1]`` each added row copies). float32
    ``[ngram_max, block_size - 1]``.

    Raises:
      ConfigError: ``ngram_max`` below the table's rows.
    """
    table = np.asarray(table, np.float32)
    if ngram_max < table.shape[0]:
        raise ConfigError(
            f"the copy-bias table has {table.shape[0]} rows (matched lengths); ngram_max {ngram_max} drops some"
        )
    extra = np.full((ngram_max - table.shape[0], table.shape[1]), value, np.float32)
    return np.concatenate([table, extra])


def copy_bonus(params, num: Array, matched: Array, k: int) -> tuple[Array, Array]:
    """The copy bias's bonus at offsets ``1 .. k``, ``copy_bias[matched - 1, offset - 1]`` float32
    ``[..., k]``, and where it applies, bool ``[..., k]`` (offsets ``<= num``, those holding a
    proposed n-gram token); ``num``, ``matched``: int ``[...]`` (``block_inputs``)."""
    offsets = jnp.arange(k)
    bonus = params["copy_bias"][jnp.maximum(matched - 1, 0)[..., None], offsets]  # table [ngram_max, block_size - 1]
    return bonus, offsets < num[..., None]


class DrafterAttention(nn.Module):
    """Attention with K/V injection: keys/values = ``[ctx (projected here); block]``."""

    cfg: DrafterConfig

    def setup(self):
        c = self.cfg
        d, h, kv, hd = c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim
        self.q_proj = param(self, "q_proj", (d, h * hd), ("embed", "heads"))
        self.k_proj = param(self, "k_proj", (d, kv * hd), ("embed", "kv_heads"))
        self.v_proj = param(self, "v_proj", (d, kv * hd), ("embed", "kv_heads"))
        self.o_proj = param(self, "o_proj", (h * hd, d), ("heads", "embed"))
        if c.attention_bias:
            zeros = nn.initializers.zeros
            self.q_bias = param(self, "q_bias", (h * hd,), ("heads",), zeros)
            self.k_bias = param(self, "k_bias", (kv * hd,), ("kv_heads",), zeros)
            self.v_bias = param(self, "v_bias", (kv * hd,), ("kv_heads",), zeros)
            self.o_bias = param(self, "o_bias", (d,), ("embed",), zeros)
        self.q_norm = RMSNorm(c.rms_norm_eps, "head_dim")
        self.k_norm = RMSNorm(c.rms_norm_eps, "head_dim")
        self.inv_freq = rope_inv_freq(c.head_dim, c.rope_theta, dict(c.rope_scaling) if c.rope_scaling else None)

    def _proj(self, x, name, heads):
        dt = self.cfg.compute_dtype
        out = x.astype(dt) @ getattr(self, f"{name}_proj").astype(dt)
        if self.cfg.attention_bias:
            out = out + getattr(self, f"{name}_bias").astype(dt)
        return out.reshape(*x.shape[:-1], heads, self.cfg.head_dim)

    def kv(self, x: Array, positions: Array) -> tuple[Array, Array]:
        """Keys (k_norm, RoPE) and values of ``x`` ``[B, S, d]`` at ``positions`` ``[B, S]``."""
        k = apply_rope(self.k_norm(self._proj(x, "k", self.cfg.num_kv_heads)), positions, self.inv_freq)
        return k, self._proj(x, "v", self.cfg.num_kv_heads)

    def __call__(self, x: Array, positions: Array, ctx_kv: tuple[Array, Array], mask: Array) -> Array:
        c, dt = self.cfg, self.cfg.compute_dtype
        q = apply_rope(self.q_norm(self._proj(x, "q", c.num_heads)), positions, self.inv_freq)
        k, v = self.kv(x, positions)
        keys = jnp.concatenate([ctx_kv[0].astype(dt), k], axis=1)
        values = jnp.concatenate([ctx_kv[1].astype(dt), v], axis=1)
        out = attend(q, keys, values, mask).reshape(*x.shape[:2], c.num_heads * c.head_dim)
        out = out @ self.o_proj.astype(dt)
        return out + self.o_bias.astype(dt) if c.attention_bias else out


def _identity_taps(key, shape, dtype=jnp.float32):
    """``base_kernel [2, K, d]`` of a convolution that passes its input through: tap 0 = 1."""
    return jnp.zeros(shape, dtype).at[:, 0].set(1.0)


class GroupedCausalConv(nn.Module):
    """DFlash 2's grouped dynamic depthwise causal convolution around a sublayer (SPEC "DFlash 2" 1).

    ``out[i, c] = sum_{t < K} (base[t, c] + dyn[i, t, g(c)]) * x[i - t, c]``, ``x`` zero before the
    first position of each block of ``block_len`` positions (no tap crosses a block boundary).
    ``prepare(x)`` convolves the sublayer's (normed) input with ``base_kernel[0]`` and the first
    half of ``kernel_projection(x)``, and returns the second half for ``finish``, which convolves
    the sublayer's output with ``base_kernel[1]``. Starts as the identity (tap 0 = 1, projection 0).
    """

    cfg: DrafterConfig

    def setup(self):
        c = self.cfg
        k, groups = c.conv_kernel_size, c.hidden_size // c.conv_group_size
        self.base_kernel = param(self, "base_kernel", (2, k, c.hidden_size), (None, None, "norm"), _identity_taps)
        zeros = nn.initializers.zeros
        self.kernel_projection = param(
            self, "kernel_projection", (c.hidden_size, 2 * k * groups), ("embed", None), zeros
        )

    def _convolve(self, x: Array, dyn: Array, base: Array, block_len: int) -> Array:
        """``x [B, T, d]``, ``dyn [B, T, K, groups]``, ``base [K, d]``; T a multiple of ``block_len``."""
        c = self.cfg
        b, t, d = x.shape
        groups, gs = d // c.conv_group_size, c.conv_group_size
        xb = x.reshape(b, t // block_len, block_len, groups, gs)
        dyn = dyn.reshape(b, t // block_len, block_len, c.conv_kernel_size, groups, 1)
        out = jnp.zeros_like(xb)
        for tap in range(c.conv_kernel_size):
            shifted = xb if tap == 0 else jnp.pad(xb[:, :, :-tap], ((0, 0), (0, 0), (tap, 0), (0, 0), (0, 0)))
            out = out + (base[tap].reshape(groups, gs).astype(x.dtype) + dyn[:, :, :, tap].astype(x.dtype)) * shifted
        return out.reshape(b, t, d)

    def prepare(self, x: Array, block_len: int) -> tuple[Array, Array]:
        c = self.cfg
        groups = c.hidden_size // c.conv_group_size
        dyn = (x @ self.kernel_projection.astype(x.dtype)).reshape(*x.shape[:2], 2, c.conv_kernel_size, groups)
        return self._convolve(x, dyn[:, :, 0], self.base_kernel[0], block_len), dyn[:, :, 1]

    def finish(self, x: Array, dyn: Array, block_len: int) -> Array:
        return self._convolve(x, dyn, self.base_kernel[1], block_len)


class DrafterLayer(nn.Module):
    cfg: DrafterConfig

    def setup(self):
        c = self.cfg
        self.self_attn = DrafterAttention(c)
        self.mlp = SwiGLU(c.hidden_size, c.intermediate_size, c.compute_dtype)
        self.input_layernorm = RMSNorm(c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.rms_norm_eps)
        if c.dflash2:
            self.attention_conv = GroupedCausalConv(c)
            self.mlp_conv = GroupedCausalConv(c)

    def context_kv(self, ctx: Array, positions: Array):
        """K/V of the fused context (not passed through this layer's input norm: SPEC 3)."""
        return self.self_attn.kv(ctx, positions)

    def __call__(self, h, positions, ctx_kv, mask, block_len: int | None = None):
        """``block_len``: positions per block in ``h [B, T, d]`` (DFlash 2's convolutions stay
        inside a block; default ``T``, one block)."""
        bl = block_len or h.shape[1]
        x = self.input_layernorm(h)
        if self.cfg.dflash2:
            x, dyn = self.attention_conv.prepare(x, bl)
            h = h + self.attention_conv.finish(self.self_attn(x, positions, ctx_kv, mask), dyn, bl)
            x, dyn = self.mlp_conv.prepare(self.post_attention_layernorm(h), bl)
            return h + self.mlp_conv.finish(self.mlp(x), dyn, bl)
        h = h + self.self_attn(x, positions, ctx_kv, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class Drafter(nn.Module):
    """The drafter. Methods (all pure given the parameter pytree):

    - ``fuse(feats)``: ``[B, S, n_taps * d]`` target features -> ``[B, S, d]`` (``fc`` then ``hidden_norm``).
    - ``context_kv(ctx, positions)``: per-layer ``(k, v)`` ``[B, S, KV, D]`` of fused context.
    - ``__call__(block_emb, positions, ctx_kv, masks)``: block hidden states after the final norm,
      ``[B, T, d]``; ``masks`` is one bool ``[B, T, S + T]`` per layer (True = visible).
    """

    cfg: DrafterConfig

    def setup(self):
        c = self.cfg
        n_in = len(c.target_layer_ids) * c.hidden_size
        self.fc = param(self, "fc", (n_in, c.hidden_size), ("taps", "embed"))
        self.hidden_norm = RMSNorm(c.rms_norm_eps)
        self.layers = [DrafterLayer(c, name=f"layers_{i}") for i in range(c.num_layers)]
        self.norm = RMSNorm(c.rms_norm_eps)
        if c.dflash2:  # the candidate selector's parameters (``select``)
            r = c.selector_rank
            self.predecessor_codebook = param(self, "predecessor_codebook", (c.vocab_size, r), ("vocab", None))
            self.successor_codebook = param(self, "successor_codebook", (c.vocab_size, r), ("vocab", None))
            self.hidden_projection = param(self, "hidden_projection", (c.hidden_size, r), ("embed", None))
        if c.copy_bias is not None:
            init = nn.initializers.constant(c.copy_bias)
            self.copy_bias = param(self, "copy_bias", (c.ngram_max, c.block_size - 1), (None, None), init)

    def fuse(self, feats: Array) -> Array:
        dt = self.cfg.compute_dtype
        return self.hidden_norm(feats.astype(dt) @ self.fc.astype(dt))

    def context_kv(self, ctx: Array, positions: Array):
        return [layer.context_kv(ctx, positions) for layer in self.layers]

    def __call__(
        self,
        block_emb: Array,
        positions: Array,
        ctx_kv: Sequence,
        masks: Sequence[Array],
        block_len: int | None = None,
    ) -> Array:
        h = block_emb.astype(self.cfg.compute_dtype)
        for layer, kv, mask in zip(self.layers, ctx_kv, masks):
            h = layer(h, positions, kv, mask, block_len)
        return self.norm(h)

    def init_all(self, feats, block_emb, positions):
        """Touch every parameter (for ``init``)."""
        ctx = self.fuse(feats)
        kv = self.context_kv(ctx, positions[:, :1].repeat(feats.shape[1], 1))
        t, s = block_emb.shape[1], feats.shape[1]
        masks = [jnp.ones((block_emb.shape[0], t, s + t), bool)] * self.cfg.num_layers
        out = [self(block_emb, positions, kv, masks)]
        if self.cfg.dflash2:
            out += [self.predecessor_codebook, self.successor_codebook, self.hidden_projection]
        if self.cfg.copy_bias is not None:
            out.append(self.copy_bias)
        return out


def _variables(cfg: DrafterConfig, seed: int = 0):
    """The one trace of ``Drafter.init`` (boxed variables with logical axis names)."""
    n = len(cfg.target_layer_ids) * cfg.hidden_size
    feats = jnp.zeros((1, 2, n), jnp.float32)
    emb = jnp.zeros((1, cfg.block_size, cfg.hidden_size), jnp.float32)
    pos = jnp.zeros((1, cfg.block_size), jnp.int32)
    return Drafter(cfg).init(jax.random.PRNGKey(seed), feats, emb, pos, method=Drafter.init_all)


def init_drafter_params(cfg: DrafterConfig, seed: int = 0):
    """Random drafter parameters (plain pytree, float32)."""
    return nn.meta.unbox(_variables(cfg, seed))["params"]


def drafter_param_shapes(cfg: DrafterConfig):
    """``jax.ShapeDtypeStruct`` pytree of ``init_drafter_params(cfg)`` (traced; nothing is computed)."""
    return jax.eval_shape(lambda: init_drafter_params(cfg))


def drafter_logical_specs(cfg: DrafterConfig):
    """Pytree of logical ``PartitionSpec`` matching ``init_drafter_params(cfg)`` (for ``sharding``)."""
    return nn.get_partition_spec(jax.eval_shape(lambda: _variables(cfg)))["params"]


def draft_logits(hidden: Array, target_params, target_cfg: TargetConfig, cfg: DrafterConfig) -> Array:
    """Target LM head on drafter outputs, then ``output_multiplier`` and the optional tanh soft-cap (float32)."""
    return _scale_logits(Target(target_cfg).apply({"params": target_params}, hidden, method="head"), cfg)


def _scale_logits(logits: Array, cfg: DrafterConfig) -> Array:
    logits = logits * cfg.output_multiplier
    if cfg.final_logit_softcapping:
        cap = cfg.final_logit_softcapping
        logits = jnp.tanh(logits / cap) * cap
    return logits


# --- a draft vocabulary (inference only) ------------------------------------------------------
#
# On a CPU the target's LM head over the whole vocabulary is most of a small drafter's forward
# (docs/JOURNAL.md, "Where a DFlash 2 round's time goes"). A draft vocabulary is a list of the
# N tokens the drafter may propose (the most frequent answer tokens, ``draft_vocab.json`` in its
# folder; EAGLE-3's idea): the head then runs over those N columns only, plus, for a drafter with
# a copy bias, each offset's prompt-lookup token whatever the list. The verify is unchanged, so
# decoding stays exact: a token outside the list is simply never drafted, and under sampling q is
# the distribution actually drawn from (0 outside the list).

DRAFT_VOCAB = "draft_vocab"  # the key of the draft vocabulary in a DraftStep's parameters


def head_columns(target_params, target_cfg: TargetConfig, tokens: Array) -> Array:
    """The target LM head's columns for ``tokens`` (int ``[...]``): ``[..., d]`` in the parameters' dtype
    (the embedding's rows when the head is tied to it, as ``Target.logits`` reads it)."""
    if target_cfg.tie_word_embeddings:
        return jnp.take(target_params["embedding"], tokens, axis=0)
    return jnp.moveaxis(jnp.take(target_params["lm_head"], tokens, axis=1), 0, -1)


def with_draft_vocab(params, ids, target_params, target_cfg: TargetConfig):
    """Drafter parameters plus a draft vocabulary: ``{**params, "draft_vocab": {"ids": int32 [N],
    "head": [d, N]}}``, the head's columns for ``ids`` gathered once here (not every round).

    Args:
      ids: the N token ids the drafter may propose (``read_draft_vocab``), distinct, in
        ``[0, vocab_size)``; their order does not matter.

    Raises:
      ValueError: ``ids`` empty, not 1-D, repeated or out of range.
    """
    ids = jnp.asarray(check_draft_vocab(ids, target_cfg.vocab_size))
    return {**params, DRAFT_VOCAB: {"ids": ids, "head": head_columns(target_params, target_cfg, ids).T}}


def check_draft_vocab(ids, vocab_size: int | None) -> np.ndarray:
    """``ids`` as int32 ``[N]`` if they make a draft vocabulary: a non-empty 1-D list of distinct
    integers in ``[0, vocab_size)`` (no upper bound when ``vocab_size`` is None).

    Raises:
      ValueError: naming what is wrong.
    """
    ids = np.asarray(ids)
    if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(
            f"a draft vocabulary is a non-empty list of distinct token ids; got shape {ids.shape} {ids.dtype}"
        )
    if ids.min() < 0 or (vocab_size is not None and ids.max() >= vocab_size):
        raise ValueError(
            f"a draft vocabulary is distinct token ids that lie in [0, {vocab_size}); got {ids.min()}..{ids.max()}"
        )
    if np.unique(ids).size != ids.size:
        raise ValueError("a draft vocabulary is distinct token ids; these repeat")
    return ids.astype(np.int32)


def _model_params(params):
    """The drafter's own parameters (without a ``draft_vocab``), as ``Drafter.apply`` takes them."""
    return {k: v for k, v in params.items() if k != DRAFT_VOCAB}


class DraftScores(NamedTuple):
    """A draft step's logits over the tokens it may propose, and which token each column is.

    Without a draft vocabulary ``logits [B, K, V]`` and column j is token j (``ids`` and ``copy``
    None). With one of N tokens, column j < N is token ``ids[j]``; with a copy bias there is one more
    column, each offset's prompt-lookup token (``copy [B, K]``, -inf where the offset has none),
    and that token's column among the first N is -inf, so no token is scored twice.
    """

    logits: Array  # float32 [B, K, M]
    ids: Array | None = None  # int32 [N]
    copy: Array | None = None  # int32 [B, K]

    def tokens(self, index: Array) -> Array:
        """Token ids int32 of column indices ``index [B, K, ...]``."""
        index = index.astype(jnp.int32)
        if self.ids is None:
            return index
        n = self.ids.shape[0]
        tok = jnp.take(self.ids, jnp.minimum(index, n - 1))
        if self.copy is None:
            return tok
        copy = self.copy.reshape(self.copy.shape + (1,) * (index.ndim - self.copy.ndim))
        return jnp.where(index == n, copy, tok)

    def dense(self, vocab_size: int) -> Array:
        """The logits on the whole vocabulary ``[B, K, vocab_size]``, -inf on tokens never proposed."""
        if self.ids is None:
            return self.logits
        n = self.ids.shape[0]
        full = jnp.full((*self.logits.shape[:-1], vocab_size), -jnp.inf, jnp.float32)
        full = full.at[..., self.ids].set(self.logits[..., :n])
        if self.copy is None:
            return full
        b, k = jnp.indices(self.copy.shape)
        return full.at[b, k, self.copy].max(self.logits[..., n])


def draft_scores(
    hidden: Array, params, target_params, target_cfg: TargetConfig, cfg: DrafterConfig, block, num, matched
) -> DraftScores:
    """The draft step's ``DraftScores`` at offsets ``1 .. K`` (``hidden [B, K, d]``): the target's head
    and ``copy_prior`` over the whole vocabulary, or, when ``params`` hold a ``draft_vocab``
    (``with_draft_vocab``), over its N tokens and the copy column (the copy bonus exactly as
    ``copy_prior`` adds it). ``block``, ``num``, ``matched``: ``block_inputs``' outputs."""
    vocab = params.get(DRAFT_VOCAB)
    if vocab is None:
        logits = draft_logits(hidden, target_params, target_cfg, cfg)
        return DraftScores(copy_prior(logits, params, cfg, block, num, matched))
    dt = target_cfg.compute_dtype  # as ``Target.head`` runs over the whole vocabulary
    head = jnp.asarray(vocab["head"]).astype(dt)
    sub = _scale_logits(jnp.matmul(hidden.astype(dt), head, preferred_element_type=jnp.float32), cfg)
    if cfg.copy_bias is None:
        return DraftScores(sub, vocab["ids"])
    k = hidden.shape[-2]
    copy = block[..., 1 : k + 1]  # [B, K]: the proposed token where offset < num, else the mask token
    w = head_columns(target_params, target_cfg, copy).astype(dt)  # [B, K, d]
    own = _scale_logits(jnp.einsum("bkd,bkd->bk", hidden.astype(dt), w, preferred_element_type=jnp.float32), cfg)
    bonus, has = copy_bonus(params, num, matched, k)  # [B, K] each
    sub = jnp.where(has[..., None] & (vocab["ids"] == copy[..., None]), -jnp.inf, sub)
    column = jnp.where(has, own + bonus, -jnp.inf)
    return DraftScores(jnp.concatenate([sub, column[..., None]], axis=-1), vocab["ids"], copy)


def block_embeddings(tokens: Array, target_params, target_cfg: TargetConfig, cfg: DrafterConfig) -> Array:
    """Target embeddings of the block tokens times ``input_embedding_scale``."""
    return Target(target_cfg).apply({"params": target_params}, tokens, method="embed") * cfg.input_embedding_scale


def selector_candidates(logits: Array, cfg: DrafterConfig) -> tuple[Array, Array]:
    """DFlash 2's candidates: the unary scores and tokens of the head's top ``selector_top_k`` per
    offset, ``([..., K, k] float32, [..., K, k] int32)`` from ``logits [..., K, V]`` (SPEC "DFlash 2" 2;
    ``k = min(selector_top_k, V)``: a draft vocabulary may hold fewer tokens than ``selector_top_k``)."""
    k = min(cfg.selector_top_k, logits.shape[-1])
    unary, candidates = jax.lax.top_k(logits.astype(jnp.float32), k)
    return unary, candidates.astype(jnp.int32)


def selector_scores(params, hidden: Array, unary: Array, candidates: Array, predecessors: Array) -> Array:
    """Candidate scores ``unary_j(b) + <A(a_j) * H(h_j), B(b)>`` ``[..., K, k]`` (float32) given each
    offset's predecessor ``a_j`` (``predecessors [..., K]``: the anchor at offset 1, then the token
    before each offset) and the drafter's final hidden states ``hidden [..., K, d]``; A, B are the
    predecessor / successor codebooks, H the hidden projection (SPEC "DFlash 2" 2). With the gold
    predecessors this is the training objective's teacher-forced score; the decode walk
    (``select``) calls it one offset at a time with its own choices."""
    h = hidden.astype(jnp.float32) @ params["hidden_projection"]  # [..., K, r]
    query = jnp.take(jnp.asarray(params["predecessor_codebook"]), predecessors, axis=0) * h  # [..., K, r]
    keys = jnp.take(jnp.asarray(params["successor_codebook"]), candidates, axis=0)  # [..., K, k, r]
    return unary + jnp.einsum("...r,...kr->...k", query, keys)


def select(
    params, cfg: DrafterConfig, hidden: Array, scores: DraftScores | Array, anchor: Array, temperature: float, key=None
):
    """DFlash 2's left-to-right walk over each block's candidates (SPEC "DFlash 2" 2; the
    reference's ``CandidateSelector.select``): at offset j the predecessor is the anchor (j = 1)
    or the token chosen at j - 1; greedy (``temperature == 0``) takes the best score, sampling draws
    from ``softmax(scores / temperature)`` over the k candidates (no top-p / top-k inside the walk).

    Args:
      hidden: ``[B, K, d]`` the drafter's final hidden states at offsets 1..K.
      scores: the head's logits there: ``DraftScores`` (``draft_scores``; the candidates are its top
        columns, read as tokens through ``scores.tokens``), or logits ``[B, K, V]`` over the whole
        vocabulary.
      anchor: int32 ``[B]``.
      key: typed PRNG keys ``[B]``, one per row (sampling only); row b draws offset j with
        ``fold_in(key[b], j)``, so a row's draft never depends on the rest of the batch.

    Returns:
      ``(path int32 [B, K], candidates int32 [B, K, k], q float32 [B, K, k])``: the chosen tokens,
      the candidate sets, and each offset's q over its candidates (sampling: the distribution the
      token was drawn from, which the verify's rejection rule uses, 0 outside the candidates;
      greedy: the softmax of the scores, read as the walk's confidence).
    """
    scores = scores if isinstance(scores, DraftScores) else DraftScores(jnp.asarray(scores))
    unary, columns = selector_candidates(scores.logits, cfg)
    candidates = scores.tokens(columns)

    def step(prev, xs):
        j, h, u, c = xs  # offset j's hidden [B, d], unary scores and candidates [B, k]
        scores = selector_scores(params, h, u, c, prev)  # [B, k]
        if temperature > 0:
            q = jax.nn.softmax(scores / temperature, axis=-1)
            draw = lambda k, logq: jax.random.categorical(jax.random.fold_in(k, j), logq)  # noqa: E731
            index = jax.vmap(draw)(key, jnp.log(q))
        else:  # q at temperature 1: the walk's confidence in its choice
            q, index = jax.nn.softmax(scores, axis=-1), jnp.argmax(scores, axis=-1)
        chosen = jnp.take_along_axis(c, index[:, None], axis=1)[:, 0]
        return chosen, (chosen, q)

    by_offset = (jnp.arange(hidden.shape[1]),) + tuple(
        jnp.swapaxes(jnp.asarray(x), 0, 1) for x in (hidden, unary, candidates)
    )
    _, (path, q) = jax.lax.scan(step, jnp.asarray(anchor, jnp.int32), by_offset)
    path, q = path.T, jnp.swapaxes(q, 0, 1)
    return path, candidates, q


def selector_tree(
    params, cfg: DrafterConfig, hidden: Array, scores: DraftScores | Array, anchor: Array, budget: int, temperature=1.0
) -> Tree:
    """DFlash 2's best-first draft tree of ``budget`` nodes (SPEC "Tree verification" 1 with the
    selector of "DFlash 2" 2 on its edges): below a node holding token ``a`` at depth ``j - 1`` (the
    anchor at 0), offset ``j``'s candidates score ``log softmax(selector_scores(..., a) /
    temperature)``; ``tree.build_tree_with`` keeps the best prefixes. ``hidden [B, K, d]``,
    ``scores`` and ``anchor [B]`` as ``select``; following each node's best child is ``select``'s
    greedy walk."""
    scores = scores if isinstance(scores, DraftScores) else DraftScores(jnp.asarray(scores))
    unary, columns = selector_candidates(scores.logits, cfg)
    candidates = scores.tokens(columns)  # [B, K, k]
    # computed once, before the tree's loop (XLA otherwise moves their work into it: build_tree)
    hidden, unary, candidates = jax.lax.optimization_barrier((hidden, unary, candidates))
    k, width = candidates.shape[1], min(budget, candidates.shape[2])
    rows = jnp.arange(candidates.shape[0])

    def children(token, depth):  # the candidates at offset depth + 1 given the node's token
        d = jnp.minimum(depth, k - 1)
        c = candidates[rows, d]
        logq = jax.nn.log_softmax(selector_scores(params, hidden[rows, d], unary[rows, d], c, token) / temperature)
        v, index = jax.lax.top_k(logq, width)
        return v, jnp.take_along_axis(c, index, axis=1)

    return build_tree_with(children, budget, k, anchor)


def decode_masks(cfg: DrafterConfig, cache_len: int, start: Array, block_len: int, block_valid: Array) -> list[Array]:
    """Per-layer masks ``[B, T, S + T]`` for drafting a block at ``start``: ``masks.decode_masks``
    with this drafter's layer types and window."""
    return masks.decode_masks(cfg.layer_types, cfg.sliding_window, cache_len, start, block_len, block_valid)


@dataclasses.dataclass(frozen=True)
class DraftStep:
    """The drafter as the decoding loop uses it (static, hashable; parameters are passed in).

    Its context cache holds, per drafter layer, the projected K/V ``[B, S, KV, D]`` of the
    fused target features, slot = absolute position (like the target's KV cache), so the
    loop never compacts it: ``decode_masks`` hides slots ``>= start``. (A sliding layer's
    mask hides slots older than its window; the memory for them is kept for static shapes.)

    Its parameters may carry a draft vocabulary (``with_draft_vocab``): the step then scores only
    those tokens and the copy column (``draft_scores``).
    """

    cfg: DrafterConfig
    target_cfg: TargetConfig

    @property
    def tap_layers(self) -> tuple[int, ...]:
        return self.cfg.target_layer_ids

    @property
    def max_block_size(self) -> int:
        return self.cfg.block_size

    @property
    def default_block_size(self) -> int:
        return self.cfg.block_size

    def init_cache(self, batch: int, cache_len: int):
        shape = (batch, cache_len, self.cfg.num_kv_heads, self.cfg.head_dim)
        dt = self.cfg.compute_dtype
        return [(jnp.zeros(shape, dt), jnp.zeros(shape, dt)) for _ in range(self.cfg.num_layers)]

    def write_context(self, params, cache, feats: Array, start: Array):
        """Project target features ``[B, C, n_taps * d]`` of positions ``start .. start+C-1`` into the cache."""
        model, variables = Drafter(self.cfg), {"params": _model_params(params)}
        ctx = model.apply(variables, feats, method=Drafter.fuse)
        positions = start[:, None] + jnp.arange(feats.shape[1])
        kv = model.apply(variables, ctx, positions, method=Drafter.context_kv)
        return [(write_block(ck, k, start), write_block(cv, v, start)) for (ck, cv), (k, v) in zip(cache, kv)]

    def logits(
        self,
        params,
        target_params,
        cache,
        anchor: Array,
        start: Array,
        block_valid: Array,
        block_len: int,
        *,
        tokens: Array | None = None,
    ):
        """Draft logits ``[B, block_len - 1, V]`` (float32) for blocks ``[anchor, MASK...]`` at ``start``
        (``block_tokens``: with ``block_input="ngram"`` the prompt-lookup continuation of ``tokens``,
        the loop's token buffer ``[B, L]``, in place of the first mask tokens); with a draft
        vocabulary, -inf on the tokens it never proposes."""
        scores = self._forward(params, target_params, cache, anchor, start, block_valid, block_len, tokens)[1]
        return scores.dense(self.cfg.vocab_size)

    def tree(
        self, params, target_params, cache, anchor, start, block_valid, block_len, budget: int, *, tokens, sampling
    ) -> Tree:
        """The best-first draft tree of ``budget`` nodes below each row's anchor (SPEC "Tree
        verification" 1): DFlash from its per-offset distributions (``logprobs``, ``tree.build_tree``);
        DFlash 2 from its selector, a node's children scored given the node's token as the selector's
        walk scores them (``selector_scores`` over the offset's candidates, softmax at the sampling
        temperature, ``cfg.tree_temperature`` when greedy; ``tree.build_tree_with``), so its best chain is
        the walk's. A greedy DFlash tree reads its log-probabilities at ``cfg.tree_temperature`` too."""
        hidden, scores = self._forward(params, target_params, cache, anchor, start, block_valid, block_len, tokens)
        greedy = sampling is None or sampling.greedy
        if not self.cfg.dflash2:
            logits = scores.dense(self.cfg.vocab_size)
            logp = (
                jax.nn.log_softmax(logits / self.cfg.tree_temperature, -1)
                if greedy
                else jnp.log(probs(logits, sampling))
            )
            return build_tree(logp, budget)
        temperature = self.cfg.tree_temperature if greedy else sampling.temperature
        return selector_tree(params, self.cfg, hidden, scores, anchor, budget, temperature)

    def _forward(self, params, target_params, cache, anchor, start, block_valid, block_len, tokens):
        """(final hidden states ``[B, block_len - 1, d]``, ``DraftScores``) at offsets ``1 .. block_len - 1``."""
        block, num, matched = block_inputs(self.cfg, anchor, start, block_len, tokens)
        emb = block_embeddings(block, target_params, self.target_cfg, self.cfg)
        masks = decode_masks(self.cfg, cache[0][0].shape[1], start, block_len, block_valid)
        positions = start[:, None] + jnp.arange(block_len)
        hidden = Drafter(self.cfg).apply({"params": _model_params(params)}, emb, positions, cache, masks)[:, 1:]
        return hidden, draft_scores(hidden, params, target_params, self.target_cfg, self.cfg, block, num, matched)

    def propose(self, params, target_params, cache, anchor, start, block_valid, block_len, *, tokens, key, sampling):
        """The drafter's ``Draft`` for the blocks of ``logits`` (``steps``; every token real).

        Greedy: DFlash's argmax per offset, confidence its largest probability; DFlash 2 the
        selector's greedy walk (``select``), confidence its probability among the offset's
        candidates. Sampled (``key``: per-row keys ``[B]``): DFlash draws each offset from
        ``probs(logits, sampling)``, the ``q`` it returns, confidence its largest probability;
        DFlash 2 draws the selector's walk at ``sampling.temperature`` (SPEC "DFlash 2" 2;
        ``dflash_generate`` with ``draft_indices``), ``q`` the walk's distribution over each
        offset's candidates scattered onto the vocabulary (0 elsewhere), and its confidence is the
        head's largest probability at that temperature, not the walk's: the walk's q at offset
        ``j + 1`` depends on the token drawn at ``j``, and a verify length chosen from the draws
        would decide from a drawn token whether it is checked at all, which biases the output."""
        hidden, scores = self._forward(params, target_params, cache, anchor, start, block_valid, block_len, tokens)
        if sampling.greedy:
            if self.cfg.dflash2:
                draft, _, q = select(params, self.cfg, hidden, scores, anchor, 0.0)
                return Draft(draft, all_real(draft), jnp.max(q, axis=-1))
            draft = scores.tokens(jnp.argmax(scores.logits, axis=-1))
            return Draft(draft, all_real(draft), jnp.max(jax.nn.softmax(scores.logits, axis=-1), axis=-1))
        if not self.cfg.dflash2:
            draft, q = sampled(key, scores.dense(self.cfg.vocab_size), sampling)
            return Draft(draft, all_real(draft), jnp.max(q, axis=-1), q)
        draft, candidates, q = select(params, self.cfg, hidden, scores, anchor, sampling.temperature, key)
        dense = jnp.zeros((*draft.shape, self.cfg.vocab_size), jnp.float32)
        b, k = jnp.indices(candidates.shape[:2])
        conf = jnp.max(jax.nn.softmax(scores.logits / sampling.temperature, axis=-1), axis=-1)
        # add, not set: with a draft vocabulary shorter than selector_top_k, -inf columns (q = 0) can
        # name a token another candidate names too
        return Draft(draft, all_real(draft), conf, dense.at[b[..., None], k[..., None], candidates].add(q))


def check_fits(
    cfg: DrafterConfig,
    target: TargetConfig,
    drafter_target_identity: dict | None = None,
    target_identity: dict | None = None,
) -> None:
    """Raise ``ConfigError`` naming the mismatch if the drafter cannot serve ``target``.

    Checks hidden size, vocabulary, ``num_target_layers``, the range of ``target_layer_ids``
    and, when both are known, the target identity (config and tokenizer hashes) recorded
    with the drafter.
    """
    if cfg.hidden_size != target.hidden_size:
        raise ConfigError(f"drafter hidden_size {cfg.hidden_size} != target hidden_size {target.hidden_size}")
    if cfg.vocab_size != target.vocab_size:
        raise ConfigError(f"drafter vocab_size {cfg.vocab_size} != target vocab_size {target.vocab_size}")
    if cfg.num_target_layers != target.num_layers:
        raise ConfigError(
            f"drafter was built for a {cfg.num_target_layers}-layer target; this target has {target.num_layers} layers"
        )
    if drafter_target_identity and target_identity:
        for key in ("config_sha256", "tokenizer_sha256"):
            if key in drafter_target_identity and drafter_target_identity[key] != target_identity.get(key):
                raise ConfigError(
                    f"drafter was trained for another target ({key} differs); use the target it was trained for"
                )
