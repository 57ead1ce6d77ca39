"""The Flax target equals Hugging Face transformers, with and without a KV cache, with padding."""

import numpy as np
import pytest
from helpers import HYBRID_REL, LLAMA3_ROPE, TINY, TINY_REL, assert_close, hf_logits, target_forward

from dflash_jax import checkpoint, hf_format
from dflash_jax.errors import ConfigError
from dflash_jax.target import commit_cache, init_cache


def _forward(ck, tokens, positions=None, cache=None, taps=(), lengths=None):
    logits, _, feats, cache = target_forward(ck, tokens, positions, cache, taps, lengths)
    return logits, feats, cache


FAMILIES = ["llama", "qwen2", "qwen3", "qwen3_moe", "gpt_oss", "qwen3_5", "qwen3_5_moe", "gemma3", "deepseek_v3"]
FAMILIES += ["glm4_moe", "gemma4", "gemma4_moe"]


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_equal_transformers(tiny_models, family):
    hf, _, path = tiny_models[family]
    ck = checkpoint.load_target(path)
    hybrid = ck.cfg.linear is not None
    length = 150 if hybrid else 50  # Qwen3.5: three chunks of the delta rule, the last padded
    tokens = np.random.RandomState(1).randint(0, TINY["vocab_size"], (3, length))
    ours, _, _ = _forward(ck, tokens)
    ref = hf_logits(hf, tokens)
    assert_close(ours, ref, HYBRID_REL if hybrid else TINY_REL)
    assert (ours.argmax(-1) == ref.argmax(-1)).all()


def test_taps_are_raw_layer_outputs(tiny_models):
    import torch

    hf, _, path = tiny_models["llama"]
    ck = checkpoint.load_target(path)
    tokens = np.random.RandomState(2).randint(0, TINY["vocab_size"], (1, 20))
    _, feats, _ = _forward(ck, tokens, taps=(0, 2))
    with torch.no_grad():
        hs = hf(torch.as_tensor(tokens), output_hidden_states=True).hidden_states
    d = TINY["hidden_size"]
    # layer i's output is hidden_states[i + 1] in transformers' convention
    assert_close(np.asarray(feats)[..., :d], hs[1].numpy(), TINY_REL)
    assert_close(np.asarray(feats)[..., d:], hs[3].numpy(), TINY_REL)


CACHED = ["llama", "qwen3", "qwen3_moe", "gpt_oss", "qwen3_5", "gemma3", "deepseek_v3", "gemma4"]


@pytest.mark.parametrize("family", CACHED)
def test_cached_blocks_equal_full_forward(tiny_models, family):
    """Blocks on top of the cache give the full forward's logits (gpt-oss, Gemma 3: sliding window 8,
    so blocks see keys leave their window; Qwen3.5: the recurrent state carried through commits;
    DeepSeek-V3: the latent cache; Gemma 4: layers reading earlier layers' caches)."""
    _, _, path = tiny_models[family]
    ck = checkpoint.load_target(path)
    tokens = np.random.RandomState(3).randint(0, TINY["vocab_size"], (2, 37))
    full, full_feats, _ = _forward(ck, tokens, taps=(1,))
    cache = init_cache(ck.cfg, 2, 64)
    got, got_feats, start = [], [], 0
    for size in (9, 1, 16, 4, 7):  # blocks of varying size on top of the cache
        block = tokens[:, start : start + size]
        pos = np.broadcast_to(np.arange(start, start + size), block.shape)
        logits, feats, cache = _forward(ck, block, pos, cache, taps=(1,))
        cache = commit_cache(cache, np.full(2, size))
        got.append(logits)
        got_feats.append(np.asarray(feats))
        start += size
    # Same math, different key counts per softmax: float32 noise only.
    assert_close(np.concatenate(got, 1), full, TINY_REL)
    assert_close(np.concatenate(got_feats, 1), np.asarray(full_feats), TINY_REL)
    assert (np.concatenate(got, 1).argmax(-1) == full.argmax(-1)).all()


