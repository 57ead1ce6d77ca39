"""Small runtime helpers: logging, the cache folder, JSON files and hashes, atomic writes, the
persistent compilation cache.

Every write of a file or folder that a user keeps goes through ``atomic_write_text`` or
``atomic_folder`` (a temporary sibling, then one rename), and every hash of a JSON-like
object through ``json_sha256``, so that each rule lives in one place.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import hashlib
import json
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import jax
import numpy as np
from safetensors import safe_open

from dflash_jax.errors import CheckpointError

META_FILE = "dflash_jax.json"  # the marker of a folder written by dflash-jax (targets and drafters)


def log(msg: str) -> None:
    """Progress and diagnostics go to stderr so that stdout stays machine-readable."""
    print(f"[dflash-jax {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def home() -> Path:
    """The cache folder: ``$DFLASH_JAX_HOME``, default ``~/.cache/dflash-jax`` (models, ``jax_cache/``)."""
    return Path(os.environ.get("DFLASH_JAX_HOME", Path.home() / ".cache" / "dflash-jax")).expanduser()


def json_sha256(obj, digits: int | None = None) -> str:
    """sha256 (hex) of ``obj`` as canonical JSON (sorted keys; non-JSON leaves as ``str``), cut to ``digits``."""
    digest = hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()
    return digest if digits is None else digest[:digits]


def short(value, width: int = 24) -> str:
    """``repr`` of ``value``, cut to ``width`` characters (``...`` marks the cut): for error messages."""
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def differences(old, new, prefix: str = "", width: int | None = None) -> list[str]:
    """``key: old -> new`` for every leaf that differs between two JSON-like trees.

    A nested dict's leaves are named by dotted keys (``target.tokenizer_sha256``); a dataclass
    instance (a ``train_config.TrainConfig``, its sections) compares as the dict of its fields; with
    ``width``, each value is cut to that many characters (``short``).
    """
    old, new = (
        dataclasses.asdict(x) if dataclasses.is_dataclass(x) and not isinstance(x, type) else x for x in (old, new)
    )
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new)):
            out += differences(old.get(k), new.get(k), f"{prefix}{k}.", width)
        return out
    if old == new:
        return []
    if width is None:
        return [f"{prefix[:-1]}: {old!r} -> {new!r}"]
    return [f"{prefix[:-1]}: {short(old, width)} -> {short(new, width)}"]


def differences_text(old, new, limit: int = 3, width: int = 24) -> str:
    """The first ``limit`` of ``differences(old, new, width=width)``, joined by ``; `` (then how many
    more), for a one-line error message; ``unknown difference`` when none shows."""
    diff = differences(old, new, width=width)
    more = f"; and {len(diff) - limit} more" if len(diff) > limit else ""
    return "; ".join(diff[:limit]) + more if diff else "unknown difference"


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    """sha256 (hex) of a file's bytes, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def read_json(path: str | os.PathLike) -> dict:
    """A JSON file's content.

    Raises:
      CheckpointError: the file is missing or not valid JSON (named).
    """
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise CheckpointError(f"missing file {path}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path} is not valid JSON: {e}") from None


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary sibling and one rename: a reader (or a kill)
    sees the old file or the new one, never a cut one."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")  # writers never share one
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def read_jsonl(path: str | os.PathLike) -> tuple[list, int]:
    """Read a JSONL file that a killed writer may have left with a cut line: ``(rows, skipped)``.

    Used for every append-only log here (training ``metrics.jsonl``, bench ``.records.jsonl``): lines
    that are not JSON (a write cut by a kill) are skipped and counted; the file is not changed.

    Raises:
      OSError: the file cannot be read.
    """
    rows, skipped = [], 0
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            skipped += 1
    return rows, skipped


KIND_FILE = ".dflash-jax-kind"  # in every folder atomic_folder writes: what it holds ("target", "drafter", ...)
SCRATCH_FILE = ".dflash-jax-scratch"  # in every scratch folder atomic_folder makes: "<host> <pid>"
_SCRATCH = ".dflash-jax-{role}-"  # scratch names: .<out name>.dflash-jax-{partial,old}-<host>-<pid>-<random>


def folder_kind(folder: str | os.PathLike) -> str | None:
    """What a folder written by dflash-jax holds (``KIND_FILE``; for folders written before that
    file existed, read from their own metadata), or None for any other folder."""
    folder = Path(folder)
    if (folder / KIND_FILE).is_file():
        return (folder / KIND_FILE).read_text().strip() or None
    for name in (META_FILE, "meta.json"):
        try:
            fmt = json.loads((folder / name).read_text()).get("format")
        except (OSError, ValueError, AttributeError):
            continue
        legacy = {"dflash-jax-target": "target", "dflash-jax-drafter": "drafter", "dflash-jax-tokens": "tokens"}
        if fmt in legacy:
            return legacy[fmt]
    if (folder / ".dflash-jax-gguf-sha256").is_file():
        return "hf-from-gguf"
    return None


