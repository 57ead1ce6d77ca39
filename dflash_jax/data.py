"""Training data: tokenised sequences with a loss mask, and the grain input pipeline.

On-disk format (a folder, written atomically by ``write_dataset``)::

    meta.json       {"format": "dflash-jax-tokens", "format_version": 1, "num_sequences": N,
                     "num_tokens": M, "tokenizer_sha256": ..., ...free-form provenance}
    tokens.npy      int32 [M]   all sequences concatenated (prompt + response)
    loss_mask.npy   bool  [M]   True on supervised tokens (the target's own response)
    offsets.npy     int64 [N+1] sequence i is tokens[offsets[i]:offsets[i+1]]

``prepare`` (``dflash-jax prepare-data``) writes such folders as shards ``shard_00000/`` ... under
one folder whose ``meta.json`` (format ``dflash-jax-tokens-sharded``) indexes them;
``TokenDataset`` reads either layout.

The arrays are memory-mapped, so a dataset larger than RAM is fine.

Stored target features (``prepare.write_features``, ``dflash-jax prepare-features``) live beside
the tokens (``features_<key>/``, float32, memory-mapped by ``FeatureStore``) so that training can
skip the target's forward pass (``train.stored_features``).

This module holds the formats only: ``pipeline`` turns them into training batches, ``prepare``
writes them.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from dflash_jax.errors import ConfigError, DataError
from dflash_jax.utils import atomic_folder, json_sha256

FORMAT = "dflash-jax-tokens"
SHARDED_FORMAT = "dflash-jax-tokens-sharded"
FILES = ("tokens.npy", "loss_mask.npy", "offsets.npy")


def write_dataset(
    out: str | Path,
    sequences: Sequence[Sequence[int]],
    loss_masks: Sequence[Sequence[bool]],
    *,
    meta: dict | None = None,
    overwrite: bool = False,
) -> Path:
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
    flat = [t for s in sequences for t in s]
    if not all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) and 0 <= t < 2**31 for t in flat):
        raise DataError("token ids must be integers in [0, 2**31)")
    flat_mask = [x for m in loss_masks for x in m]
    if not all(isinstance(x, (bool, np.bool_)) or x in (0, 1) for x in flat_mask):
        raise DataError("loss masks must hold booleans (or 0/1)")
    tokens = np.asarray(flat, np.int32)
    mask = np.asarray(flat_mask, bool)
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    _check_anchorable(mask, offsets, Path(out))
    with atomic_folder(Path(out), overwrite, kind="tokens") as tmp:
        meta = {**(meta or {}), "content_sha256": content_sha256(tokens, mask, offsets)}
        np.save(tmp / "tokens.npy", tokens)
        np.save(tmp / "loss_mask.npy", mask)
        np.save(tmp / "offsets.npy", offsets)
        info = {
            "format": FORMAT,
            "format_version": 1,
            "num_sequences": len(lens),
            "num_tokens": int(offsets[-1]),
            **meta,
        }
        (tmp / "meta.json").write_text(json.dumps(info, indent=2))
    return Path(out)


def content_sha256(tokens: np.ndarray, loss_mask: np.ndarray, offsets: np.ndarray) -> str:
    """sha256 (hex) of a dataset's arrays: what its sequences and loss masks are, whatever its name."""
    h = hashlib.sha256()
    for a in (tokens, loss_mask, offsets):
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def _check_anchorable(mask: np.ndarray, offsets: np.ndarray, where: Path) -> None:
    """Every sequence needs a position ``p`` with ``p`` and ``p + 1`` supervised (one anchor)."""
    pair = np.zeros(len(mask), np.int64)
    pair[:-1] = mask[:-1] & mask[1:]
    last = offsets[1:] - 1  # a pair starting at a sequence's last token crosses into the next one
    pair[last[(last >= 0) & (offsets[1:] > offsets[:-1])]] = 0
    cs = np.concatenate([[0], np.cumsum(pair)])
    bad = np.flatnonzero(cs[offsets[1:]] - cs[offsets[:-1]] == 0)
    if len(bad):
        raise DataError(
            f"{where}: {len(bad)} sequence(s) have no two consecutive supervised tokens (first: "
            f"index {bad[0]}), so no anchor can be drawn; drop them or regenerate their responses"
        )