@pytest.mark.parametrize("family", ["qwen2", "qwen3_moe", "gpt_oss", "qwen3_5", "gemma3", "gemma4_moe"])
def test_padding_changes_no_sequence(tiny_models, family):
    """A row's logits do not depend on the other rows of its batch or on its padding (with experts:
    on which tokens share an expert), in the padded prefill and in the block after it (Qwen3.5: the
    state kept at each row's own length, the padding never entering it)."""
    _, _, path = tiny_models[family]
    ck = checkpoint.load_target(path)
    rs = np.random.RandomState(4)
    lens = [5, 23, 12]
    seqs = [rs.randint(0, TINY["vocab_size"], n) for n in lens]
    batch = np.zeros((3, 32), np.int64)
    for i, s in enumerate(seqs):
        batch[i, : len(s)] = s
        batch[i, len(s) :] = rs.randint(0, TINY["vocab_size"], 32 - len(s))  # arbitrary padding
    padded, _, cache = _forward(ck, batch, cache=init_cache(ck.cfg, 3, 64), lengths=np.asarray(lens))
    recurrent = ck.cfg.linear is not None  # the block after the prefill reads the state kept at each length
    if recurrent:
        following = rs.randint(0, TINY["vocab_size"], (3, 4))
        after, _, _ = _forward(ck, following, np.asarray(lens)[:, None] + np.arange(4), cache)
    for i, s in enumerate(seqs):
        alone, _, one = _forward(ck, s[None], cache=init_cache(ck.cfg, 1, 64), lengths=np.asarray([len(s)]))
        assert_close(padded[i, : len(s)], alone[0], TINY_REL)
        if recurrent:
            next_alone, _, _ = _forward(ck, following[i : i + 1], len(s) + np.arange(4)[None], one)
            assert_close(after[i], next_alone[0], TINY_REL)


BASE = {
    "model_type": "qwen2",
    "vocab_size": 10,
    "hidden_size": 8,
    "intermediate_size": 16,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
}


@pytest.mark.parametrize(
    "patch, message",
    [
        ({"model_type": "mistral"}, "model_type 'mistral' is not supported; supported families: llama, qwen2, "),
        ({"use_sliding_window": True}, "use_sliding_window"),
        ({"rope_scaling": {"rope_type": "dynamic", "factor": 4.0}}, "rope type 'dynamic'"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "yarn rope scaling needs"),
        ({"layer_types": ["sliding_attention"]}, "layer_types .* not supported for qwen2"),
        ({"model_type": "gpt_oss", "layer_types": ["full_attention"] * 2}, "layer_types has 2 entries"),
        ({"model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 5}, "num_experts_per_tok"),
        ({"model_type": "gpt_oss", "quantization_config": {"quant_method": "mxfp4"}}, "quant_method 'mxfp4'"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 4.0}}, "missing"),
        ({"hidden_act": "gelu"}, "hidden_act"),
    ],
)
def test_unsupported_config_is_a_clear_error(patch, message):
    with pytest.raises(ConfigError, match=message):
        hf_format.read_config({**BASE, **patch})