def _scratch_owner(folder: Path) -> tuple[str, int] | None:
    """``(host, pid)`` of the dflash-jax process that made scratch ``folder``, or None if it is not ours."""
    try:
        host, pid = (folder / SCRATCH_FILE).read_text().split()
        return host, int(pid)
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def remove_stale_scratch(out: str | os.PathLike) -> list[Path]:
    """Delete the scratch folders that a killed ``atomic_folder`` on ``out`` left beside it.

    Only folders that provably are ours go: named ``.<out name>.dflash-jax-{partial,old}-...``,
    holding a ``SCRATCH_FILE`` that names this host and a process that is no longer running.
    A user's ``thesis.old-2023/`` or a live writer's scratch is never touched. Returns what was removed.
    """
    out = Path(out)
    removed = []
    for role in ("partial", "old"):
        for folder in out.parent.glob(f".{glob.escape(out.name)}{_SCRATCH.format(role=role)}*"):
            owner = _scratch_owner(folder)
            if owner is not None and owner[0] == socket.gethostname() and not _alive(owner[1]):
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder)
    return removed


def _make_scratch(out: Path, role: str) -> Path:
    host, pid = socket.gethostname(), os.getpid()
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}{_SCRATCH.format(role=role)}{host}-{pid}-", dir=out.parent))
    (tmp / SCRATCH_FILE).write_text(f"{host} {pid}")
    return tmp


def check_out(out: str | os.PathLike, overwrite: bool, kind: str) -> None:
    """Whether ``atomic_folder(out, overwrite, kind)`` may write ``out``; call it early to fail before work.

    Raises:
      CheckpointError: ``out`` exists and ``overwrite`` is False, or it is not a ``kind`` folder
        written by dflash-jax (nor empty), or it is a file.
    """
    out = Path(out)
    if not out.exists():
        return
    if not overwrite:
        raise CheckpointError(f"{out} already exists; choose another --out or pass --overwrite")
    if not out.is_dir():
        raise CheckpointError(f"refusing to overwrite {out}: it is a file; remove it yourself")
    have = folder_kind(out)
    if have is None and any(out.iterdir()):
        raise CheckpointError(
            f"refusing to overwrite {out}: it is not a folder written by dflash-jax; remove it yourself"
        )
    if have is not None and have != kind:
        raise CheckpointError(
            f"refusing to overwrite {out}: it holds a dflash-jax {have}, not a {kind}; choose another --out"
        )


@contextlib.contextmanager
def atomic_folder(out: str | os.PathLike, overwrite: bool = False, kind: str = "folder"):
    """Yield a scratch folder that becomes ``out`` only if the block finishes.

    The scratch is a hidden sibling named after ``out`` and this process (``remove_stale_scratch``
    clears those of killed runs, and only those); the finished folder gets ``KIND_FILE`` = ``kind``.
    An existing ``out`` is replaced only with ``overwrite``, and only if it is empty or a ``kind``
    folder written by dflash-jax (``check_out``); the replacement is logged. Files inside get the
    usual permissions (the umask's), not ``mkdtemp``'s owner-only ones.

    Raises:
      CheckpointError: as ``check_out``.
    """
    out = Path(out)
    check_out(out, overwrite, kind)
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_scratch(out)
    tmp = _make_scratch(out, "partial")
    try:
        yield tmp
        (tmp / SCRATCH_FILE).unlink()
        (tmp / KIND_FILE).write_text(kind)
        umask = os.umask(0)
        os.umask(umask)
        for root, dirs, files in os.walk(tmp):
            for d in dirs:
                os.chmod(os.path.join(root, d), 0o777 & ~umask)
            for f in files:
                os.chmod(os.path.join(root, f), 0o666 & ~umask)
        os.chmod(tmp, 0o777 & ~umask)
        if out.exists():  # move the old folder aside in one rename, so a kill never leaves a half-deleted one
            log(f"replacing {out} (a dflash-jax {folder_kind(out) or 'empty folder'})")
            old = _make_scratch(out, "old")
            os.replace(out, old / out.name)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


CACHE_MAX_BYTES = 16 * 2**30  # the persistent compilation cache's size limit (it turns on its file lock)


