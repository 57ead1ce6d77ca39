"""Test helpers: tiny Hugging Face models (random weights) written as real HF folders."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import jax
import numpy as np

TINY = dict(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
)


@partial(jax.jit, static_argnames=("cfg", "taps"))
def _target_apply(params, tokens, positions, cache, lengths, tree, *, cfg, taps):
    from dflash_jax.target import Target

    model = Target(cfg)
    hidden, feats, cache = model.apply({"params": params}, tokens, positions, cache, taps, lengths, tree)
    return model.apply({"params": params}, hidden, method="logits"), hidden, feats, cache


def target_forward(ck, tokens, positions=None, cache=None, taps=(), lengths=None, tree=None):
    """``Target(ck.cfg)``'s forward compiled as one program per shape (the tests' way to call the model:
    run op by op, every op compiles for its own shapes, several times slower here).

    Returns (logits [B, T, V] float32 numpy, hidden [B, T, d], features [B, T, len(taps) * d], cache).
    """
    if positions is None:
        positions = np.broadcast_to(np.arange(np.shape(tokens)[1]), np.shape(tokens))
    logits, hidden, feats, cache = _target_apply(
        ck.params, tokens, positions, cache, lengths, tree, cfg=ck.cfg, taps=tuple(taps)
    )
    return np.asarray(logits), hidden, feats, cache


def tiny_tokenizer(vocab_size: int):
    """A word-level tokenizer whose tokens are 't0'..'tN' plus chat specials, as a HF fast tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<|im_start|>", "<|im_end|>", "<mask>"]
    vocab = {s: i for i, s in enumerate(specials)}
    for i in range(len(specials), vocab_size):
        vocab[f"t{i}"] = i
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk, unk_token="<unk>", eos_token="<|im_end|>", bos_token="<|im_start|>", pad_token="<|im_end|>"
    )
    tok.chat_template = (
        "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> {% endfor %}"
        "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
    )
    return tok


def make_hf_model(family: str, folder: Path, seed: int = 0, std: float = 0.2, **overrides):
    """Save a random tiny ``family`` model (llama, qwen2, qwen3, qwen3_moe, gpt_oss, qwen3_5, qwen3_5_moe, gemma3,
    deepseek_v3, glm4_moe)
    with a tokenizer to ``folder``.

    Weights are drawn with std 0.2 by default (not HF's 0.02) so logits are far from uniform
    and argmax ties are improbable. Returns the torch model (float32, eval mode).
    """
    import torch
    import transformers

    kw = dict(TINY, **overrides)
    cls = {
        "llama": transformers.LlamaConfig,
        "qwen2": transformers.Qwen2Config,
        "qwen3": transformers.Qwen3Config,
        "qwen3_moe": transformers.Qwen3MoeConfig,
        "gpt_oss": transformers.GptOssConfig,
        "qwen3_5": transformers.Qwen3_5TextConfig,
        "qwen3_5_moe": transformers.Qwen3_5MoeTextConfig,
        "gemma3": transformers.Gemma3TextConfig,
        "deepseek_v3": transformers.DeepseekV3Config,
        "glm4_moe": transformers.Glm4MoeConfig,
        "gemma4": transformers.Gemma4TextConfig,
    }[family]
    if family == "qwen3_5_moe":  # every layer has experts: the config has no dense intermediate_size
        kw.pop("intermediate_size")
    tie = kw.pop("tie_word_embeddings", False)
    config = cls(**kw, tie_word_embeddings=tie)
    torch.manual_seed(seed)
    # eager attention: the one transformers implementation of gpt-oss's attention sinks on CPU
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(std * torch.randn_like(p))
        for name, b in model.named_buffers():  # saved buffers: DeepSeek-V3's router correction, Gemma 4's scalars
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.1 * torch.randn_like(b))
            elif name.endswith("layer_scalar"):
                b.copy_(1.0 + 0.2 * torch.randn_like(b))
    model.save_pretrained(folder, safe_serialization=True)
    tiny_tokenizer(kw["vocab_size"]).save_pretrained(folder)
    return model


# float32 parity is judged relative to the scale of the compared tensor (SPEC "What
# token-identical means in floating point"): torch and XLA sum in other orders, and the error
# of a float32 sum grows with the size of its terms, so an absolute tolerance that passes at
# one magnitude fails at another (a SmolLM2 tap with values up to 94 missed atol=1e-3 by 3%).
# Measured worst cases, max |got - want| / max |want|: tiny random models 3.5e-6 (logits ~6),
# SmolLM2-135M logits 2.7e-6 (~40), its layer-28 tap 1.1e-5 (values up to 94).
# Llama 3 RoPE scaling for the tiny Llama (a context of 64 so that the scaling changes frequencies)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}

