"""The drafter equals the reference ``dflash.model.DFlashDraftModel`` (dflash==0.1.0) on released-format weights."""

import numpy as np
import pytest
import torch
from helpers import TINY_REL, assert_close

from dflash_jax import dflash_format
from dflash_jax.drafter import (
    Drafter,
    DrafterConfig,
    block_embeddings,
    decode_masks,
    default_target_layer_ids,
    draft_logits,
    init_drafter_params,
)
from dflash_jax.drafter_io import export_released, import_released
from dflash_jax.target import TargetConfig, init_params

TARGET = TargetConfig(
    family="qwen3",
    vocab_size=96,
    hidden_size=64,
    intermediate_size=128,
    num_layers=6,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    tie_word_embeddings=False,
    qk_norm=True,
)


def test_default_layer_ids_round_half_to_even():
    assert default_target_layer_ids(35, 3) == (1, 16, 32)
    assert default_target_layer_ids(30, 1) == (15,)
    assert default_target_layer_ids(36, 5) == (1, 9, 17, 25, 33)


def _scaled(params, seed, scale):
    """Weights times ``scale`` and norm scales jittered around 1, so a swapped tensor would show."""
    import jax

    rs = np.random.RandomState(seed)
    return jax.tree_util.tree_map(
        lambda x: (
            np.asarray(x) * scale if x.ndim > 1 else (np.asarray(x) + 0.1 * rs.randn(*x.shape)).astype(np.float32)
        ),
        params,
    )


CONFIGS = {
    "gqa": dict(num_layers=2),
    "sliding": dict(
        num_layers=3, layer_types=("full_attention", "sliding_attention", "sliding_attention"), sliding_window=5
    ),
    "scaled": dict(num_layers=1, input_embedding_scale=2.5, output_multiplier=0.7, final_logit_softcapping=8.0),
}


def _one_block(cfg, params, tparams, ref, ctx_len=9):
    """One block ``[anchor 7, mask...]`` at position ``ctx_len`` after ``ctx_len`` random context
    features, through our drafter and through the reference ``ref`` (target embeddings from
    ``tparams``): ``(ours [1, B, d], the reference's as a torch tensor, ours_with)``, where
    ``ours_with(cfg, params)`` runs another of our drafters on the same inputs."""
    bs = cfg.block_size
    feats = np.random.RandomState(0).randn(1, ctx_len, len(cfg.target_layer_ids) * cfg.hidden_size)
    feats = feats.astype(np.float32)
    block = np.array([[7] + [cfg.mask_token_id] * (bs - 1)])
    positions = np.arange(ctx_len, ctx_len + bs)[None]

    def ours_with(c, p):
        model = Drafter(c)
        ctx = model.apply({"params": p}, feats, method=Drafter.fuse)
        kv = model.apply({"params": p}, ctx, np.arange(ctx_len)[None], method=Drafter.context_kv)
        masks = decode_masks(c, ctx_len, np.array([ctx_len]), bs, np.array([bs]))
        return np.asarray(model.apply({"params": p}, block_embeddings(block, tparams, TARGET, c), positions, kv, masks))

    emb_t = torch.tensor(np.asarray(tparams["embedding"]))[torch.tensor(block)] * cfg.input_embedding_scale
    with torch.no_grad():
        want = ref(
            target_hidden=torch.tensor(feats),
            noise_embedding=emb_t,
            position_ids=torch.arange(ctx_len + bs)[None],
            use_cache=False,
        )
    return ours_with(cfg, params), want, ours_with


@pytest.mark.parametrize("name", list(CONFIGS))
def test_draft_logits_equal_reference(name, tmp_path):
    from dflash.model import DFlashDraftModel

    cfg = DrafterConfig.for_target(TARGET, block_size=6, mask_token_id=3, **CONFIGS[name])
    params = _scaled(init_drafter_params(cfg, 1), 1, 5.0)
    tparams = _scaled(init_params(TARGET, seed=2), 2, 20.0)
    export_released(params, cfg, tmp_path / "drafter")
    params2, cfg2, _ = import_released(tmp_path / "drafter")
    assert cfg2 == cfg

    ref = DFlashDraftModel.from_pretrained(tmp_path / "drafter", dtype=torch.float32).eval()
    hidden, h, _ = _one_block(cfg2, params2, tparams, ref)  # the reference: target embedding / head from tparams
    ours = np.asarray(draft_logits(hidden, tparams, TARGET, cfg2))
    with torch.no_grad():
        head = torch.nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        head.weight.copy_(torch.tensor(np.asarray(tparams["lm_head"]).T))
        want = ref.compute_logits(h, head).numpy()
    assert_close(ours, want, TINY_REL)
    assert np.abs(want).max() > 1 and (ours.argmax(-1) == want.argmax(-1)).all()  # not vacuous