def test_config_reads_both_rope_layouts():
    old = hf_format.read_config({**BASE, "rope_theta": 5e5})
    new = hf_format.read_config({**BASE, "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}})
    assert old == new and old.rope_theta == 5e5 and old.qkv_bias


@pytest.mark.parametrize(
    "patch, digest",
    [
        (
            {"model_type": "llama", "rope_scaling": LLAMA3_ROPE, "attention_bias": True},
            "6b5b2d0e598c878acca4f169ce767e0592b5884f24728d5d0661e2743b3d177a",
        ),
        ({"model_type": "qwen2"}, "6ee4c04c4d5f89b9dfc70f1c2ece5f227f6588228e1e6f5386695e84a7ea19d7"),
        (
            {"model_type": "qwen3", "tie_word_embeddings": True},
            "2fe51c40471e9212a1dcff92ed10b6043af0683b37f343c96eafc8ea32821936",
        ),
    ],
)
def test_dense_config_hash_is_what_it_was(patch, digest):
    """Dense targets converted before the mixture-of-experts fields existed keep their identity: the
    digests are the ones the code before those fields computed (commit 67c6500)."""
    assert checkpoint.config_hash(hf_format.read_config({**BASE, **patch})) == digest
    moe = {**BASE, "model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 2, "num_key_value_heads": 2}
    moe = hf_format.read_config(moe)
    assert "moe" in moe.hash_fields() and checkpoint.config_hash(moe) != digest


@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss"])
def test_defaults_of_a_minimal_config_are_transformers(family):
    """A config.json that leaves fields out reads as transformers' config class fills them in."""
    import transformers

    minimal = {"model_type": family, "vocab_size": 32, "hidden_size": 64, "num_hidden_layers": 4}
    minimal.update(num_attention_heads=16, intermediate_size=48)
    ours = hf_format.read_config(minimal)
    theirs = transformers.AutoConfig.for_model(**minimal)
    assert ours.num_kv_heads == theirs.num_key_value_heads
    assert ours.head_dim == (getattr(theirs, "head_dim", None) or theirs.hidden_size // theirs.num_attention_heads)
    assert ours.rms_norm_eps == theirs.rms_norm_eps
    assert ours.moe.experts_per_token == theirs.num_experts_per_tok
    assert ours.qkv_bias == ours.o_bias == theirs.attention_bias
    if family == "qwen3_moe":
        assert ours.moe.num_experts == theirs.num_experts and ours.moe.norm_topk_prob == theirs.norm_topk_prob
        assert ours.moe.intermediate_size == theirs.moe_intermediate_size and ours.yarn is None
        assert ours.rope_theta == theirs.rope_parameters["rope_theta"]
    else:
        assert ours.moe.num_experts == theirs.num_local_experts
        assert list(ours.layer_types) == theirs.layer_types and ours.sliding_window == theirs.sliding_window
        rope = {k: float(v) for k, v in theirs.rope_parameters.items() if k not in ("rope_type", "rope_theta")}
        assert dict(ours.yarn) == rope and ours.rope_theta == theirs.rope_parameters["rope_theta"]
        explicit = hf_format.read_config({**minimal, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}})
        assert explicit.yarn is None  # rope parameters given: no YaRN default, as transformers


@pytest.mark.parametrize("family", ["qwen3_5_text", "qwen3_5_moe_text"])
def test_defaults_of_a_minimal_hybrid_config_are_transformers(family):
    """Qwen3.5 (-MoE) text configs that leave fields out read as transformers' config classes fill them in."""
    import transformers

    minimal = {"model_type": family, "vocab_size": 32, "hidden_size": 64, "num_hidden_layers": 8}
    minimal.update(num_attention_heads=16, **({"intermediate_size": 48} if family == "qwen3_5_text" else {}))
    ours = hf_format.read_config(minimal)
    theirs = transformers.AutoConfig.for_model(**minimal)
    assert ours.num_kv_heads == theirs.num_key_value_heads and ours.head_dim == theirs.head_dim
    assert list(ours.layer_types) == theirs.layer_types and ours.rms_norm_eps == theirs.rms_norm_eps
    assert ours.partial_rotary_factor == theirs.rope_parameters["partial_rotary_factor"]
    assert ours.rope_theta == theirs.rope_parameters["rope_theta"]
    lin = ours.linear
    assert (lin.num_k_heads, lin.num_v_heads) == (theirs.linear_num_key_heads, theirs.linear_num_value_heads)
    assert (lin.head_k_dim, lin.head_v_dim) == (theirs.linear_key_head_dim, theirs.linear_value_head_dim)
    assert lin.conv_kernel == theirs.linear_conv_kernel_dim
    assert ours.max_position_embeddings == theirs.max_position_embeddings
    if family == "qwen3_5_moe_text":
        moe = ours.moe
        assert (moe.num_experts, moe.experts_per_token) == (theirs.num_experts, theirs.num_experts_per_tok)
        assert moe.intermediate_size == theirs.moe_intermediate_size
        assert moe.shared_expert_size == theirs.shared_expert_intermediate_size and moe.norm_topk_prob
        assert moe.layers == tuple(range(8))
    else:
        assert ours.moe is None and ours.intermediate_size == 48


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen3_5_moe", "deepseek_v3"])
def test_fused_expert_checkpoint_loads(tmp_path, tiny_models, family):
    """transformers 5's fused expert layout (``save_original_format=False``) loads like the per-expert one."""
    hf, hf_dir, path = tiny_models[family]
    hf.save_pretrained(tmp_path / "fused", save_original_format=False)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (hf_dir / name).exists():
            (tmp_path / "fused" / name).write_bytes((hf_dir / name).read_bytes())
    from safetensors import safe_open

    layer = checkpoint.load_target(path).cfg.moe.layers[0]  # DeepSeek-V3: a dense layer first
    with safe_open(str(next((tmp_path / "fused").glob("*.safetensors"))), "numpy") as f:
        assert f"model.layers.{layer}.mlp.experts.gate_up_proj" in f.keys()
    fused = checkpoint.load_hf_params(tmp_path / "fused", checkpoint.load_target(path).cfg)
    per_expert = checkpoint.load_target(path).params
    for name in ("gate_up", "down"):
        want = np.asarray(per_expert[f"layers_{layer}"]["moe"][name])
        np.testing.assert_array_equal(fused[f"layers_{layer}"]["moe"][name], want)


def test_rejected_tokens_leave_no_trace_in_the_recurrent_state(tiny_models):
    """Qwen3.5: blocks of 8 where only the first ``keep`` tokens are real (the rest random, as
    rejected draft tokens are), committed at ``keep`` per row: the kept tokens' logits equal the
    full forward's, so nothing of a rejected token stays in the linear layers' state."""
    _, _, path = tiny_models["qwen3_5"]
    ck = checkpoint.load_target(path)
    rs = np.random.RandomState(5)
    tokens = rs.randint(0, TINY["vocab_size"], (2, 48))
    full, _, _ = _forward(ck, tokens)
    cache, start = init_cache(ck.cfg, 2, 64), np.zeros(2, np.int64)
    got = [[], []]
    while start.min() < 30:
        keep = np.minimum(rs.randint(0, 9, 2), 48 - start)  # 0 .. 8 per row (0: keeps nothing this round)
        block = rs.randint(0, TINY["vocab_size"], (2, 8))
        for b in range(2):
            block[b, : keep[b]] = tokens[b, start[b] : start[b] + keep[b]]
        pos = start[:, None] + np.arange(8)
        logits, _, cache = _forward(ck, block, pos, cache)
        cache = commit_cache(cache, keep)
        for b in range(2):
            got[b].append(logits[b, : keep[b]])
        start += keep
    for b in range(2):
        kept = np.concatenate(got[b])
        assert_close(kept, full[b, : len(kept)], TINY_REL)


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_5_moe"])
def test_multimodal_qwen3_5_checkpoint_converts_to_its_language_model(tmp_path, family):
    """A Qwen3.5 (-MoE) checkpoint with its vision tower (``model.language_model.*``, ``model.visual.*``):
    the target is the language model, equal to transformers' text forward; the vision weights are skipped."""
    import torch
    import transformers
    from helpers import tiny_tokenizer

    text = dict(
        TINY, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16
    )
    if family == "qwen3_5_moe":
        text.pop("intermediate_size")
        text.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48)
    vision = dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=TINY["hidden_size"])
    classes = {
        "qwen3_5": (transformers.Qwen3_5Config, transformers.Qwen3_5ForConditionalGeneration),
        "qwen3_5_moe": (transformers.Qwen3_5MoeConfig, transformers.Qwen3_5MoeForConditionalGeneration),
    }
    config_class, model_class = classes[family]
    config = config_class(text_config=text, vision_config=vision)
    torch.manual_seed(0)
    model = model_class(config).float().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.2 * torch.randn_like(p))
    model.save_pretrained(tmp_path / "hf")
    tiny_tokenizer(TINY["vocab_size"]).save_pretrained(tmp_path / "hf")
    ck = checkpoint.load_target(checkpoint.convert_hf(tmp_path / "hf", tmp_path / "ck"))
    assert ck.cfg.family == family and ck.cfg.is_linear(0) and not ck.cfg.is_linear(3)
    assert (ck.cfg.moe is not None) == (family == "qwen3_5_moe")
    tokens = np.random.RandomState(2).randint(0, TINY["vocab_size"], (2, 30))
    ours, _, _ = _forward(ck, tokens)
    assert_close(ours, hf_logits(model, tokens), HYBRID_REL)