# Gemma 3: a sliding (window 8) and a global layer, each with its own RoPE (the global one
# linearly scaled), attention scaled by query_pre_attn_scalar (not head_dim), a final logit soft-cap
# (Gemma 3 releases have none; it proves the path), a tied head
GEMMA3 = dict(
    tie_word_embeddings=True,
    num_hidden_layers=2,  # one of each kind (compiles in half the time of four)
    sliding_window=8,
    layer_types=["sliding_attention", "full_attention"],
    query_pre_attn_scalar=24,
    final_logit_softcapping=30.0,
    rope_scaling={"rope_type": "linear", "factor": 4.0},
)

# DeepSeek-V3: multi-head latent attention (query rank 24, latent 16, 8 + 8 query/key dims of which 8
# rotary, interleaved; values of 12), YaRN with mscale_all_dim (the attention scale's factor), a dense
# layer then one with 8 experts in 4 groups (2 kept, 2 experts a token), a shared expert, routed scaling 2.5
DEEPSEEK_V3 = dict(
    num_hidden_layers=2,  # the dense layer and one with experts
    num_key_value_heads=4,
    head_dim=8,  # transformers' RoPE reads head_dim, which DeepseekV3Config means to be qk_rope_head_dim
    q_lora_rank=24,
    kv_lora_rank=16,
    qk_nope_head_dim=8,
    qk_rope_head_dim=8,
    v_head_dim=12,
    n_routed_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    n_group=4,
    topk_group=2,
    first_k_dense_replace=1,
    rope_parameters={
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 128,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    },
)
# GLM-4.5: grouped-query attention with half the head rotary, q/k norms, q/k/v biases; a dense layer
# then one with 8 experts in 2 groups (1 kept), a shared expert
GLM4_MOE = dict(
    num_hidden_layers=2,
    n_routed_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    n_group=2,
    topk_group=1,
    first_k_dense_replace=1,
    use_qk_norm=True,
    attention_bias=True,
    routed_scaling_factor=1.5,
)

# Gemma 4: sliding (window 8) and full layers alternating, full layers with heads of 32 and one
# key/value head equal to its values, proportional RoPE; the last two layers reusing earlier keys and
# values with double-wide MLPs; per-layer embeddings of 8; a soft-cap
GEMMA4 = dict(
    tie_word_embeddings=True,
    sliding_window=8,
    layer_types=["sliding_attention", "full_attention"] * 2,
    global_head_dim=32,
    num_global_key_value_heads=1,
    attention_k_eq_v=True,
    num_kv_shared_layers=2,
    hidden_size_per_layer_input=8,
    vocab_size_per_layer_input=96,
    use_double_wide_mlp=True,
    final_logit_softcapping=30.0,
)
# Gemma 4 with experts beside each MLP (26B-A4B's block): 8 experts of 32, 2 a token
GEMMA4_MOE = dict(GEMMA4, enable_moe_block=True, num_experts=8, top_k_experts=2, moe_intermediate_size=32)

TINY_REL = 2e-5  # tiny random float32 models: about 5x the worst measured
# Qwen3.5's Gated DeltaNet layers: the chunked delta rule (a triangular solve per chunk, exponentials
# of cumulative decays) rounds differently from transformers' loop; worst measured 3.6e-5 (3 seeds)
HYBRID_REL = 1e-4
REAL_REL = 5e-5  # 30-layer SmolLM2-135M in float32: about 4.5x the worst measured


def assert_close(got, want, rel: float, err_msg: str = "") -> None:
    """``|got - want| <= rel * max|want|`` elementwise: a scale-relative float32 parity check.

    The bound is one number for the whole tensor, so small entries are held to the error that the
    large ones (which dominate every sum they enter) leave behind.
    """
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = float(np.abs(want).max())
    assert scale > 0, "comparing against an all-zero tensor says nothing"
    np.testing.assert_allclose(got, want, rtol=0, atol=rel * scale, err_msg=err_msg)


def hf_logits(model, tokens: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.as_tensor(tokens, dtype=torch.long)).logits.float().numpy()