def test_released_drafter_with_yarn_rope_is_refused():
    """The drafter implements plain and Llama 3 RoPE only: a YaRN config is an error, not run without it."""
    from dflash_jax.errors import ConfigError

    released = dflash_format.config_json(DrafterConfig.for_target(TARGET, num_layers=1, block_size=4, mask_token_id=3))
    dflash_format.read_config(released)  # the config as exported loads
    yarn = {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0, "original_max_position_embeddings": 64}
    with pytest.raises(ConfigError, match="rope type 'yarn' is not supported for drafters"):
        dflash_format.read_config({**released, "rope_scaling": yarn})


def test_a_released_config_of_another_architecture_is_refused_by_name():
    """``architectures`` says which drafter a released ``config.json`` is: an entry other than
    DFlash's and DFlash 2's is refused in one line that names it and the known ones (it was read as
    DFlash, and failed later on missing tensors); a config without ``architectures`` reads as DFlash."""
    from dflash_jax.errors import ConfigError

    cfg = DrafterConfig.for_target(TARGET, num_layers=1, block_size=4, mask_token_id=3)
    released = dflash_format.config_json(cfg)
    for arch in (["Qwen3ForCausalLM"], ["DFlashDraftModel", "EagleDraftModel"], "LlamaForCausalLM", 3):
        unknown = arch[-1] if isinstance(arch, list) else arch
        with pytest.raises(ConfigError) as e:
            dflash_format.read_config({**released, "architectures": arch})
        assert str(e.value) == (
            f"drafter config.json: architectures {unknown!r} is not a released DFlash drafter; "
            "known: DFlashDraftModel, DFlash2DraftModel"
        )
    without = {k: v for k, v in released.items() if k != "architectures"}
    for missing in ({}, {"architectures": None}, {"architectures": []}):
        assert dflash_format.read_config({**without, **missing}) == cfg
    assert dflash_format.read_config({**released, "architectures": "DFlashDraftModel"}) == cfg


def test_ngram_block_input_survives_the_released_format(tmp_path):
    """``block_input="ngram"`` and its n-gram lengths are written to ``dflash_config`` and read back;
    a mask-token drafter's config has no such keys; the reference still loads the folder."""
    import dataclasses

    from dflash.model import DFlashDraftModel

    from dflash_jax.errors import ConfigError

    plain = DrafterConfig.for_target(TARGET, num_layers=1, block_size=8, mask_token_id=3)
    assert "block_input" not in dflash_format.config_json(plain)["dflash_config"]
    cfg = dataclasses.replace(plain, block_input="ngram", ngram_max=3, ngram_min=2)
    out = export_released(init_drafter_params(cfg, seed=0), cfg, tmp_path / "d")
    _, back, _ = import_released(out)
    assert (back.block_input, back.ngram_max, back.ngram_min) == ("ngram", 3, 2) and back == cfg
    DFlashDraftModel.from_pretrained(out, dtype=torch.float32)
    for bad, message in (
        (dict(block_input="oracle"), "block_input 'oracle'"),
        (dict(ngram_min=0), "ngram_min"),
        (dict(copy_bias=2.0), 'copy_bias rewards copying the n-gram block input: set block_input="ngram"'),
    ):
        with pytest.raises(ConfigError, match=message):
            dataclasses.replace(plain, **bad)