class Shard:
    """One dataset folder, checked and memory-mapped; ``len()`` sequences, ``[i]`` -> (tokens, loss_mask).

    Raises (on open):
      DataError: a missing file, a wrong format name, wrong dtypes or shapes, offsets that do not
        match the arrays, or sequences without an anchorable position; the message names the file.
    """

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        meta_path = self.folder / "meta.json"
        if not meta_path.exists():
            raise DataError(
                f"{self.folder} is not a token dataset (no meta.json); make one with "
                "`dflash-jax prepare-data` (or dflash_jax.data.write_dataset)"
            )
        try:
            self.meta = json.loads(meta_path.read_text())
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
            raise DataError(f"{meta_path} is not a readable JSON file: {e}") from None
        if not isinstance(self.meta, dict) or self.meta.get("format") != FORMAT:
            raise DataError(f"{meta_path} does not describe a {FORMAT!r} dataset")
        if self.meta.get("format_version") != 1:
            raise DataError(
                f"{meta_path}: format_version {self.meta.get('format_version')!r} is not 1; "
                "written by another version of dflash-jax?"
            )
        if not all(isinstance(self.meta.get(k), int) for k in ("num_sequences", "num_tokens")):
            raise DataError(f"{meta_path}: num_sequences and num_tokens must be integers")
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
                raise DataError(
                    f"{self.folder / name}: expected a 1-d {np.dtype(dt).name} array, got "
                    f"{arrays[name].ndim}-d {arrays[name].dtype}"
                )
        n, m = self.meta.get("num_sequences"), self.meta.get("num_tokens")
        off = np.asarray(self.offsets)
        if (
            len(off) != (n or 0) + 1
            or off[0] != 0
            or off[-1] != m
            or len(self.tokens) != m
            or len(self.loss_mask) != m
            or np.any(np.diff(off) < 0)
        ):
            raise DataError(
                f"{self.folder}: offsets.npy, tokens.npy and loss_mask.npy do not match meta.json "
                f"({n} sequences, {m} tokens): a truncated or mixed-up copy?"
            )
        _check_anchorable(np.asarray(self.loss_mask), off, self.folder)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def content_sha256(self) -> str:
        """``content_sha256`` of this shard's arrays: recorded when it was written (computed for
        shards written before that was recorded)."""
        recorded = self.meta.get("content_sha256")
        if not isinstance(recorded, str):
            recorded = self.meta["content_sha256"] = content_sha256(self.tokens, self.loss_mask, self.offsets)
        return recorded

    def __getitem__(self, i: int):
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return np.asarray(self.tokens[a:b]), np.asarray(self.loss_mask[a:b])

    def check_vocab(self, vocab_size: int) -> None:
        """Raise ``DataError`` if a token id is outside ``[0, vocab_size)`` (another tokenizer?)."""
        if len(self.tokens) == 0:
            return
        hi, lo = int(np.max(self.tokens)), int(np.min(self.tokens))
        if lo < 0 or hi >= vocab_size:
            raise DataError(
                f"{self.folder}: token ids span [{lo}, {hi}] but the target's vocabulary has "
                f"{vocab_size} entries: the data was tokenised for another model"
            )


class _Shards:
    """Sequences read across a list of ``Shard`` (``self.shards``, in order): what ``TokenDataset``
    and ``DatasetMix`` share. Sequence ``i`` is row ``j`` of shard ``k`` (``locate``)."""

    shards: list[Shard]

    def _index(self) -> None:
        self._starts = np.cumsum([0] + [len(s) for s in self.shards])

    def __len__(self) -> int:
        return int(self._starts[-1])

    def shard_start(self, k: int) -> int:
        """Index of shard ``k``'s first sequence (``k == len(self.shards)``: the dataset's size)."""
        return int(self._starts[k])

    def locate(self, i: int) -> tuple[int, int]:
        """``(shard k, row j in it)`` of sequence ``i``."""
        if not 0 <= i < len(self):
            raise IndexError(i)
        k = int(np.searchsorted(self._starts, i, side="right")) - 1
        return k, i - int(self._starts[k])

    def __getitem__(self, i: int):
        k, j = self.locate(i)
        return self.shards[k][j]

    def lengths(self) -> np.ndarray:
        """int64 ``[len(self)]``: tokens per sequence, from the offsets (no token is read)."""
        return np.concatenate([np.diff(np.asarray(s.offsets)) for s in self.shards])

    def check_vocab(self, vocab_size: int) -> None:
        """Raise ``DataError`` if a token id is outside ``[0, vocab_size)`` (another tokenizer?)."""
        for s in self.shards:
            s.check_vocab(vocab_size)


