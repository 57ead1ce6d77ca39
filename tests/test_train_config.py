"""The typed training config: loading a ConfigDict file into frozen dataclasses, their checks, and a
run identity that stays what the ConfigDict-era code computed (so existing runs still resume).

No model and no data: every test here takes well under a second.
"""

import dataclasses
from pathlib import Path

import pytest

from dflash_jax.errors import ConfigError
from dflash_jax.train_config import (
    CkptSettings,
    DrafterSpec,
    EvalSettings,
    TrainConfig,
    TrainSettings,
    fingerprint,
    load_config,
    run_identity,
)
from dflash_jax.utils import differences

ROOT = Path(__file__).resolve().parents[1]

# The config of the shipped drafter (dflash_jax/assets/smollm2-135m-instruct-dflash/train_config.json,
# the run's config.json: a DFlash 2 drafter reading prompt lookup, written before eval.best_by existed)
SHIPPED = {
    "ckpt": {"every": 40, "keep": 3},
    "data": "data/smollm2-mix",
    "data_shards": 5,
    "drafter": {
        "block_input": "ngram",
        "block_size": 16,
        "conv_group_size": 16,
        "conv_kernel_size": 2,
        "copy_bias": 30.0,
        "layer_types": [],
        "mask_token_id": None,
        "ngram_max": 4,
        "ngram_min": 2,
        "num_layers": 2,
        "selector_rank": 64,
        "selector_top_k": 16,
        "sliding_window": None,
        "target_layer_ids": [1, 14, 27],
    },
    "eval": {"decode_max_new_tokens": 256, "decode_prompts": 4, "every": 259, "val_size": 32, "val_within_shards": 2},
    "init_from": "assets/smollm2-135m-instruct-dflash",
    "mesh": [1, 1, 1],
    "out_dir": "runs/study/copy2_off8_dflash2",
    "seed": 0,
    "target": "smollm2-135m-instruct",
    "train": {
        "anchor_chunk": 8,
        "b1": 0.9,
        "b2": 0.999,
        "batch_size": 4,
        "compute_dtype": "float32",
        "copy_bias_lr": 0.03,
        "gamma": 7.0,
        "grad_accum": 1,
        "grad_clip": 1.0,
        "length_buckets": [],
        "loss_offsets": 8,
        "lr": 0.0007,
        "max_len": 384,
        "num_anchors": 64,
        "remat": False,
        "selector_alpha": 1.0,
        "selector_stop_grad": False,
        "steps": 259,
        "stored_features": True,
        "warmup_frac": 0.04,
        "weight_decay": 0.0,
    },
}
# Stage 5 of the earlier SmolLM2 drafter (assets/smollm2-135m-instruct-dflash-stage5/train_config.json):
# written before the n-gram block input, the copy bias, DFlash 2 and eval.best_by existed
STAGE5 = {
    "ckpt": {"every": 50, "keep": 3},
    "data": "data/smollm2-gsm8k-alpaca",
    "data_shards": 37,
    "drafter": {
        "block_size": 16,
        "layer_types": [],
        "mask_token_id": None,
        "num_layers": 2,
        "sliding_window": None,
        "target_layer_ids": [1, 14, 27],
    },
    "eval": {"decode_max_new_tokens": 256, "decode_prompts": 4, "every": 150, "val_size": 32, "val_within_shards": 8},
    "init_from": "runs/smollm2_v4/best",
    "mesh": [1, 1, 1],
    "out_dir": "runs/smollm2_v5",
    "seed": 0,
    "target": "smollm2-135m-instruct",
    "train": {
        "anchor_chunk": 8,
        "b1": 0.9,
        "b2": 0.999,
        "batch_size": 4,
        "compute_dtype": "float32",
        "gamma": 7.0,
        "grad_accum": 1,
        "grad_clip": 1.0,
        "length_buckets": [],
        "loss_offsets": 8,
        "lr": 0.0007,
        "max_len": 384,
        "num_anchors": 64,
        "remat": False,
        "steps": 500,
        "stored_features": True,
        "warmup_frac": 0.04,
        "weight_decay": 0.0,
    },
}