@pytest.mark.parametrize("family", ["gemma3_text", "gemma3"])
def test_defaults_of_a_minimal_gemma3_config_are_transformers(family):
    """A Gemma 3 config.json that leaves fields out (the text config, or the multimodal one with a
    ``text_config``) reads as transformers' ``Gemma3TextConfig`` fills it in: five sliding layers then
    a global one, two RoPE bases, the window, the attention scale, a tied head."""
    import transformers

    text = {"vocab_size": 32, "hidden_size": 64, "num_hidden_layers": 8, "num_attention_heads": 4}
    theirs = transformers.Gemma3TextConfig(**text)
    minimal = {"model_type": "gemma3_text", **text}
    if family == "gemma3":
        minimal = {"model_type": "gemma3", "text_config": {**minimal}}
    ours = hf_format.read_config(minimal)
    assert ours.family == "gemma3" and list(ours.layer_types) == theirs.layer_types
    assert ours.sliding_window == theirs.sliding_window and ours.head_dim == theirs.head_dim
    assert ours.num_kv_heads == theirs.num_key_value_heads and ours.intermediate_size == theirs.intermediate_size
    assert ours.rope_theta == theirs.rope_parameters["full_attention"]["rope_theta"] and ours.rope_scaling is None
    assert ours.local_rope_theta == theirs.rope_parameters["sliding_attention"]["rope_theta"]
    assert ours.attn_scale == theirs.query_pre_attn_scalar**-0.5 and ours.tie_word_embeddings
    assert ours.final_logit_softcap == 0.0 and theirs.final_logit_softcapping is None
    # a text_config without the head count or vocabulary (as the released multimodal folders' is):
    # transformers' defaults, not a refusal
    sparse = {"model_type": "gemma3_text", "hidden_size": 64, "num_hidden_layers": 2}
    defaults = transformers.Gemma3TextConfig(**sparse)
    read = hf_format.read_config({"model_type": "gemma3", "text_config": sparse})
    assert (read.num_heads, read.num_kv_heads, read.vocab_size, read.head_dim) == (
        defaults.num_attention_heads,
        defaults.num_key_value_heads,
        defaults.vocab_size,
        defaults.head_dim,
    )
    # transformers 4.x's layout: rope_theta, rope_local_base_freq and rope_scaling at the top level
    old = {"model_type": "gemma3_text", **text, "rope_theta": 5e5, "rope_local_base_freq": 2e4}
    old = hf_format.read_config({**old, "rope_scaling": {"rope_type": "linear", "factor": 8.0}})
    assert (old.rope_theta, old.local_rope_theta, dict(old.rope_scaling)) == (5e5, 2e4, {"factor": 8.0})
    with pytest.raises(ConfigError, match="hidden_activation 'gelu' is not supported for gemma3"):
        hf_format.read_config(
            {**minimal, "hidden_activation": "gelu"}
            if family == "gemma3_text"
            else {**minimal, "text_config": {**minimal["text_config"], "hidden_activation": "gelu"}}
        )