class TokenDataset(_Shards):
    """A token dataset: one folder (``write_dataset``) or a folder of shards (``prepare``).

    ``len()`` sequences; ``[i]`` -> ``(tokens int32 [n], loss_mask bool [n])``; ``meta`` is the
    top-level ``meta.json``.

    Raises (on open):
      DataError: as ``Shard`` for any shard (the message names it), or a shard index that lists
        missing shards.
    """

    def __init__(self, folder: str | Path, max_shards: int | None = None):
        """``max_shards``: use only the first N shards of a sharded dataset (a fixed prefix, usable
        while ``prepare-data`` is still adding shards)."""
        self.folder = Path(folder)
        self.prefix = False
        try:
            meta = json.loads((self.folder / "meta.json").read_text())
        except (OSError, json.JSONDecodeError, UnicodeDecodeError):
            meta = None
        if isinstance(meta, dict) and meta.get("format") == SHARDED_FORMAT:
            self.meta = meta
            names = meta.get("shards")
            if (
                not isinstance(names, list)
                or not names
                or not all(isinstance(n, str) and re.fullmatch(r"shard_\d+", n) for n in names)
            ):
                raise DataError(
                    f"{self.folder}/meta.json: 'shards' must be a non-empty list of shard_NNNNN names; "
                    "run prepare-data again"
                )
            shards = [Shard(self.folder / name) for name in names]
            total = sum(len(x) for x in shards)
            if meta.get("num_sequences") != total:
                raise DataError(
                    f"{self.folder}/meta.json counts {meta.get('num_sequences')} sequences but its "
                    f"shards hold {total}; run prepare-data again"
                )
            if max_shards:
                if len(shards) < max_shards:
                    raise DataError(
                        f"{self.folder} has {len(shards)} finished shards, fewer than the "
                        f"{max_shards} asked for (data_shards); wait for prepare-data or ask for fewer"
                    )
                shards, self.prefix = shards[:max_shards], True
            self.shards = shards
        else:
            self.shards = [Shard(self.folder)]
            self.meta = self.shards[0].meta
        self._index()

    @property
    def parts(self) -> list[TokenDataset]:
        """The datasets read (``DatasetMix``'s field): this one."""
        return [self]

    @property
    def complete(self) -> bool:
        """False for a sharded dataset whose ``prepare-data`` run has not finished (unless a fixed
        prefix of shards was asked for)."""
        return self.prefix or self.meta.get("format") != SHARDED_FORMAT or bool(self.meta.get("complete"))

    @property
    def identity(self) -> dict:
        """What a training run records about its data (and checks on resume): the counts and names,
        and each shard's content hash, so data re-made with another seed or by another target is
        another run's data even under the same names."""
        return {
            "num_sequences": len(self),
            "num_tokens": int(sum(s.meta["num_tokens"] for s in self.shards)),
            "shards": [s.folder.name for s in self.shards],
            "tokenizer_sha256": self.meta.get("tokenizer_sha256"),
            "source": self.meta.get("source"),
            "content_sha256": [s.content_sha256 for s in self.shards],
        }


class DatasetMix(_Shards):
    """Several token datasets read as one, in the order given: sequence ``i`` is the first part's
    while ``i`` is below its size, then the second's, and so on (a training run draws its order over
    the whole; ``TrainConfig.data`` naming several folders, e.g. single-turn answers beside chats).

    ``parts``: the ``TokenDataset`` s; ``shards``: theirs, in order (so ``eval.val_within_shards``
    counts the first part's shards first).

    Raises (on construction):
      ValueError: fewer than two parts.
      DataError: two parts that are one folder, or that hold a shard of the same content (an answer
        held out from one would be trained on in the other).
    """

    def __init__(self, parts: Sequence[TokenDataset]):
        if len(parts) < 2:
            raise ValueError(f"a DatasetMix reads two or more datasets, got {len(parts)}; use the TokenDataset")
        folders = [p.folder.resolve() for p in parts]
        if len(set(folders)) < len(folders):
            raise DataError(f"data names one folder twice ({', '.join(str(p.folder) for p in parts)}); name it once")
        where: dict[str, str] = {}
        for p in parts:
            for shard in p.shards:
                seen = where.setdefault(shard.content_sha256, str(shard.folder))
                if seen != str(shard.folder):
                    raise DataError(
                        f"{shard.folder} and {seen} hold the same answers: a held-out answer would be trained on; "
                        "name each dataset once"
                    )
        self.parts = list(parts)
        self.shards = [s for p in self.parts for s in p.shards]
        self._index()

    @property
    def complete(self) -> bool:
        """Every part complete (``TokenDataset.complete``)."""
        return all(p.complete for p in self.parts)

    @property
    def identity(self) -> dict:
        """Each part's ``TokenDataset.identity``, in order (the content hashes name the data, so a folder
        may be renamed or moved between a run and its resume, as for one folder)."""
        return {"parts": [p.identity for p in self.parts]}


Dataset = TokenDataset | DatasetMix  # what a training run reads (``open_data``)