def config_file(folder: Path, values: dict, name: str = "cfg") -> Path:
    """A config file whose ``get_config()`` returns ``values`` as a ConfigDict."""
    path = folder / f"{name}.py"
    path.write_text(
        f"from ml_collections import ConfigDict\n\n\ndef get_config():\n    return ConfigDict({values!r})\n"
    )
    return path


class StubDrafter:
    """What ``run_identity`` reads of a ``DrafterConfig`` (its released form stands in for the
    drafter's part of the identity, which this change does not touch)."""

    def __init__(self, dflash2: bool):
        self.dflash2 = dflash2

    def to_released(self) -> dict:
        return {"stub": "drafter", "dflash2": self.dflash2}


# name: (config, overrides, run_identity arguments, the run id the ConfigDict-era code computed:
# git show 64d65ee:dflash_jax/train_config.py, its load_config and run_identity on the same file)
LEGACY_RUN_IDS = {
    "shipped": (
        SHIPPED,
        ["init_from=/dflash-test/start"],
        dict(dflash2=True, val_within=2000, bucket_lengths=None),
        "6372fbe4c5181ea803b6dd94968fa1e8dc19cfcec35eca3e3ec915ef0cf23821",
    ),
    "stage5": (
        STAGE5,
        ["init_from=/dflash-test/v4"],
        dict(dflash2=False, val_within=None, bucket_lengths=None),
        "e32b9b9d432355f4d7dd194d22ed715e44b5849312160b95e5b56e790023ff51",
    ),
    "buckets": (
        SHIPPED,
        [
            "drafter.conv_kernel_size=0",
            "drafter.selector_rank=0",
            "drafter.block_input=mask",
            "drafter.copy_bias=None",
            "train.copy_bias_lr=0.0",
            "train.loss_offsets=0",
            "train.length_buckets=[256, 320]",
            "init_from=''",
            "seed=1",
        ],
        dict(dflash2=False, val_within=None, bucket_lengths=(256, 320, 384)),
        "c686df2cd6d85c1c3fbd9179328689a6bac142265a7f4ec8f86af88f93ee78ec",
    ),
}


@pytest.mark.parametrize("name", sorted(LEGACY_RUN_IDS))
def test_run_id_is_the_one_the_configdict_code_computed(name, tmp_path, monkeypatch):
    """A run started before the typed config resumes: its id, from the same file and overrides, is
    unchanged (a DFlash 2 run with every newer field set, a run from before those fields existed,
    and a DFlash run with length buckets and no init_from)."""
    from dflash_jax import dflash_format

    monkeypatch.setattr(dflash_format, "config_json", lambda dcfg, *a: dcfg.to_released())  # the stub's part
    values, overrides, kw, want = LEGACY_RUN_IDS[name]
    c = load_config(config_file(tmp_path, values), overrides)
    identity = run_identity(
        c,
        target_identity={"name": "t"},
        data_identity={"name": "d"},
        dcfg=StubDrafter(kw["dflash2"]),
        val_within=kw["val_within"],
        bucket_window=16,
        bucket_lengths=kw["bucket_lengths"],
    )
    assert fingerprint(identity) == want, identity


def test_a_file_without_the_newer_fields_loads_with_their_defaults(tmp_path):
    c = load_config(config_file(tmp_path, STAGE5), ["eval.best_by=tau_blocks", "drafter.block_input=ngram"])
    assert isinstance(c, TrainConfig) and isinstance(c.drafter, DrafterSpec) and isinstance(c.train, TrainSettings)
    assert (c.drafter.block_input, c.drafter.ngram_max, c.drafter.copy_bias, c.drafter.dflash2) == (
        "ngram",
        4,
        None,
        False,
    )
    assert (c.train.copy_bias_lr, c.train.selector_alpha, c.train.selector_stop_grad) == (0.0, 1.0, False)
    assert c.eval.best_by == "tau_blocks"  # a field the file lacks can still be overridden
    assert c.mesh == (1, 1, 1) and c.drafter.target_layer_ids == (1, 14, 27)  # lists become tuples


def test_the_config_written_by_a_run_loads_back_as_the_same_config(tmp_path):
    """``config.json`` (``TrainConfig.to_dict``) is a complete config file's values."""
    c = load_config(ROOT / "configs" / "smollm2_135m.py", ["train.length_buckets=(256,)", "mesh=(1, 1, 1, 1)"])
    assert load_config(config_file(tmp_path, c.to_dict())) == c


