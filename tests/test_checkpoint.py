"""Conversion HF/GGUF -> orbax, loading back with dtype and sharding, and the errors for bad input."""

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dflash_jax import checkpoint, hf_format
from dflash_jax.errors import CheckpointError, ConfigError
from dflash_jax.sharding import make_mesh


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_roundtrip_identity_and_dtypes(tiny_models):
    _, hf_dir, path = tiny_models["llama"]
    ck = checkpoint.load_target(path)
    meta = json.loads((path / "dflash_jax.json").read_text())
    assert set(meta["identity"]) == {"config_sha256", "tokenizer_sha256", "source_sha256"}
    assert meta["identity"]["config_sha256"] == checkpoint.config_hash(ck.cfg)
    assert all(x.dtype == jnp.float32 for x in jax.tree_util.tree_leaves(ck.params))
    bf = checkpoint.load_target(path, dtype="bfloat16")
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree_util.tree_leaves(bf.params))
    np.testing.assert_allclose(
        np.asarray(bf.params["embedding"], np.float32), np.asarray(ck.params["embedding"]), rtol=1e-2
    )


def test_the_tokenizer_equals_autotokenizers_for_every_family(tiny_models):
    """``TargetCheckpoint.tokenizer`` (the generic fast tokenizer, no PyTorch import) is what
    ``AutoTokenizer`` builds from the same folder: vocabulary, special tokens, chat template, and the
    ids of a chat and of plain text, decoded back alike; with no tokenizer.json it is AutoTokenizer's."""
    from transformers import AutoTokenizer

    text = "Hello world: 7 * 6 = 42, naïve café; <tool> \n end"
    chat = [{"role": "user", "content": text}]
    families = [*tiny_models, "smollm2"]
    for family in families:
        path = hub_path() if family == "smollm2" else tiny_models[family][2]
        ours, ref = checkpoint.load_target(path).tokenizer(), AutoTokenizer.from_pretrained(str(path))
        assert ours.get_vocab() == ref.get_vocab() and ours.all_special_tokens == ref.all_special_tokens, family
        assert ours.chat_template == ref.chat_template, family
        assert ours(text)["input_ids"] == ref(text)["input_ids"], family
        if ref.chat_template:
            got = ours.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)
            assert got == ref.apply_chat_template(chat, add_generation_prompt=True, tokenize=True), family
        ids = ref(text)["input_ids"]
        assert ours.decode(ids, skip_special_tokens=True) == ref.decode(ids, skip_special_tokens=True), family


def hub_path():
    from dflash_jax import hub

    return checkpoint.resolve_target(hub.SMOLLM2)


def test_sharded_load(tiny_models):
    _, _, path = tiny_models["qwen3"]
    mesh = make_mesh((2, 2, 2))
    ck = checkpoint.load_target(path, mesh=mesh)
    q = ck.params["layers_0"]["attn"]["q_proj"]  # [embed, heads*head_dim] -> (fsdp, tensor)
    assert q.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor")
    assert len(q.addressable_shards) == 8
    plain = checkpoint.load_target(path)
    np.testing.assert_array_equal(np.asarray(q), np.asarray(plain.params["layers_0"]["attn"]["q_proj"]))


def test_existing_output_is_refused(tiny_models, tmp_path):
    _, hf_dir, path = tiny_models["qwen2"]
    with pytest.raises(CheckpointError, match="already exists"):
        checkpoint.convert_hf(hf_dir, path)


def test_missing_tensor_named_and_nothing_written(tiny_models, tmp_path):
    from safetensors.numpy import load_file, save_file

    _, hf_dir, _ = tiny_models["qwen2"]
    bad = _copy(hf_dir, tmp_path / "hf")
    weights = load_file(bad / "model.safetensors")
    del weights["model.layers.1.mlp.up_proj.weight"]
    save_file(weights, bad / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
        checkpoint.convert_hf(bad, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert not list(tmp_path.glob(".out.dflash-jax-*"))


def test_index_pointing_at_the_wrong_shard_says_so(tiny_models, tmp_path):
    """A ``model.safetensors.index.json`` that maps a tensor to a shard that does not hold it (and so
    leaves out the one that does) names the tensor, both files and the fix, not "missing"."""
    from safetensors.numpy import load_file, save_file

    _, hf_dir, _ = tiny_models["qwen2"]
    bad = _copy(hf_dir, tmp_path / "hf")
    weights = load_file(bad / "model.safetensors")
    (bad / "model.safetensors").unlink()
    moved = "model.layers.1.mlp.up_proj.weight"
    first, second = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    save_file({moved: weights.pop(moved)}, bad / first)
    save_file(weights, bad / second)
    index = bad / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {name: second for name in [moved, *weights]}}))
    with pytest.raises(CheckpointError) as e:
        checkpoint.convert_hf(bad, tmp_path / "out")
    assert str(e.value) == (
        f"{index} points tensor {moved} at the wrong file: {second} does not hold it, {first} does; "
        "regenerate model.safetensors.index.json from the files (save_pretrained writes it)"
    )
    index.write_text(json.dumps({"weight_map": {name: second for name in weights}}))  # the tensor left out
    with pytest.raises(CheckpointError, match=f"does not list tensor {moved}, which is in {first}; regenerate"):
        checkpoint.convert_hf(bad, tmp_path / "out")
    (bad / first).unlink()  # and held by no file at all: missing, and the index's entry named
    index.write_text(json.dumps({"weight_map": {name: second for name in [moved, *weights]}}))
    with pytest.raises(CheckpointError, match=f"tensor {moved} is missing: .* maps it to {second}, which does not"):
        checkpoint.convert_hf(bad, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_shape_mismatch_named(tiny_models, tmp_path):
    _, hf_dir, _ = tiny_models["qwen2"]
    bad = _copy(hf_dir, tmp_path / "hf")
    cfg = json.loads((bad / "config.json").read_text())
    cfg["intermediate_size"] = 96
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"mlp\.(gate|up|down)_proj\.weight.*shape"):
        checkpoint.convert_hf(bad, tmp_path / "out")


