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

The arrays are memory-mapped, so a dataset larger than RAM is fine. Training rows come from a
grain ``MapDataset`` (shuffled per epoch with a seed, repeated); it is random-access, so batch
``s`` is rows ``s*B .. s*B+B-1``, resuming at step ``s`` is exact, and each host of a multi-host
job reads only the rows its devices hold. ``bucketed_batches`` (``train.length_buckets``) groups
the same stream into batches of similar length, each padded to its length bucket.

``write_features`` (``dflash-jax prepare-features``) stores the frozen target's tapped features
beside the tokens (``features_<key>/``, float32, memory-mapped by ``FeatureStore``) so that
training can skip the target's forward pass (``train.stored_features``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from functools import partial
from pathlib import Path
from typing import Sequence

import numpy as np

from dflash_jax.checkpoint import CheckpointError, atomic_folder

FORMAT = "dflash-jax-tokens"
SHARDED_FORMAT = "dflash-jax-tokens-sharded"
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
    with atomic_folder(Path(out), overwrite, marker="meta.json") as tmp:
        np.save(tmp / "tokens.npy", tokens)
        np.save(tmp / "loss_mask.npy", mask)
        np.save(tmp / "offsets.npy", offsets)
        info = {"format": FORMAT, "format_version": 1, "num_sequences": len(lens), "num_tokens": int(offsets[-1]),
                **(meta or {})}
        (tmp / "meta.json").write_text(json.dumps(info, indent=2))
    return Path(out)


def _check_anchorable(mask: np.ndarray, offsets: np.ndarray, where: Path) -> None:
    """Every sequence needs a position ``p`` with ``p`` and ``p + 1`` supervised (one anchor)."""
    pair = np.zeros(len(mask), np.int64)
    pair[:-1] = mask[:-1] & mask[1:]
    last = offsets[1:] - 1  # a pair starting at a sequence's last token crosses into the next one
    pair[last[(last >= 0) & (offsets[1:] > offsets[:-1])]] = 0
    cs = np.concatenate([[0], np.cumsum(pair)])
    bad = np.flatnonzero(cs[offsets[1:]] - cs[offsets[:-1]] == 0)
    if len(bad):
        raise DataError(f"{where}: {len(bad)} sequence(s) have no two consecutive supervised tokens (first: "
                        f"index {bad[0]}), so no anchor can be drawn; drop them or regenerate their responses")


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
            raise DataError(f"{self.folder} is not a token dataset (no meta.json); make one with "
                            "`dflash-jax prepare-data` (or dflash_jax.data.write_dataset)")
        try:
            self.meta = json.loads(meta_path.read_text())
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
            raise DataError(f"{meta_path} is not a readable JSON file: {e}") from None
        if not isinstance(self.meta, dict) or self.meta.get("format") != FORMAT:
            raise DataError(f"{meta_path} does not describe a {FORMAT!r} dataset")
        if self.meta.get("format_version") != 1:
            raise DataError(f"{meta_path}: format_version {self.meta.get('format_version')!r} is not 1; "
                            "written by another version of dflash-jax?")
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
        if len(self.tokens) == 0:
            return
        hi, lo = int(np.max(self.tokens)), int(np.min(self.tokens))
        if lo < 0 or hi >= vocab_size:
            raise DataError(f"{self.folder}: token ids span [{lo}, {hi}] but the target's vocabulary has "
                            f"{vocab_size} entries: the data was tokenised for another model")