def test_the_config_is_frozen_and_a_changed_copy_is_checked_again():
    c = load_config(ROOT / "configs" / "smollm2_135m.py")
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.train.steps = 5
    assert dataclasses.replace(c.train, steps=5).steps == 5
    with pytest.raises(ConfigError, match="train.steps must be an integer >= 1"):
        dataclasses.replace(c.train, steps=0)
    with pytest.raises(
        ConfigError, match=r"train.loss_offsets must be an integer in \[0, drafter.block_size - 1 = 3\]"
    ):
        dataclasses.replace(
            c, drafter=dataclasses.replace(c.drafter, block_size=4), train=dataclasses.replace(c.train, loss_offsets=8)
        )
    with pytest.raises(ConfigError, match="eval.best_by must be one of loss, tau_blocks, decode_tau, got 'tau'"):
        EvalSettings(every=1, decode_max_new_tokens=1, best_by="tau")
    with pytest.raises(ConfigError, match="ckpt.keep must be an integer >= 1"):
        CkptSettings(every=1, keep=0)


@pytest.mark.parametrize(
    "overrides, msg",
    [
        (["train.stepz=3"], r"unknown config key 'train.stepz'; the keys of train: anchor_chunk, b1, .*weight_decay$"),
        (["trian.steps=3"], r"unknown config key 'trian'; the keys at the top level: ckpt, data, .*train$"),
        (["train.lr.x=1"], r"unknown config key 'train.lr.x': train.lr is a field, not a section"),
        (["train=3"], r"train is a section: override its fields"),
        (["train.steps"], r"override 'train.steps' is not key=value"),
        (["train.steps=abc"], r"train.steps: expected int, got 'abc'"),
        (["train.steps=2.5"], r"train.steps: expected int, got '2.5'"),
        (["target=None"], r"config: target must be a non-empty string"),
        (["mesh=(1, 2)"], r"config: mesh must be three or four positive integers"),
        (["drafter.mask_token_id=1.5"], r"config: drafter.mask_token_id must be an integer or None"),
        (
            ["train.copy_bias_lr=0.1"],
            r"train.copy_bias_lr is the copy-bias table's learning rate: set drafter.copy_bias",
        ),
        (["train.length_buckets=(600,)"], r"train.length_buckets must be increasing integers in \[1, train.max_len"),
        (["eval.best_by=decode_tau", "eval.decode_prompts=0"], r"needs eval.decode_prompts >= 1"),
        (["drafter.selector_rank=4"], r"selector_rank is DFlash 2's"),
    ],
)
def test_bad_overrides_are_one_line_errors_naming_the_field(overrides, msg):
    with pytest.raises(ConfigError, match=msg) as e:
        load_config(ROOT / "configs" / "smollm2_135m.py", overrides)
    assert "\n" not in str(e.value)


def test_bad_files_are_one_line_errors_naming_the_key(tmp_path):
    bad = dict(SHIPPED, train=dict(SHIPPED["train"], stepz=3))
    with pytest.raises(ConfigError, match=r"cfg.py: unknown config key 'train.stepz'; the keys of train: anchor_chunk"):
        load_config(config_file(tmp_path, bad))
    lacking = dict(SHIPPED, train={k: v for k, v in SHIPPED["train"].items() if k != "steps"})
    with pytest.raises(ConfigError, match=r"cfg.py: train.steps is missing"):
        load_config(config_file(tmp_path, lacking))
    with pytest.raises(ConfigError, match=r"cfg.py: ckpt is missing"):
        load_config(config_file(tmp_path, {k: v for k, v in SHIPPED.items() if k != "ckpt"}))
    with pytest.raises(ConfigError, match=r"cfg.py: eval must be a section"):
        load_config(config_file(tmp_path, dict(SHIPPED, eval=3)))


def test_differences_names_the_fields_of_two_configs():
    one = load_config(ROOT / "configs" / "smollm2_135m.py")
    two = load_config(ROOT / "configs" / "smollm2_135m.py", ["train.lr=1e-3", "drafter.num_layers=2"])
    assert differences(one, two) == ["drafter.num_layers: 1 -> 2", "train.lr: 0.0006 -> 0.001"]
    assert differences(one.train, two.train, "train.") == ["train.lr: 0.0006 -> 0.001"]
