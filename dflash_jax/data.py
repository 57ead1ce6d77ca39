"""Training data: tokenised sequences with a loss mask, and the grain input pipeline.

On-disk format (a folder, written atomically by ``write_dataset``)::

    meta.json       {"format": "dflash-jax-tokens", "format_version": 1, "num_sequences": N,
                     "num_tokens": M, "tokenizer_sha256": ..., ...free-form provenance}
    tokens.npy      int32 [M]   all sequences concatenated (prompt + response)
    loss_mask.npy   bool  [M]   True on supervised tokens (the target's own response)
    offsets.npy     int64 [N+1] sequence i is tokens[offsets[i]:offsets[i+1]]

The arrays are memory-mapped, so a dataset larger than RAM is fine. Batches come from a grain
``MapDataset`` (shuffled per epoch with a seed, repeated, batched); it is random-access, so the
batch of step ``s`` is ``dataset[s]`` and resuming at step ``s`` is exact.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np

from dflash_jax.checkpoint import CheckpointError, atomic_folder

FORMAT = "dflash-jax-tokens"
FILES = ("tokens.npy", "loss_mask.npy", "offsets.npy")


class DataError(CheckpointError):
    """A data folder that is not what it claims (names the file and the fix)."""


def write_dataset(out: str | Path, sequences: Sequence[Sequence[int]], loss_masks: Sequence[Sequence[bool]], *,
                  meta: dict | None = None, overwrite: bool = False) -> Path:
    """Write sequences and their loss masks as a dataset folder (atomic).

    Raises:
      DataError: lengths differ, or a sequence has no two consecutive supervised tokens
        (it could not hold a single anchor).
    """
    if len(sequences) != len(loss_masks):
        raise DataError(f"{len(sequences)} sequences but {len(loss_masks)} loss masks")
    lens = [len(s) for s in sequences]
    for i, (s, m) in enumerate(zip(sequences, loss_masks)):
        if len(s) != len(m):
            raise DataError(f"sequence {i}: {len(s)} tokens but a loss mask of {len(m)}")
    tokens = np.asarray([t for s in sequences for t in s], np.int32)
    mask = np.asarray([bool(x) for m in loss_masks for x in m], bool)
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    _check_anchorable(mask, offsets, Path(out))
    with atomic_folder(Path(out), overwrite, marker="meta.json") as tmp:
        np.save(tmp / "tokens.npy", tokens)
        np.save(tmp / "loss_mask.npy", mask)
        np.save(tmp / "offsets.npy", offsets)
        info = {"format": FORMAT, "format_version": 1, "num_sequences": len(lens), "num_tokens": int(offsets[-1]),
                **(meta or {})}
        (tmp / "meta.json").write_text(json.dumps(info, indent=2))
    return Path(out)


def _check_anchorable(mask: np.ndarray, offsets: np.ndarray, where: Path) -> None:
    pair = mask[:-1] & mask[1:]
    pair = np.concatenate([pair, [False]])
    ends = offsets[1:] - 1  # the pair starting at a sequence's last token crosses into the next one
    pair[ends[ends >= 0]] = False
    per_seq = np.add.reduceat(pair.astype(np.int64), offsets[:-1]) if len(offsets) > 1 else np.zeros(0)
    per_seq = np.where(offsets[1:] > offsets[:-1], per_seq, 0)
    bad = np.flatnonzero(per_seq == 0)
    if len(bad):
        raise DataError(f"{where}: {len(bad)} sequence(s) have no two consecutive supervised tokens (first: "
                        f"index {bad[0]}), so no anchor can be drawn; drop them or regenerate their responses")


class TokenDataset:
    """A dataset folder, checked and memory-mapped; ``len()`` sequences, ``[i]`` -> (tokens, loss_mask).

    Raises (on open):
      DataError: a missing file, a wrong format name, wrong dtypes or shapes, offsets that do not
        match the arrays, or sequences without an anchorable position; the message names the file.
    """

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        meta_path = self.folder / "meta.json"
        if not meta_path.exists():
            raise DataError(f"{self.folder} is not a token dataset (no meta.json); make one with "
                            "dflash_jax.data.write_dataset or `dflash-jax make-data`")
        try:
            self.meta = json.loads(meta_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise DataError(f"{meta_path} is not valid JSON: {e}") from None
        if not isinstance(self.meta, dict) or self.meta.get("format") != FORMAT:
            raise DataError(f"{meta_path} does not describe a {FORMAT!r} dataset")
        arrays = {}
        for name in FILES:
            try:
                arrays[name] = np.load(self.folder / name, mmap_mode="r", allow_pickle=False)
            except (OSError, ValueError) as e:
                raise DataError(f"cannot read {self.folder / name}: {e}") from None
        self.tokens, self.loss_mask, self.offsets = (arrays[n] for n in FILES)
        want = {"tokens.npy": np.int32, "loss_mask.npy": np.bool_, "offsets.npy": np.int64}
        for name, dt in want.items():
            if arrays[name].dtype != dt or arrays[name].ndim != 1:
                raise DataError(f"{self.folder / name}: expected a 1-d {np.dtype(dt).name} array, got "
                                f"{arrays[name].ndim}-d {arrays[name].dtype}")
        n, m = self.meta.get("num_sequences"), self.meta.get("num_tokens")
        off = np.asarray(self.offsets)
        if (len(off) != (n or 0) + 1 or off[0] != 0 or off[-1] != m or len(self.tokens) != m
                or len(self.loss_mask) != m or np.any(np.diff(off) < 0)):
            raise DataError(f"{self.folder}: offsets.npy, tokens.npy and loss_mask.npy do not match meta.json "
                            f"({n} sequences, {m} tokens): a truncated or mixed-up copy?")
        _check_anchorable(np.asarray(self.loss_mask), off, self.folder)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int):
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return np.asarray(self.tokens[a:b]), np.asarray(self.loss_mask[a:b])

    def check_vocab(self, vocab_size: int) -> None:
        """Raise ``DataError`` if a token id is outside ``[0, vocab_size)`` (another tokenizer?)."""
        hi, lo = int(np.max(self.tokens)), int(np.min(self.tokens))
        if lo < 0 or hi >= vocab_size:
            raise DataError(f"{self.folder}: token ids span [{lo}, {hi}] but the target's vocabulary has "
                            f"{vocab_size} entries: the data was tokenised for another model")


class PaddedSource:
    """grain source: sequence ``indices[i]`` of a ``TokenDataset``, cut/padded to ``max_len``."""

    def __init__(self, ds: TokenDataset, indices: np.ndarray, max_len: int, pad_id: int = 0):
        self.ds, self.indices, self.max_len, self.pad_id = ds, np.asarray(indices), max_len, pad_id

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> dict:
        tok, mask = self.ds[int(self.indices[i])]
        tok, mask = tok[: self.max_len], mask[: self.max_len]
        out_t = np.full(self.max_len, self.pad_id, np.int32)
        out_m = np.zeros(self.max_len, bool)
        out_t[: len(tok)], out_m[: len(mask)] = tok, mask
        return {"tokens": out_t, "loss_mask": out_m}


def split_indices(n: int, val_size: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A fixed held-out split: ``val_size`` sequences for validation, the rest for training."""
    if not 0 <= val_size < n:
        raise DataError(f"validation size {val_size} must be in [0, {n}) for a dataset of {n} sequences")
    perm = np.random.RandomState(seed).permutation(n)
    return np.sort(perm[val_size:]), np.sort(perm[:val_size])