def enable_compilation_cache(path: str | os.PathLike | None = None) -> str:
    """Turn on JAX's persistent compilation cache (``$DFLASH_JAX_COMPILATION_CACHE`` or ``<home>/jax_cache``).

    Repeated runs then load compiled executables instead of recompiling. The folder can
    be moved (point the variable at it) or deleted at any time. Processes may share it: a size limit
    (``CACHE_MAX_BYTES``, least recently used entries evicted past it) turns on JAX's file lock around
    every read and write, without which one process could read an entry another is still writing.
    """
    path = str(path or os.environ.get("DFLASH_JAX_COMPILATION_CACHE") or home() / "jax_cache")
    os.makedirs(path, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_compilation_cache_max_size", CACHE_MAX_BYTES)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path


def _unreadable(path, e: Exception) -> CheckpointError:
    return CheckpointError(
        f"{path} is not a readable safetensors file ({type(e).__name__}: {e}); a cut copy? copy or export it again"
    )


def safetensors_names(path) -> list[str]:
    """The tensor names in one safetensors file (header only).

    Raises:
      CheckpointError: an unreadable or cut file (as ``read_safetensors`` says it)."""
    try:
        with safe_open(str(path), framework="numpy") as f:
            return list(f.keys())
    except Exception as e:  # safetensors raises its own error types for a cut or garbled file
        raise _unreadable(path, e) from None


def read_safetensors(
    files, names: dict[str, tuple], expected=None, ignore=lambda name: False
) -> tuple[dict, list[str]]:
    """Read the tensors ``names`` maps (safetensors name -> (pytree path, transpose?[, piece])) from ``files``.

    ``transpose`` swaps the last two axes (PyTorch's ``[..., out, in]`` to our ``[..., in, out]``).

    ``piece`` (ints and slices, needs ``expected``): the tensor fills that part of the leaf, as
    ``leaf[piece] = tensor``; the pieces mapped to one leaf must tile it (each is required).

    Returns ``(params, unused)``: a nested dict of float32 numpy arrays (transposed where asked),
    and the names present in the files that ``names`` does not map and ``ignore`` does not excuse,
    for the caller to refuse or warn about. ``expected``: a pytree of shapes or ``ShapeDtypeStruct``
    (our orientation) each tensor must have. A format's module says what a model's tensors are called
    (``hf_format.param_names``, ``dflash_format.param_names``); this is the one reader of them.

    Raises:
      CheckpointError: an unreadable or cut file, a non-float tensor, a tensor of the wrong shape
        (in the file's orientation), or a mapped tensor missing from every file; named.
    """
    params: dict = {}
    found, unused = set(), []
    for path in files:
        try:
            with safe_open(str(path), framework="numpy") as f:
                for name in f.keys():
                    if name not in names:
                        if not ignore(name):
                            unused.append(name)
                        continue
                    if name in found:
                        raise CheckpointError(
                            f"tensor {name} is in more than one of {', '.join(map(str, files))}; "
                            "keep one copy (or list the files in model.safetensors.index.json)"
                        )
                    ours, transpose, *piece = names[name]
                    arr = np.asarray(f.get_tensor(name))
                    if arr.dtype.kind != "f" and arr.dtype.name != "bfloat16":
                        raise CheckpointError(
                            f"tensor {name} in {path} has dtype {arr.dtype}, expected a float type "
                            "(float32, float16 or bfloat16)"
                        )
                    arr = arr.astype(np.float32)
                    arr = np.swapaxes(arr, -1, -2) if transpose else arr  # [.., out, in] -> [.., in, out]
                    if expected is not None:
                        want = expected
                        for k in ours:
                            want = want[k]
                        want = getattr(want, "shape", want)
                        leaf_shape = tuple(want)
                        if piece:
                            want = np.broadcast_to(np.empty((), np.bool_), leaf_shape)[piece[0]].shape  # no memory
                        if tuple(arr.shape) != tuple(want):
                            if transpose:
                                shape, want = np.swapaxes(arr, -1, -2).shape, (*want[:-2], want[-1], want[-2])
                            else:
                                shape, want = arr.shape, tuple(want)
                            raise CheckpointError(
                                f"tensor {name} in {path} has shape {tuple(shape)}, expected "
                                f"{tuple(want)} from config.json"
                            )
                    node = params
                    for k in ours[:-1]:
                        node = node.setdefault(k, {})
                    if piece:
                        node.setdefault(ours[-1], np.zeros(leaf_shape, np.float32))[piece[0]] = arr
                    else:
                        node[ours[-1]] = arr
                    found.add(name)
        except CheckpointError:
            raise
        except Exception as e:  # safetensors raises its own error types for a cut or garbled file
            raise _unreadable(path, e) from None
    missing = sorted(set(names) - found)
    if missing:
        raise CheckpointError(f"{len(missing)} tensor(s) missing from {Path(files[0]).parent}, first: {missing[0]}")
    return params, unused