def test_dtype_mismatch_named(tiny_models, tmp_path):
    from safetensors.numpy import load_file, save_file

    _, hf_dir, _ = tiny_models["qwen2"]
    bad = _copy(hf_dir, tmp_path / "hf")
    weights = load_file(bad / "model.safetensors")
    weights["model.norm.weight"] = weights["model.norm.weight"].astype(np.int32)
    save_file(weights, bad / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"model\.norm\.weight.*dtype int32"):
        checkpoint.convert_hf(bad, tmp_path / "out")


def test_cli_reports_bad_input_in_one_line(tmp_path, capsys):
    from dflash_jax.cli import main

    with pytest.raises(SystemExit, match="error: .*not a folder"):
        main(["convert", "--hf", str(tmp_path / "missing"), "--out", str(tmp_path / "out")])


def test_unsupported_architecture(tiny_models, tmp_path):
    _, hf_dir, _ = tiny_models["qwen2"]
    bad = _copy(hf_dir, tmp_path / "hf")
    cfg = json.loads((bad / "config.json").read_text())
    cfg["use_sliding_window"] = True
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="use_sliding_window"):
        checkpoint.convert_hf(bad, tmp_path / "out")


def test_missing_files(tmp_path):
    with pytest.raises(CheckpointError, match="not a folder"):
        checkpoint.convert_hf(tmp_path / "nope", tmp_path / "out")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="config.json"):
        checkpoint.convert_hf(tmp_path / "empty", tmp_path / "out")


def test_corrupt_safetensors(tiny_models, tmp_path):
    _, hf_dir, _ = tiny_models["qwen2"]
    bad = _copy(hf_dir, tmp_path / "hf")
    (bad / "model.safetensors").write_bytes(b"\x00" * 100)
    with pytest.raises(CheckpointError, match="model.safetensors"):
        checkpoint.convert_hf(bad, tmp_path / "out")


def test_partial_or_corrupt_checkpoint(tiny_models, tmp_path):
    _, _, path = tiny_models["qwen2"]
    broken = _copy(path, tmp_path / "ck")
    shutil.rmtree(broken / "params")
    with pytest.raises(CheckpointError, match="missing orbax checkpoint"):
        checkpoint.load_target(broken)
    broken2 = _copy(path, tmp_path / "ck2")
    for f in (broken2 / "params").rglob("*"):
        if f.is_file() and f.stat().st_size > 1000:
            f.write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="cannot restore"):
        checkpoint.load_target(broken2)
    with pytest.raises(CheckpointError, match="not a dflash-jax target checkpoint"):
        checkpoint.load_target(tmp_path)


def test_hf_folder_passed_as_checkpoint_explains(tiny_models):
    _, hf_dir, _ = tiny_models["qwen2"]
    with pytest.raises(CheckpointError, match="dflash-jax convert --hf"):
        checkpoint.load_target(hf_dir)