class TokenDataset:
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
            if not isinstance(names, list) or not names or not all(
                    isinstance(n, str) and re.fullmatch(r"shard_\d+", n) for n in names):
                raise DataError(f"{self.folder}/meta.json: 'shards' must be a non-empty list of shard_NNNNN names; "
                                "run prepare-data again")
            shards = [Shard(self.folder / name) for name in names]
            total = sum(len(x) for x in shards)
            if meta.get("num_sequences") != total:
                raise DataError(f"{self.folder}/meta.json counts {meta.get('num_sequences')} sequences but its "
                                f"shards hold {total}; run prepare-data again")
            if max_shards:
                if len(shards) < max_shards:
                    raise DataError(f"{self.folder} has {len(shards)} finished shards, fewer than the "
                                    f"{max_shards} asked for (data_shards); wait for prepare-data or ask for fewer")
                shards, self.prefix = shards[:max_shards], True
            self.shards = shards
        else:
            self.shards = [Shard(self.folder)]
            self.meta = self.shards[0].meta
        self._starts = np.cumsum([0] + [len(s) for s in self.shards])

    @property
    def complete(self) -> bool:
        """False for a sharded dataset whose ``prepare-data`` run has not finished (unless a fixed
        prefix of shards was asked for)."""
        return self.prefix or self.meta.get("format") != SHARDED_FORMAT or bool(self.meta.get("complete"))

    @property
    def identity(self) -> dict:
        """What a training run records about its data (and checks on resume)."""
        return {"num_sequences": len(self), "num_tokens": int(sum(s.meta["num_tokens"] for s in self.shards)),
                "shards": [s.folder.name for s in self.shards], "tokenizer_sha256": self.meta.get("tokenizer_sha256"),
                "source": self.meta.get("source")}

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


class PaddedSource:
    """grain source: sequence ``indices[i]`` of a ``TokenDataset``, cut/padded to ``max_len``:
    ``{"tokens": int32 [max_len], "loss_mask": bool [max_len]}``, plus ``"features"`` float32
    ``[max_len, F]`` (zeros past the sequence) when a ``FeatureStore`` is given."""

    def __init__(self, ds: TokenDataset, indices: np.ndarray, max_len: int, pad_id: int = 0,
                 features: FeatureStore | None = None):
        self.ds, self.indices, self.max_len, self.pad_id = ds, np.asarray(indices), max_len, pad_id
        self.features = features

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> dict:
        tok, mask = self.ds[int(self.indices[i])]
        tok, mask = tok[: self.max_len], mask[: self.max_len]
        out_t = np.full(self.max_len, self.pad_id, np.int32)
        out_m = np.zeros(self.max_len, bool)
        out_t[: len(tok)], out_m[: len(mask)] = tok, mask
        out = {"tokens": out_t, "loss_mask": out_m}
        if self.features is not None:
            f = self.features[int(self.indices[i])][: self.max_len]
            out["features"] = np.zeros((self.max_len, f.shape[1]), np.float32)
            out["features"][: len(f)] = f
        return out


