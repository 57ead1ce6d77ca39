"""The failure paths a user actually hits: nothing of theirs is lost, no data is mixed, no code of
a downloaded folder is run, and every bad input ends in one line that names the fix.

Each test reproduces a case that lost, mixed or ran something, or showed a traceback, before
the fix (tiny models and tiny data throughout).
"""

import json
import os
import shutil
import stat
from pathlib import Path

import jax
import numpy as np
import pytest
from helpers import TINY, stale_scratch

from dflash_jax import checkpoint, data, prepare, prompts
from dflash_jax.cli import main
from dflash_jax.drafter import DrafterConfig, init_drafter_params
from dflash_jax.drafter_io import export_released, import_released, load_drafter, save_drafter
from dflash_jax.errors import CheckpointError, ConfigError, DataError
from dflash_jax.sampling import Sampling
from dflash_jax.sharding import make_mesh
from dflash_jax.train import Trainer
from dflash_jax.train_config import load_config

ROOT = Path(__file__).resolve().parents[1]


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


@pytest.fixture(scope="session")
def target(tiny_models):
    _, hf_dir, path = tiny_models["qwen3"]
    ck = checkpoint.load_target(path)
    return ck, ck.tokenizer(), hf_dir


def _drafter(ck):
    cfg = DrafterConfig.for_target(ck.cfg, num_layers=1, block_size=4, mask_token_id=3)
    return init_drafter_params(cfg, seed=0), cfg


def _dataset(folder: Path, seed: int, n: int = 40) -> Path:
    rs = np.random.RandomState(seed)
    return data.write_dataset(
        folder, [rs.randint(4, 96, 30).tolist() for _ in range(n)], [[False] * 6 + [True] * 24 for _ in range(n)]
    )


def _config(ck, folder, out, *extra):
    return load_config(
        ROOT / "configs" / "smollm2_135m.py",
        [
            f"target={ck.path}",
            f"data={folder}",
            f"out_dir={out}",
            "drafter.num_layers=1",
            "drafter.target_layer_ids=(1,)",
            "drafter.block_size=4",
            "train.max_len=32",
            "train.num_anchors=8",
            "train.anchor_chunk=8",
            "train.batch_size=4",
            "eval.val_size=4",
            "eval.decode_prompts=0",
            "eval.every=100",
            *extra,
        ],
    )


