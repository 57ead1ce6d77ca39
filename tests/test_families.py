"""The target families beyond the dense Llama / Qwen ones in the decoder, on a mesh and through the CLI:
mixture of experts (Qwen3-MoE, gpt-oss), the hybrid Qwen3.5-MoE (Gated DeltaNet + gated attention,
experts), Gemma 3 (sliding and global layers with their own RoPE, sandwich norms, GeGLU), DeepSeek-V3
(latent attention, a sigmoid group-limited router, shared experts, dense first layers), GLM-4.5 and
Gemma 4 (here with experts beside each MLP, layers reusing earlier keys and values, per-layer inputs).

Their parity with transformers (logits, cached blocks, padding, the hybrid's rollback) is in
``test_target.py``. Every rejected draft token below is one the hybrid's commit must keep out of
its recurrent state."""

import jax
import numpy as np
import optax
import pytest
from helpers import (
    DEEPSEEK_V3,
    GEMMA4_MOE,
    GLM4_MOE,
    TINY_REL,
    OracleDraft,
    assert_close,
    expected_rounds,
    oracle_params,
)

from dflash_jax import checkpoint
from dflash_jax.decode import Decoder
from dflash_jax.drafter import DrafterConfig, DraftStep, init_drafter_params
from dflash_jax.loss import LossSettings
from dflash_jax.sampling import Sampling
from dflash_jax.sharding import axis_rules, make_mesh
from dflash_jax.speculation import make_plan
from dflash_jax.target import Target
from dflash_jax.train_step import sharded_step, train_step

# Qwen3.5-MoE (two layers: one Gated DeltaNet, one gated attention; experts and a shared expert in both)
# stands for the hybrids here: its rollback is the dense Qwen3.5's, whose batched decoding is
# compared with transformers' generate in test_decode.py
# GLM-4.5 (grouped-query attention, partial RoPE, DeepSeek-V3's router) is here through the CLI only
# Gemma 3 (a sliding window as gpt-oss's, dense layers) is here through the CLI; its loop is test_tree.py's
FAMILIES = ["qwen3_moe", "gpt_oss", "qwen3_5_moe", "deepseek_v3", "gemma4_moe"]


def _load(tiny_models, family):
    _, _, path = tiny_models[family]
    ck = checkpoint.load_target(path)
    return path, ck, Decoder(ck.params, ck.cfg)


@pytest.fixture(scope="session", params=FAMILIES)
def family_target(request, tiny_models):
    return _load(tiny_models, request.param)


def test_oracle_drafter_rounds_stop_mid_block_at_limit_and_stop_token(family_target):
    """An oracle drafter that is wrong at chosen positions: every round's acceptance is the one the
    SPEC rule gives, the output is the plain greedy output, rows stop at a stop token and at the
    length limit inside a block."""
    _, ck, plain = family_target
    bs, rs = 6, np.random.RandomState(7)
    prompts = [rs.randint(4, 96, n).tolist() for n in (5, 19, 11)]
    greedy = [r.token_ids for r in plain.generate(prompts, 40)]
    errors = [{len(p) + 3, len(p) + 4, len(p) + 12, len(p) + 20} for p in prompts]
    stop = greedy[1][25]  # row 1 (at least) stops at this token; the others may too, or hit the limit
    draft = OracleDraft(96, bs)
    dec = Decoder(ck.params, ck.cfg, make_plan(draft, oracle_params(prompts, greedy, errors)))
    want = plain.generate(prompts, 37, stop_token_ids=[stop])
    got = dec.generate(prompts, 37, stop_token_ids=[stop])
    for p, g, e, w, r in zip(prompts, greedy, errors, want, got):
        assert r.token_ids == w.token_ids
        assert r.acceptance_lengths == expected_rounds(len(p), g, e, bs, 37, stop_ids=(stop,))
        assert any(1 < a < bs for a in r.acceptance_lengths)  # acceptance stopped mid-block
    assert got[1].token_ids[-1] == stop and len(got[1].token_ids) <= 26