def test_a_copy_bias_survives_the_released_format(tmp_path):
    """``copy_bias`` (its starting value in ``dflash_config``, its learned table as the tensor
    ``copy_bias``) is written and read back as it was; the reference still loads the folder."""
    import dataclasses

    import jax
    from dflash.model import DFlashDraftModel

    cfg = DrafterConfig.for_target(
        TARGET, num_layers=1, block_size=8, mask_token_id=3, block_input="ngram", ngram_max=3, copy_bias=4.0
    )
    params = init_drafter_params(cfg, seed=0)
    np.testing.assert_array_equal(np.asarray(params["copy_bias"]), np.full((3, 7), 4.0, np.float32))
    table = np.asarray(jax.random.normal(jax.random.key(1), (3, 7)), np.float32)
    out = export_released(dict(params, copy_bias=table), cfg, tmp_path / "d")
    got, back, _ = import_released(out)
    assert back == cfg and back.copy_bias == 4.0
    np.testing.assert_array_equal(np.asarray(got["copy_bias"]), table)
    assert "copy_bias" not in dflash_format.config_json(dataclasses.replace(cfg, copy_bias=None))["dflash_config"]
    # a periodic block input is written (only when on: earlier drafters' configs stay as they were) and read back
    periodic = dataclasses.replace(cfg, ngram_periodic=True)
    assert import_released(export_released(params, periodic, tmp_path / "p"))[1] == periodic
    assert dflash_format.config_json(periodic)["dflash_config"]["ngram_periodic"] is True
    assert "ngram_periodic" not in dflash_format.config_json(cfg)["dflash_config"]
    # so is a draft tree's temperature (absent at 1)
    tempered = dataclasses.replace(cfg, tree_temperature=1.5)
    assert import_released(export_released(params, tempered, tmp_path / "t"))[1] == tempered
    assert "tree_temperature" not in dflash_format.config_json(cfg)["dflash_config"]
    from dflash_jax.errors import ConfigError

    for bad in (0.0, -1.0, float("inf")):
        with pytest.raises(ConfigError, match="tree_temperature must be a positive number"):
            dataclasses.replace(cfg, tree_temperature=bad)

    raw = dflash_format.config_json(cfg)
    raw["dflash_config"]["copy_bias"] = True
    with pytest.raises(ConfigError, match="copy_bias must be a number, got True"):
        dflash_format.read_config(raw)
    raw = dflash_format.config_json(periodic)
    raw["dflash_config"]["ngram_periodic"] = "false"  # a string is no boolean (it would read as True)
    with pytest.raises(ConfigError, match="ngram_periodic must be true or false, got 'false'"):
        dflash_format.read_config(raw)
    DFlashDraftModel.from_pretrained(out, dtype=torch.float32)


# --- DFlash 2 (issue 21): the backbone with its convolutions ------------------------------------

DFLASH2 = dict(conv_kernel_size=2, conv_group_size=16, selector_rank=8, selector_top_k=5)


def _dflash2_params(cfg, seed):
    """Random DFlash 2 weights: the backbone as ``_scaled``, convolutions away from the identity
    (every tap and the dynamic projection non-zero), codebooks and projection at unit scale."""
    import jax

    rs = np.random.RandomState(seed)
    params = _scaled(init_drafter_params(cfg, seed), seed, 5.0)

    def conv(path, x):
        name = jax.tree_util.keystr(path)
        if "base_kernel" in name:
            return (np.asarray(x) / 5.0 + 0.3 * rs.randn(*x.shape)).astype(np.float32)  # identity + noise
        if "kernel_projection" in name:
            return (0.2 * rs.randn(*x.shape)).astype(np.float32)
        if "codebook" in name or "hidden_projection" in name:
            return rs.randn(*x.shape).astype(np.float32)
        return x

    return jax.tree_util.tree_map_with_path(conv, params)


