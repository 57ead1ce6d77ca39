"""What a non-editable install gets: the wheel holds the shipped drafter and the benchmark prompt sets."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from conftest import SHARED

from dflash_jax import hub
from dflash_jax.prompts import DATASETS, PACKAGED_EVAL_DATA

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dflash_jax"


def _in_wheel(path: Path) -> str:
    """The name a file of the package has inside the wheel."""
    return path.resolve().relative_to(PACKAGE.parent).as_posix()


def test_the_wheel_holds_the_shipped_drafter_and_the_prompt_sets(tmp_path):
    # Built from a copy, so the checkout gets no build/ or .egg-info; offline (--no-index, no build isolation).
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(PACKAGE, src / "dflash_jax", ignore=shutil.ignore_patterns("__pycache__"))
    run = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q"]
        + ["-w", str(tmp_path / "dist"), str(src)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    (wheel,) = (tmp_path / "dist").glob("dflash_jax-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())

    drafter = hub.SHIPPED_DRAFTERS[hub.SMOLLM2]
    assert drafter.is_relative_to(PACKAGE)  # package data, not a folder beside the package
    files = [p for p in drafter.iterdir() if p.is_file()]
    assert {"config.json", "model.safetensors", "draft_vocab.json"} <= {p.name for p in files}
    missing = sorted(_in_wheel(p) for p in files if _in_wheel(p) not in names)
    assert not missing, f"not in the wheel: {missing}"

    sets = [PACKAGED_EVAL_DATA / name for name in [*DATASETS.values(), "LICENSES.md"]]
    missing = sorted(_in_wheel(p) for p in sets if _in_wheel(p) not in names)
    assert not missing, f"not in the wheel: {missing}"
    assert not any("__pycache__" in n or n.startswith(("assets/", "tests/")) for n in names)


def test_the_shipped_prompt_sets_are_the_public_files_their_licences_name():
    licences = (PACKAGED_EVAL_DATA / "LICENSES.md").read_text()
    recorded = {name: digest for digest, name in re.findall(r"^([0-9a-f]{64})  (\S+)$", licences, re.M)}
    assert set(recorded) == set(DATASETS.values())
    for name in DATASETS.values():
        data = (PACKAGED_EVAL_DATA / name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == recorded[name], name
        assert f"`{name}`" in licences  # a row with its origin and licence
        shared = SHARED / "data" / "eval" / name
        if shared.is_file():  # the sibling checkout of the data, where present: the same bytes
            assert shared.read_bytes() == data, name
