"""The input pipeline: dataset rows -> padded training rows, held-out splits, length buckets,
and the one path from host rows to global (sharded) batch arrays.

Training rows come from a grain ``MapDataset`` (shuffled per epoch with a seed, repeated); it is
random-access, so batch ``s`` is rows ``s*B .. s*B+B-1``, resuming at step ``s`` is exact, and each
host of a multi-host job reads only the rows its devices hold (``global_batch``).
``bucketed_batches`` (``train.length_buckets``) groups the same stream into batches of similar
length, each padded to its length bucket.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import grain
import jax
import numpy as np

from dflash_jax.data import Dataset, FeatureStore
from dflash_jax.errors import DataError


class PaddedSource:
    """grain source: sequence ``indices[i]`` of a dataset (``data.open_data``), cut/padded to ``max_len``:
    ``{"tokens": int32 [max_len], "loss_mask": bool [max_len]}``, plus ``"features"`` float32
    ``[max_len, F]`` (zeros past the sequence) when a ``FeatureStore`` is given."""

    def __init__(
        self, ds: Dataset, indices: np.ndarray, max_len: int, pad_id: int = 0, features: FeatureStore | None = None
    ):
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


def repeat_parts(indices: np.ndarray, starts: Sequence[int], repeats: Sequence[int]) -> np.ndarray:
    """``indices`` (int, sequences of a dataset whose part ``k`` holds sequences ``starts[k] ..
    starts[k+1] - 1``) with each part's indices written ``repeats[k]`` times, in order: the training
    indices of an epoch where part ``k`` counts ``repeats[k]`` times (``TrainConfig.data_repeats``).
    ``starts``: ``len(repeats) + 1`` increasing offsets, the last the dataset's size.

    Raises:
      ValueError: ``starts`` and ``repeats`` of mismatched lengths, or a repeat below 1.
    """
    if len(starts) != len(repeats) + 1 or any(r < 1 for r in repeats):
        raise ValueError(f"repeat_parts: {len(repeats)} repeats (each >= 1) need {len(repeats) + 1} starts")
    indices = np.asarray(indices)
    parts = [indices[(indices >= a) & (indices < b)] for a, b in zip(starts[:-1], starts[1:])]
    return np.concatenate([np.tile(p, r) for p, r in zip(parts, repeats)])


def rows(
    ds: Dataset,
    indices: np.ndarray,
    *,
    max_len: int,
    seed: int,
    pad_id: int = 0,
    features: FeatureStore | None = None,
):
    """Random-access grain dataset of training rows, reshuffled every epoch and repeated forever:
    ``[j]`` -> ``{"tokens", "loss_mask"}`` ``[max_len]`` (and ``"features"`` with a ``FeatureStore``,
    see ``PaddedSource``). Batch ``s`` of size ``B`` is rows ``s*B .. s*B+B-1``, so a restart at
    step ``s`` is exact and each process reads just its rows."""
    src = PaddedSource(ds, indices, max_len, pad_id, features)
    return grain.MapDataset.source(src).shuffle(seed=seed).repeat(None)


BUCKET_WINDOW = 16  # batches regrouped together (part of a bucketed run's identity)


def bucket_lengths(buckets: Sequence[int], max_len: int) -> tuple[int, ...]:
    """The padded lengths a bucketed batch may take: ``buckets`` with ``max_len`` always last.

    Raises:
      ValueError: ``buckets`` not a tuple/list of increasing positive integers, or one above ``max_len``.
    """
    ok_type = isinstance(buckets, (tuple, list)) and all(
        isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in buckets
    )
    b = [int(x) for x in buckets] if ok_type else []
    if not b or any(x <= 0 for x in b) or b != sorted(set(b)) or b[-1] > max_len:
        raise ValueError(
            f"length buckets {buckets!r} must be a tuple/list of increasing positive integers <= max_len ({max_len})"
        )
    return tuple(b if b[-1] == max_len else [*b, max_len])


def bucketed_batches(
    ds: Dataset,
    indices: np.ndarray,
    *,
    batch_size: int,
    max_len: int,
    buckets: Sequence[int],
    seed: int,
    window: int = BUCKET_WINDOW,
    pad_id: int = 0,
    features: FeatureStore | None = None,
):
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
        mine = pos[k * batch_size : (k + 1) * batch_size]
        length = int(b[bucket_of[mine].max()])
        rows = [src[int(p)] for p in mine]
        return {key: np.stack([r[key][:length] for r in rows]) for key in rows[0]}

    return grain.MapDataset.range(0, 2**62).map(batch)


def global_batch(
    row: Callable[[int], dict], shape: tuple[int, int, int], shardings: dict, feature_width: int | None = None
) -> dict:
    """Rows ``row(0) .. row(accum * micro - 1)`` as global arrays ``[accum, micro, T, ...]``.

    The one path from host rows to device batches, for training and validation alike. Row ``j``
    goes to ``[j // micro, j % micro]``; ``row(j)`` is a dict of arrays ``[T, ...]`` (``tokens``,
    ``loss_mask``, optionally ``features``); ``shardings`` (``sharding.batch_shardings``) says how
    each key is split; ``feature_width`` is ``F`` of ``features [.., T, F]``. Each process calls
    ``row`` only for the rows its own devices hold (per-host data loading), each row at most once.
    """
    accum, micro, length = shape
    cache: dict[int, dict] = {}

    def get(j: int) -> dict:
        if j not in cache:
            cache[j] = row(j)
        return cache[j]

    def fetch(key: str):
        full = (accum, micro, length) + ((feature_width,) if key == "features" else ())

        def block(index):
            a_idx, r_idx = range(accum)[index[0]], range(micro)[index[1]]
            return np.stack([np.stack([get(a * micro + r)[key][index[2:]] for r in r_idx]) for a in a_idx])

        return jax.make_array_from_callback(full, shardings[key], block)

    return {key: fetch(key) for key in shardings}