def test_not_a_gguf(tmp_path):
    f = tmp_path / "model.gguf"
    f.write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(CheckpointError, match="not a GGUF file"):
        checkpoint.convert_gguf(f, tmp_path / "out")
    with pytest.raises(CheckpointError, match="does not exist"):
        checkpoint.convert_gguf(tmp_path / "missing.gguf", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_convert_cli(tiny_models, tmp_path):
    from dflash_jax.cli import main

    _, hf_dir, _ = tiny_models["llama"]
    main(["convert", "--hf", str(hf_dir), "--out", str(tmp_path / "cli")])
    assert (tmp_path / "cli" / "dflash_jax.json").exists()
    assert checkpoint.load_target(tmp_path / "cli").cfg.family == "llama"


def test_overwrite_never_deletes_foreign_folders(tiny_models, tmp_path):
    _, hf_dir, _ = tiny_models["qwen2"]
    src = _copy(hf_dir, tmp_path / "src")
    with pytest.raises(CheckpointError, match="overwrite the source"):
        checkpoint.convert_hf(src, src, overwrite=True)
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("precious")
    with pytest.raises(CheckpointError, match="not a folder written by dflash-jax"):
        checkpoint.convert_hf(src, other, overwrite=True)
    assert (other / "keep.txt").read_text() == "precious" and (src / "model.safetensors").exists()


def test_gguf_never_reuses_a_stale_hf_folder(tiny_models, tmp_path):
    _, hf_dir, _ = tiny_models["qwen2"]
    _copy(hf_dir, tmp_path / "g.hf")  # a stale folder beside --out, not made from this GGUF
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"GGUFgarbage")
    with pytest.raises(CheckpointError, match="not a readable GGUF model"):
        checkpoint.convert_gguf(fake, tmp_path / "g")
    assert not (tmp_path / "g").exists()


@pytest.mark.parametrize(
    "patch, message",
    [
        ({"num_attention_heads": None}, "num_attention_heads|malformed"),
        ({"hidden_size": "abc"}, "malformed"),
        ({"num_key_value_heads": 3}, "multiple of"),
        ({"rope_scaling": {"factor": 2.0}}, "no rope_type"),
    ],
)
def test_malformed_config_fields(patch, message):
    base = {
        "model_type": "llama",
        "vocab_size": 10,
        "hidden_size": 8,
        "intermediate_size": 16,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
    }
    cfg = {**base, **patch}
    cfg = {k: v for k, v in cfg.items() if v is not None}
    with pytest.raises(ConfigError, match=message):
        hf_format.read_config(cfg)
    with pytest.raises(ConfigError, match="JSON object"):
        hf_format.read_config([1, 2])


def test_qwen3_moe_gguf_converts_like_its_hf_folder(tmp_path):
    """A mixture-of-experts GGUF (llama.cpp's ``qwen3moe`` names, stacked experts), read through
    transformers: the same config and exactly the same parameters as the model's HF folder."""
    from helpers import write_tiny_qwen3_moe_gguf

    gguf_file = write_tiny_qwen3_moe_gguf(tmp_path)
    ck = checkpoint.load_target(checkpoint.convert_gguf(gguf_file, tmp_path / "ck"))
    hf_cfg = hf_format.read_config(json.loads((tmp_path / "hf" / "config.json").read_text()))
    assert ck.cfg.moe == hf_cfg.moe and ck.cfg.num_layers == 2 and ck.cfg.qk_norm
    want = checkpoint.load_hf_params(tmp_path / "hf", hf_cfg)
    for got, ref in zip(jax.tree.leaves(ck.params), jax.tree.leaves(want)):
        np.testing.assert_array_equal(np.asarray(got), ref)


def test_a_gguf_missing_a_tensor_is_refused(tmp_path):
    """transformers fills a tensor a GGUF lacks at random and only logs it; the conversion refuses instead."""
    from helpers import write_tiny_qwen3_moe_gguf

    gguf_file = write_tiny_qwen3_moe_gguf(tmp_path, omit=("blk.1.ffn_down_exps.weight",))
    with pytest.raises(CheckpointError, match=r"lacks 1 tensors .*first: model\.layers\.1\.mlp\.experts"):
        checkpoint.convert_gguf(gguf_file, tmp_path / "ck")
    assert not (tmp_path / "ck").exists() and not (tmp_path / "ck.hf").exists()


@pytest.mark.parametrize(
    "arch, message",
    [
        # transformers 5.24 reads neither the experts nor the sinks of llama.cpp's gpt-oss GGUFs
        ("gpt-oss", "gpt-oss GGUF, which transformers' GGUF reader does not read whole"),
        # its gemma3 mapping keeps one RoPE base and no scaling (Gemma 3 has two bases, and 8x scaling)
        ("gemma3", r"gemma3 GGUF, .* does not read whole \(the sliding layers' RoPE base, RoPE scaling\)"),
        ("gemma4", r"gemma4 GGUF, .* does not read whole \(its RoPE bases\)"),
        # nor Qwen3.5's (llama.cpp's qwen35) at all
        ("qwen35", "qwen35 GGUF, which transformers' GGUF reader does not read; convert the Hugging Face"),
    ],
)
def test_a_gguf_transformers_cannot_read_is_refused_with_the_fix(tmp_path, arch, message):
    """One line naming the architecture and the fix (not "a cut download?"), before any tensor is read."""
    import gguf

    path = tmp_path / "model.gguf"
    w = gguf.GGUFWriter(str(path), arch)
    w.add_uint32(f"{arch}.block_count", 2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(CheckpointError, match=message):
        checkpoint.convert_gguf(path, tmp_path / "ck")