def test_multimodal_gemma3_checkpoint_converts_to_its_language_model(tmp_path):
    """A Gemma 3 checkpoint with its vision tower and projector: the target is the language model,
    equal to transformers' forward on text; the vision weights are skipped."""
    import torch
    import transformers
    from helpers import GEMMA3, tiny_tokenizer

    text = dict(TINY, **{k: v for k, v in GEMMA3.items() if k != "tie_word_embeddings"})
    vision = dict(hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2)
    vision.update(image_size=28, patch_size=14)
    config = transformers.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4)
    torch.manual_seed(0)
    model = transformers.Gemma3ForConditionalGeneration(config).float().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.2 * torch.randn_like(p))
    model.save_pretrained(tmp_path / "hf")  # the released layout: language_model.model.*, vision_tower.*
    tiny_tokenizer(TINY["vocab_size"]).save_pretrained(tmp_path / "hf")
    ck = checkpoint.load_target(checkpoint.convert_hf(tmp_path / "hf", tmp_path / "ck"))
    assert ck.cfg.family == "gemma3" and ck.cfg.tie_word_embeddings and ck.cfg.is_sliding(0)
    tokens = np.random.RandomState(2).randint(0, TINY["vocab_size"], (2, 30))
    ours, _, _ = _forward(ck, tokens)
    assert_close(ours, hf_logits(model, tokens), TINY_REL)
    model.save_pretrained(tmp_path / "v5", save_original_format=False)  # model.language_model.*
    v5 = checkpoint.load_hf_params(tmp_path / "v5", ck.cfg)
    np.testing.assert_array_equal(v5["layers_1"]["attn"]["q_proj"], np.asarray(ck.params["layers_1"]["attn"]["q_proj"]))