def test_dflash2_backbone_equals_reference(tmp_path):
    """A DFlash 2 drafter's block hidden states (convolutions around attention and MLP, the
    dynamic taps from each sublayer's normed input) equal ``DFlash2DraftModel``'s on random
    weights, the folder written by ``export_released`` with the reference's tensor names."""
    from dflash.model import DFlash2DraftModel

    cfg = DrafterConfig.for_target(TARGET, num_layers=2, block_size=6, mask_token_id=3, **DFLASH2)
    assert cfg.dflash2 and dflash_format.config_json(cfg)["architectures"] == ["DFlash2DraftModel"]
    params = _dflash2_params(cfg, 1)
    tparams = _scaled(init_params(TARGET, seed=2), 2, 20.0)
    export_released(params, cfg, tmp_path / "drafter")
    ref = DFlash2DraftModel.from_pretrained(tmp_path / "drafter", dtype=torch.float32).eval()
    sel = ref.candidate_selector  # every selector tensor reached the reference under its name
    for name, ours in (
        ("predecessor_codebook", sel.predecessor_codebook.weight),
        ("successor_codebook", sel.successor_codebook.weight),
    ):
        np.testing.assert_array_equal(ours.detach().numpy(), np.asarray(params[name]))
    np.testing.assert_array_equal(
        sel.hidden_projection.weight.detach().numpy().T, np.asarray(params["hidden_projection"])
    )
    conv = ref.layers[1].mlp_conv
    np.testing.assert_array_equal(conv.base_kernel.detach().numpy(), params["layers_1"]["mlp_conv"]["base_kernel"])
    ours, want, ours_with = _one_block(cfg, params, tparams, ref)
    want = want.numpy()
    assert_close(ours, want, TINY_REL)
    # the convolutions matter: the same weights without them give other hidden states
    plain_cfg = DrafterConfig.for_target(TARGET, num_layers=2, block_size=6, mask_token_id=3)
    plain = {
        k: v for k, v in params.items() if k not in ("predecessor_codebook", "successor_codebook", "hidden_projection")
    }
    plain = {
        k: ({n: w for n, w in v.items() if not n.endswith("_conv")} if k.startswith("layers_") else v)
        for k, v in plain.items()
    }
    other = ours_with(plain_cfg, plain)
    assert np.abs(other - want).max() > 0.1 * np.abs(want).max()


def test_dflash2_convolution_stays_inside_each_block():
    """Blocks laid side by side (as training lays its anchors' blocks) convolve as if alone: no tap
    reaches across a block boundary; an untrained convolution is the identity."""
    import jax

    from dflash_jax.drafter import GroupedCausalConv

    cfg = DrafterConfig.for_target(
        TARGET, num_layers=1, block_size=4, mask_token_id=3, **dict(DFLASH2, conv_kernel_size=3)
    )
    conv = GroupedCausalConv(cfg)
    x = np.random.RandomState(0).randn(2, 12, cfg.hidden_size).astype(np.float32)
    fresh = conv.init(jax.random.key(0), x, 4, method=GroupedCausalConv.prepare)
    y, dyn = conv.apply(fresh, x, 4, method=GroupedCausalConv.prepare)
    np.testing.assert_array_equal(np.asarray(y), x)
    np.testing.assert_array_equal(np.asarray(conv.apply(fresh, x, dyn, 4, method=GroupedCausalConv.finish)), x)
    variables = jax.tree.map(lambda v: v + 0.3 * np.random.RandomState(1).randn(*v.shape).astype(np.float32), fresh)
    together, _ = conv.apply(variables, x, 4, method=GroupedCausalConv.prepare)
    for b in range(3):
        alone, _ = conv.apply(variables, x[:, 4 * b : 4 * b + 4], 4, method=GroupedCausalConv.prepare)
        assert_close(np.asarray(together[:, 4 * b : 4 * b + 4]), np.asarray(alone), 1e-6)
    whole, _ = conv.apply(variables, x, 12, method=GroupedCausalConv.prepare)  # one long block: taps do cross
    assert np.abs(np.asarray(whole[:, 4:]) - np.asarray(together[:, 4:])).max() > 1e-2