def test_random_drafter_greedy_and_sampled(family_target):
    """A random DFlash drafter: greedy output equals plain decoding (most rounds
    reject inside the block); sampled, a row's tokens do not depend on the batch it is in (its
    distribution is the chi-square test of ``test_sampling.py``, which the target does not enter)."""
    _, ck, plain = family_target
    dcfg = DrafterConfig.for_target(ck.cfg, num_layers=1, block_size=4, mask_token_id=3)
    step, dparams = DraftStep(dcfg, ck.cfg), init_drafter_params(dcfg, seed=1)
    rs = np.random.RandomState(3)
    prompts = [rs.randint(4, 96, n).tolist() for n in (7, 30)]
    spec = Decoder(ck.params, ck.cfg, make_plan(step, dparams, block_size=4))
    # verify lengths chosen per round (one lax.switch branch per length; the hybrid pads its pending state)
    chosen = Decoder(
        ck.params, ck.cfg, make_plan(step, dparams, block_size=4, verify_lengths=(1, 2, 4), verify_costs=(1, 1.3, 1.6))
    )
    want = plain.generate(prompts, 24)
    for dec in (spec, chosen):
        for w, g in zip(want, dec.generate(prompts, 24)):
            assert g.token_ids == w.token_ids
            assert sum(g.acceptance_lengths) == len(g.token_ids) - 1
    sampled = Decoder(ck.params, ck.cfg, make_plan(step, dparams, block_size=4), sampling=Sampling(temperature=0.8))
    batch = sampled.generate(prompts, 16, seed=[5, 6])
    alone = sampled.generate(prompts[1:], 16, seed=[6])
    assert batch[1].token_ids == alone[0].token_ids
    assert all(len(r.token_ids) == 16 for r in batch)


MESHES = [(1, 1, 1, 8), (1, 2, 2, 2)]


@pytest.mark.parametrize(
    "family,shape",
    [(f, m) for f in FAMILIES for m in MESHES] + [("gemma3", (1, 2, 2, 2)), ("glm4_moe", (1, 2, 2, 2))],
)
def test_a_mesh_gives_the_same_logits(tiny_models, family, shape):
    """Parameters split over the mesh (experts over an ``expert`` axis, with fsdp and tensor): the same
    logits as one device (Gemma 3 and GLM-4.5, whose loops are tested elsewhere, on one mesh)."""
    path, ck, _ = _load(tiny_models, family)
    tokens = np.random.RandomState(1).randint(0, 96, (2, 24))
    positions = np.broadcast_to(np.arange(24), tokens.shape)
    model = Target(ck.cfg)

    def logits(params, tokens, positions):
        hidden, _, _ = model.apply({"params": params}, tokens, positions)
        return model.apply({"params": params}, hidden, method="logits")

    want = np.asarray(jax.jit(logits)(ck.params, tokens, positions))
    mesh = make_mesh(shape)
    sharded = checkpoint.load_target(path, mesh=mesh).params
    if ck.cfg.moe is not None:
        gate_up = sharded[f"layers_{ck.cfg.moe.layers[0]}"]["moe"]["gate_up"]
        assert gate_up.sharding.spec[0] == "expert" and len(gate_up.sharding.device_set) == 8
    else:
        assert any(sharded["layers_0"]["attn"]["q_proj"].sharding.spec) or shape == (1, 1, 1, 8)
    with axis_rules(), jax.set_mesh(mesh):
        got = np.asarray(jax.jit(logits)(sharded, tokens, positions))
    assert_close(got, want, TINY_REL)