@pytest.mark.parametrize("family", ["deepseek_v3", "glm4_moe"])
def test_defaults_of_a_minimal_grouped_router_config_are_transformers(family):
    """DeepSeek-V3 and GLM-4.5 config.json files that leave fields out read as transformers' config
    classes fill them in: latent ranks and head dims, the dense first layers, the router's groups and
    scaling, the shared experts' width, the partial RoPE."""
    import transformers

    minimal = {"model_type": family, "vocab_size": 32, "hidden_size": 64, "num_hidden_layers": 5}
    minimal["num_attention_heads"] = 8  # GLM-4.5 defaults to 8 key/value heads
    ours = hf_format.read_config(minimal)
    theirs = transformers.AutoConfig.for_model(**minimal)
    moe = ours.moe
    assert (moe.num_experts, moe.experts_per_token) == (theirs.n_routed_experts, theirs.num_experts_per_tok)
    assert moe.layers == tuple(range(theirs.first_k_dense_replace, 5)) and not moe.shared_expert_gated
    assert moe.shared_expert_size == theirs.n_shared_experts * theirs.moe_intermediate_size
    assert (moe.num_groups, moe.topk_groups) == (theirs.n_group, theirs.topk_group)
    assert moe.routed_scaling == theirs.routed_scaling_factor and moe.norm_topk_prob == theirs.norm_topk_prob
    assert ours.intermediate_size == theirs.intermediate_size and ours.rms_norm_eps == theirs.rms_norm_eps
    assert ours.rope_theta == theirs.rope_parameters["rope_theta"] and ours.tie_word_embeddings is False
    if family == "deepseek_v3":
        lat = ours.latent
        assert (lat.q_lora_rank, lat.kv_lora_rank) == (theirs.q_lora_rank, theirs.kv_lora_rank)
        assert (lat.qk_nope_head_dim, lat.qk_rope_head_dim) == (theirs.qk_nope_head_dim, theirs.qk_rope_head_dim)
        assert lat.v_head_dim == theirs.v_head_dim and lat.rope_interleave == theirs.rope_interleave
        assert ours.head_dim == theirs.head_dim and ours.attn_scale == theirs.qk_head_dim**-0.5
        no_q_rank = hf_format.read_config({**minimal, "q_lora_rank": None})
        assert no_q_rank.latent.q_lora_rank == 0
        assert hf_format.read_config({**minimal, "model_type": "kimi_k2"}) == ours  # Kimi-K2: DeepSeek-V3's model
    else:
        assert ours.latent is None and ours.num_kv_heads == theirs.num_key_value_heads
        assert ours.partial_rotary_factor == theirs.rope_parameters["partial_rotary_factor"] == 0.5
        assert ours.qk_norm == theirs.use_qk_norm and ours.qkv_bias == theirs.attention_bias and not ours.o_bias
    with pytest.raises(ConfigError, match="n_group .3. must divide n_routed_experts"):
        hf_format.read_config({**minimal, "n_routed_experts": 8, "n_group": 3})


def test_multimodal_kimi_k25_checkpoint_converts_to_its_language_model(tmp_path):
    """A Kimi-K2.5 checkpoint (a DeepSeek-V3 language model beside a vision tower and projector): the
    target is the language model, equal to transformers' forward on text; the vision weights are skipped."""
    import torch
    import transformers
    from helpers import DEEPSEEK_V3, tiny_tokenizer

    text = dict(TINY, **DEEPSEEK_V3, model_type="deepseek_v3")
    vision = dict(num_hidden_layers=1, hidden_size=16, intermediate_size=16, num_attention_heads=2)
    vision.update(pos_emb_height=4, pos_emb_width=4, pos_emb_time=1)
    config = transformers.Kimi_K25Config(text_config=text, vision_config=vision, projection_hidden_size=16)
    torch.manual_seed(0)
    model = transformers.Kimi_K25ForConditionalGeneration(config).float().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.2 * torch.randn_like(p))
    # transformers 5.24 saves this model's decoder layers as language_model.model.blocks.* in the original
    # format (its Kimi-K2.5 renames reversed past the vision tower): its in-memory layout is used instead
    model.save_pretrained(tmp_path / "hf", save_original_format=False)
    tiny_tokenizer(TINY["vocab_size"]).save_pretrained(tmp_path / "hf")
    ck = checkpoint.load_target(checkpoint.convert_hf(tmp_path / "hf", tmp_path / "ck"))
    assert ck.cfg.family == "deepseek_v3" and ck.cfg.latent is not None and ck.cfg.tie_word_embeddings
    tokens = np.random.RandomState(2).randint(0, TINY["vocab_size"], (2, 30))
    ours, _, _ = _forward(ck, tokens)
    assert_close(ours, hf_logits(model, tokens), TINY_REL)


