"""The training configs outside the package: every one in experiments/ loads and validates, each states
its own fields (no inheritance chain), and the shipped drafter's recipe is the run that made it."""

import ast
import json
from pathlib import Path

import pytest

from dflash_jax.train_config import load_config

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = sorted((ROOT / "experiments").rglob("smollm2_135m_*.py"))


def test_experiments_hold_the_study_configs():
    assert len(EXPERIMENTS) >= 14 and {p.parent.name for p in EXPERIMENTS} == {"smollm2"}


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.stem)
def test_every_experiment_config_loads(path):
    c = load_config(path)
    assert c.train.steps > 0 and c.target == "smollm2-135m-instruct"


@pytest.mark.parametrize("path", [*EXPERIMENTS, ROOT / "configs" / "smollm2_135m_shipped.py"], ids=lambda p: p.stem)
def test_a_study_or_shipped_config_states_every_field_itself(path):
    """No import but ml_collections: the file alone is the config (no chain of get_config calls)."""
    tree = ast.parse(path.read_text())
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert [(n.module, [a.name for a in n.names]) for n in imports] == [("ml_collections", ["ConfigDict"])]


def test_the_shipped_recipe_is_the_shipped_drafters_training_config():
    """configs/smollm2_135m_shipped.py equals the shipped drafter's recorded train_config.json but for
    its out_dir, and any train field (``NEWER_TRAIN_FIELDS``), drafter field or top-level field added after
    the run, at its default; the stage it continues (stage 10, kept in the repository) is its init_from."""
    c = json.loads(json.dumps(load_config(ROOT / "configs" / "smollm2_135m_shipped.py").to_dict(), default=list))
    shipped = ROOT / "dflash_jax" / "assets" / "smollm2-135m-instruct-dflash"
    ran = json.loads((shipped / "train_config.json").read_text())
    assert c.pop("out_dir") != ran.pop("out_dir")
    assert c["init_from"] == ran["init_from"] == "assets/smollm2-135m-instruct-dflash-stage10"
    from dflash_jax.train_config import NEWER_TRAIN_FIELDS

    for key, default in NEWER_TRAIN_FIELDS.items():  # fields added after the run, at their defaults
        if key not in ran["train"]:
            assert c["train"].pop(key) == json.loads(json.dumps(default, default=list)), key
    from dflash_jax.train_config import DrafterSpec

    for key in set(c["drafter"]) - set(ran["drafter"]):  # drafter fields added after the run, at their defaults
        assert c["drafter"].pop(key) == DrafterSpec.__dataclass_fields__[key].default, key
    from dflash_jax.train_config import TrainConfig

    for key in set(c) - set(ran):  # top-level fields added after the run (data_repeats), at their defaults
        assert c.pop(key) == TrainConfig.__dataclass_fields__[key].default, key
    assert c == ran
    # what the recipe and the stages before it start from are kept in the repository
    for stage in ("stage10", "stage8", "long1024", "stage6", "stage5"):
        assert (ROOT / "assets" / f"smollm2-135m-instruct-dflash-{stage}" / "model.safetensors").exists()


def test_the_shipped_drafter_is_stage_11_averaged_and_read_with_a_longer_reach():
    """The package's drafter is stage 11's weights averaged half and half with stage 10's, the stage it continued
    (``assets/smollm2-135m-instruct-dflash-stage11``: the recipe's run shipped with ``--average-with``), read
    matching up to 16 tokens with periodic continuations (``experiments/longer_reach.py``): every tensor equal but
    the copy-bias table, whose rows for 2-4-token matches are stage 11's and whose rows for longer matches stand at
    ``copy_bias``; its draft trees' scores are tempered at 1.5; its record says so."""
    import ml_dtypes  # noqa: F401  (numpy reads bfloat16 through it)
    from safetensors.numpy import load_file

    shipped = ROOT / "dflash_jax" / "assets" / "smollm2-135m-instruct-dflash"
    stage11 = ROOT / "assets" / "smollm2-135m-instruct-dflash-stage11"
    ours, theirs = load_file(str(shipped / "model.safetensors")), load_file(str(stage11 / "model.safetensors"))
    assert ours.keys() == theirs.keys()
    (table,) = [k for k in ours if "copy_bias" in k]
    assert all((ours[k] == theirs[k]).all() for k in ours if k != table)
    summary = json.loads((shipped / "training_summary.json").read_text())
    assert summary["averaged_with"] == {
        "drafter": "assets/smollm2-135m-instruct-dflash-stage10",
        "weight_of_this_run": 0.5,
    }
    stage10 = load_file(str(ROOT / "assets" / "smollm2-135m-instruct-dflash-stage10" / "model.safetensors"))
    moved = [k for k in ours if k != table and (ours[k] != stage10[k]).any()]
    assert len(moved) >= len(ours) - 2  # the average is not stage 10 itself
    config = json.loads((shipped / "config.json").read_text())["dflash_config"]
    assert (config["ngram_max"], config["ngram_min"], config["ngram_periodic"]) == (16, 2, True)
    old = theirs[table].shape[0]
    assert ours[table].shape[0] == 16 and (ours[table][:old] == theirs[table]).all()  # a row per matched length
    assert (ours[table][old:].astype("float32") == config["copy_bias"]).all()
    read_with = summary["read_with"]
    assert read_with["trained_with"] == {"ngram_max": 4, "ngram_periodic": False} and read_with["ngram_max"] == 16
    # its draft trees read its scores tempered (tuned on held-out shards: docs/BENCHMARKS.md "Draft trees")
    assert config["tree_temperature"] == read_with["tree_temperature"] == 1.5
