"""The target model in Flax linen, with an explicit KV cache: Llama, Qwen2, Qwen3 (dense),
Qwen3-MoE and gpt-oss (mixture of experts), Qwen3.5 and Qwen3.5-MoE (hybrid: Gated DeltaNet
layers, ``deltanet.py``, among gated full attention), Gemma 3 (sliding and global layers with their
own RoPE, GeGLU, norms around each sublayer, scaled embeddings), DeepSeek-V3 / Kimi-K2 (multi-head
latent attention, ``LatentAttention``; a sigmoid, group-limited router) and GLM-4.5 (that router on
grouped-query attention).

Read top to bottom: ``MoEConfig``, ``LatentConfig`` and ``TargetConfig``, ``Attention`` (grouped-query;
sliding window and attention sinks for gpt-oss), ``LatentAttention`` (MLA, the cache holding the
compressed latent), ``MoE`` (router and experts as one grouped matmul, shared experts), ``DecoderLayer``,
``Target``, then the KV-cache and parameter helpers. The model
only: a Hugging Face ``config.json`` and tensor names are read in ``hf_format.py``.

KV cache convention: one ``(k, v)`` pair per layer, each ``[B, S, KV, D]`` with a
static maximum length ``S``; the cache slot of a token **is** its absolute
position. A forward over a block of ``T`` new tokens at positions
``p .. p+T-1`` writes slots ``p .. p+T-1`` and lets each query see slots
``<= its position``. Truncating the cache to ``n`` tokens therefore costs
nothing: later writes overwrite slots ``>= n`` before anything reads them.
Each sequence of a batch has its own positions, so sequences advance
independently.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from dflash_jax.deltanet import GatedDeltaNet, LinearState, PendingLinear, commit
from dflash_jax.layers import ACTIVATIONS, RMSNorm, SwiGLU, apply_rope, attend, param, rope_inv_freq, yarn_inv_freq

Array = jax.Array
KVCache = list  # list over layers of (k, v), each [B, S, KV, D]


@dataclasses.dataclass(frozen=True)
class MoEConfig:
    """The mixture-of-experts MLP of a target (static, hashable).

    ``router``: ``"softmax_topk"`` (Qwen3-MoE: softmax over all experts, then the top k, renormalised
    when ``norm_topk_prob``) or ``"topk_softmax"`` (gpt-oss: top k of the biased router logits, then a
    softmax over those k). ``expert_mlp``: ``"swiglu"`` (Qwen3-MoE: ``down(silu(gate) * up)``, no
    biases) or ``"clamped_swiglu"`` (gpt-oss: gate and up interleaved in one ``gate_up`` projection,
    ``gate`` clamped above at ``swiglu_limit``, ``up`` to ``+-swiglu_limit``,
    ``(up + 1) * gate * sigmoid(swiglu_alpha * gate)``, biased). ``layers``: the decoder layers that
    use experts (the others keep the dense SwiGLU of ``intermediate_size``). ``shared_expert_size``:
    when nonzero, every token also goes through one shared SwiGLU expert of that width, scaled by
    ``sigmoid(x @ shared_expert_gate)`` (Qwen3.5-MoE's ``Qwen3NextSparseMoeBlock``), or unscaled where
    ``shared_expert_gated`` is false (DeepSeek-V3's ``shared_experts``, of width ``n_shared_experts *
    moe_intermediate_size``).

    ``router="scaled_softmax"`` (Gemma 4's ``Gemma4TextRouter``, with ``expert_mlp="geglu"``): the experts
    run beside the dense MLP (``DecoderLayer``), routed on the un-normed residual through the router's own
    unscaled norm, a learned per-channel scale and ``hidden_size ** -0.5``; softmax, the top k,
    renormalised, each times its learned per-expert scale.

    ``router="sigmoid_group"`` (DeepSeek-V3, GLM-4.5: ``DeepseekV3TopkRouter``): each expert's score is
    ``sigmoid(logit)``; the choice adds a learned correction bias (``router_correction``, for choosing
    only), keeps the ``topk_groups`` of ``num_groups`` expert groups whose two best scores sum highest,
    and takes the top k inside them; the weights are the chosen experts' scores (without the bias),
    renormalised when ``norm_topk_prob``, times ``routed_scaling``.
    """

    num_experts: int
    experts_per_token: int
    intermediate_size: int
    layers: tuple[int, ...]
    router: str = "softmax_topk"
    norm_topk_prob: bool = False
    router_bias: bool = False
    expert_mlp: str = "swiglu"
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    shared_expert_size: int = 0
    shared_expert_gated: bool = True
    num_groups: int = 1
    topk_groups: int = 1
    routed_scaling: float = 1.0


@dataclasses.dataclass(frozen=True)
class LinearAttentionConfig:
    """Qwen3.5's Gated DeltaNet layers (``deltanet.GatedDeltaNet``): key / value heads and their sizes,
    the causal convolution's kernel."""

    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int


@dataclasses.dataclass(frozen=True)
class LatentConfig:
    """DeepSeek-V3's multi-head latent attention (``LatentAttention``): the query through a low-rank
    ``q_lora_rank`` bottleneck (0: one ``q_proj``), keys and values from one compressed latent of
    ``kv_lora_rank`` per token plus one shared rotary key of ``qk_rope_head_dim``; each head's query and
    key have ``qk_nope_head_dim`` dims without RoPE and ``qk_rope_head_dim`` with, its value
    ``v_head_dim``. ``rope_interleave``: the rotary dims are stored in interleaved pairs (the released
    checkpoints; transformers' ``rope_interleave``)."""

    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rope_interleave: bool = True


# Fields added after format 1: they enter a checkpoint's config hash only when they differ from
# their default, so targets converted before they existed keep their identity.
_LATER_FIELDS = (
    "layer_types",
    "sliding_window",
    "attention_sinks",
    "yarn",
    "moe",
    "linear",
    "partial_rotary_factor",
    "attn_output_gate",
    "norm_zero_centered",
    "mlp_activation",
    "sandwich_norms",
    "embed_scale",
    "attn_scale",
    "local_rope_theta",
    "final_logit_softcap",
    "latent",
    "global_head_dim",
    "global_kv_heads",
    "rope_proportion",
    "k_eq_v",
    "v_norm",
    "kv_shared_layers",
    "per_layer_input",
    "per_layer_vocab",
    "layer_scalar",
    "double_wide_mlp",
    "norm_product_f32",
)


@dataclasses.dataclass(frozen=True)
class TargetConfig:
    """Static shape and numerics of a target model (hashable: safe as a jit static arg); read from a
    Hugging Face ``config.json`` by ``hf_format.read_config``."""

    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: tuple[tuple[str, float], ...] | None = None  # llama3 parameters, sorted items
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    max_position_embeddings: int = 4096
    dtype: str = "float32"  # compute dtype; parameters stay as loaded
    layer_types: tuple[str, ...] = ()  # per layer "full_attention" / "sliding_attention"; () = all full
    sliding_window: int = 0  # a sliding layer's query sees the keys at positions > its own - window
    attention_sinks: bool = False  # gpt-oss: one learned sink logit per head (``layers.attend``)
    yarn: tuple[tuple[str, float], ...] | None = None  # YaRN RoPE parameters, sorted items
    moe: MoEConfig | None = None
    linear: LinearAttentionConfig | None = None  # Qwen3.5: the "linear_attention" layers' shape
    partial_rotary_factor: float = 1.0  # RoPE rotates the first head_dim * factor dims of q and k
    attn_output_gate: bool = False  # Qwen3.5: q_proj also gives a per-head gate, out *= sigmoid(gate)
    norm_zero_centered: bool = False  # Qwen3.5, Gemma: every RMSNorm weight is applied as 1 + w
    mlp_activation: str = "silu"  # the gated MLP's activation (``layers.ACTIVATIONS``; Gemma: "gelu_tanh")
    sandwich_norms: bool = False  # Gemma: the attention's and the MLP's outputs are normed before each residual add
    embed_scale: bool = False  # Gemma: embeddings times sqrt(hidden_size), rounded to the compute dtype
    attn_scale: float = 0.0  # the attention logits' scale; 0 = head_dim ** -0.5 (Gemma: query_pre_attn_scalar ** -0.5)
    local_rope_theta: float = 0.0  # Gemma: the sliding layers' RoPE base (plain RoPE); 0 = the global layers' RoPE
    final_logit_softcap: float = 0.0  # Gemma 2/4 style: logits = cap * tanh(logits / cap); 0 = none
    latent: LatentConfig | None = None  # DeepSeek-V3: every layer's attention is MLA (head_dim: its rotary dims)
    # Gemma 4 (all 0 / False elsewhere): full-attention layers' own head size and key/value heads; their
    # "proportional" RoPE (the first rope_proportion of each half rotated at frequencies of the whole head,
    # the rest not rotated); keys equal to values on full layers (no v_proj); values normed without a
    # scale; the last kv_shared_layers layers reusing the keys and values of the last earlier layer of
    # their kind (no projections, no cache of their own); per-layer embeddings of per_layer_input dims
    # (over per_layer_vocab tokens); a learned scalar on each layer's output; kv-sharing layers' MLP twice
    # as wide; norms multiplied in float32 (``Gemma4RMSNorm``)
    global_head_dim: int = 0
    global_kv_heads: int = 0
    rope_proportion: float = 0.0
    k_eq_v: bool = False
    v_norm: bool = False
    kv_shared_layers: int = 0
    per_layer_input: int = 0
    per_layer_vocab: int = 0
    layer_scalar: bool = False
    double_wide_mlp: bool = False
    norm_product_f32: bool = False

    def is_sliding(self, layer: int) -> bool:
        return bool(self.layer_types) and self.layer_types[layer] == "sliding_attention"

    def is_linear(self, layer: int) -> bool:
        return bool(self.layer_types) and self.layer_types[layer] == "linear_attention"

    @property
    def has_linear_layers(self) -> bool:
        """Whether any layer is linear attention (Gated DeltaNet): one recurrent state per sequence, so no
        per-node copy for a draft tree's branches."""
        return any(self.is_linear(i) for i in range(self.num_layers))

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    def layer_head_dim(self, layer: int) -> int:
        """The head size of ``layer``'s attention (Gemma 4: ``global_head_dim`` on full-attention layers)."""
        full = self.global_head_dim and not self.is_sliding(layer)
        return self.global_head_dim if full else self.head_dim

    def layer_kv_heads(self, layer: int) -> int:
        """The key/value heads of ``layer`` (Gemma 4: ``global_kv_heads`` on full-attention layers)."""
        full = self.global_kv_heads and not self.is_sliding(layer)
        return self.global_kv_heads if full else self.num_kv_heads

    def kv_source(self, layer: int) -> int | None:
        """The layer whose keys and values ``layer`` reuses (Gemma 4's ``num_kv_shared_layers``: the last
        layer of the same kind before the shared ones), or None where it computes its own."""
        first = self.num_layers - self.kv_shared_layers
        if layer < first:
            return None
        kind = self.is_sliding(layer)
        return max(j for j in range(first) if self.is_sliding(j) == kind)

    def is_moe(self, layer: int) -> bool:
        return self.moe is not None and layer in self.moe.layers

    def hash_fields(self) -> dict[str, Any]:
        """The fields that fix the model's function (not the compute dtype), for identity hashes."""
        fields = dataclasses.asdict(self)
        fields.pop("dtype")
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        for name in _LATER_FIELDS:
            if getattr(self, name) == defaults[name]:
                fields.pop(name)
        if self.moe is not None:  # fields added after the first MoE targets, kept out at their defaults
            defaults = {f.name: f.default for f in dataclasses.fields(MoEConfig)}
            for name in ("shared_expert_size", "shared_expert_gated", "num_groups", "topk_groups", "routed_scaling"):
                if getattr(self.moe, name) == defaults[name]:
                    fields["moe"].pop(name)
        return fields

    @property
    def compute_dtype(self):
        return jnp.dtype(self.dtype)

    @property
    def rope_scaling_dict(self) -> dict | None:
        return None if self.rope_scaling is None else dict(self.rope_scaling)


def rope_tables(cfg: TargetConfig, sliding: bool = False, head_dim: int | None = None) -> tuple[np.ndarray, float]:
    """The target's RoPE for one layer: inverse frequencies ``[rotary // 2]`` and the cos/sin scale (1 but
    for YaRN), ``rotary = head_dim * cfg.partial_rotary_factor`` dims rotated. ``head_dim``: the layer's
    head size (default ``cfg.head_dim``; Gemma 4's full layers have their own, ``global_head_dim``).
    ``sliding``: for a sliding-window layer, which has its own plain RoPE where ``cfg.local_rope_theta``
    is set (Gemma 3: base 10000 locally, a scaled base-1e6 RoPE on global layers). With
    ``cfg.rope_proportion`` (Gemma 4's "proportional" type): ``[head_dim // 2]`` frequencies, zero past
    the rotated ones (transformers' ``_compute_proportional_rope_parameters``)."""
    hd = head_dim or cfg.head_dim
    rotary = int(hd * cfg.partial_rotary_factor)
    if sliding and cfg.local_rope_theta:
        return rope_inv_freq(rotary, cfg.local_rope_theta), 1.0
    if cfg.rope_proportion:
        angles = int(cfg.rope_proportion * hd // 2)
        rotated = 1.0 / (cfg.rope_theta ** (np.arange(0, 2 * angles, 2, dtype=np.int64).astype(np.float32) / hd))
        return np.concatenate([rotated.astype(np.float32), np.zeros(hd // 2 - angles, np.float32)]), 1.0
    if cfg.yarn is not None:
        return yarn_inv_freq(rotary, cfg.rope_theta, dict(cfg.yarn))
    return rope_inv_freq(rotary, cfg.rope_theta, cfg.rope_scaling_dict), 1.0


def rotate(x: Array, positions: Array, cfg: TargetConfig, sliding: bool = False) -> Array:
    """RoPE on the first ``x.shape[-1] * cfg.partial_rotary_factor`` dims of ``x`` ``[B, T, N, D]`` (the
    layer's head, ``rope_tables``); the rest pass through (Qwen3.5's and GLM-4.5's partial rotary
    embedding; Qwen3.5's multimodal sections coincide for text positions). ``sliding``: the layer is a
    sliding-window one."""
    inv_freq, scale = rope_tables(cfg, sliding, x.shape[-1])
    r = 2 * len(inv_freq)
    if r == x.shape[-1]:
        return apply_rope(x, positions, inv_freq, scale)
    return jnp.concatenate([apply_rope(x[..., :r], positions, inv_freq, scale), x[..., r:]], axis=-1)


class Attention(nn.Module):
    """Causal grouped-query self-attention over a block, on top of an optional KV cache.

    A sliding layer's query at position p sees only keys at positions > p - ``cfg.sliding_window``
    (transformers' ``sliding_window_overlay``); with ``cfg.attention_sinks`` each head has a learned
    sink logit (gpt-oss). Gemma 4: a full layer's own head size and key/value heads, keys equal to
    values (``k_eq_v``), values normed without a scale (``v_norm``), and, in a layer that reuses another's
    keys and values (``cfg.kv_source``), no key/value projections at all: ``shared`` holds what that
    layer attended over.

    Returns ``(out [B, T, d], new_cache, attended)``: ``attended`` = ``(keys, values, key_pos, mask)``
    before the sliding window, for the layers that reuse them."""

    cfg: TargetConfig
    layer: int = 0

    @nn.compact
    def __call__(self, x, positions, cache, tree=None, shared=None):
        cfg, dt, sliding = self.cfg, self.cfg.compute_dtype, self.cfg.is_sliding(self.layer)
        d, h = cfg.hidden_size, cfg.num_heads
        kv, hd = cfg.layer_kv_heads(self.layer), cfg.layer_head_dim(self.layer)
        zeros = nn.initializers.zeros

        def proj(name, heads, axes, width=hd):
            out = x @ param(self, f"{name}_proj", (d, heads * width), ("embed", axes)).astype(dt)
            if cfg.qkv_bias:
                out = out + param(self, f"{name}_bias", (heads * width,), (axes,), zeros).astype(dt)
            return out.reshape(*x.shape[:2], heads, width)

        def norm(name, y):
            return RMSNorm(cfg.rms_norm_eps, "head_dim", cfg.norm_zero_centered, cfg.norm_product_f32, name=name)(y)

        if cfg.attn_output_gate:  # per head [query | gate] (Qwen3_5Attention)
            q, gate = jnp.split(proj("q", h, "heads", 2 * hd), 2, axis=-1)
        else:
            q, gate = proj("q", h, "heads"), None
        if cfg.qk_norm:
            q = norm("q_norm", q)
        q = nn.with_logical_constraint(rotate(q, positions, cfg, sliding), ("batch", "length", "act_heads", None))
        if shared is None:
            k = proj("k", kv, "kv_heads")
            v = k if cfg.k_eq_v and not sliding else proj("v", kv, "kv_heads")  # Gemma 4's full layers
            if cfg.qk_norm:
                k = norm("k_norm", k)
            if cfg.v_norm:
                v = RMSNorm(cfg.rms_norm_eps, scaled=False, name="v_norm")(v)
            k = rotate(k, positions, cfg, sliding)
            (keys, values), key_pos, mask, new_cache = over_cache(cache, (k, v), positions, tree, "act_kv_heads")
        else:  # another layer's keys and values, seen as that layer saw them; nothing to cache
            (keys, values, key_pos, mask), new_cache = shared, cache
        attended = (keys, values, key_pos, mask)
        if sliding:
            mask = mask & (key_pos[:, None, :] > positions[:, :, None] - cfg.sliding_window)
        sinks = param(self, "sinks", (h,), ("heads",), zeros) if cfg.attention_sinks else None
        out = attend(q, keys.astype(dt), values.astype(dt), mask, sinks, cfg.attn_scale or None)
        if gate is not None:
            out = out * jax.nn.sigmoid(gate)
        out = out.reshape(*x.shape[:2], h * hd)
        out = out @ param(self, "o_proj", (h * hd, d), ("heads", "embed")).astype(dt)
        if cfg.o_bias:
            out = out + param(self, "o_bias", (d,), ("embed",), zeros).astype(dt)
        return out, new_cache, attended


def over_cache(
    cache: tuple[Array, ...] | None, block: tuple[Array, ...], positions: Array, tree: Array | None, heads_axis
):
    """What a block's queries attend over: ``(entries, key_pos [B, S], mask bool [B, T, S], new_cache)``.

    Without a cache the block's own ``block`` entries (each ``[B, T, ...]``), causal, and no new
    cache; with one, every entry written at the block's positions into its cache array (``[B, S,
    ...]``, slot = position) and the block seeing every slot up to its own position, or, for a
    tree block, the committed slots and its ancestors (``tree_mask``). ``heads_axis``: the logical
    name of the entries' third axis (``"act_kv_heads"``; None for MLA's one latent)."""
    if cache is None:  # plain causal forward over the block itself
        return block, positions, positions[:, None, :] <= positions[:, :, None], None
    axes = ("batch", "cache_length", heads_axis, None)
    full = tuple(nn.with_logical_constraint(write_block(c, b, positions[:, 0]), axes) for c, b in zip(cache, block))
    key_pos = jnp.broadcast_to(jnp.arange(full[0].shape[1]), full[0].shape[:2])
    mask = key_pos[:, None, :] <= positions[:, :, None]
    if tree is not None:  # a tree block: slot start + t holds token t; each sees the cache and its ancestors
        mask, key_pos = tree_mask(tree, positions, full[0].shape[1])
    return full, key_pos, mask, full


class LatentAttention(nn.Module):
    """Multi-head latent attention (DeepSeek-V2/V3's MLA, transformers' ``DeepseekV3Attention``), computed
    in its absorbed form over a cache of latents.

    Per token the cache holds the normed compressed latent ``c`` ``[kv_lora_rank]`` and the shared
    rotary key ``k_r`` ``[qk_rope_head_dim]`` (one "head", as serving engines cache it), never per-head
    keys and values. Head h's key is ``[c @ W_uk[h], k_r]`` and its value ``c @ W_uv[h]`` (``kv_b_proj``
    split), so its score ``q_nope[h] . (c @ W_uk[h]) + q_rope[h] . k_r`` equals ``(W_uk[h] @ q_nope[h]) . c
    + q_rope[h] . k_r``: the query is moved into latent space, attention runs as one key/value head of
    ``kv_lora_rank + qk_rope_head_dim`` (values: the latent), and ``W_uv`` maps each head's output back.
    The same function as transformers' (which expands the keys and values), summed in another order.
    Scores scaled by ``cfg.attn_scale`` (``qk_head_dim ** -0.5``, times YaRN's ``mscale_all_dim`` factor
    squared)."""

    cfg: TargetConfig

    @nn.compact
    def __call__(self, x: Array, positions: Array, cache: tuple[Array, Array] | None, tree: Array | None = None):
        cfg, lat, dt = self.cfg, self.cfg.latent, self.cfg.compute_dtype
        d, h = cfg.hidden_size, cfg.num_heads
        dn, dr, dv, r = lat.qk_nope_head_dim, lat.qk_rope_head_dim, lat.v_head_dim, lat.kv_lora_rank
        zeros = nn.initializers.zeros

        def linear(inp, name, shape, axes, bias=False):
            out = inp @ param(self, name, shape, axes).astype(dt)
            if bias:
                out = out + param(self, f"{name}_bias", shape[-1:], axes[-1:], zeros).astype(dt)
            return out

        if lat.q_lora_rank:  # the query through its own low-rank bottleneck
            q = linear(x, "q_a_proj", (d, lat.q_lora_rank), ("embed", "latent"), cfg.qkv_bias)
            q = RMSNorm(cfg.rms_norm_eps, "latent", name="q_a_norm")(q)
            q = linear(q, "q_b_proj", (lat.q_lora_rank, h * (dn + dr)), ("latent", "heads"))
        else:
            q = linear(x, "q_proj", (d, h * (dn + dr)), ("embed", "heads"))
        q_nope, q_rope = jnp.split(q.reshape(*x.shape[:2], h, dn + dr), [dn], axis=-1)
        kv = linear(x, "kv_a_proj", (d, r + dr), ("embed", "latent"), cfg.qkv_bias)
        latent, k_rope = jnp.split(kv[:, :, None, :], [r], axis=-1)  # [B, T, 1, r], [B, T, 1, dr]
        latent = RMSNorm(cfg.rms_norm_eps, "latent", name="kv_a_norm")(latent)
        if lat.rope_interleave:  # pairs (x0, x1), (x2, x3), ... -> rotate_half's halves, for q and k alike
            q_rope, k_rope = _deinterleave(q_rope), _deinterleave(k_rope)
        q_rope, k_rope = rotate(q_rope, positions, cfg), rotate(k_rope, positions, cfg)

        (latents, k_ropes), _, mask, new_cache = over_cache(cache, (latent, k_rope), positions, tree, None)
        kv_b = param(self, "kv_b_proj", (r, h * (dn + dv)), ("latent", "heads")).astype(dt).reshape(r, h, dn + dv)
        w_uk, w_uv = kv_b[..., :dn], kv_b[..., dn:]
        query = jnp.concatenate([jnp.einsum("bthn,rhn->bthr", q_nope, w_uk), q_rope], axis=-1)
        query = nn.with_logical_constraint(query, ("batch", "length", "act_heads", None))
        keys = jnp.concatenate([latents.astype(dt), k_ropes.astype(dt)], axis=-1)  # [B, S, 1, r + dr]
        out = attend(query, keys, latents.astype(dt), mask, None, cfg.attn_scale or None)  # [B, T, h, r]
        out = jnp.einsum("bthr,rhv->bthv", out, w_uv).reshape(*x.shape[:2], h * dv)
        return linear(out, "o_proj", (h * dv, d), ("heads", "embed"), cfg.o_bias), new_cache


def _deinterleave(x: Array) -> Array:
    """``[..., D]`` with the rotary dims in interleaved pairs -> ``[even dims | odd dims]`` (the layout
    ``rotate_half`` RoPE rotates; transformers' ``apply_rotary_pos_emb_interleave`` computes the same)."""
    return jnp.concatenate([x[..., 0::2], x[..., 1::2]], axis=-1)


class MoE(nn.Module):
    """Mixture-of-experts MLP: route each token to ``experts_per_token`` experts, sum their outputs
    weighted by the router (Qwen3-MoE's ``Qwen3MoeSparseMoeBlock``, gpt-oss's ``GptOssMLP``).

    The experts run as one grouped matmul: the (token, choice) pairs are sorted by expert and
    ``jax.lax.ragged_dot`` multiplies each expert's rows by its weights, so the activations are
    ``[tokens * k, width]``, never ``[tokens, experts, width]``. (XLA lowers ``ragged_dot`` to a
    grouped GEMM on accelerators; its CPU backend expands it to a masked dense product, which costs
    ``experts`` times the FLOPs: fine for tests' few experts, not for a 128-expert model on CPU.)
    Parameters: ``router`` ``[d, E]`` (+ ``router_bias`` ``[E]``), ``gate_up`` ``[E, d, 2F]``
    (Qwen3-MoE: ``[gate | up]`` halves; gpt-oss: interleaved, as stored), ``down`` ``[E, F, d]``
    (+ ``gate_up_bias`` ``[E, 2F]``, ``down_bias`` ``[E, d]`` for gpt-oss); the expert axis carries
    the logical name ``expert``.
    """

    cfg: TargetConfig

    @nn.compact
    def __call__(self, x: Array, route: Array | None = None) -> Array:
        moe, dt = self.cfg.moe, self.cfg.compute_dtype
        d, e, f, k = self.cfg.hidden_size, moe.num_experts, moe.intermediate_size, moe.experts_per_token
        zeros = nn.initializers.zeros
        biased = moe.expert_mlp == "clamped_swiglu"
        tokens = x.reshape(-1, d)  # [N, d]
        routed = tokens if route is None else route.reshape(-1, d)  # Gemma 4 routes the un-normed residual
        if moe.router == "scaled_softmax":  # Gemma4TextRouter: its own unscaled norm, a learned scale, d^-0.5
            routed = RMSNorm(self.cfg.rms_norm_eps, scaled=False, name="router_norm")(routed)
            routed = routed * param(self, "router_scale", (d,), ("embed",), nn.initializers.ones).astype(dt)
            routed = routed * np.float32(d**-0.5)
        logits = jnp.matmul(
            routed, param(self, "router", (d, e), ("embed", None)).astype(dt), preferred_element_type=jnp.float32
        )
        if moe.router_bias:
            logits = logits + param(self, "router_bias", (e,), (None,), zeros)
        if moe.router == "sigmoid_group":
            correction = param(self, "router_correction", (e,), (None,), zeros)
            weights, experts = group_limited_topk(jax.nn.sigmoid(logits), correction, moe)
        elif moe.router == "scaled_softmax":
            weights, experts = jax.lax.top_k(jax.nn.softmax(logits, axis=-1), k)
            weights = weights / weights.sum(-1, keepdims=True)
            weights = weights * param(self, "expert_scale", (e,), (None,), nn.initializers.ones)[experts]
        elif moe.router == "softmax_topk":
            weights, experts = jax.lax.top_k(jax.nn.softmax(logits, axis=-1), k)
            if moe.norm_topk_prob:
                weights = weights / weights.sum(-1, keepdims=True)
        else:  # "topk_softmax"
            top, experts = jax.lax.top_k(logits, k)
            weights = jax.nn.softmax(top, axis=-1)
        weights = weights.astype(dt)  # as transformers: the routing weights in the compute dtype

        flat = experts.reshape(-1)  # [N * k], choice j of token n at n * k + j
        order = jnp.argsort(flat, stable=True)
        rows = tokens[order // k]  # [N * k, d], grouped by expert
        sizes = jnp.bincount(flat, length=e).astype(jnp.int32)
        chosen = flat[order]
        gate_up = param(self, "gate_up", (e, d, 2 * f), ("expert", "embed", "mlp")).astype(dt)
        h = jax.lax.ragged_dot(rows, gate_up, sizes)  # [N * k, 2F]
        if biased:
            h = h + param(self, "gate_up_bias", (e, 2 * f), ("expert", "mlp"), zeros).astype(dt)[chosen]
            gate, up = h[:, ::2], h[:, 1::2]
            gate = jnp.minimum(gate, moe.swiglu_limit)
            up = jnp.clip(up, -moe.swiglu_limit, moe.swiglu_limit)
            h = (up + 1) * (gate * jax.nn.sigmoid(gate * moe.swiglu_alpha))
        else:  # [gate | up]: SwiGLU, or GeGLU (Gemma 4)
            h = ACTIVATIONS["gelu_tanh" if moe.expert_mlp == "geglu" else "silu"](h[:, :f]) * h[:, f:]
        out = jax.lax.ragged_dot(h, param(self, "down", (e, f, d), ("expert", "mlp", "embed")).astype(dt), sizes)
        if biased:
            out = out + param(self, "down_bias", (e, d), ("expert", "embed"), zeros).astype(dt)[chosen]
        out = out * weights.reshape(-1)[order][:, None]
        combined = jnp.zeros_like(tokens).at[order // k].add(out)
        if moe.shared_expert_size:
            shared = SwiGLU(d, moe.shared_expert_size, dt, name="shared_expert")(x).reshape(-1, d)
            if moe.shared_expert_gated:
                gate = jnp.matmul(tokens, param(self, "shared_expert_gate", (d, 1), ("embed", None)).astype(dt))
                shared = jax.nn.sigmoid(gate) * shared
            combined = combined + shared
        return combined.reshape(x.shape)


def group_limited_topk(scores: Array, correction: Array, moe: MoEConfig) -> tuple[Array, Array]:
    """DeepSeek-V3's choice of experts (``DeepseekV3TopkRouter``; ``MoEConfig``'s ``sigmoid_group``).

    Args:
      scores: float32 ``[N, E]``, each expert's sigmoid score.
      correction: float32 ``[E]``, the bias added to the scores for choosing (never to the weights).

    Returns:
      ``(weights float32 [N, k], experts int32 [N, k])``: the experts chosen among the ``topk_groups``
      groups whose two best corrected scores sum highest, and their scores, renormalised (``+ 1e-20``)
      when ``norm_topk_prob``, times ``routed_scaling``.
    """
    n, e = scores.shape
    g = moe.num_groups
    choice = scores + correction
    grouped = choice.reshape(n, g, e // g)
    group_scores = jax.lax.top_k(grouped, min(2, e // g))[0].sum(-1)  # [N, G]
    _, kept = jax.lax.top_k(group_scores, moe.topk_groups)
    in_kept = jnp.any(kept[:, :, None] == jnp.arange(g), axis=1)  # [N, G]
    choice = jnp.where(jnp.repeat(in_kept, e // g, axis=1), choice, -jnp.inf)
    _, experts = jax.lax.top_k(choice, moe.experts_per_token)
    weights = jnp.take_along_axis(scores, experts, axis=1)
    if moe.norm_topk_prob:
        weights = weights / (weights.sum(-1, keepdims=True) + 1e-20)
    return weights * moe.routed_scaling, experts


def tree_mask(tree: Array, positions: Array, cache_len: int) -> tuple[Array, Array]:
    """The attention mask and key positions of a tree block written at slots ``start .. start + T - 1``
    (``start = positions[:, 0]``, the anchor's) on top of a cache of ``cache_len`` slots (SPEC "Tree
    verification" 2).

    Args:
      tree: bool ``[B, T, T]``, ``tree[b, i, j]``: block token ``i`` sees block token ``j`` (its
        ancestors and itself; nothing for a padding node, not even the cache).
      positions: int32 ``[B, T]``, each block token's position (``start + depth``).

    Returns:
      ``(mask bool [B, T, S], key_pos int32 [B, S])``: a block token sees the committed cache slots
      ``< start`` and the block tokens ``tree`` lets it; slot ``s`` holds position ``s`` before the
      block and the position of the block token written there inside it (what a sliding window
      compares).
    """
    t = tree.shape[1]
    start = positions[:, :1]
    slots = jnp.arange(cache_len, dtype=jnp.int32)[None, :]
    rel = slots - start  # [B, S]: the block token a slot holds, if 0 <= rel < T
    inside = (rel >= 0) & (rel < t)
    idx = jnp.clip(rel, 0, t - 1)
    key_pos = jnp.where(inside, jnp.take_along_axis(positions, idx, axis=1), slots)
    sees = jnp.take_along_axis(tree, jnp.broadcast_to(idx[:, None, :], (*tree.shape[:2], cache_len)), axis=2)
    any_seen = jnp.any(tree, axis=2, keepdims=True)  # a padding node sees nothing at all
    mask = jnp.where(inside[:, None, :], sees, (rel < 0)[:, None, :] & any_seen)
    return mask, key_pos


class DecoderLayer(nn.Module):
    """One decoder layer: the norm, the token mixer (attention, latent attention or Gated DeltaNet), the
    residual add, the norm, the MLP (dense, experts, or Gemma 4's both side by side), the residual add;
    Gemma's norms around each sublayer's output, Gemma 4's per-layer input and output scalar.

    Returns ``(x, cache, attended)`` (``Attention``'s ``attended``; None for the other mixers)."""

    cfg: TargetConfig
    layer: int = 0

    def norm(self, name: str, x: Array) -> Array:
        cfg = self.cfg
        return RMSNorm(cfg.rms_norm_eps, "norm", cfg.norm_zero_centered, cfg.norm_product_f32, name=name)(x)

    @nn.compact
    def __call__(self, x, positions, cache, lengths=None, tree=None, shared=None, per_layer=None):
        cfg, dt, attended = self.cfg, self.cfg.compute_dtype, None
        normed = self.norm("input_norm", x)
        if cfg.is_linear(self.layer):
            lin = cfg.linear
            mixer = GatedDeltaNet(
                cfg.hidden_size,
                lin.num_k_heads,
                lin.num_v_heads,
                lin.head_k_dim,
                lin.head_v_dim,
                lin.conv_kernel,
                cfg.rms_norm_eps,
                cfg.compute_dtype,
                name="linear_attn",
            )
            if tree is not None:
                raise ValueError(
                    "tree verification is not supported with linear-attention (Gated DeltaNet) layers: their "
                    "recurrent state has no per-node copy for the branches; verify one chain (--tree off)"
                )
            attn, cache = mixer(normed, cache, lengths)
        elif cfg.latent is not None:
            attn, cache = LatentAttention(cfg, name="attn")(normed, positions, cache, tree)
        else:
            attn, cache, attended = Attention(cfg, self.layer, name="attn")(normed, positions, cache, tree, shared)
        if cfg.sandwich_norms:  # Gemma: each sublayer's output normed before its residual add
            attn = self.norm("attn_out_norm", attn)
        x = x + attn
        beside = cfg.is_moe(self.layer) and cfg.moe.router == "scaled_softmax"  # Gemma 4: experts beside the MLP
        if cfg.is_moe(self.layer) and not beside:
            h = MoE(cfg, name="moe")(self.norm("post_attn_norm", x))
        else:
            width = cfg.intermediate_size * (2 if cfg.double_wide_mlp and cfg.kv_source(self.layer) is not None else 1)
            mlp = SwiGLU(cfg.hidden_size, width, dt, cfg.mlp_activation, name="mlp")
            h = mlp(self.norm("post_attn_norm", x))
        if beside:
            experts = MoE(cfg, name="moe")(self.norm("moe_in_norm", x), route=x)
            h = self.norm("mlp_out_norm_1", h) + self.norm("moe_out_norm", experts)
        if cfg.sandwich_norms:
            h = self.norm("mlp_out_norm", h)
        x = x + h
        if cfg.per_layer_input:  # Gemma 4: this layer's slice of the per-layer embeddings, gated by x
            p = cfg.per_layer_input
            gate = ACTIVATIONS[cfg.mlp_activation](
                x @ param(self, "per_layer_gate", (cfg.hidden_size, p), ("embed", None)).astype(dt)
            )
            h = (gate * per_layer) @ param(self, "per_layer_proj", (p, cfg.hidden_size), (None, "embed")).astype(dt)
            x = x + self.norm("per_layer_norm", h)
        if cfg.layer_scalar:
            x = x * param(self, "layer_scalar", (1,), (None,), nn.initializers.ones).astype(dt)
        return nn.with_logical_constraint(x, ("batch", "length", "act_embed")), cache, attended


class Target(nn.Module):
    """Decoder-only LM. One parameter set per layer (unrolled): fastest on XLA CPU (NOTES.md).

    ``__call__(tokens, positions, cache=None, tap_layers=())``:
      tokens, positions: int32 ``[B, T]`` (positions are absolute; with a cache, each
        row's block occupies positions ``positions[b, 0] .. positions[b, 0] + T - 1``).
      cache: ``None`` (causal forward over the block alone) or a ``KVCache``.
      tap_layers: static tuple of 0-based decoder layer ids whose **raw outputs** are
        returned (``hidden_states[i + 1]`` in transformers' convention).
      lengths: optional int32 ``[B]`` with a cache: row ``b`` keeps only its first ``lengths[b]``
        tokens in the linear-attention layers' state (right-padded prefill), returned committed.
        Without it those layers return a ``PendingLinear`` for ``commit_cache`` (verification,
        where the kept length is known only afterwards).
      tree: optional bool ``[B, T, T]`` with a cache: the block is a draft tree (``tree_mask``): token
        ``t`` is written at slot ``positions[b, 0] + t`` whatever its position, and sees the cache
        before the anchor and the block tokens ``tree`` lets it. Refused with linear-attention layers.

    Returns ``(hidden, taps, cache)``: hidden ``[B, T, d]`` after the final norm (feed
    it to ``logits``); taps ``[B, T, len(tap_layers) * d]`` (concatenated in the order
    given) or ``None``; the updated cache (or ``None``).
    """

    cfg: TargetConfig

    def setup(self):
        cfg = self.cfg
        self.embedding = param(self, "embedding", (cfg.vocab_size, cfg.hidden_size), ("vocab", "embed"))
        if not cfg.tie_word_embeddings:
            self.lm_head = param(self, "lm_head", (cfg.hidden_size, cfg.vocab_size), ("embed", "vocab"))
        if cfg.per_layer_input:  # Gemma 4's per-layer embeddings: a table and a projection of the embedding
            width = cfg.num_layers * cfg.per_layer_input
            self.per_layer_embedding = param(self, "per_layer_embedding", (cfg.per_layer_vocab, width), ("vocab", None))
            self.per_layer_projection = param(self, "per_layer_projection", (cfg.hidden_size, width), ("embed", None))
            self.per_layer_norm = RMSNorm(cfg.rms_norm_eps, product_f32=cfg.norm_product_f32)
        self.layers = [DecoderLayer(cfg, i, name=f"layers_{i}") for i in range(cfg.num_layers)]
        self.final_norm = RMSNorm(
            cfg.rms_norm_eps, zero_centered=cfg.norm_zero_centered, product_f32=cfg.norm_product_f32
        )

    def __call__(
        self,
        tokens: Array,
        positions: Array,
        cache: KVCache | None = None,
        tap_layers: Sequence[int] = (),
        lengths: Array | None = None,
        tree: Array | None = None,
    ):
        if tree is not None and cache is None:
            raise ValueError("a tree block is verified on top of a KV cache; pass the cache")
        x = self.embed(tokens)
        per_layer = self.per_layer_inputs(tokens, x) if self.cfg.per_layer_input else None
        taps, new_cache, attended = {}, [], {}
        for i, layer in enumerate(self.layers):
            source = self.cfg.kv_source(i)
            x, layer_cache, attended[i] = layer(
                x,
                positions,
                None if cache is None else cache[i],
                lengths,
                tree,
                None if source is None else attended[source],
                None if per_layer is None else per_layer[:, :, i],
            )
            new_cache.append(layer_cache)
            if i in tap_layers:
                taps[i] = x
        tapped = jnp.concatenate([taps[i] for i in tap_layers], axis=-1) if tap_layers else None
        return self.final_norm(x), tapped, (new_cache if cache is not None else None)

    def embed(self, tokens: Array) -> Array:
        """Token embeddings ``[..., d]`` in the compute dtype (Gemma: times ``sqrt(d)`` rounded to that
        dtype, as ``Gemma3TextScaledWordEmbedding``)."""
        cfg = self.cfg
        x = jnp.take(self.embedding, tokens, axis=0).astype(cfg.compute_dtype)
        if cfg.embed_scale:
            x = x * jnp.asarray(np.float32(cfg.hidden_size**0.5), cfg.compute_dtype)
        return nn.with_logical_constraint(x, ("batch", "length", "act_embed"))

    def per_layer_inputs(self, tokens: Array, x: Array) -> Array:
        """Gemma 4's per-layer embeddings ``[B, T, num_layers, per_layer_input]``: the token's row of the
        per-layer table (times its width's square root) plus the normed projection of its embedding ``x``
        (times ``hidden_size ** -0.5``), times ``2 ** -0.5`` (transformers' ``get_per_layer_inputs`` and
        ``project_per_layer_inputs``)."""
        cfg, dt = self.cfg, self.cfg.compute_dtype
        shape = (*tokens.shape, cfg.num_layers, cfg.per_layer_input)
        table = jnp.take(self.per_layer_embedding, tokens, axis=0).astype(dt)
        table = (table * jnp.asarray(np.float32(cfg.per_layer_input**0.5), dt)).reshape(shape)
        projected = (x @ self.per_layer_projection.astype(dt)) * np.float32(cfg.hidden_size**-0.5)
        return (self.per_layer_norm(projected.reshape(shape)) + table) * np.float32(2**-0.5)

    def head(self, hidden: Array) -> Array:
        """The LM head alone: ``[..., d]`` -> float32 ``[..., vocab]`` (a drafter's logits go through it
        and its own soft-cap, as the reference's ``target.lm_head``)."""
        dt = self.cfg.compute_dtype
        w = self.embedding.T if self.cfg.tie_word_embeddings else self.lm_head
        return jnp.matmul(hidden.astype(dt), w.astype(dt), preferred_element_type=jnp.float32)

    def logits(self, hidden: Array) -> Array:
        """The target's next-token logits: ``[..., d]`` -> float32 ``[..., vocab]``, the LM head then,
        where the config has one, the final soft-cap ``cap * tanh(logits / cap)`` (Gemma's
        ``final_logit_softcapping``)."""
        logits = self.head(hidden)
        cap = self.cfg.final_logit_softcap
        return jnp.tanh(logits / cap) * cap if cap else logits


def write_block(buf: Array, block: Array, start: Array) -> Array:
    """Write ``block`` ``[B, T, ...]`` into ``buf`` ``[B, S, ...]`` at per-row offsets ``start`` ``[B]``."""
    return jax.vmap(lambda b, x, s: jax.lax.dynamic_update_slice_in_dim(b, x, s, axis=0))(
        buf, block.astype(buf.dtype), start
    )


def init_cache(cfg: TargetConfig, batch: int, max_len: int, dtype=None) -> KVCache:
    """Empty cache: per attention layer a ``(k, v)`` pair of zeros ``[batch, max_len, KV, head_dim]`` (the
    layer's own; an empty tuple for a layer reusing another's, Gemma 4's ``kv_shared_layers``);
    per latent-attention (MLA) layer ``(latent, rotary key)`` zeros ``[batch, max_len, 1, kv_lora_rank]``
    and ``[batch, max_len, 1, qk_rope_head_dim]``; per linear-attention layer a zero
    ``deltanet.LinearState``."""
    dtype = dtype or cfg.compute_dtype
    cache = []
    for i in range(cfg.num_layers):
        shape = (batch, max_len, cfg.layer_kv_heads(i), cfg.layer_head_dim(i))
        if cfg.kv_source(i) is not None:  # Gemma 4: reads another layer's keys and values, caches nothing
            cache.append(())
            continue
        if cfg.latent is not None:
            lat = cfg.latent
            cache.append(
                tuple(jnp.zeros((batch, max_len, 1, n), dtype) for n in (lat.kv_lora_rank, lat.qk_rope_head_dim))
            )
            continue
        if cfg.is_linear(i):
            lin = cfg.linear
            channels = 2 * lin.num_k_heads * lin.head_k_dim + lin.num_v_heads * lin.head_v_dim
            conv = jnp.zeros((batch, lin.conv_kernel - 1, channels), dtype)
            cache.append(LinearState(conv, jnp.zeros((batch, lin.num_v_heads, lin.head_k_dim, lin.head_v_dim))))
        else:
            cache.append((jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)))
    return cache


def commit_cache(cache: list, keep: Array) -> KVCache:
    """The cache after a forward over a block, keeping row ``b``'s first ``keep[b]`` block tokens
    (``keep`` int32 ``[B]``): linear-attention layers replay them into their state
    (``deltanet.commit``); attention layers are already right (slots at or past the next position
    are overwritten before they are read). The identity for targets without linear attention."""
    return [commit(c, keep) if isinstance(c, PendingLinear) else c for c in cache]


def compact_cache(cache: list, start: Array, path: Array) -> KVCache:
    """The cache after a tree verify (``Target(tree=...)``) whose accept walk took ``path`` (int32
    ``[B, D + 1]``, the block slot of the path's token at each depth, ``tree.Accepted.path``): every
    attention layer's key/value rows of slots ``start + path[d]`` move to ``start + d``, so the
    accepted path lies in place, slot = position, and no other branch survives (SPEC "Tree
    verification" 4). Reads every moved row before writing (a path slot is never below its depth).

    Raises:
      ValueError: a linear-attention layer (their state has no per-node copy; trees are refused there).
    """
    out = []
    for c in cache:
        if not isinstance(c, tuple):
            raise ValueError("tree verification is not supported with linear-attention (Gated DeltaNet) layers")
        out.append(tuple(_move_rows(x, start, path) for x in c))
    return out


def _move_rows(x: Array, start: Array, path: Array) -> Array:
    """``x [B, S, ...]`` with rows ``start[b] + d`` replaced by rows ``start[b] + path[b, d]``."""

    def row(r, s, p):
        moved = jnp.take(r, s + p, axis=0)  # [D + 1, ...]
        return jax.lax.dynamic_update_slice_in_dim(r, moved, s, axis=0)

    return jax.vmap(row)(x, start, path)


def pad_pending(cache: list, block: int) -> list:
    """Pad the block axis of every ``PendingLinear`` to ``block`` tokens (masked: ``beta = g = 0``), so
    verify passes of different lengths return caches of one shape (``lax.switch``)."""

    def pad(c):
        if not isinstance(c, PendingLinear):
            return c
        extra = block - c.k.shape[1]

        def tail(x, axis=1):
            return jnp.pad(x, [(0, extra) if a == axis else (0, 0) for a in range(x.ndim)])

        return PendingLinear(tail(c.window), c.state, tail(c.k), tail(c.v), tail(c.g), tail(c.beta))

    return [pad(c) for c in cache]


def _variables(cfg: TargetConfig, seed: int = 0):
    """The one trace of ``Target.init`` (boxed variables with logical axis names)."""
    tokens = jnp.zeros((1, 1), jnp.int32)
    return Target(cfg).init(jax.random.PRNGKey(seed), tokens, tokens)


def init_params(cfg: TargetConfig, seed: int = 0):
    """Random parameters (plain pytree, float32) for tests and benchmarks."""
    return nn.meta.unbox(_variables(cfg, seed))["params"]


def param_shapes(cfg: TargetConfig):
    """``jax.ShapeDtypeStruct`` pytree of ``init_params(cfg)`` (traced; nothing is computed)."""
    return jax.eval_shape(lambda: init_params(cfg))


def param_logical_specs(cfg: TargetConfig):
    """Pytree of logical ``PartitionSpec`` matching ``init_params(cfg)``."""
    return nn.get_partition_spec(jax.eval_shape(lambda: _variables(cfg)))["params"]
