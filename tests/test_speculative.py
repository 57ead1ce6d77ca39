"""Speculative decoding with a drafter is lossless and matches the reference loop."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from dflash_jax import checkpoint
from dflash_jax.decode import Decoder
from dflash_jax.drafter import DrafterConfig, init_drafter_params
from dflash_jax.drafter_io import export_released


@pytest.fixture(scope="module")
def setup(tiny_models):
    hf, _, path = tiny_models["qwen3"]
    ck = checkpoint.load_target(path)
    dcfg = DrafterConfig.for_target(ck.cfg, num_layers=2, block_size=8, mask_token_id=3,
                                    layer_types=("full_attention", "sliding_attention"), sliding_window=6)
    dparams = init_drafter_params(dcfg, seed=0)
    plain = Decoder(ck.params, ck.cfg)
    return hf, ck, dcfg, dparams, plain, {}


def _spec(setup, bs):
    _, ck, dcfg, dparams, _, decoders = setup
    if bs not in decoders:
        decoders[bs] = Decoder(ck.params, ck.cfg, drafter=(dparams, dcfg), block_size=bs)
    return decoders[bs]


@settings(max_examples=8, deadline=None)
@given(lens=st.lists(st.integers(1, 40), min_size=1, max_size=3), bs=st.sampled_from([2, 5, 8]),
       n_new=st.integers(1, 30), seed=st.integers(0, 1000))
def test_speculative_equals_plain(setup, lens, bs, n_new, seed):
    plain = setup[4]
    rs = np.random.RandomState(seed)
    prompts = [rs.randint(4, 96, n).tolist() for n in lens]
    want = plain.generate(prompts, n_new)
    got = _spec(setup, bs).generate(prompts, n_new)
    for w, g in zip(want, got):
        assert g.token_ids == w.token_ids
        assert sum(g.acceptance_lengths) == len(g.token_ids) - 1  # every token but the first comes from a round
        assert all(1 <= a <= bs for a in g.acceptance_lengths)


def test_acceptance_lengths_equal_reference(setup, tmp_path, monkeypatch):
    import time

    import dflash.model
    from dflash.model import DFlashDraftModel, dflash_generate

    # The reference times itself with torch.cuda.synchronize; on CPU use a plain clock so that
    # return_stats=True (which carries the per-round acceptance lengths) works.
    monkeypatch.setattr(dflash.model, "_cuda_time", time.perf_counter)

    hf, ck, dcfg, dparams, _, _ = setup
    export_released(dparams, dcfg, tmp_path / "drafter")
    ref = DFlashDraftModel.from_pretrained(tmp_path / "drafter", dtype=torch.float32).eval()
    rs = np.random.RandomState(5)
    dec = _spec(setup, 8)
    for n in (4, 13, 30):
        prompt = rs.randint(4, 96, n).tolist()
        ours = dec.generate([prompt], 25)[0]
        out = dflash_generate(ref, hf, torch.tensor([prompt]), max_new_tokens=25, stop_token_ids=None,
                              return_stats=True)
        assert ours.token_ids == out.output_ids[0, n:].tolist()
        assert ours.acceptance_lengths == out.acceptance_lengths


def test_drafter_that_does_not_fit_is_a_clear_error(setup, tmp_path):
    import dataclasses

    from dflash_jax.drafter import check_fits
    from dflash_jax.target import ConfigError

    _, ck, dcfg, _, _, _ = setup
    with pytest.raises(ConfigError, match="hidden_size"):
        check_fits(dataclasses.replace(dcfg, hidden_size=32), ck.cfg)
    with pytest.raises(ConfigError, match="vocab_size"):
        check_fits(dataclasses.replace(dcfg, vocab_size=97), ck.cfg)
    with pytest.raises(ConfigError, match="4-layer target"):
        check_fits(dataclasses.replace(dcfg, num_target_layers=4, target_layer_ids=(1,)), ck.cfg.__class__(
            **{**dataclasses.asdict(ck.cfg), "num_layers": 5}))
    with pytest.raises(ConfigError, match="another target"):
        check_fits(dcfg, ck.cfg, {"config_sha256": "x"}, ck.identity)
    with pytest.raises(ConfigError, match="target_layer_ids"):
        dataclasses.replace(dcfg, target_layer_ids=(0, 4))
    with pytest.raises(ValueError, match="block size 9"):
        Decoder(ck.params, ck.cfg, drafter=(setup[3], dcfg), block_size=9)


def test_generate_cli_with_released_drafter(setup, tmp_path, capsys):
    import json

    from dflash_jax.cli import main

    _, ck, dcfg, dparams, _, _ = setup
    export_released(dparams, dcfg, tmp_path / "d", target_identity=ck.identity)
    main(["generate", "--target", str(ck.path), "--drafter", str(tmp_path / "d"), "--prompt", "t10 t11",
          "--max-new-tokens", "9", "--block-size", "4", "--json"])
    rec = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rec["num_output_tokens"] == 9 and sum(rec["acceptance_lengths"]) == 8
    assert rec["tau"] == pytest.approx(np.mean(rec["acceptance_lengths"]))


def test_jax_modules_never_import_torch(tiny_models):
    import subprocess
    import sys

    _, _, path = tiny_models["qwen3"]
    code = (
        "import sys; from dflash_jax import checkpoint, decode, drafter, target, sharding\n"
        f"ck = checkpoint.load_target({str(path)!r})\n"
        "print(decode.Decoder(ck.params, ck.cfg).generate([[5, 6]], 3)[0].token_ids)\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