def open_data(folders: str | Path | Sequence[str | Path], max_shards: int | Sequence[int] = 0) -> Dataset:
    """The dataset of one folder (``TokenDataset``) or several (``DatasetMix``, in the order given).

    Args:
      folders: a dataset folder, or a sequence of them.
      max_shards: the first N shards of each (``TokenDataset``'s ``max_shards``; 0: all): one number,
        or one per folder; one number other than 0 with several folders is refused.

    Raises:
      ConfigError: ``max_shards`` not matching the folders (the message names the fix).
      DataError: as ``TokenDataset`` and ``DatasetMix``.
    """
    folders = [folders] if isinstance(folders, (str, Path)) else list(folders)
    if isinstance(max_shards, int):
        if max_shards and len(folders) > 1:
            raise ConfigError(
                f"data_shards={max_shards} with {len(folders)} data folders: give one count per folder, "
                f"e.g. data_shards={tuple([max_shards] + [0] * (len(folders) - 1))} (0 = all)"
            )
        max_shards = [max_shards] * len(folders)
    if len(max_shards) != len(folders):
        raise ConfigError(f"data_shards has {len(max_shards)} counts for {len(folders)} data folders; give one each")
    parts = [TokenDataset(f, max_shards=m or None) for f, m in zip(folders, max_shards)]
    return parts[0] if len(parts) == 1 else DatasetMix(parts)


# ----------------------------------------------------------------------------- stored target features

FEATURES_FORMAT = "dflash-jax-features"


def features_folder(data_folder: str | Path, target_identity: dict, layer_ids: Sequence[int], dtype: str) -> Path:
    """Where the stored target features of a dataset live: ``<data>/features_<key>``, the key a
    hash of the target's identity, the tapped layers and the compute dtype (features of another
    target, tap set or dtype never mix)."""
    spec = {"target": target_identity, "layers": [int(x) for x in layer_ids], "dtype": dtype}
    key = json_sha256(spec, 12)
    return Path(data_folder) / f"features_{key}"


class FeatureStore:
    """The target's tapped features of every token of a ``TokenDataset``, memory-mapped:
    ``[i]`` -> float32 ``[n_i, F]`` for sequence ``i`` (``F`` = taps x hidden size), the same rows
    the training step would compute (``loss.target_features``; causal, so a cut sequence's
    features are the first rows). Files: ``meta.json`` and one ``<shard name>.npy`` float32
    ``[shard tokens, F]`` per token shard, written by ``write_features``.

    Raises (on open):
      DataError: no ``meta.json`` (features never made: the message gives the command), features
        of another width, a missing shard file (``prepare-features`` unfinished, or the dataset
        folder renamed) or one whose shape or dtype does not match its token shard (delete it
        and rerun). A shard file is matched to its token shard by name and token count only.
    """

    def __init__(self, folder: str | Path, ds: TokenDataset, feature_size: int):
        self.folder = Path(folder)
        fix = "make them with `dflash-jax prepare-features --config <your training config>`"
        try:
            meta = json.loads((self.folder / "meta.json").read_text())
        except FileNotFoundError:
            raise DataError(f"no stored target features in {self.folder}; {fix}") from None
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
            raise DataError(f"{self.folder}/meta.json is not readable ({e}); delete {self.folder} and {fix}") from None
        if (
            not isinstance(meta, dict)
            or meta.get("format") != FEATURES_FORMAT
            or meta.get("feature_size") != feature_size
        ):
            raise DataError(
                f"{self.folder} does not hold {feature_size}-wide {FEATURES_FORMAT!r} features; delete it and {fix}"
            )
        self.arrays = []
        for shard in ds.shards:
            path = self.folder / f"{shard.folder.name}.npy"
            if not path.exists():
                raise DataError(
                    f"{path} is missing: prepare-features has not finished (or the dataset folder was "
                    f"renamed since); {fix} (it resumes)"
                )
            try:
                a = np.load(path, mmap_mode="r", allow_pickle=False)
            except (OSError, ValueError) as e:
                raise DataError(f"cannot read {path} ({e}); delete it and rerun prepare-features") from None
            if a.dtype != np.float32 or a.shape != (len(shard.tokens), feature_size):
                raise DataError(
                    f"{path} is {a.dtype} {a.shape}, but its token shard has {len(shard.tokens)} tokens "
                    f"and features are float32 x {feature_size}; delete it and rerun prepare-features"
                )
            self.arrays.append(a)
        self.ds = ds

    def __getitem__(self, i: int) -> np.ndarray:
        k, j = self.ds.locate(i)
        off = self.ds.shards[k].offsets
        return np.asarray(self.arrays[k][int(off[j]) : int(off[j + 1])])