def _run_cli(argv, capsys) -> str:
    """``dflash-jax argv`` that must fail: its one-line message (no traceback)."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    msg = str(e.value.code)
    assert msg.startswith("error:") or msg.startswith("\n"), msg
    assert "Traceback" not in capsys.readouterr().err
    return msg


# --- 1, 11: only what this program provably wrote is ever deleted ----------------------------------


def test_convert_removes_its_own_leftovers_and_nothing_else(tiny_models, tmp_path):
    _, hf_dir, _ = tiny_models["qwen2"]
    out = tmp_path / "ck"
    stale = stale_scratch(out)  # a convert killed mid-write
    mine = tmp_path / "ck.old-2023"  # a user's folder that looks like the old leftover names
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    live = stale_scratch(tmp_path / "other")
    (live / ".dflash-jax-scratch").write_text(f"{os.uname().nodename} {os.getpid()}")  # a live writer's
    checkpoint.convert_hf(hf_dir, out)
    assert not stale.exists() and (mine / "notes.txt").read_text() == "keep" and live.exists()
    assert not list(tmp_path.glob(".ck.dflash-jax-*"))  # the convert left no scratch of its own


# --- 2: --overwrite replaces only a folder of the same kind -----------------------------------------


def test_overwrite_refuses_a_folder_of_another_kind(target, tmp_path, capsys):
    ck, _, _ = target
    params, cfg = _drafter(ck)
    ours = save_drafter(params, cfg, tmp_path / "ours", target_identity=ck.identity)
    victim = _copy(ck.path, tmp_path / "target")
    msg = _run_cli(["export-drafter", "--drafter", str(ours), "--out", str(victim), "--overwrite"], capsys)
    assert "holds a dflash-jax target, not a released-drafter" in msg
    with pytest.raises(CheckpointError, match="holds a dflash-jax target, not a drafter"):
        save_drafter(params, cfg, victim, overwrite=True)
    assert checkpoint.load_target(victim).identity == ck.identity  # untouched
    export_released(params, cfg, tmp_path / "rel", target_identity=ck.identity)
    export_released(params, cfg, tmp_path / "rel", target_identity=ck.identity, overwrite=True)  # same kind: fine
    with pytest.raises(CheckpointError, match="holds a dflash-jax released-drafter, not a drafter"):
        save_drafter(params, cfg, tmp_path / "rel", overwrite=True)


# --- 3, 4: data is identified by content; shards by the settings that made them ---------------------


def test_resume_refuses_data_remade_with_other_content(target, tmp_path):
    ck, _, _ = target
    folder, out = tmp_path / "d", tmp_path / "run"
    _dataset(folder, seed=0)
    Trainer(_config(ck, folder, out, "train.steps=4", "ckpt.every=2"), log=lambda *_: None).run(stop_after=2)
    shutil.rmtree(folder)
    _dataset(folder, seed=1)  # same name, counts and lengths; other tokens
    with pytest.raises(CheckpointError, match="another data.*content_sha256"):
        Trainer(_config(ck, folder, out, "train.steps=4", "ckpt.every=2"), log=lambda *_: None)


def test_prepare_refuses_a_folder_or_shard_made_with_other_settings_naming_them(target, tmp_path):
    """A rerun with other settings is refused before anything is written, naming the folder (or the
    shard) and each setting that differs, old -> new, with the fix."""
    ck, tok, _ = target
    src = tmp_path / "p.jsonl"
    src.write_text("".join(json.dumps({"prompt": f"t{10 + i} t{20 + i}"}) + "\n" for i in range(8)))
    items = prompts.read_prompts(src)
    out = tmp_path / "d"
    prepare.prepare(ck, tok, items, out, max_new_tokens=6, batch_size=4, shard_size=4, progress=False)
    with pytest.raises(DataError) as e:  # the folder's index says what it was made with
        prepare.prepare(ck, tok, items, out, max_new_tokens=7, batch_size=4, shard_size=4, seed=1, progress=False)
    assert str(e.value) == (
        f"{out} holds data prepared with other settings (max_new_tokens: 6 -> 7; seed: 0 -> 1); "
        "choose another --out, or rerun with the settings it was made with"
    )
    (out / "meta.json").unlink()  # as if killed between the first shards and the index write
    shutil.rmtree(out / "shard_00001")
    with pytest.raises(DataError) as e:  # then the shard does
        prepare.prepare(ck, tok, items, out, max_new_tokens=7, batch_size=4, shard_size=4, progress=False)
    assert str(e.value).startswith(
        f"{out / 'shard_00000'} was made with other settings (max_new_tokens: 6 -> 7); choose another --out, "
        "or rerun with the settings it was made with"
    )
    assert not (out / "shard_00001").exists()  # nothing was written
    meta = json.loads((out / "shard_00000" / "meta.json").read_text())
    del meta["settings"]  # a shard written before shards recorded their settings: only the hash tells
    (out / "shard_00000" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DataError, match=r"shard_00000 was made with other settings \(it records their hash only"):
        prepare.prepare(ck, tok, items, out, max_new_tokens=7, batch_size=4, shard_size=4, progress=False)
    again = prepare.prepare(ck, tok, items, out, max_new_tokens=6, batch_size=4, shard_size=4, progress=False)
    assert again["complete"] and set(again["content_sha256"]) == {"shard_00000", "shard_00001"}


def test_rerun_over_a_damaged_shard_names_the_fix_and_keeps_the_index(target, tmp_path):
    ck, tok, _ = target
    src = tmp_path / "p.jsonl"
    src.write_text("".join(json.dumps({"prompt": f"t{10 + i}"}) + "\n" for i in range(8)))
    items = prompts.read_prompts(src)
    out = tmp_path / "d"
    prepare.prepare(ck, tok, items, out, max_new_tokens=6, batch_size=4, shard_size=4, progress=False)
    index = (out / "meta.json").read_text()
    np.save(out / "shard_00001" / "tokens.npy", np.zeros(3, np.int32))  # damaged after it was finished
    with pytest.raises(DataError, match=r"delete .*shard_00001 and rerun this command"):
        prepare.prepare(ck, tok, items, out, max_new_tokens=6, batch_size=4, shard_size=4, progress=False)
    assert (out / "meta.json").read_text() == index and json.loads(index)["complete"]


def test_empty_prompt_file_is_refused_before_the_model_loads(tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    msg = _run_cli(
        [
            "prepare-data",
            "--target",
            str(tmp_path / "no-such-target"),
            "--prompts",
            str(empty),
            "--out",
            str(tmp_path / "d"),
        ],
        capsys,
    )
    assert "has no prompts" in msg and not (tmp_path / "d").exists()


def test_prepare_features_remakes_a_damaged_features_file(target, tmp_path):
    ck, _, _ = target
    ds = data.TokenDataset(_dataset(tmp_path / "d", seed=0))
    folder = prepare.write_features(ds, ck, (1,), dtype="float32", progress=False)
    good = np.load(folder / "d.npy")
    with open(folder / "d.npy", "r+b") as f:
        f.truncate(os.path.getsize(folder / "d.npy") // 2)
    logs = []
    prepare.write_features(ds, ck, (1,), dtype="float32", progress=False, log=logs.append)
    assert np.array_equal(np.load(folder / "d.npy"), good) and any("damaged" in x for x in logs)


# --- 5: tensors the config does not describe are an error, not dropped --------------------------------


def test_tensors_the_config_does_not_describe_are_refused(tiny_models, target, tmp_path):
    from safetensors.numpy import load_file, save_file

    _, hf_dir, _ = tiny_models["qwen2"]
    bad = _copy(hf_dir, tmp_path / "hf")
    w = load_file(bad / "model.safetensors")
    w["model.layers.9.mlp.up_proj.weight"] = w["model.layers.1.mlp.up_proj.weight"]  # a layer config.json lacks
    save_file(w, bad / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"does not describe, first: model\.layers\.9\.mlp\.up_proj\.weight"):
        checkpoint.convert_hf(bad, tmp_path / "out")

    _, tied_dir, _ = tiny_models["qwen3"]  # tie_word_embeddings=True
    tied = _copy(tied_dir, tmp_path / "tied")
    w = load_file(tied / "model.safetensors")
    w["lm_head.weight"] = w["model.embed_tokens.weight"] * 2  # an untied head in a folder marked tied
    save_file(w, tied / "model.safetensors")
    with pytest.warns(UserWarning, match="ignored lm_head.weight"):
        checkpoint.convert_hf(tied, tmp_path / "tied-ck")

    ck, _, _ = target
    params, cfg = _drafter(ck)
    rel = export_released(params, cfg, tmp_path / "rel")
    w = load_file(rel / "model.safetensors")
    w["layers.0.attention_conv.base_kernel"] = np.zeros((2, 2, cfg.hidden_size), np.float32)  # a DFlash 2 tensor
    save_file(w, rel / "model.safetensors")
    with pytest.raises(CheckpointError, match="attention_conv.base_kernel"):
        import_released(rel)


# --- 6: a folder's own Python is never run -------------------------------------------------------------


def test_a_folder_with_remote_code_is_loaded_without_running_it(tiny_models, tmp_path):
    _, hf_dir, _ = tiny_models["qwen2"]
    evil = _copy(hf_dir, tmp_path / "hf")
    sentinel = tmp_path / "ran"
    (evil / "evil_tokenizer.py").write_text(
        f"open({str(sentinel)!r}, 'w').write('ran')\n"
        "from transformers import PreTrainedTokenizerFast as EvilTokenizer\n"
    )
    cfg = json.loads((evil / "tokenizer_config.json").read_text())
    cfg["auto_map"] = {"AutoTokenizer": [None, "evil_tokenizer.EvilTokenizer"]}
    (evil / "tokenizer_config.json").write_text(json.dumps(cfg))
    try:
        out = checkpoint.convert_hf(evil, tmp_path / "ck")
        checkpoint.load_target(out).tokenizer()
    except CheckpointError:
        pass  # refusing it is as good as loading it without its code
    assert not sentinel.exists()


# --- 7: a damaged newest checkpoint falls back to the newest that restores ------------------------------


def test_a_damaged_latest_checkpoint_falls_back_to_an_earlier_one(target, tmp_path):
    ck, _, _ = target
    folder, out = _dataset(tmp_path / "d", seed=0), tmp_path / "run"
    extra = ("train.steps=6", "ckpt.every=2", "ckpt.keep=3")
    whole = Trainer(_config(ck, folder, tmp_path / "whole", *extra), log=lambda *_: None)
    whole.run()
    Trainer(_config(ck, folder, out, *extra), log=lambda *_: None).run(stop_after=4)
    for f in (out / "ckpt" / "4" / "state").rglob("*"):
        if f.is_file() and f.stat().st_size > 0:
            f.write_bytes(b"\0" * 7)  # a disk that filled up while step 4 was written
    logs = []
    again = Trainer(_config(ck, folder, out, *extra), log=logs.append)
    assert again.step == 2 and any("step 4" in x and "does not restore" in x for x in logs)
    again.run()  # steps 3..6 again, and step 4 is saved anew
    for a, b in zip(jax.tree.leaves(again.params), jax.tree.leaves(whole.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # as if never interrupted


# --- 8: the Hugging Face cache layout -----------------------------------------------------------------


def test_hugging_face_cache_layout_with_symlinks(tiny_models, tmp_path):
    _, hf_dir, _ = tiny_models["qwen2"]
    repo = tmp_path / "models--org--tiny"
    snap, blobs = repo / "snapshots" / "0123abc", repo / "blobs"
    snap.mkdir(parents=True)
    blobs.mkdir()
    files = [p for p in hf_dir.iterdir() if p.is_file()]
    for i, p in enumerate(files):
        shutil.copy(p, blobs / f"blob{i}")
        (snap / p.name).symlink_to(Path("../../blobs") / f"blob{i}")
    index = {"metadata": {}, "weight_map": {"model.embed_tokens.weight": "model.safetensors"}}
    (blobs / "index").write_text(json.dumps(index))
    (snap / "model.safetensors.index.json").symlink_to(Path("../../blobs/index"))
    out = checkpoint.convert_hf(snap, tmp_path / "ck")
    assert checkpoint.load_target(out).cfg.num_layers == TINY["num_hidden_layers"]
    (blobs / "index").write_text(json.dumps({"weight_map": {"x": "../../../secret.safetensors"}}))
    with pytest.raises(CheckpointError, match="points outside"):
        checkpoint.convert_hf(snap, tmp_path / "ck2")


# --- 9: one line instead of a traceback ---------------------------------------------------------------


def test_bad_drafter_folders_are_one_line_errors(target, tmp_path, capsys):
    ck, _, _ = target
    params, cfg = _drafter(ck)
    rel = export_released(params, cfg, tmp_path / "rel", target_identity=ck.identity)
    cut = _copy(rel, tmp_path / "cut")
    size = (cut / "model.safetensors").stat().st_size
    with open(cut / "model.safetensors", "r+b") as f:
        f.truncate(size // 2)
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        load_drafter(cut)
    assert "not a readable safetensors" in _run_cli(
        ["import-drafter", "--drafter", str(cut), "--out", str(tmp_path / "x")], capsys
    )
    for patch, field in (
        ({"num_hidden_layers": None}, "num_hidden_layers"),
        ({"block_size": "abc"}, "block_size"),
        ({"hidden_size": 1.5}, "hidden_size"),
        ({"architectures": ["DFlash2DraftModel"]}, "conv_kernel_size"),  # a DFlash 2 label without its fields
        ({"architectures": ["Qwen3ForCausalLM"]}, "architectures"),  # not a DFlash drafter: refused by name
    ):
        bad = _copy(rel, tmp_path / f"bad-{field.replace(' ', '')}")
        raw = json.loads((bad / "config.json").read_text())
        for k, v in patch.items():
            if v is None:
                raw.pop(k)
            else:
                raw[k] = v
                raw["dflash_config"].pop(k, None)
        (bad / "config.json").write_text(json.dumps(raw))
        with pytest.raises(ConfigError, match=field):
            load_drafter(bad)
    ours = save_drafter(params, cfg, tmp_path / "ours")
    leaf = max((p for p in (ours / "params").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    leaf.write_bytes(leaf.read_bytes()[:1000])  # the array data, cut
    msg = _run_cli(["export-drafter", "--drafter", str(ours), "--out", str(tmp_path / "y")], capsys)
    assert "cannot restore" in msg


def test_bad_gguf_bodies_are_one_line_errors(tmp_path, capsys):
    from dflash_jax import hub

    real = hub.smollm2_gguf()
    cut = tmp_path / "cut.gguf"
    with open(real, "rb") as f:
        cut.write_bytes(f.read(1 << 16))  # the header and a little of the tensors
    assert "not a readable GGUF model" in _run_cli(
        ["convert", "--gguf", str(cut), "--out", str(tmp_path / "o")], capsys
    )
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"GGUF" + os.urandom(4096))
    assert "not a readable GGUF model" in _run_cli(
        ["convert", "--gguf", str(garbage), "--out", str(tmp_path / "o")], capsys
    )


def test_unwritable_outputs_and_a_too_large_mesh_are_one_line_errors(tiny_models, tmp_path, capsys):
    _, hf_dir, _ = tiny_models["qwen2"]
    a_file = tmp_path / "f"
    a_file.write_text("x")
    msg = _run_cli(["convert", "--hf", str(hf_dir), "--out", str(a_file / "sub" / "ck")], capsys)
    assert str(a_file) in msg
    with pytest.raises(ConfigError, match="needs 64 devices"):
        make_mesh((4, 4, 4))


def test_ctrl_c_in_prepare_data_says_how_to_resume(target, tmp_path, capsys, monkeypatch):
    ck, _, _ = target
    src = tmp_path / "p.jsonl"
    src.write_text(json.dumps({"prompt": "t5 t6"}) + "\n")

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(prepare, "prepare", interrupted)
    msg = _run_cli(
        ["prepare-data", "--target", str(ck.path), "--prompts", str(src), "--out", str(tmp_path / "d")], capsys
    )
    assert "run the same command again to resume" in msg


# --- 12: smaller ones ------------------------------------------------------------------------------------


def test_tiny_temperatures_are_refused():
    with pytest.raises(ValueError, match="too small"):
        Sampling(temperature=1e-39)
    assert Sampling(temperature=1e-4).temperature == 1e-4 and Sampling(0.0).greedy


def test_generate_checks_every_argument_and_prompt_before_decoding(target, tmp_path, capsys):
    ck, _, _ = target
    missing = str(tmp_path / "no-such-target")
    assert "top_p" in _run_cli(["generate", "--target", missing, "--prompt", "t5", "--top-p", "2"], capsys)
    assert "choose one" in _run_cli(["generate", "--target", missing, "--prompt", "t5", "--stream", "--json"], capsys)
    long = tmp_path / "p.jsonl"
    long.write_text(
        "\ufeff"
        + json.dumps({"prompt": "t5 t6"})
        + "\n"  # a byte-order mark, as some editors write
        + json.dumps({"prompt": " ".join(["t7"] * 600)})
        + "\n"
    )
    msg = _run_cli(
        [
            "generate",
            "--target",
            str(ck.path),
            "--drafter",
            "none",
            "--prompts-file",
            str(long),
            "--max-new-tokens",
            "4",
        ],
        capsys,
    )
    assert "p.jsonl:2" in msg and "context" in msg and capsys.readouterr().out == ""  # nothing was decoded


def test_convert_checks_out_before_reading(tiny_models, tmp_path, capsys):
    _, hf_dir, _ = tiny_models["qwen2"]
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "x").write_text("mine")
    assert "already exists" in _run_cli(["convert", "--gguf", str(tmp_path / "none.gguf"), "--out", str(taken)], capsys)


def test_written_weights_are_readable_by_others(target, tmp_path):
    ck, _, _ = target
    params, cfg = _drafter(ck)
    old = os.umask(0o022)
    try:
        rel = export_released(params, cfg, tmp_path / "rel")
    finally:
        os.umask(old)
    assert stat.S_IMODE((rel / "model.safetensors").stat().st_mode) == 0o644
    assert stat.S_IMODE(rel.stat().st_mode) == 0o755


def test_unsupported_architecture_folder_is_one_line_listing_the_supported(tiny_models, tmp_path, capsys):
    """``convert`` on a checkpoint folder of another architecture: one line that names it and lists
    every family we read."""
    import shutil

    from dflash_jax.hf_format import SUPPORTED_FAMILIES

    _, hf_dir, _ = tiny_models["qwen2"]
    folder = tmp_path / "mistral"
    shutil.copytree(hf_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "mistral"}))
    msg = _run_cli(["convert", "--hf", str(folder), "--out", str(tmp_path / "ck")], capsys)
    assert "model_type 'mistral' is not supported" in msg and len(msg.strip().splitlines()) == 1
    assert all(family in msg for family in SUPPORTED_FAMILIES)
