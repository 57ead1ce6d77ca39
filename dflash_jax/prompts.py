"""Every prompt format: training prompt files and the benchmark sets (``shared/data/README.md``).

Training: ``read_prompts`` reads GSM8K, Alpaca-style (``instruction`` + ``input``), MBPP (its
evaluation task ids 11-510 skipped) or plain ``{"prompt": ...}`` rows, as JSONL or a JSON list.
Benchmarks: ``load_eval_prompts`` reads GSM8K, MATH-500, HumanEval, MBPP (ids 11-510 only) and
MT-Bench, formatted as the reference DFlash benchmark does, so that acceptance lengths are
comparable with published figures; the five sets ship in the package (``PACKAGED_EVAL_DATA``).
Both read files through ``read_rows``.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import json
import os
from pathlib import Path

from dflash_jax.errors import BenchError, DataError

GSM8K_SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{}."
MBPP_EVAL_IDS = range(11, 511)  # the standard MBPP evaluation split: never train on it


@dataclasses.dataclass(frozen=True)
class Prompt:
    text: str
    where: str  # "file:line" (or "file:index" for a JSON list), for error messages


def read_rows(path: Path) -> list[tuple[int, object]]:
    """``(n, row)`` pairs of a JSONL file (n = line number) or a JSON list (n = 1-based index).

    Raises:
      DataError: unreadable file or invalid JSON, naming the file (and line).
    """
    try:
        text = path.read_text(encoding="utf-8-sig")  # a byte-order mark, as some editors write, is dropped
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"cannot read prompts from {path}: {e}") from None
    if text.lstrip().startswith("["):
        try:
            return list(enumerate(json.loads(text), 1))
        except json.JSONDecodeError as e:
            raise DataError(f"{path} starts like a JSON list but is not valid JSON: {e}") from None
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                rows.append((n, json.loads(line)))
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{n}: not a JSON object ({e}); expected JSONL") from None
    return rows


def _plain_field(row: dict) -> str | None:
    """The field the ``plain`` format reads: the first non-empty one of ``prompt``, ``question``,
    ``problem``, ``instruction``."""
    return next(
        (k for k in ("prompt", "question", "problem", "instruction") if isinstance(row.get(k), str) and row[k].strip()),
        None,
    )


def read_prompts(path: str | Path, fmt: str = "auto", limit: int | None = None) -> list[Prompt]:
    """User prompts of a prompt file, formatted as the reference benchmark does (shared/data README).

    Formats: ``gsm8k`` (``question`` + the step-by-step/boxed suffix), ``alpaca`` (``instruction``,
    then ``input`` if any), ``mbpp`` (``prompt``; task ids 11-510, the evaluation split, skipped),
    ``plain`` (the first of ``prompt``, ``question``, ``problem``, ``instruction``). ``auto`` picks
    by file name (gsm8k / alpaca / mbpp), else reads each row as ``plain``, but a row whose text
    ``plain`` would take from ``instruction`` as ``alpaca`` (its ``input`` kept, whatever the file is
    called).

    Raises:
      DataError: unreadable file, not JSONL / a JSON list, or a row without the needed text
        field (the message names the file and line).
    """
    path = Path(path)
    by_row = fmt == "auto"
    if by_row:
        name = path.name.lower()
        fmt = next((f for f in ("gsm8k", "alpaca", "mbpp") if f in name), "plain")
        by_row = fmt == "plain"  # no name to go by: an Alpaca row is known by its instruction field
    out = []
    for n, row in read_rows(path):
        where = f"{path}:{n}"
        if not isinstance(row, dict):
            raise DataError(f"{where}: expected a JSON object")
        if by_row:  # where plain would read the instruction, read the row as Alpaca's (its input too)
            fmt = "alpaca" if _plain_field(row) == "instruction" else "plain"
        if fmt == "gsm8k":
            text = row.get("question")
            text = text + GSM8K_SUFFIX if isinstance(text, str) and text.strip() else None
        elif fmt == "alpaca":
            text = row.get("instruction")
            if isinstance(text, str) and isinstance(row.get("input"), str) and row["input"].strip():
                text = f"{text}\n\n{row['input']}"
        elif fmt == "mbpp":
            if row.get("task_id") in MBPP_EVAL_IDS:
                continue
            text = row.get("prompt")
        else:
            text = row.get(_plain_field(row))
        if not isinstance(text, str) or not text.strip():
            need = {
                "gsm8k": "a 'question' field",
                "alpaca": "an 'instruction' field",
                "mbpp": "a 'prompt' field",
            }.get(fmt, "a 'prompt' (or 'question', 'problem', 'instruction') field")
            raise DataError(f"{where}: no prompt text: each row needs {need} with text (format {fmt!r})")
        out.append(Prompt(text, where))
        if limit and len(out) >= limit:
            break
    if not out:
        raise DataError(f"{path} has no prompts")
    return out


DATASETS = {
    "gsm8k": "gsm8k_test.jsonl",
    "math500": "math500_test.jsonl",
    "humaneval": "humaneval.jsonl",
    "mbpp": "mbpp_sanitized.json",
    "mt-bench": "mt_bench.jsonl",
}
# The five sets shipped in the package (unmodified public files, origins and licences in its LICENSES.md);
# pip installs a wheel as plain files, so this is a real folder.
PACKAGED_EVAL_DATA = Path(str(importlib.resources.files("dflash_jax") / "eval_sets"))
HUMANEVAL_PREFIX = "Write a solution to the following problem and make sure that it passes the tests:"


@dataclasses.dataclass(frozen=True)
class EvalPrompt:
    """One benchmark item: user turns (several only for MT-Bench), formatted as the reference does."""

    dataset: str
    id: str
    turns: tuple[str, ...]


def eval_data_dir() -> Path:
    """Folder of the evaluation prompt files: ``$DFLASH_JAX_EVAL_DATA`` if set, else the copies shipped
    in the package (``PACKAGED_EVAL_DATA``; origins and licences in its ``LICENSES.md``).

    Raises:
      BenchError: the folder does not exist.
    """
    env = os.environ.get("DFLASH_JAX_EVAL_DATA")
    folder = Path(env) if env else PACKAGED_EVAL_DATA
    if not folder.is_dir():
        raise BenchError(
            f"no evaluation data folder {folder}: "
            + ("point DFLASH_JAX_EVAL_DATA at the folder with gsm8k_test.jsonl etc." if env else "reinstall dflash-jax")
            + ", or pass --prompts-file"
        )
    return folder


def _read_rows(path: Path) -> list[tuple[str, dict]]:
    """``(where, row)`` pairs of a JSONL file or a JSON list (``data.read_rows``, errors as ``BenchError``)."""
    try:
        return [(f"{path}:{n}", row) for n, row in read_rows(path)]
    except DataError as e:
        raise BenchError(str(e)) from None


def _field(row, key: str, where: str) -> str:
    value = row.get(key) if isinstance(row, dict) else None
    if not isinstance(value, str) or not value.strip():
        raise BenchError(f"{where}: expected a non-empty string field '{key}'")
    return value


def load_eval_prompts(
    dataset: str, path: str | Path | None = None, max_samples: int | None = None, max_turns: int = 2
) -> list[EvalPrompt]:
    """The prompts of a benchmark set, in file order, formatted as in ``shared/data/README.md``.

    Args:
      dataset: one of ``DATASETS``, or ``"custom"`` for ``path`` = a JSONL file of ``{"prompt": ...}``
        (optionally ``"id"``; a ``"turns"`` list instead of ``"prompt"`` gives a multi-turn item).
      path: the file (default: ``eval_data_dir() / DATASETS[dataset]``).
      max_samples: the first N items (after the MBPP restriction to task ids 11-510).
      max_turns: MT-Bench turns kept (1: first turns only).

    Raises:
      BenchError: unknown dataset, missing file, or a malformed row (names the file and line).
    """
    if dataset != "custom" and dataset not in DATASETS:
        raise BenchError(f"unknown dataset {dataset!r}: choose from {', '.join(DATASETS)} (or --prompts-file)")
    if path is None:
        if dataset == "custom":
            raise BenchError("dataset 'custom' needs a prompts file")
        folder = eval_data_dir()
        path = folder / DATASETS[dataset]
        if not path.is_file():
            env = "unset DFLASH_JAX_EVAL_DATA for the shipped copy, " if os.environ.get("DFLASH_JAX_EVAL_DATA") else ""
            raise BenchError(
                f"prompt file {path} not found: put {path.name} (the {dataset} set, see "
                f"{PACKAGED_EVAL_DATA / 'LICENSES.md'}) in {folder}, {env}or pass --prompts-file"
            )
    path = Path(path)
    if not path.is_file():
        raise BenchError(f"prompt file {path} not found")
    items = []
    for i, (where, row) in enumerate(_read_rows(path)):
        if dataset == "gsm8k":
            item = (str(i), (_field(row, "question", where) + GSM8K_SUFFIX,))
        elif dataset == "math500":
            item = (str(i), (_field(row, "problem", where) + GSM8K_SUFFIX,))
        elif dataset == "humaneval":
            code = _field(row, "prompt", where)
            item = (str(row.get("task_id", i)), (f"{HUMANEVAL_PREFIX}\n```python\n{code}\n```",))
        elif dataset == "mbpp":
            if row.get("task_id") not in MBPP_EVAL_IDS:
                continue
            item = (str(row["task_id"]), (_field(row, "prompt", where),))
        elif dataset == "mt-bench":
            turns = row.get("turns") if isinstance(row, dict) else None
            if not (isinstance(turns, list) and turns and all(isinstance(t, str) and t.strip() for t in turns)):
                raise BenchError(f"{where}: expected a non-empty list of strings 'turns'")
            item = (str(row.get("question_id", i)), tuple(turns))
        else:
            turns = row.get("turns") if isinstance(row, dict) else None
            if isinstance(turns, list) and turns and all(isinstance(t, str) and t.strip() for t in turns):
                item = (str(row.get("id", i)), tuple(turns))
            else:
                item = (str(row.get("id", i)) if isinstance(row, dict) else str(i), (_field(row, "prompt", where),))
        items.append(EvalPrompt(dataset, item[0], item[1][:max_turns]))
        if max_samples is not None and len(items) >= max_samples:
            break
    if not items:
        raise BenchError(f"{path} has no prompts")
    return items
