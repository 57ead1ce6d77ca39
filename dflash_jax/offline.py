"""Offline decoding: a prompts file in, a resumable answers file out (``dflash-jax generate --out``).

Every prompt's answer is appended to the answers file (one JSON line) as soon as its request
finishes (``Decoder.as_completed``: rows refilled as they finish). A rerun with the same settings
skips what is written and decodes the rest; a file of other settings is refused. When the job
ends the file is rewritten (atomically) in prompt order. Data-parallel jobs: each process of a
``jax.distributed`` job decodes every ``count``-th prompt into its own part file, and process 0
merges the parts into the one answers file once all are complete.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from tqdm import tqdm

from dflash_jax.errors import DataError
from dflash_jax.utils import atomic_write_text, differences_text, json_sha256, log

SETTINGS_SUFFIX = ".settings.json"


def part_path(out: Path, index: int, count: int) -> Path:
    """Where process ``index`` of ``count`` writes its answers (``out`` itself for one process)."""
    return out if count == 1 else out.with_name(f"{out.name}.part-{index:05d}-of-{count:05d}")


def read_answers(path: Path, key: str) -> dict[int, dict]:
    """The answers already in ``path`` (``{index: record}``), made with settings of hash ``key``.

    A last line that a kill cut (no newline, or not a whole record) is dropped from the file.

    Raises:
      DataError: a damaged line before the last, or a record made with other settings.
    """
    if not path.exists():
        return {}
    raw = path.read_bytes()
    lines = raw.decode("utf-8", errors="replace").split("\n")
    cut = lines.pop() != ""  # the file does not end with a newline: a line a kill interrupted
    records = {}
    for n, line in enumerate(lines, 1):
        try:
            rec = json.loads(line)
            index = int(rec["index"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            if n < len(lines):
                raise DataError(f"{path}:{n} is not an answer record; delete that line (or the file), rerun") from None
            cut, lines = True, lines[:-1]  # written but unreadable (or blank): the last line only, made again
            break
        if rec.get("settings_sha256") != key:
            raise DataError(
                f"{path} holds answers made with other settings; choose another --out, or rerun with the "
                "settings it was made with"
            )
        records[index] = rec
    if cut:
        atomic_write_text(path, "".join(line + "\n" for line in lines))
    return records


def check_settings(out: Path, settings: dict, record: bool = True) -> str:
    """Check ``settings`` against the ones recorded beside ``out`` (``<out>.settings.json``), or
    record them there (with ``record``; as JSON: compared as JSON reads them back); returns their
    hash, which every answer record carries. With neither ``out`` nor a part of it left (deleted to
    start over), the recorded settings are replaced.

    Raises:
      DataError: ``out`` was started with other settings (the differences named, old -> new).
    """
    settings = json.loads(json.dumps(settings, default=str))
    key = json_sha256(settings)
    path = out.with_name(out.name + SETTINGS_SUFFIX)
    started = out.exists() or any(out.parent.glob(f"{out.name}.part-*"))
    if path.exists() and not started:  # the answers were deleted: a new job (its settings recorded anew)
        if record:
            atomic_write_text(path, json.dumps(settings, indent=2))
        return key
    if path.exists():
        try:
            old = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError, UnicodeDecodeError):
            raise DataError(f"{path} is damaged; delete it together with {out} and rerun") from None
        if old != settings:
            raise DataError(
                f"{out} was started with other settings ({differences_text(old, settings)}); choose another "
                "--out, or rerun with the settings it was made with"
            )
    elif out.exists() and out.stat().st_size:
        raise DataError(f"{out} exists and is not a dflash-jax answers file; choose another --out")
    elif record:
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(settings, indent=2))
    return key


def write_answers(
    decoder,
    prompt_ids: Sequence[Sequence[int]],
    out: str | os.PathLike,
    *,
    settings: dict,
    record: Callable[[int, object], dict],
    max_new_tokens: int,
    stop_ids: Sequence[int] = (),
    seed: int = 0,
    batch_size: int = 16,
    part: tuple[int, int] = (0, 1),
    agree: Callable[[bool], bool] | None = None,
    progress: bool = True,
    log=log,
) -> Path:
    """Decode ``prompt_ids`` into the answers file ``out`` (JSONL, one record per prompt), resumably.

    Args:
      decoder: a ``decode.Decoder`` (plain or speculative, greedy or sampling).
      prompt_ids: the token-id prompts; prompt ``i`` decodes with seed ``seed + i`` (what
        ``generate`` gives a batch), so its answer does not depend on how the job is split.
      settings: what the answers depend on (target, prompts, decoding settings); recorded beside
        the file and hashed into every record, so that a rerun of other settings is refused.
      record: ``(i, GenerationResult) -> dict``: prompt ``i``'s record (``index`` and
        ``settings_sha256`` are added).
      part: ``(index, count)``: this process decodes prompts ``index, index + count, ...`` into its
        part file (``part_path``), then process 0 merges the parts into ``out`` in prompt order.
      agree: required when ``count > 1``: ``agree(ok)`` waits for every process and returns whether
        every one passed ``ok`` True (a barrier that also tells a failure), so that a process that
        refuses its input makes all of them stop at once instead of leaving them waiting.

    Returns: ``out``, complete, in prompt order (process 0; the others return it once merged).

    Raises:
      DataError: as ``check_settings`` / ``read_answers``.
    """
    out = Path(out)
    index, count = part
    if count > 1 and agree is None:
        raise ValueError("a job split over processes needs agree (a barrier over jax.distributed's processes)")

    def together(step):  # run step on every process; if one fails, all raise
        try:
            result, error = step(), None
        except DataError as e:
            result, error = None, e
        if agree is not None and not agree(error is None):
            raise error or DataError("another process of this job refused its input (see its log); nothing was decoded")
        if error is not None:
            raise error
        return result

    def start():
        key = check_settings(out, settings, record=index == 0)
        done = read_answers(out, key) if count > 1 else {}  # a merged file from an earlier run of this job
        done.update(read_answers(part_path(out, index, count), key))
        return key, done

    key, done = together(start)
    mine = list(range(index, len(prompt_ids), count))
    path = part_path(out, index, count)
    todo = [i for i in mine if i not in done]
    if not todo:
        log(f"all {len(mine)} answers are already in {path}: nothing to decode")
    else:
        log(f"{len(mine) - len(todo)} of {len(mine)} answers already in {path}; decoding {len(todo)}")
        _decode_into(decoder, prompt_ids, todo, path, key, record, max_new_tokens, stop_ids, seed, batch_size, progress)

    def merge():
        if index != 0:
            return
        merged = dict(done)
        for p in range(count):
            merged.update(read_answers(part_path(out, p, count), key))
        missing = [i for i in range(len(prompt_ids)) if i not in merged]
        if missing:
            raise DataError(f"answers of prompts {missing[:5]} are missing after the job; rerun the same command")
        atomic_write_text(out, "".join(json.dumps(merged[i]) + "\n" for i in range(len(prompt_ids))))
        for p in range(count if count > 1 else 0):
            part_path(out, p, count).unlink(missing_ok=True)

    if agree is not None:
        agree(True)  # every part complete
    together(merge)
    return out


def _decode_into(decoder, prompt_ids, todo, path, key, record, max_new_tokens, stop_ids, seed, batch_size, progress):
    """Decode prompts ``todo`` with rows refilled as they finish, appending each record to ``path``."""
    bar = tqdm(total=len(todo), desc="generate", unit="prompt", disable=not progress)
    t0, produced, compiling = time.perf_counter(), 0, 0.0
    stream = decoder.as_completed(
        [prompt_ids[i] for i in todo],
        max_new_tokens,
        stop_ids,
        seed=[seed + i for i in todo],
        batch_size=batch_size,
    )
    with open(path, "a", encoding="utf-8") as f:
        for j, result in stream:
            rec = {"index": todo[j], **record(todo[j], result), "settings_sha256": key}
            f.write(json.dumps(rec) + "\n")
            f.flush()
            produced, compiling = produced + result.num_output_tokens, compiling + result.compile_s
            bar.update(1)
            decoding = max(time.perf_counter() - t0 - compiling, 1e-9)  # compilation apart
            bar.set_postfix_str(f"{produced / decoding:.1f} tok/s", refresh=False)
    bar.close()