def test_multi_token_prediction_layers_are_not_part_of_the_target(tmp_path, tiny_models):
    """DeepSeek-V3's releases hold their multi-token-prediction layer as ``model.layers.<num_hidden_layers>``:
    skipped (the target equals the folder without it); a Llama folder with such a layer is refused."""
    import shutil

    from safetensors.numpy import load_file, save_file

    for family, refused in (("deepseek_v3", False), ("llama", True), ("glm4_moe", True)):
        _, hf_dir, path = tiny_models[family]
        last = checkpoint.load_target(path).cfg.num_layers - 1
        shutil.copytree(hf_dir, tmp_path / family)
        weights = next((tmp_path / family).glob("*.safetensors"))
        tensors = load_file(weights)
        mtp = f"model.layers.{last + 1}.eh_proj.weight"  # as DeepSeek-V3's multi-token-prediction layer
        if family == "glm4_moe":  # a real layer past the last (config.json says one layer fewer): not skipped
            mtp = f"model.layers.{last + 1}.input_layernorm.weight"
        tensors[mtp] = np.ones((64, 128), np.float32)
        save_file(tensors, weights, metadata={"format": "pt"})
        if refused:
            with pytest.raises(checkpoint.CheckpointError, match=mtp):
                checkpoint.convert_hf(tmp_path / family, tmp_path / f"{family}-ck")
            continue
        ck = checkpoint.load_target(checkpoint.convert_hf(tmp_path / family, tmp_path / f"{family}-ck"))
        want = checkpoint.load_target(path).params[f"layers_{last}"]["attn"]["kv_b_proj"]
        np.testing.assert_array_equal(ck.params[f"layers_{last}"]["attn"]["kv_b_proj"], want)


@pytest.mark.parametrize("family", ["gemma4_text", "gemma4"])
def test_defaults_of_a_minimal_gemma4_config_are_transformers(family):
    """A Gemma 4 config.json that leaves fields out (text, or multimodal with a ``text_config``) reads as
    transformers' ``Gemma4TextConfig`` fills it in: the layer pattern (the last layer full), the full
    layers' head size and key/value heads, proportional RoPE, per-layer inputs, a tied head."""
    import transformers

    text = {"vocab_size": 32, "hidden_size": 64, "num_hidden_layers": 8, "num_attention_heads": 4}
    text.update(attention_k_eq_v=True, num_global_key_value_heads=1, num_kv_shared_layers=2)
    theirs = transformers.Gemma4TextConfig(**text)
    minimal = {"model_type": "gemma4_text", **text}
    ours = hf_format.read_config({"model_type": "gemma4", "text_config": minimal} if family == "gemma4" else minimal)
    assert ours.family == "gemma4" and list(ours.layer_types) == theirs.layer_types
    full = theirs.layer_types.index("full_attention")
    layer = theirs.per_layer_config  # head_dim and num_key_value_heads are per layer there
    assert ours.layer_head_dim(full) == layer[full].head_dim != ours.layer_head_dim(0) == layer[0].head_dim
    assert ours.layer_kv_heads(full) == layer[full].num_key_value_heads
    assert ours.layer_kv_heads(0) == layer[0].num_key_value_heads and ours.sliding_window == theirs.sliding_window
    rope = theirs.rope_parameters
    assert ours.rope_proportion == rope["full_attention"]["partial_rotary_factor"]
    assert ours.rope_theta == rope["full_attention"]["rope_theta"]
    assert ours.local_rope_theta == rope["sliding_attention"]["rope_theta"]
    assert ours.per_layer_input == theirs.hidden_size_per_layer_input and ours.tie_word_embeddings
    assert ours.per_layer_vocab == theirs.vocab_size_per_layer_input
    modes = theirs.kv_sharing_modes
    assert [ours.kv_source(i) is not None for i in range(8)] == [m == "reuse" for m in modes]
    saved = hf_format.read_config({**theirs.to_dict(), "model_type": "gemma4_text"})  # transformers 5's layout
    assert saved == hf_format.read_config(minimal)
    # full layers like the others: transformers saves per_layer_config {} and no global_head_dim, and reads
    # that back as head_dim everywhere (not the 512 of a config without per_layer_config)
    plain = transformers.Gemma4TextConfig(**{**text, "global_head_dim": 16, "head_dim": 16})
    saved = {**plain.to_dict(), "model_type": "gemma4_text"}
    again = transformers.Gemma4TextConfig(**{k: v for k, v in saved.items() if k != "model_type"})
    ours = hf_format.read_config(saved)
    full = again.layer_types.index("full_attention")
    assert ours.layer_head_dim(full) == again.per_layer_config[full].head_dim == 16
    # every layer full attention (layer_types then reads as ()): transformers' per-layer shapes, no crash
    every = transformers.Gemma4TextConfig(**{**text, "layer_types": ["full_attention"] * 8, "global_head_dim": 32})
    ours = hf_format.read_config({**every.to_dict(), "model_type": "gemma4_text"})
    assert ours.layer_types == () and [ours.layer_head_dim(i) for i in range(8)] == [32] * 8