def batches(ds: TokenDataset, indices: np.ndarray, *, batch_size: int, max_len: int, seed: int, pad_id: int = 0):
    """Random-access grain dataset of training batches: ``[step]`` -> ``{"tokens", "loss_mask"}``
    arrays ``[batch_size, max_len]``; reshuffled every epoch, repeated forever."""
    import grain

    src = PaddedSource(ds, indices, max_len, pad_id)
    return grain.MapDataset.source(src).shuffle(seed=seed).repeat(None).batch(batch_size, drop_remainder=True)


# ----------------------------------------------------------------------------- making data


def read_prompt_file(path: str | Path, limit: int | None = None) -> list[str]:
    """User prompts from a JSONL file or a JSON list: the field ``prompt``, ``question``,
    ``problem`` or ``instruction`` (+ ``input`` when non-empty), in that order of preference.

    Raises:
      DataError: unreadable file, or a row with none of those fields (its number is named).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"cannot read prompts from {path}: {e}") from None
    try:
        rows = json.loads(text) if text.lstrip().startswith("[") else [json.loads(x) for x in text.splitlines() if x.strip()]
    except json.JSONDecodeError as e:
        raise DataError(f"{path} is neither JSONL nor a JSON list: {e}") from None
    out = []
    for n, row in enumerate(rows[:limit] if limit else rows, 1):
        if not isinstance(row, dict):
            raise DataError(f"{path}: row {n} is not a JSON object")
        for key in ("prompt", "question", "problem", "instruction"):
            if isinstance(row.get(key), str) and row[key].strip():
                p = row[key]
                if key == "instruction" and isinstance(row.get("input"), str) and row["input"].strip():
                    p = f"{p}\n\n{row['input']}"
                out.append(p)
                break
        else:
            raise DataError(f"{path}: row {n} has no 'prompt', 'question', 'problem' or 'instruction' text")
    return out


def regenerate(decoder, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, batch_size: int,
               stop_ids: Sequence[int] = (), progress: bool = True):
    """The target's own greedy responses to token-id ``prompts`` (SPEC "Training" 1).

    Returns:
      ``(sequences, loss_masks)``: prompt + response token ids, and True exactly on the response
      (the stop token, when produced, is part of the response).
    """
    from tqdm import tqdm

    order = np.argsort([len(p) for p in prompts])  # similar lengths share a batch: less padding
    seqs: list = [None] * len(prompts)
    bar = tqdm(total=len(prompts), desc="regenerate", unit="seq", disable=not progress)
    for i in range(0, len(order), batch_size):
        idx = order[i: i + batch_size]
        results = decoder.generate([prompts[j] for j in idx], max_new_tokens, stop_ids)
        for j, r in zip(idx, results):
            seqs[j] = (list(prompts[j]), r.token_ids)
        bar.update(len(idx))
    bar.close()
    return [p + r for p, r in seqs], [[False] * len(p) + [True] * len(r) for p, r in seqs]