class OracleDraft:
    """A draft step (see ``Decoder``) that proposes the target's own greedy continuation.

    Its "parameters" are ``{"cont": int32 [n, W], "err": bool [n, W]}``: the greedy token at
    every absolute position of each sequence, and where to inject a wrong token instead
    (``(token + 1) % vocab``). With it, the acceptance length of every round is known in
    advance (``expected_rounds``), so the loop's accept/commit logic is tested without a
    trained drafter. Padded batch rows reuse the last sequence.
    """

    tap_layers = ()

    def __init__(self, vocab_size: int, max_block_size: int):
        self.vocab_size, self.max_block_size = vocab_size, max_block_size
        self.default_block_size = max_block_size

    def init_cache(self, batch, cache_len):
        return None

    def write_context(self, params, cache, feats, start):
        return cache

    def draft(self, params, target_params, cache, anchor, start, block_valid, block_len, *, tokens=None):
        import jax
        import jax.numpy as jnp

        rows = jnp.minimum(jnp.arange(anchor.shape[0]), params["cont"].shape[0] - 1)
        take = jax.vmap(lambda r, s: jax.lax.dynamic_slice_in_dim(r, s + 1, block_len - 1))
        tok = take(params["cont"][rows], start)
        err = take(params["err"][rows], start)
        return jnp.where(err, (tok + 1) % self.vocab_size, tok).astype(jnp.int32)

    def propose(self, params, target_params, cache, anchor, start, block_valid, block_len, *, tokens, key, sampling):
        """``draft``'s tokens as a ``steps.Draft`` (greedy only): all real, each trusted fully."""
        import jax.numpy as jnp

        from dflash_jax.steps import Draft, all_real

        draft = self.draft(params, target_params, cache, anchor, start, block_valid, block_len)
        return Draft(draft, all_real(draft), jnp.ones(draft.shape, jnp.float32))


def oracle_params(prompts, greedy, errors, width=1024):
    """``OracleDraft`` parameters from prompts, their greedy new tokens and error positions (absolute)."""
    cont = np.zeros((len(prompts), width), np.int32)
    err = np.zeros((len(prompts), width), bool)
    for i, (p, g, e) in enumerate(zip(prompts, greedy, errors)):
        seq = list(p) + list(g)
        cont[i, : len(seq)] = seq
        err[i, sorted(e)] = True
    return {"cont": cont, "err": err}


def expected_rounds(prompt_len, greedy, errors, block_size, max_new, stop_ids=()):
    """Tokens committed per round, by the SPEC rule, for a drafter that is right except at ``errors``.

    ``greedy[i]`` is the target's greedy token at absolute position ``prompt_len + i``. A round at
    ``start`` drafts positions ``start+1 .. start+v-1`` (``v = min(B, limit - start)``), accepts
    up to the first error, adds the bonus token, and is cut at the length limit and after the
    first stop token.
    """
    limit = prompt_len + max_new
    start, rounds = prompt_len, []
    if greedy[0] in stop_ids:
        return rounds
    while start + 1 < limit:
        v = min(block_size, limit - start)
        a = 0
        while a < v - 1 and start + 1 + a not in errors:
            a += 1
        produced = min(a + 1, limit - start - 1)
        new = greedy[start + 1 - prompt_len : start + 1 - prompt_len + produced]
        hits = [i for i, t in enumerate(new) if t in stop_ids]
        if hits:
            produced = hits[0] + 1
        rounds.append(produced)
        start += produced
        if hits:
            break
    return rounds


def stale_scratch(out: Path) -> Path:
    """The scratch folder a dflash-jax process killed while writing ``out`` leaves beside it
    (``utils.atomic_folder``): its name, marker file and a process id that no longer runs."""
    import socket
    import subprocess
    import sys

    from dflash_jax.utils import SCRATCH_FILE

    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    pid, host = int(dead.stdout), socket.gethostname()
    folder = out.parent / f".{out.name}.dflash-jax-partial-{host}-{pid}-abc123"
    folder.mkdir(parents=True)
    (folder / SCRATCH_FILE).write_text(f"{host} {pid}")
    (folder / "params").mkdir()  # half-written content
    return folder


