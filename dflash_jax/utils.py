"""Small runtime helpers: logging to stderr, reading append-only JSONL logs, the persistent compilation cache."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def log(msg: str) -> None:
    """Progress and diagnostics go to stderr so that stdout stays machine-readable."""
    print(f"[dflash-jax {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


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


def enable_compilation_cache(path: str | os.PathLike | None = None) -> str:
    """Turn on JAX's persistent compilation cache (``$DFLASH_JAX_COMPILATION_CACHE`` or ``<home>/jax_cache``).

    Repeated runs then load compiled executables instead of recompiling. The folder can
    be moved (point the variable at it) or deleted at any time.
    """
    import jax

    from dflash_jax.hub import home

    path = str(path or os.environ.get("DFLASH_JAX_COMPILATION_CACHE") or home() / "jax_cache")
    os.makedirs(path, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path