def split_indices(n: int, val_size: int, seed: int = 0, within: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """A fixed held-out split of sequences ``0..n-1``: ``(train, val)`` index arrays (int64, sorted).

    ``val_size`` sequences are drawn (a seeded permutation) from the first ``within`` sequences
    (default: all ``n``); every sequence from ``within`` on is for training. So a later training
    stage on more sequences holds out exactly what an earlier stage held out when it passes the
    same ``within``, ``val_size`` and ``seed``: ``within`` is the size over which that earlier
    split was drawn (its dataset size if it drew from all, else its own ``within``; carry it along
    a chain of stages, never the previous stage's larger size). Its validation loss then stays
    comparable and never scores a sequence any stage using that split trained on.

    Raises:
      DataError: ``val_size`` not in ``[0, within)`` or ``within`` not in ``[1, n]``.
    """
    within = n if within is None else within
    if not 1 <= within <= n:
        raise DataError(f"the validation split's range ({within} sequences) must be within the dataset's {n}")
    if not 0 <= val_size < within:
        raise DataError(f"validation size {val_size} must be in [0, {within}) for a split over {within} sequences")
    perm = np.random.RandomState(seed).permutation(within)
    train = np.concatenate([perm[val_size:], np.arange(within, n)])
    return np.sort(train), np.sort(perm[:val_size])


def rows(ds: TokenDataset, indices: np.ndarray, *, max_len: int, seed: int, pad_id: int = 0,
         features: FeatureStore | None = None):
    """Random-access grain dataset of training rows, reshuffled every epoch and repeated forever:
    ``[j]`` -> ``{"tokens", "loss_mask"}`` ``[max_len]`` (and ``"features"`` with a ``FeatureStore``,
    see ``PaddedSource``). Batch ``s`` of size ``B`` is rows ``s*B .. s*B+B-1``, so a restart at
    step ``s`` is exact and each process reads just its rows."""
    import grain

    src = PaddedSource(ds, indices, max_len, pad_id, features)
    return grain.MapDataset.source(src).shuffle(seed=seed).repeat(None)


BUCKET_WINDOW = 16  # batches regrouped together (part of a bucketed run's identity)


def bucket_lengths(buckets: Sequence[int], max_len: int) -> tuple[int, ...]:
    """The padded lengths a bucketed batch may take: ``buckets`` with ``max_len`` always last.

    Raises:
      ValueError: ``buckets`` not a tuple/list of increasing positive integers, or one above ``max_len``.
    """
    ok_type = isinstance(buckets, (tuple, list)) and all(
        isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in buckets)
    b = [int(x) for x in buckets] if ok_type else []
    if not b or any(x <= 0 for x in b) or b != sorted(set(b)) or b[-1] > max_len:
        raise ValueError(f"length buckets {buckets!r} must be a tuple/list of increasing positive integers <= max_len "
                         f"({max_len})")
    return tuple(b if b[-1] == max_len else [*b, max_len])


def bucketed_batches(ds: TokenDataset, indices: np.ndarray, *, batch_size: int, max_len: int,
                     buckets: Sequence[int], seed: int, window: int = BUCKET_WINDOW, pad_id: int = 0,
                     features: FeatureStore | None = None):
    """Random-access grain dataset of whole training batches, bucketed by length:
    ``[s]`` -> ``{"tokens": int32 [batch_size, L], "loss_mask": bool [batch_size, L]}``.

    The rows are the stream of ``rows`` (same seeded shuffle, same epochs), taken a window of
    ``window`` batches at a time; inside a window the rows are ordered by bucket (stably), cut
    into ``window`` batches, and those batches visited in a seeded random order. A batch is
    padded to ``L``, the smallest of ``buckets`` (plus ``max_len``, always the last bucket) that
    holds its longest row (cut to ``max_len``): fewer padding tokens through the target than
    ``max_len`` everywhere, one compiled step per bucket (with a ``FeatureStore``, each batch also
    holds ``"features"`` float32 ``[batch_size, L, F]``). Batch ``s`` is a pure function of
    ``s`` and the arguments, so a restart at step ``s`` is exact (the step number is the
    iterator state the trainer checkpoints).

    Raises:
      ValueError: as ``bucket_lengths``.
    """
    import grain

    b = np.array(bucket_lengths(buckets, max_len))
    indices = np.asarray(indices)
    bucket_of = np.searchsorted(b, np.minimum(ds.lengths()[indices], max_len))  # per position in ``indices``
    order = grain.MapDataset.range(len(indices)).shuffle(seed=seed).repeat(None)  # the permutation of ``rows``
    src = PaddedSource(ds, indices, max_len, pad_id, features)
    span = batch_size * window

    def batch(s: int) -> dict:
        w, i = divmod(int(s), window)
        pos = np.array([order[w * span + j] for j in range(span)])
        pos = pos[np.argsort(bucket_of[pos], kind="stable")]
        k = np.random.default_rng([seed, w]).permutation(window)[i]
        mine = pos[k * batch_size:(k + 1) * batch_size]
        length = int(b[bucket_of[mine].max()])
        rows = [src[int(p)] for p in mine]
        return {key: np.stack([r[key][:length] for r in rows]) for key in rows[0]}

    return grain.MapDataset.range(0, 2**62).map(batch)


# ----------------------------------------------------------------------------- stored target features

FEATURES_FORMAT = "dflash-jax-features"


def features_folder(data_folder: str | Path, target_identity: dict, layer_ids: Sequence[int], dtype: str) -> Path:
    """Where the stored target features of a dataset live: ``<data>/features_<key>``, the key a
    hash of the target's identity, the tapped layers and the compute dtype (features of another
    target, tap set or dtype never mix)."""
    spec = {"target": target_identity, "layers": [int(x) for x in layer_ids], "dtype": dtype}
    key = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
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
        if not isinstance(meta, dict) or meta.get("format") != FEATURES_FORMAT or meta.get("feature_size") != feature_size:
            raise DataError(f"{self.folder} does not hold {feature_size}-wide {FEATURES_FORMAT!r} features; delete it "
                            f"and {fix}")
        self.arrays = []
        for shard in ds.shards:
            path = self.folder / f"{shard.folder.name}.npy"
            if not path.exists():
                raise DataError(f"{path} is missing: prepare-features has not finished (or the dataset folder was "
                                f"renamed since); {fix} (it resumes)")
            try:
                a = np.load(path, mmap_mode="r", allow_pickle=False)
            except (OSError, ValueError) as e:
                raise DataError(f"cannot read {path} ({e}); delete it and rerun prepare-features") from None
            if a.dtype != np.float32 or a.shape != (len(shard.tokens), feature_size):
                raise DataError(f"{path} is {a.dtype} {a.shape}, but its token shard has {len(shard.tokens)} tokens "
                                f"and features are float32 x {feature_size}; delete it and rerun prepare-features")
            self.arrays.append(a)
        self.ds = ds

    def __getitem__(self, i: int) -> np.ndarray:
        k, j = self.ds.locate(i)
        off = self.ds.shards[k].offsets
        return np.asarray(self.arrays[k][int(off[j]): int(off[j + 1])])


def write_features(ds: TokenDataset, ck, layer_ids: Sequence[int], *, dtype: str, batch_size: int = 4,
                   progress: bool = True) -> Path:
    """Run the frozen target once over every sequence of ``ds`` and store its tapped features
    (``FeatureStore`` layout, under ``features_folder``), so that training skips the target's
    forward pass (``train.stored_features``). Resumable: a shard file is written atomically
    (a temporary name, then a rename) and a restart skips the shard files already there.

    Sequences are taken ``batch_size`` at a time in length order, each batch padded to a multiple of
    128 tokens (one compile per padded length); padding sits after the tokens, so, the target being
    causal, it does not change their features.

    Args:
      ck: the target (``checkpoint.load_target(..., dtype=dtype)``): the features are computed in
        its dtype and stored as float32 (exact for bfloat16).
      layer_ids: the drafter's ``target_layer_ids``; dtype: ``"float32"`` or ``"bfloat16"``.
    Returns:
      the features folder.
    Raises:
      DataError: the folder holds features made with other settings, its ``meta.json`` is
        damaged, or another ``prepare-features`` is writing it (an exclusive lock on
        ``<folder>/.lock`` guards the writes).
    """
    import fcntl

    folder = features_folder(ds.folder, ck.identity, layer_ids, dtype)
    width = len(layer_ids) * ck.cfg.hidden_size
    meta = {"format": FEATURES_FORMAT, "format_version": 1, "feature_size": width, "layers": [int(x) for x in layer_ids],
            "dtype": dtype, "target": ck.identity}
    folder.mkdir(parents=True, exist_ok=True)
    lock = open(folder / ".lock", "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise DataError(f"another prepare-features is writing {folder}; wait for it to finish (or stop it)") from None
    try:
        _write_features(ds, ck, layer_ids, folder, meta, batch_size, progress)
    finally:
        lock.close()  # releases the lock
    return folder


def _write_features(ds, ck, layer_ids, folder: Path, meta: dict, batch_size: int, progress: bool) -> None:
    """``write_features`` under its lock."""
    import jax
    from tqdm import tqdm

    from dflash_jax.loss import target_features

    width = meta["feature_size"]
    if (folder / "meta.json").exists():
        try:
            old = json.loads((folder / "meta.json").read_text())
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
            raise DataError(f"{folder}/meta.json is damaged ({e}); delete {folder} and rerun") from None
        if old != meta:
            raise DataError(f"{folder} holds features made with other settings; delete it and rerun")
    else:
        tmp = folder / "meta.json.tmp"
        tmp.write_text(json.dumps(meta, indent=2))
        os.replace(tmp, folder / "meta.json")
    for stale in folder.glob("*.npy.partial"):  # left by a killed run (we hold the lock: nobody else writes)
        stale.unlink()

    taps = jax.jit(partial(target_features, tcfg=ck.cfg, layer_ids=tuple(layer_ids)))
    todo = [sh for sh in ds.shards if not (folder / f"{sh.folder.name}.npy").exists()]
    bar = tqdm(total=sum(len(sh) for sh in todo), desc="prepare-features", unit="seq", disable=not progress)
    for sh in todo:
        path = folder / f"{sh.folder.name}.npy"
        unfinished = folder / f"{sh.folder.name}.npy.partial"
        out = np.lib.format.open_memmap(unfinished, mode="w+", dtype=np.float32, shape=(len(sh.tokens), width))
        off = np.asarray(sh.offsets)
        lens = np.diff(off)
        order = np.argsort(lens, kind="stable")
        for i in range(0, len(order), batch_size):
            idx = order[i: i + batch_size]
            length = -(-int(lens[idx].max()) // 128) * 128
            tokens = np.zeros((batch_size, length), np.int32)  # a short last batch is padded with empty rows
            for r, j in enumerate(idx):
                tokens[r, : lens[j]] = sh.tokens[off[j]: off[j + 1]]
            f = np.asarray(taps(ck.params, tokens), np.float32)
            for r, j in enumerate(idx):
                out[off[j]: off[j + 1]] = f[r, : lens[j]]
            bar.update(len(idx))
        out.flush()
        del out
        os.replace(unfinished, path)
    bar.close()


# ----------------------------------------------------------------------------- making data

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
        text = path.read_text(encoding="utf-8")
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


def read_prompts(path: str | Path, fmt: str = "auto", limit: int | None = None) -> list[Prompt]:
    """User prompts of a prompt file, formatted as the reference benchmark does (shared/data README).

    Formats: ``gsm8k`` (``question`` + the step-by-step/boxed suffix), ``alpaca`` (``instruction``,
    then ``input`` if any), ``mbpp`` (``prompt``; task ids 11-510, the evaluation split, skipped),
    ``plain`` (the first of ``prompt``, ``question``, ``problem``, ``instruction``). ``auto`` picks
    by file name (gsm8k / alpaca / mbpp), else ``plain``.

    Raises:
      DataError: unreadable file, not JSONL / a JSON list, or a row without the needed text
        field (the message names the file and line).
    """
    path = Path(path)
    if fmt == "auto":
        name = path.name.lower()
        fmt = next((f for f in ("gsm8k", "alpaca", "mbpp") if f in name), "plain")
    out = []
    for n, row in read_rows(path):
        where = f"{path}:{n}"
        if not isinstance(row, dict):
            raise DataError(f"{where}: expected a JSON object")
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
            text = next((row[k] for k in ("prompt", "question", "problem", "instruction")
                         if isinstance(row.get(k), str) and row[k].strip()), None)
        if not isinstance(text, str) or not text.strip():
            raise DataError(f"{where}: no prompt text for format {fmt!r}")
        out.append(Prompt(text, where))
        if limit and len(out) >= limit:
            break
    return out


def loops(response: Sequence[int], n: int = 8, repeats: int = 3) -> bool:
    """True if some ``n``-gram occurs at least ``repeats`` times: a looping answer."""
    seen: dict[tuple, int] = {}
    for i in range(len(response) - n + 1):
        g = tuple(response[i: i + n])
        seen[g] = seen.get(g, 0) + 1
        if seen[g] >= repeats:
            return True
    return False


def regenerate(decoder, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, batch_size: int,
               stop_ids: Sequence[int] = (), progress: bool = True):
    """The target's own greedy responses to token-id ``prompts`` (SPEC "Training" 1).

    Returns:
      ``(sequences, loss_masks)``: prompt + response token ids, and True exactly on the response
      (the stop token, when produced, is part of the response).
    """
    from tqdm import tqdm

    order = np.argsort([len(p) for p in prompts], kind="stable")  # similar lengths share a batch
    seqs: list = [None] * len(prompts)
    bar = tqdm(total=len(prompts), desc="regenerate", unit="seq", disable=not progress, leave=False)
    for i in range(0, len(order), batch_size):
        idx = order[i: i + batch_size]
        results = decoder.generate([prompts[j] for j in idx], max_new_tokens, stop_ids)
        for j, r in zip(idx, results):
            seqs[j] = (list(prompts[j]), r.token_ids)
        bar.update(len(idx))
    bar.close()
    return [p + r for p, r in seqs], [[False] * len(p) + [True] * len(r) for p, r in seqs]


def prepare(ck, tokenizer, prompts: Sequence[Prompt], out: str | Path, *, max_new_tokens: int = 384,
            batch_size: int = 16, shard_size: int = 256, seed: int = 0, progress: bool = True) -> dict:
    """Regenerate responses with the target and write them as shards under ``out`` (resumable).

    The prompts are shuffled with ``seed`` and cut into shards of ``shard_size``; each shard is
    written atomically (``out/shard_00000`` ...), and a restart skips the shards already there
    (after checking them). ``out/meta.json`` indexes the shards and counts the answers that hit
    the cap or loop (``loops``), since looping answers inflate acceptance.

    Raises:
      DataError: a prompt too long for the target's context (named by file and line), a corrupt
        finished shard (named; the others are kept), or ``out`` prepared with other settings.
    """
    from tqdm import tqdm

    from dflash_jax.cli import encode, stop_ids
    from dflash_jax.decode import Decoder

    out = Path(out)
    ids = []
    for p in prompts:
        x = encode(tokenizer, p.text, chat=True)
        if len(x) + max_new_tokens > ck.cfg.max_position_embeddings:
            raise DataError(f"{p.where}: the prompt has {len(x)} tokens; with {max_new_tokens} new tokens it exceeds "
                            f"the target's context of {ck.cfg.max_position_embeddings}; shorten or drop it")
        ids.append(x)
    order = np.random.RandomState(seed).permutation(len(prompts))
    settings = {"max_new_tokens": max_new_tokens, "shard_size": shard_size, "seed": seed, "mode": "greedy",
                "chat": True, "num_prompts": len(prompts), "target": ck.identity,
                "prompts_sha256": hashlib.sha256("\n".join(p.text for p in prompts).encode()).hexdigest()}
    index_path = out / "meta.json"
    if index_path.exists():
        try:
            old = json.loads(index_path.read_text())
        except (OSError, json.JSONDecodeError, UnicodeDecodeError):
            raise DataError(f"{index_path} exists but is not a dflash-jax data index; choose another --out") from None
        if not isinstance(old, dict) or old.get("settings") != settings:
            raise DataError(f"{out} holds data prepared from other prompts or settings; choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("shard_*.partial-*"):  # left by a kill during a shard write
        import shutil

        shutil.rmtree(stale, ignore_errors=True)
    n_shards = -(-len(prompts) // shard_size)
    names = [f"shard_{k:05d}" for k in range(n_shards)]

    def write_index(done: list[str]) -> None:
        stats = {"sequences": 0, "tokens": 0, "hit_cap": 0, "looping": 0}
        for name in done:
            m = json.loads((out / name / "meta.json").read_text())
            for k in stats:
                stats[k] += m["stats"][k]
        meta = {"format": SHARDED_FORMAT, "format_version": 1, "shards": done, "complete": len(done) == n_shards,
                "settings": settings, "stats": stats, "tokenizer_sha256": ck.identity["tokenizer_sha256"],
                "num_sequences": stats["sequences"], "num_tokens": stats["tokens"],
                "source": sorted({p.where.rsplit(":", 1)[0] for p in prompts})}
        tmp = index_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(meta, indent=2))
        os.replace(tmp, index_path)

    decoder = Decoder(ck.params, ck.cfg)
    stops = stop_ids(tokenizer)
    done = []
    bar = tqdm(total=len(prompts), desc="prepare-data", unit="prompt", disable=not progress)
    for k, name in enumerate(names):
        idx = order[k * shard_size: (k + 1) * shard_size]
        if (out / name).exists():
            Shard(out / name)  # raises, naming the shard, if it is corrupt
        else:
            seqs, masks = regenerate(decoder, [ids[i] for i in idx], max_new_tokens=max_new_tokens,
                                     batch_size=batch_size, stop_ids=stops, progress=progress)
            responses = [s[len(ids[i]):] for s, i in zip(seqs, idx)]
            keep = [j for j, m in enumerate(masks) if sum(m) >= 2]  # a one-token answer holds no anchor
            if not keep:
                raise DataError(f"every answer of {name} has fewer than 2 tokens, so there is nothing to train on; "
                                "raise --max-new-tokens")
            stats = {"sequences": len(keep), "tokens": int(sum(len(seqs[j]) for j in keep)),
                     "hit_cap": sum(len(r) >= max_new_tokens and r[-1] not in stops for r in responses),
                     "looping": sum(loops(r) for r in responses), "dropped": len(seqs) - len(keep)}
            write_dataset(out / name, [seqs[j] for j in keep], [masks[j] for j in keep],
                          meta={"tokenizer_sha256": ck.identity["tokenizer_sha256"], "stats": stats,
                                "prompts": [prompts[idx[j]].where for j in keep]})
        done.append(name)
        write_index(done)
        bar.update(len(idx))
    bar.close()
    return json.loads(index_path.read_text())