def test_rope_of_a_layer_with_its_own_head_size_is_transformers():
    """Gemma 4's full layers with plain ("default") RoPE and a head size of their own: the inverse
    frequencies span that head (transformers' rope init for the layer type), not the sliding layers'."""
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from dflash_jax.target import rope_tables

    rope = {
        "full_attention": {"rope_type": "default", "rope_theta": 1e4},
        "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
    }
    text = {"vocab_size": 32, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 16}
    theirs = transformers.Gemma4TextConfig(**text, global_head_dim=32, rope_parameters=rope)
    ours = hf_format.read_config({**theirs.to_dict(), "model_type": "gemma4_text"})
    for kind, head, sliding in (("full_attention", 32, False), ("sliding_attention", 16, True)):
        init = ROPE_INIT_FUNCTIONS.get(theirs.rope_parameters[kind]["rope_type"])
        if init is None:  # "default" has no entry: base ** (-2i / head)
            base = theirs.rope_parameters[kind]["rope_theta"]
            want = 1.0 / base ** (np.arange(0, head, 2, dtype=np.float32) / head)
        else:
            want = init(theirs, "cpu", layer_type=kind)[0].numpy()
        np.testing.assert_allclose(rope_tables(ours, sliding, head)[0], want, rtol=1e-6)


def test_multimodal_gemma4_checkpoint_converts_to_its_language_model(tmp_path):
    """A Gemma 4 checkpoint with its vision tower (``model.language_model.*``, ``model.vision_tower.*``,
    ``model.embed_vision.*``): the target is the language model, equal to transformers' forward on text."""
    import torch
    import transformers
    from helpers import GEMMA4, tiny_tokenizer

    text = dict(TINY, **{k: v for k, v in GEMMA4.items() if k != "tie_word_embeddings"})
    vision = dict(hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2, head_dim=8)
    config = transformers.Gemma4Config(
        text_config=text, vision_config={**vision, "global_head_dim": 8}, audio_config=None
    )
    torch.manual_seed(0)
    model = transformers.Gemma4ForConditionalGeneration(config).float().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.2 * torch.randn_like(p))
    model.save_pretrained(tmp_path / "hf")
    tiny_tokenizer(TINY["vocab_size"]).save_pretrained(tmp_path / "hf")
    ck = checkpoint.load_target(checkpoint.convert_hf(tmp_path / "hf", tmp_path / "ck"))
    assert ck.cfg.family == "gemma4" and ck.cfg.tie_word_embeddings and ck.cfg.kv_source(3) == 1
    tokens = np.random.RandomState(2).randint(0, TINY["vocab_size"], (2, 30))
    ours, _, _ = _forward(ck, tokens)
    assert_close(ours, hf_logits(model, tokens), TINY_REL)
