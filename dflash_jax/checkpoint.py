"""Target checkpoints: Hugging Face / GGUF in, orbax out, and loading back.

A converted target checkpoint is a folder::

    config.json          the Hugging Face config (unchanged)
    tokenizer files      copied from the source (tokenizer.json, chat template, ...)
    dflash_jax.json      format version, source, identity hashes
    params/              orbax checkpoint of the parameter pytree (float32)

Every write goes to a sibling ``*.partial-*`` folder first and is renamed into
place at the end, so an interrupted conversion never leaves a half-written
checkpoint under the requested name. Weights are read with ``safetensors``
(never pickle). GGUF files are read by transformers (``gguf`` extra) and turned
into an HF folder first; torch is imported only inside that path.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dflash_jax.target import ConfigError, TargetConfig, param_logical_specs

FORMAT = "dflash-jax-target"
FORMAT_VERSION = 1
META_FILE = "dflash_jax.json"
HF_MARKER = ".dflash-jax-gguf-sha256"  # in HF folders made from a GGUF: the GGUF's hash
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
    "chat_template.json", "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json",
    "generation_config.json",
)


class CheckpointError(ValueError):
    """A checkpoint or source folder is missing, corrupt, or not what it claims to be."""


# ----------------------------------------------------------------------------- helpers


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def config_hash(cfg: TargetConfig) -> str:
    """Hash of everything that fixes the model's function (not its compute dtype)."""
    fields = dataclasses.asdict(cfg)
    fields.pop("dtype")
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def tokenizer_hash(folder: Path) -> str:
    """Hash of the tokenizer's vocabulary, special tokens and chat template (format-independent)."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(folder))
    except Exception as e:  # tokenizers raise many types for corrupt files
        raise CheckpointError(f"cannot load the tokenizer files in {folder}: {type(e).__name__}: {e}") from None
    payload = {
        "vocab": sorted(tok.get_vocab().items(), key=lambda kv: kv[1]),
        "special": sorted(tok.all_special_tokens),
        "chat_template": tok.chat_template,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


@contextlib.contextmanager
def atomic_folder(out: Path, overwrite: bool = False, marker: str = META_FILE):
    """Yield a scratch folder that becomes ``out`` only if the block finishes.

    An existing ``out`` is replaced only with ``overwrite`` and only if it holds ``marker``
    (a file dflash-jax writes) or is empty, so a user's own folder is never deleted.

    Raises:
      CheckpointError: ``out`` exists and ``overwrite`` is False.
    """
    out = Path(out)
    if out.exists() and not overwrite:
        raise CheckpointError(f"{out} already exists; choose another --out or remove it")
    if out.exists() and (not out.is_dir() or not ((out / marker).exists() or (out / HF_MARKER).exists()
                                                   or not any(out.iterdir()))):
        raise CheckpointError(
            f"refusing to overwrite {out}: it is not a folder written by dflash-jax; remove it yourself")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".partial-", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes 0700; the result should be an ordinary folder
    try:
        yield tmp
        if out.exists():  # move the old folder aside in one rename, so a kill never leaves a half-deleted one
            old = Path(tempfile.mkdtemp(prefix=out.name + ".old-", dir=out.parent))
            os.replace(out, old / out.name)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def read_json(path: Path) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise CheckpointError(f"missing file {path}") from None
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path} is not valid JSON: {e}") from None


# ----------------------------------------------------------------------------- HF -> params


def hf_param_names(cfg: TargetConfig) -> dict[str, tuple[tuple[str, ...], str]]:
    """Map each HF tensor name to (our param path, layout) where layout is 'T' (transpose) or '='."""
    names: dict[str, tuple[tuple[str, ...], str]] = {"model.embed_tokens.weight": (("embedding",), "=")}
    names["model.norm.weight"] = (("final_norm", "scale"), "=")
    if not cfg.tie_word_embeddings:
        names["lm_head.weight"] = (("lm_head",), "T")
    for i in range(cfg.num_layers):
        hf, ours = f"model.layers.{i}.", (f"layers_{i}",)
        for p in "qkvo":
            names[f"{hf}self_attn.{p}_proj.weight"] = ((*ours, "attn", f"{p}_proj"), "T")
        if cfg.qkv_bias:
            for p in "qkv":
                names[f"{hf}self_attn.{p}_proj.bias"] = ((*ours, "attn", f"{p}_bias"), "=")
        if cfg.o_bias:
            names[f"{hf}self_attn.o_proj.bias"] = ((*ours, "attn", "o_bias"), "=")
        if cfg.qk_norm:
            names[f"{hf}self_attn.q_norm.weight"] = ((*ours, "attn", "q_norm", "scale"), "=")
            names[f"{hf}self_attn.k_norm.weight"] = ((*ours, "attn", "k_norm", "scale"), "=")
        for p in ("gate", "up", "down"):
            names[f"{hf}mlp.{p}_proj.weight"] = ((*ours, "mlp", f"{p}_proj"), "T")
        names[f"{hf}input_layernorm.weight"] = ((*ours, "input_norm", "scale"), "=")
        names[f"{hf}post_attention_layernorm.weight"] = ((*ours, "post_attn_norm", "scale"), "=")
    return names


def _safetensors_files(hf_dir: Path) -> list[Path]:
    index = hf_dir / "model.safetensors.index.json"
    if index.exists():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index} has no 'weight_map' object")
        paths = [hf_dir / f for f in sorted(set(weight_map.values()))]
        outside = [p for p in paths if hf_dir.resolve() not in p.resolve().parents]
        if outside:
            raise CheckpointError(f"{index} points outside {hf_dir}: {outside[0]}")
    else:
        paths = sorted(hf_dir.glob("*.safetensors"))
    if not paths:
        raise CheckpointError(
            f"no *.safetensors weights in {hf_dir}; pytorch_model.bin (pickle) is not read: "
            "re-save the model with save_pretrained(safe_serialization=True)"
        )
    for p in paths:
        if not p.exists():
            raise CheckpointError(f"missing weight file {p} (listed in the safetensors index)")
    return paths


def load_hf_params(hf_dir: Path, cfg: TargetConfig) -> dict:
    """Read HF safetensors into our parameter pytree (numpy float32).

    Raises:
      CheckpointError: a weight file or tensor is missing or unreadable, or a tensor has
        the wrong shape; the message names the file and tensor.
    """
    from safetensors import safe_open

    expected = jax.tree_util.tree_map(lambda s: s.shape, _abstract_params(cfg, jnp.float32))
    mapping = hf_param_names(cfg)
    params: dict = {}
    found: set[str] = set()
    for path in _safetensors_files(hf_dir):
        try:
            handle = safe_open(str(path), framework="numpy")
        except Exception as e:  # safetensors raises its own error types
            raise CheckpointError(f"{path} is not a readable safetensors file: {e}") from None
        with handle as f:
            for name in f.keys():
                if name not in mapping:
                    continue
                ours, layout = mapping[name]
                arr = np.asarray(f.get_tensor(name))
                if arr.dtype.kind != "f" and arr.dtype.name != "bfloat16":
                    raise CheckpointError(
                        f"tensor {name} in {path.name} has dtype {arr.dtype}, expected a float type "
                        "(float32, float16 or bfloat16)")
                arr = arr.astype(np.float32)
                if layout == "T":
                    arr = arr.T
                want = _get(expected, ours)
                if tuple(arr.shape) != tuple(want):
                    raise CheckpointError(
                        f"tensor {name} in {path.name} has shape {tuple(arr.shape if layout == '=' else arr.T.shape)}, "
                        f"expected {tuple(want if layout == '=' else want[::-1])} from config.json"
                    )
                _set(params, ours, arr)
                found.add(name)
    missing = sorted(set(mapping) - found)
    if missing:
        raise CheckpointError(
            f"{len(missing)} tensor(s) missing from {hf_dir}, first: {missing[0]}"
            + (" (config says untied embeddings but there is no lm_head)" if missing[0] == "lm_head.weight" else "")
        )
    return params


def _get(tree, path):
    for k in path:
        tree = tree[k]
    return tree


def _set(tree, path, value):
    for k in path[:-1]:
        tree = tree.setdefault(k, {})
    tree[path[-1]] = value


def _abstract_params(cfg: TargetConfig, dtype, mesh=None):
    from dflash_jax.target import Target
    from flax import linen as nn

    tokens = jnp.zeros((1, 1), jnp.int32)
    shapes = nn.meta.unbox(jax.eval_shape(lambda: Target(cfg).init(jax.random.PRNGKey(0), tokens, tokens)))["params"]
    if mesh is None:  # one device; a sharding makes orbax return device arrays, not numpy copies
        one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        return jax.tree_util.tree_map(lambda s: jax.ShapeDtypeStruct(s.shape, dtype, sharding=one), shapes)
    from dflash_jax.sharding import logical_to_sharding

    shardings = logical_to_sharding(param_logical_specs(cfg), mesh)
    return jax.tree_util.tree_map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, dtype, sharding=sh), shapes, shardings)


# ----------------------------------------------------------------------------- conversion


def convert_hf(hf_dir: str | Path, out: str | Path, *, source_sha256: str | None = None, overwrite: bool = False) -> Path:
    """Convert a Hugging Face checkpoint folder to an orbax target checkpoint at ``out``.

    The folder needs ``config.json``, safetensors weights and tokenizer files.

    Raises:
      CheckpointError: missing or malformed files or tensors (named in the message).
      ConfigError: an unsupported architecture or config feature.
    """
    import orbax.checkpoint as ocp

    hf_dir, out = Path(hf_dir), Path(out)
    if not hf_dir.is_dir():
        raise CheckpointError(f"{hf_dir} is not a folder; --hf takes a Hugging Face checkpoint folder")
    if out.resolve() == hf_dir.resolve() or out.resolve() in hf_dir.resolve().parents:
        raise CheckpointError(f"--out {out} would overwrite the source folder {hf_dir}")
    hf_config = read_json(hf_dir / "config.json")
    if not isinstance(hf_config, dict):
        raise CheckpointError(f"{hf_dir / 'config.json'} is not a JSON object")
    cfg = TargetConfig.from_hf(hf_config)
    params = load_hf_params(hf_dir, cfg)
    if not any((hf_dir / f).exists() for f in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        raise CheckpointError(f"no tokenizer files (tokenizer.json, tokenizer.model or vocab.json) in {hf_dir}")
    if source_sha256 is None:
        h = hashlib.sha256()
        for p in _safetensors_files(hf_dir):
            h.update(sha256_file(p).encode())
        source_sha256 = h.hexdigest()
    with atomic_folder(out, overwrite) as tmp:
        shutil.copy(hf_dir / "config.json", tmp / "config.json")
        for name in TOKENIZER_FILES:
            if (hf_dir / name).exists():
                shutil.copy(hf_dir / name, tmp / name)
        meta = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "source": str(hf_dir.resolve()),
            "identity": {
                "config_sha256": config_hash(cfg),
                "tokenizer_sha256": tokenizer_hash(tmp),
                "source_sha256": source_sha256,
            },
        }
        ckptr = ocp.StandardCheckpointer()
        ckptr.save((tmp / "params").resolve(), params)
        ckptr.wait_until_finished()
        with open(tmp / META_FILE, "w") as f:
            json.dump(meta, f, indent=2)
    return out


def gguf_to_hf(gguf_file: str | Path, out: str | Path, *, overwrite: bool = False) -> Path:
    """Dequantise a GGUF file into a Hugging Face folder (float32 safetensors + tokenizer) via transformers.

    Raises:
      CheckpointError: the file is missing or is not a GGUF file.
    """
    gguf_file, out = Path(gguf_file), Path(out)
    if not gguf_file.is_file():
        raise CheckpointError(f"GGUF file {gguf_file} does not exist")
    with open(gguf_file, "rb") as f:
        if f.read(4) != b"GGUF":
            raise CheckpointError(f"{gguf_file} is not a GGUF file (it does not start with the 'GGUF' magic)")
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as e:  # pragma: no cover - depends on the install
        raise CheckpointError(f"GGUF import needs the [gguf] extra (pip install 'dflash-jax[gguf]'): {e}") from None
    folder, name = str(gguf_file.parent), gguf_file.name
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype="float32")
    # transformers marks GGUF-loaded models as quantised and refuses to save them; the
    # weights are already dequantised floats, so drop the marker.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    with atomic_folder(out, overwrite) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        (tmp / HF_MARKER).write_text(sha256_file(gguf_file))
    return out


def convert_gguf(gguf_file: str | Path, out: str | Path, *, overwrite: bool = False) -> Path:
    """GGUF -> HF folder (kept beside ``out`` as ``<out>.hf``) -> orbax target checkpoint."""
    out, gguf_file = Path(out), Path(gguf_file)
    hf_dir = out.with_name(out.name + ".hf")
    digest = sha256_file(gguf_file) if gguf_file.is_file() else None
    marker = hf_dir / HF_MARKER
    if digest is None or not (marker.exists() and marker.read_text() == digest):  # rebuild unless made from this file
        gguf_to_hf(gguf_file, hf_dir, overwrite=hf_dir.exists())
    return convert_hf(hf_dir, out, source_sha256=digest, overwrite=overwrite)


# ----------------------------------------------------------------------------- loading


@dataclasses.dataclass
class TargetCheckpoint:
    """A loaded target: parameters (pytree of jax arrays), config, folder and metadata."""

    params: Any
    cfg: TargetConfig
    path: Path
    meta: dict

    @property
    def identity(self) -> dict:
        return self.meta["identity"]

    def tokenizer(self):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(self.path))


def load_target(path_or_name: str | Path, *, dtype: str = "float32", mesh=None) -> TargetCheckpoint:
    """Load a converted target checkpoint (or a known name such as ``smollm2-135m-instruct``).

    Args:
      path_or_name: a folder written by ``convert_hf`` / ``convert_gguf``, or a known name
        (a Hugging Face folder is refused with the ``convert`` command to run).
      dtype: parameter and compute dtype, ``"float32"`` or ``"bfloat16"``.
      mesh: optional ``jax.sharding.Mesh``; parameters are placed by the logical-axis table.

    Raises:
      CheckpointError: not a checkpoint, a partial or corrupt one.
      ConfigError: unsupported config.
    """
    from dflash_jax import hub

    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {dtype!r}")
    path = hub.resolve_target(path_or_name)
    meta_path = path / META_FILE
    if not meta_path.exists():
        if (path / "config.json").exists():
            raise CheckpointError(
                f"{path} looks like a Hugging Face folder, not a converted checkpoint: run "
                f"`dflash-jax convert --hf {path} --out OUT` and pass OUT"
            )
        raise CheckpointError(f"{path} is not a dflash-jax target checkpoint (no {META_FILE})")
    meta = read_json(meta_path)
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{meta_path} has format {meta.get('format')!r}, expected {FORMAT!r}")
    cfg = TargetConfig.from_hf(read_json(path / "config.json"), dtype=dtype)
    if meta["identity"]["config_sha256"] != config_hash(cfg):
        raise CheckpointError(f"{path}/config.json does not match the hash recorded in {META_FILE}: edited after conversion?")
    params = restore_params(path / "params", _abstract_params(cfg, jnp.dtype(dtype), mesh))
    return TargetCheckpoint(params, cfg, path, meta)


def restore_params(folder: Path, abstract):
    """Restore an orbax pytree into ``abstract`` (shapes, dtypes, shardings).

    Raises:
      CheckpointError: missing, partial or corrupt checkpoint, or a tree/shape mismatch.
    """
    import orbax.checkpoint as ocp

    if not folder.exists():
        raise CheckpointError(f"missing orbax checkpoint folder {folder}")
    try:
        return ocp.StandardCheckpointer().restore(folder.resolve(), abstract)
    except Exception as e:  # orbax raises many types; report one clear error
        raise CheckpointError(f"cannot restore {folder}: {type(e).__name__}: {str(e)[:500]}") from None