def test_a_mesh_gives_the_same_training_loss(family_target):
    """The drafter's training step over (data 2, fsdp 1, tensor 2, expert 2) equals one device."""
    path, ck, _ = family_target
    rs = np.random.RandomState(0)
    batch = {
        "tokens": rs.randint(4, 96, (1, 4, 32)).astype(np.int32),
        "loss_mask": np.broadcast_to(np.arange(32) >= 8, (1, 4, 32)).copy(),
    }
    dcfg = DrafterConfig.for_target(ck.cfg, num_layers=1, block_size=4, mask_token_id=3)
    opt = optax.sgd(1.0)
    kw = dict(tcfg=ck.cfg, dcfg=dcfg, opt=opt, num_anchors=6, loss=LossSettings(gamma=4.0, anchor_chunk=3))
    params = jax.tree.map(np.asarray, init_drafter_params(dcfg, seed=0))
    rng = jax.random.PRNGKey(0)
    _, _, want = jax.jit(lambda p, s: train_step(p, s, ck.params, batch, rng, **kw))(params, opt.init(params))
    mesh = make_mesh((2, 1, 2, 2))
    target = checkpoint.load_target(path, mesh=mesh).params
    step, param_sh, batch_sh, opt_sh = sharded_step(mesh, params, target, **kw)
    p, s = jax.device_put(params, param_sh), jax.device_put(opt.init(params), opt_sh)
    _, _, got = step(p, s, target, jax.device_put(batch, batch_sh), rng)
    np.testing.assert_allclose(float(got["loss"]), float(want["loss"]), rtol=1e-5)
    assert float(want["loss"]) > 0


LINEAR = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16)
CLI_FAMILIES = {
    "qwen3_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32),
    "gpt_oss": dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=32, sliding_window=8),
    "qwen3_5": LINEAR,
    "gemma3": dict(sliding_window=8, layer_types=["sliding_attention", "full_attention"] * 2),
    "deepseek_v3": dict(DEEPSEEK_V3, num_hidden_layers=4),  # four layers: the drafter reads layers 1 and 2
    "glm4_moe": dict(GLM4_MOE, num_hidden_layers=4),
    "gemma4": GEMMA4_MOE,
}  # (Qwen3.5-MoE's tiny folder loads its word-level tokenizer as one that encodes "t10" to nothing)


@pytest.mark.parametrize("family", CLI_FAMILIES)
def test_convert_generate_and_train_through_the_cli(tmp_path, capsys, family):
    """``convert``, ``generate`` (plain and with a random drafter) and ``train`` accept each family."""
    import json
    from pathlib import Path

    from helpers import make_hf_model

    from dflash_jax import data
    from dflash_jax.cli import main

    hf_dir = tmp_path / "hf"
    make_hf_model(family, hf_dir, **CLI_FAMILIES[family])
    main(["convert", "--hf", str(hf_dir), "--out", str(tmp_path / "ck")])
    ck = checkpoint.load_target(tmp_path / "ck")
    assert ck.cfg.family == family and (ck.cfg.moe is not None) == family.endswith(("moe", "oss", "v3", "gemma4"))
    assert (ck.cfg.linear is not None) == family.startswith("qwen3_5")
    records = []
    for drafter in ("none", "random"):
        args = ["generate", "--target", str(tmp_path / "ck"), "--prompt", "t10 t11 t12", "--max-new-tokens", "8"]
        main([*args, "--drafter", drafter, "--verify-lengths", "full", "--json"])
        records.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
    assert records[0]["token_ids"] == records[1]["token_ids"] and len(records[0]["token_ids"]) == 8

    # training reads tokens and loss masks, whoever wrote them (prepare-data's own path: test_data, test_serve)
    rs = np.random.RandomState(0)
    seqs = [rs.randint(4, 96, 22).tolist() for _ in range(24)]
    lm = [[False] * 6 + [True] * 16 for _ in seqs]
    folder = data.write_dataset(tmp_path / "data", seqs, lm, meta={"tokenizer_sha256": ck.identity["tokenizer_sha256"]})
    config = str(Path(__file__).resolve().parents[1] / "configs" / "smollm2_135m.py")
    overrides = [f"target={tmp_path / 'ck'}", f"data={folder}", f"out_dir={tmp_path / 'run'}", "drafter.num_layers=1"]
    overrides += ["drafter.block_size=4", "train.max_len=32", "train.num_anchors=4", "train.anchor_chunk=4"]
    overrides += ["train.batch_size=4", "train.steps=2", "eval.val_size=4", "eval.decode_prompts=0", "eval.every=2"]
    overrides += ["drafter.target_layer_ids=(1, 2)"]  # Qwen3.5: two linear-attention layers
    main(["train", "--config", config, *overrides])
    assert (tmp_path / "run" / "drafter" / "config.json").exists()
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    last = [s for s in steps if "loss" in s][-1]
    assert last["step"] == 2 and np.isfinite(last["loss"])