def test_dflash2_selector_equals_reference(tmp_path):
    """The candidate selector's candidates, greedy path and sampled q equal the reference's
    ``CandidateSelector.select`` on random weights and inputs (batch 2): the same top-k sets, the
    same greedy walk, and, along the reference's sampled path, the same q over each offset's
    candidates (matched by token: the reference's top-k is unsorted)."""
    import jax
    import jax.numpy as jnp
    from dflash.model import DFlash2DraftModel

    from dflash_jax.drafter import select, selector_candidates, selector_scores

    cfg = DrafterConfig.for_target(TARGET, num_layers=1, block_size=6, mask_token_id=3, **DFLASH2)
    params = _dflash2_params(cfg, 3)
    export_released(params, cfg, tmp_path / "drafter")
    ref = DFlash2DraftModel.from_pretrained(tmp_path / "drafter", dtype=torch.float32).eval().candidate_selector
    rs = np.random.RandomState(4)
    hidden = rs.randn(2, 5, cfg.hidden_size).astype(np.float32)
    logits = (3.0 * rs.randn(2, 5, cfg.vocab_size)).astype(np.float32)
    anchor = np.array([7, 11])

    path, cands, q = select(params, cfg, hidden, logits, anchor, 0.0)
    with torch.no_grad():
        ref_path, ref_cands, _ = ref.select(torch.tensor(hidden), torch.tensor(logits), torch.tensor(anchor), 0.0)
    np.testing.assert_array_equal(np.sort(np.asarray(cands), -1), np.sort(ref_cands.numpy(), -1))
    np.testing.assert_array_equal(np.asarray(path), ref_path.numpy())
    # the walk's choices are not the head's argmax alone: the transition score changes some
    assert (np.asarray(path) != logits.argmax(-1)).any()

    temperature = 0.7
    torch.manual_seed(0)
    with torch.no_grad():
        s_path, s_cands, s_q = ref.select(torch.tensor(hidden), torch.tensor(logits), torch.tensor(anchor), temperature)
    s_path, s_cands, s_q = s_path.numpy(), s_cands.numpy(), s_q.numpy()
    predecessors = np.concatenate([anchor[:, None], s_path[:, :-1]], 1)
    unary, ours_c = selector_candidates(jnp.asarray(logits), cfg)
    ours_q = np.asarray(jax.nn.softmax(selector_scores(params, hidden, unary, ours_c, predecessors) / temperature))
    ours_c = np.asarray(ours_c)
    for b in range(2):
        for j in range(5):
            mine, theirs = np.argsort(ours_c[b, j]), np.argsort(s_cands[b, j])
            np.testing.assert_array_equal(ours_c[b, j][mine], s_cands[b, j][theirs])
            assert_close(ours_q[b, j][mine], s_q[b, j][theirs], TINY_REL)
    _, _, q = select(params, cfg, hidden, logits, anchor, temperature, key=jax.random.split(jax.random.key(0), 2))
    np.testing.assert_allclose(np.asarray(q).sum(-1), 1.0, rtol=1e-5)


def test_dflash2_folders_round_trip_and_bad_ones_are_refused(tmp_path):
    """A DFlash 2 folder (written by ``export_released``) reads back to the same config and the same
    tensors, bit for bit, through ``load_drafter``; a missing or misshapen DFlash 2 tensor, a missing
    DFlash 2 field, or top-level and ``dflash_config`` block sizes that disagree are refused in one
    line naming what is wrong."""
    import json

    import jax
    from safetensors.numpy import load_file, save_file

    from dflash_jax.drafter_io import load_drafter
    from dflash_jax.errors import CheckpointError, ConfigError

    cfg = DrafterConfig.for_target(TARGET, num_layers=2, block_size=6, mask_token_id=3, **DFLASH2)
    params = _dflash2_params(cfg, 5)
    out = export_released(params, cfg, tmp_path / "d")
    got, back, _ = load_drafter(out)
    assert back == cfg and back.dflash2
    for (pa, a), (pb, b) in zip(jax.tree_util.tree_leaves_with_path(params), jax.tree_util.tree_leaves_with_path(got)):
        assert pa == pb
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    def broken(name, change_tensors=None, change_config=None):
        bad = tmp_path / name
        bad.mkdir()
        w = load_file(out / "model.safetensors")
        raw = json.loads((out / "config.json").read_text())
        change_tensors and change_tensors(w)
        change_config and change_config(raw)
        save_file(w, str(bad / "model.safetensors"))
        (bad / "config.json").write_text(json.dumps(raw))
        return bad

    with pytest.raises(CheckpointError, match="candidate_selector.successor_codebook"):
        load_drafter(broken("missing", lambda w: w.pop("candidate_selector.successor_codebook")))
    shape = lambda w: w.update({"layers.1.mlp_conv.base_kernel": np.zeros((2, 3, 64), np.float32)})  # noqa: E731
    with pytest.raises(CheckpointError, match="layers.1.mlp_conv.base_kernel"):
        load_drafter(broken("misshapen", shape))
    with pytest.raises(ConfigError, match="selector_top_k"):
        load_drafter(broken("no-field", change_config=lambda r: r["dflash_config"].pop("selector_top_k")))
    with pytest.raises(ConfigError, match="block_size 6 at the top level but 8 in dflash_config"):
        load_drafter(broken("blocks", change_config=lambda r: r["dflash_config"].update(block_size=8)))
