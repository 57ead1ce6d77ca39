"""Sharding changes nothing but speed: the training step on meshes of 8 simulated CPU devices."""

import dataclasses

import jax
import numpy as np
import optax
import pytest

from dflash_jax import checkpoint, data
from dflash_jax.drafter import DrafterConfig, DraftStep, init_drafter_params
from dflash_jax.loss import LossSettings
from dflash_jax.sharding import make_mesh
from dflash_jax.train_step import sharded_step, train_step


@pytest.fixture(scope="session")
def setup(tiny_models):
    from helpers import make_hf_model  # noqa: F401  (tiny_models builds the checkpoints)

    _, _, path = tiny_models["qwen3"]
    ck = checkpoint.load_target(path)
    rs = np.random.RandomState(0)
    seqs = [rs.randint(4, 96, 40).tolist() for _ in range(8)]
    masks = [[False] * 10 + [True] * 30 for _ in range(8)]
    batch = {"tokens": np.asarray(seqs, np.int32).reshape(1, 8, 40), "loss_mask": np.asarray(masks).reshape(1, 8, 40)}
    dcfg = DrafterConfig.for_target(ck.cfg, num_layers=2, block_size=4, mask_token_id=3)
    return path, ck, dcfg, batch


@pytest.mark.parametrize(
    "shape, dflash2", [((8, 1, 1), False), ((2, 2, 2), False), ((1, 2, 4), False), ((2, 2, 2), True)]
)
def test_sharded_training_step_equals_single_device(setup, shape, dflash2):
    """The same update on a mesh as on one device; a DFlash 2 drafter's (convolutions, selector and its
    loss) too."""
    path, ck, dcfg, batch = setup
    if dflash2:
        dcfg = dataclasses.replace(dcfg, conv_kernel_size=2, conv_group_size=16, selector_rank=8, selector_top_k=8)
    opt = optax.sgd(1.0)  # the update is minus the gradient: compare gradients, not Adam's sign-like steps
    kw = dict(tcfg=ck.cfg, dcfg=dcfg, opt=opt, num_anchors=8, loss=LossSettings(gamma=4.0, anchor_chunk=4))
    params = jax.tree.map(np.asarray, init_drafter_params(dcfg, seed=0))  # host copies: the step donates
    rng = jax.random.PRNGKey(0)
    want_p, _, want_m = jax.jit(lambda p, s: train_step(p, s, ck.params, batch, rng, **kw))(params, opt.init(params))

    mesh = make_mesh(shape)
    target = checkpoint.load_target(path, mesh=mesh).params
    step, param_sh, batch_sh, opt_sh = sharded_step(mesh, params, target, **kw)
    p = jax.device_put(params, param_sh)
    s = jax.device_put(opt.init(params), opt_sh)
    got_p, _, got_m = step(p, s, target, jax.device_put(batch, batch_sh), rng)
    assert len(jax.tree.leaves(got_p)[0].sharding.device_set) == 8
    np.testing.assert_allclose(float(got_m["loss"]), float(want_m["loss"]), rtol=1e-5)
    np.testing.assert_allclose(float(got_m["grad_norm"]), float(want_m["grad_norm"]), rtol=1e-4)
    if dflash2:
        assert float(want_m["selector_loss"]) > 0
        np.testing.assert_allclose(float(got_m["selector_loss"]), float(want_m["selector_loss"]), rtol=1e-5)
    # gradients agree to 1e-4 of their largest entry (float32; the sums run in another order per mesh)
    for p0, a, b in zip(jax.tree.leaves(params), jax.tree.leaves(got_p), jax.tree.leaves(want_p)):
        ga, gb = np.asarray(p0) - np.asarray(a), np.asarray(p0) - np.asarray(b)
        np.testing.assert_allclose(ga, gb, rtol=0, atol=1e-4 * np.abs(gb).max() + 1e-9)


def test_trainer_on_a_mesh_resumes_on_another(tiny_models, tmp_path):
    """Two steps on (2, 2, 2), checkpoint, two more on (1, 2, 4): the losses follow a single-device
    run (float tolerance: the reductions run in another order)."""
    from test_train import tiny_config  # the same small training config

    from dflash_jax.train import Trainer

    _, _, path = tiny_models["qwen3"]
    ck = checkpoint.load_target(path)
    rs = np.random.RandomState(1)
    folder = data.write_dataset(
        tmp_path / "d",
        [rs.randint(4, 96, 40).tolist() for _ in range(48)],
        [[False] * 8 + [True] * 32 for _ in range(48)],
    )
    extra = ("train.steps=4", "ckpt.every=2", "eval.every=100", "eval.val_size=8")
    single = Trainer(tiny_config(ck, folder, tmp_path / "one", *extra), log=lambda *_: None)
    single.run()
    Trainer(tiny_config(ck, folder, tmp_path / "m", *extra, "mesh=(2, 2, 2)"), log=lambda *_: None).run(stop_after=2)
    other = Trainer(tiny_config(ck, folder, tmp_path / "m", *extra, "mesh=(1, 2, 4)"), log=lambda *_: None)
    assert other.step == 2 and len(jax.tree.leaves(other.params)[0].sharding.device_set) == 8
    other.run()
    import json

    a = [json.loads(x)["loss"] for x in (tmp_path / "one" / "metrics.jsonl").read_text().splitlines()]
    b = [json.loads(x)["loss"] for x in (tmp_path / "m" / "metrics.jsonl").read_text().splitlines()]
    np.testing.assert_allclose(b, a, rtol=1e-4)