def write_tiny_qwen3_moe_gguf(folder: Path, omit: tuple[str, ...] = ()):
    """A tiny random Qwen3-MoE (2 layers, width 64, 4 experts of 768: transformers' GGUF reader takes the
    expert width from its default) saved twice: as an HF folder ``folder/hf`` and as a float32 GGUF
    ``folder/tiny-moe.gguf`` with llama.cpp's tensor names (but those in ``omit``) and the embedded
    SmolLM2's tokenizer. Returns the GGUF path."""
    import gguf
    import torch
    import transformers

    from dflash_jax import hub

    src = gguf.GGUFReader(str(hub.smollm2_gguf()))
    vocab = len(src.fields["tokenizer.ggml.tokens"].data)
    sizes = dict(hidden_size=64, intermediate_size=96, moe_intermediate_size=768, num_hidden_layers=2)
    sizes.update(num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=4, num_experts_per_tok=2)
    cfg = transformers.Qwen3MoeConfig(vocab_size=vocab, norm_topk_prob=True, max_position_embeddings=512, **sizes)
    torch.manual_seed(0)
    model = transformers.Qwen3MoeForCausalLM(cfg).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_((1 + 0.1 * torch.randn_like(p)) if name.endswith("norm.weight") else 0.05 * torch.randn_like(p))
    model.save_pretrained(folder / "hf")
    weights = {k: v.numpy() for k, v in model.state_dict().items()}  # transformers 5: experts fused in memory
    path = folder / "tiny-moe.gguf"
    w, arch = gguf.GGUFWriter(str(path), "qwen3moe"), "qwen3moe"
    for key, value in dict(
        block_count=2, context_length=512, embedding_length=64, feed_forward_length=96, vocab_size=vocab
    ).items():
        w.add_uint32(f"{arch}.{key}", value)
    for key, value in {"head_count": 4, "head_count_kv": 2, "key_length": 16, "value_length": 16}.items():
        w.add_uint32(f"{arch}.attention.{key}", value)
    w.add_uint32(f"{arch}.expert_count", 4)
    w.add_uint32(f"{arch}.expert_used_count", 2)
    w.add_uint32(f"{arch}.expert_feed_forward_length", 768)
    w.add_float32(f"{arch}.rope.freq_base", float(cfg.rope_parameters["rope_theta"]))
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", cfg.rms_norm_eps)
    for key, field in src.fields.items():  # the tokenizer, as the SmolLM2 GGUF has it
        if not key.startswith("tokenizer."):
            continue
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            strings = field.types[-1] == gguf.GGUFValueType.STRING
            values = [bytes(field.parts[i]).decode() if strings else field.parts[i].tolist()[0] for i in field.data]
            w.add_array(key, values)
        elif kind == gguf.GGUFValueType.STRING:
            w.add_string(key, bytes(field.parts[field.data[0]]).decode())
        else:
            add = {gguf.GGUFValueType.UINT32: w.add_uint32, gguf.GGUFValueType.BOOL: w.add_bool}[kind]
            add(key, field.parts[field.data[0]].tolist()[0])
    add_tensor = w.add_tensor
    w.add_tensor = lambda name, value: None if name in omit else add_tensor(name, value)
    top = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
    for hf, name in top.items():
        w.add_tensor(f"{name}.weight", weights[f"{hf}.weight"])
    per_layer = {
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "self_attn.q_norm": "attn_q_norm",
        "self_attn.k_norm": "attn_k_norm",
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
        "mlp.gate": "ffn_gate_inp",
    }
    for i in range(2):
        for hf, name in per_layer.items():
            w.add_tensor(f"blk.{i}.{name}.weight", weights[f"model.layers.{i}.{hf}.weight"])
        gate_up = weights[f"model.layers.{i}.mlp.experts.gate_up_proj"]  # [E, 2F, d], gate first
        w.add_tensor(f"blk.{i}.ffn_gate_exps.weight", np.ascontiguousarray(gate_up[:, :768]))
        w.add_tensor(f"blk.{i}.ffn_up_exps.weight", np.ascontiguousarray(gate_up[:, 768:]))
        w.add_tensor(f"blk.{i}.ffn_down_exps.weight", weights[f"model.layers.{i}.mlp.experts.down_proj"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


class OracleTree(OracleDraft):
    """A tree draft step whose first branch is wrong from its first token and whose second holds the
    target's greedy continuation (``OracleDraft``'s parameters, with its ``err`` positions wrong on
    the second branch too): every round accepts the second branch as far as the chain oracle would,
    which only holds if the verify's mask, positions and the commit's compaction are right. Node
    layout: ``wrong`` nodes of a chain of wrong tokens, then the ``K`` nodes of the continuation,
    then padding up to ``tree_size``."""

    def __init__(self, vocab_size: int, max_block_size: int, wrong: int = 3, padding: int = 2):
        super().__init__(vocab_size, max_block_size)
        self.wrong = wrong
        self.tree_size = wrong + max_block_size - 1 + padding

    def propose(self, params, target_params, cache, anchor, start, block_valid, block_len, *, tokens, key, sampling):
        import jax.numpy as jnp

        from dflash_jax.steps import Draft, all_real
        from dflash_jax.tree import Tree

        good = self.draft(params, target_params, cache, anchor, start, block_valid, block_len)  # [B, K]
        b, k = good.shape
        w, pad = self.wrong, self.tree_size - self.wrong - k
        bad = (good[:, :w] + 7) % self.vocab_size  # never the right token at depth 1
        tok = jnp.concatenate([bad, good, jnp.zeros((b, pad), jnp.int32)], axis=1)
        parent = jnp.asarray([-1, *range(w - 1)] + [-1, *range(w, w + k - 1)] + [-1] * pad, jnp.int32)
        depth = jnp.asarray([*range(1, w + 1), *range(1, k + 1)] + [0] * pad, jnp.int32)
        valid = jnp.asarray([True] * (w + k) + [False] * pad)
        tree = Tree(
            tok,
            jnp.broadcast_to(parent, tok.shape),
            jnp.broadcast_to(depth, tok.shape),
            jnp.zeros(tok.shape, jnp.float32),
            jnp.broadcast_to(valid, tok.shape),
        )
        return Draft(good, all_real(good), jnp.ones(good.shape, jnp.float32), None, tree)