@pytest.mark.parametrize("shape", [(2, 2, 2), (4, 1, 2)])
def test_speculative_decoding_on_a_mesh_equals_single_device(tiny_models, shape):
    from dflash_jax.decode import Decoder
    from dflash_jax.speculation import make_plan

    _, _, path = tiny_models["qwen3"]
    ck = checkpoint.load_target(path)
    dcfg = DrafterConfig.for_target(ck.cfg, num_layers=1, block_size=4, mask_token_id=3)
    dparams = init_drafter_params(dcfg, seed=2)
    rs = np.random.RandomState(4)
    prompts = [rs.randint(4, 96, n).tolist() for n in (3, 17, 9, 30)]
    want = Decoder(ck.params, ck.cfg, make_plan(DraftStep(dcfg, ck.cfg), dparams)).generate(prompts, 20, [7])
    mesh = make_mesh(shape)
    sharded = checkpoint.load_target(path, mesh=mesh)
    dec = Decoder(sharded.params, ck.cfg, make_plan(DraftStep(dcfg, ck.cfg), dparams), mesh=mesh)
    got = dec.generate(prompts, 20, [7])
    for w, g in zip(want, got):
        assert (g.token_ids, g.acceptance_lengths) == (w.token_ids, w.acceptance_lengths)
    k = sharded.params["layers_0"]["attn"]["k_proj"]
    assert len(k.sharding.device_set) == 8
    ((prefill, _),) = dec._compiled.values()
    cache_k = prefill.output_shardings.target_cache[0][0]  # [batch, cache_length, kv_heads, head_dim]
    assert cache_k.spec[2] == "tensor" and cache_k.spec[0] in (("data", "fsdp"), "data")  # heads, batch split


def test_two_processes_train_like_one(tiny_models, tmp_path):
    """``launch/train_hosts.sh "localhost localhost"``: two processes on this machine (4 CPU devices
    each, gloo collectives, jax.distributed) train a few steps on a (2, 2, 2) mesh and log the same
    losses as one process with 8 devices."""
    import json
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    _, _, path = tiny_models["qwen3"]
    rs = np.random.RandomState(2)
    folder = data.write_dataset(
        tmp_path / "d",
        [rs.randint(4, 96, 40).tolist() for _ in range(48)],
        [[False] * 8 + [True] * 32 for _ in range(48)],
    )
    root = Path(__file__).resolve().parents[1]
    base = [
        sys.executable,
        "-m",
        "dflash_jax.cli",
        "train",
        "--config",
        str(root / "configs" / "smollm2_135m.py"),
        f"target={path}",
        f"data={folder}",
        "drafter.num_layers=1",
        "drafter.block_size=4",
        "train.max_len=40",
        "train.num_anchors=8",
        "train.anchor_chunk=4",
        "train.batch_size=8",
        "train.steps=3",
        "ckpt.every=3",
        "eval.every=100",
        "eval.val_size=8",
        "eval.decode_prompts=0",
        "mesh=(2, 2, 2)",
    ]
    env = {**os.environ, "PYTHONPATH": str(root), "TQDM_DISABLE": "1"}
    one = subprocess.run(base + [f"out_dir={tmp_path / 'one'}"], env=env, capture_output=True, text=True)
    assert one.returncode == 0, one.stderr[-2000:]
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    env2 = {**env, "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "PORT": str(port)}
    script = [str(root / "launch" / "train_hosts.sh"), "localhost localhost", base[5]]
    two = subprocess.run(
        script + base[6:] + [f"out_dir={tmp_path / 'two'}"],
        env=env2,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=root,
    )
    assert two.returncode == 0, two.stderr[-3000:]
    assert "process 1 of 2: 4 local devices, 8 in all" in two.stderr
    a = [json.loads(x) for x in (tmp_path / "one" / "metrics.jsonl").read_text().splitlines()]
    b = [json.loads(x) for x in (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in b] == [1, 2, 3]
    np.testing.assert_allclose([r["loss"] for r in b], [r["loss"] for r in a], rtol=1e-5)
    assert (tmp_path / "two" / "drafter" / "dflash_jax.json").exists()  # exported once, by process 0
