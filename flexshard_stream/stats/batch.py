"""The one batch type: TorchRec's KeyedJaggedTensor layout as plain numpy arrays.

Layout (key-major, as in ``torchrec.sparse.jagged_tensor.KeyedJaggedTensor``)::

    keys     = ("f0", "f1")                 # one feature = one embedding table
    lengths  = [l(f0,s0), l(f0,s1), ..., l(f1,s0), l(f1,s1), ...]    # len(keys) * batch_size
    values   = [ids of f0 for s0, s1, ..., ids of f1 for s0, s1, ...]  # sum(lengths) int64 IDs
    weights  = optional, one float per value (pooling weights; statistics count lookups, not weights)
    timestamp= optional: one float (seconds) for the batch, or one per sample

Every key has the same number of samples (TorchRec's layout without a variable batch per feature):
one ``B`` for the whole batch, which the cost model and the statistics rely on. A
``KeyedJaggedTensor`` with a variable batch per feature is refused by :meth:`Batch.from_kjt`, which
names each feature's batch size; take the features of one batch size at a time (``keys=``).

:class:`Batch` only checks the *shape* of the layout on construction: one vectorized pass over the
lengths (which also gives each key's offset into the values, kept) and one reduction over the
weights when given. Checks against
a table configuration (IDs in range, configured keys) are done by :func:`validate_batch` in
:mod:`flexshard_stream.stats.stream`, before any state changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

from ..errors import BatchError
from ..kernels.batchcheck import NEGATIVE, OK, TOO_LARGE, check_lengths

__all__ = ["Batch", "slice_batch", "concat_batches", "rebatch"]


def _as_id_array(values: Any, field: str = "values") -> np.ndarray:
    arr = np.asarray(values)
    if arr.dtype == object or arr.dtype.kind not in "iu":
        if arr.size == 0 and arr.dtype.kind == "f":
            return np.zeros(0, dtype=np.int64)
        raise BatchError(f"IDs must be integers (int64, or int32 widened); got dtype {arr.dtype}",
                         field=field)
    if arr.ndim != 1:
        raise BatchError(f"expected a 1-D array, got shape {arr.shape}", field=field)
    if arr.dtype == np.uint64:
        if arr.size and int(arr.max()) > np.iinfo(np.int64).max:
            pos = int(np.argmax(arr > np.iinfo(np.int64).max))
            raise BatchError("ID does not fit in int64", field=field, position=pos)
    return _int64(arr)


def _as_lengths(lengths: Any) -> np.ndarray:
    arr = np.asarray(lengths)
    if arr.dtype == object or arr.dtype.kind not in "iu":
        if arr.size == 0 and arr.dtype.kind == "f":   # np.asarray([]) of an empty batch
            return np.zeros(0, dtype=np.int64)
        raise BatchError(f"lengths must be integers; got dtype {arr.dtype}", field="lengths")
    if arr.ndim != 1:
        raise BatchError(f"expected a 1-D array, got shape {arr.shape}", field="lengths")
    if arr.dtype == np.uint64 and arr.size and int(arr.max()) > np.iinfo(np.int64).max:
        pos = int(np.argmax(arr > np.iinfo(np.int64).max))
        raise BatchError(f"length {int(arr[pos])} does not fit in int64", field="lengths",
                         position=pos)
    return _int64(arr)


def _int64(arr: np.ndarray) -> np.ndarray:
    """An integer vector as contiguous int64: itself when it is one, a view of uint64 values
    already checked to fit, else one copy (int32 and the like widened)."""
    if arr.dtype == np.uint64:
        arr = arr.view(np.int64)
    elif arr.dtype != np.int64:
        return arr.astype(np.int64)             # a new array, contiguous
    return np.ascontiguousarray(arr)


def _checked_keys(keys: Sequence[str]) -> tuple[str, ...]:
    """``keys`` as a tuple of distinct non-empty strings (BatchError otherwise)."""
    keys = tuple(keys)
    for k in keys:
        if not isinstance(k, str) or not k:
            raise BatchError(f"keys must be non-empty strings, got {k!r}", field="keys")
    if len(set(keys)) != len(keys):
        dup = next(k for k in keys if keys.count(k) > 1)
        raise BatchError("duplicate key", feature=dup, field="keys")
    return keys


def _key_offsets(keys: tuple[str, ...], lens: np.ndarray, num_values: int) -> np.ndarray:
    """Where each key's IDs start in ``values`` (``len(keys) + 1`` int64, read-only), after
    checking ``lens`` in one pass (:func:`~flexshard_stream.kernels.batchcheck.check_lengths`):
    a multiple of the keys, none negative, none above ``num_values``, summing to it."""
    nk = len(keys)
    offsets = np.zeros(nk + 1, dtype=np.int64)
    if nk == 0:
        if num_values or lens.size:
            raise BatchError("values or lengths given without keys", field="keys")
    elif lens.size % nk:
        raise BatchError(f"{lens.size} lengths is not a multiple of {nk} keys", field="lengths")
    else:
        code, _ = check_lengths(lens, nk, num_values, offsets)
        if code != OK:
            _raise_lengths(keys, lens, num_values, code)
    offsets.flags.writeable = False
    return offsets


def _raise_lengths(keys: tuple[str, ...], lens: np.ndarray, num_values: int, code: int) -> None:
    """The BatchError for lengths that ``check_lengths`` refused (``code``), naming the first
    offending position (the error path: found here, not in the kernel)."""
    bs = lens.size // len(keys)
    if code == NEGATIVE:
        p = int(np.flatnonzero(lens < 0)[0])
        raise BatchError(f"negative length {int(lens[p])} (sample {p % bs}); expected >= 0",
                         feature=keys[p // bs], field="lengths", position=p)
    if code == TOO_LARGE:
        p = int(np.argmax(lens))
        raise BatchError(f"length {int(lens[p])} (sample {p % bs}) exceeds the {num_values} "
                         f"values of the whole batch", feature=keys[p // bs], field="lengths",
                         position=p)
    total = int(lens.sum(dtype=object))   # exact: each length <= num_values, but many of them
    raise BatchError(f"lengths sum to {total} but there are {num_values} values", field="lengths")


def _checked_weights(weights: Any, keys: tuple[str, ...], vals: np.ndarray,
                     offsets: np.ndarray) -> np.ndarray:
    """``weights`` as contiguous float32, one per value, none NaN or negative (one reduction:
    ``min`` propagates NaN; the position is found only on error)."""
    w = np.asarray(weights)
    if w.dtype.kind not in "fiu":
        raise BatchError(f"weights must be numeric, got dtype {w.dtype}", field="weights")
    w = np.ascontiguousarray(w, dtype=np.float32)
    if w.shape != vals.shape:
        raise BatchError(f"{w.size} weights for {vals.size} values", field="weights")
    if w.size and not w.min() >= 0:
        p = int(np.flatnonzero(~(w >= 0))[0])  # catches NaN and negatives
        feat = keys[int(np.searchsorted(offsets, p, side="right")) - 1]
        raise BatchError(f"weight {w[p]} is NaN or negative; expected >= 0",
                         feature=feat, field="weights", position=p)
    return w


def _checked_timestamp(timestamp: Any, keys: tuple[str, ...], lens: np.ndarray) -> np.ndarray:
    """``timestamp`` as float64 seconds, one or one per sample, every one finite."""
    ts = np.atleast_1d(np.asarray(timestamp, dtype=np.float64))
    bs = lens.size // len(keys) if keys else 0
    if ts.ndim != 1 or (ts.size != 1 and ts.size != bs):
        raise BatchError(f"timestamp must be one value or one per sample ({bs}); "
                         f"got {ts.size}", field="timestamp")
    if ts.size and not (np.isfinite(ts.min()) and np.isfinite(ts.max())):  # NaN propagates
        p = int(np.flatnonzero(~np.isfinite(ts))[0])
        raise BatchError(f"timestamp {float(ts[p])!r} is not a finite number of "
                         f"seconds", field="timestamp", position=p)
    return ts


@dataclass(frozen=True, eq=False)
class Batch:
    """A batch of embedding-ID lookups in KeyedJaggedTensor layout.

    Attributes
    ----------
    keys : tuple of str
        Feature names, one embedding table each.
    values : ndarray of int64, shape (sum(lengths),)
        Row IDs, key-major.
    lengths : ndarray of int64, shape (len(keys) * batch_size,)
        IDs per (key, sample), key-major.
    weights : ndarray of float32 or None, shape like ``values``
    timestamp : ndarray of float64 or None, shape (1,) or (batch_size,), seconds.
    """

    keys: tuple[str, ...]
    values: np.ndarray
    lengths: np.ndarray
    weights: np.ndarray | None = None
    timestamp: np.ndarray | None = None

    def __init__(self, keys: Sequence[str], values: Any, lengths: Any, weights: Any = None,
                 timestamp: Any = None):
        keys = _checked_keys(keys)
        vals = _as_id_array(values)
        lens = _as_lengths(lengths)
        offsets = _key_offsets(keys, lens, vals.size)
        w = None if weights is None else _checked_weights(weights, keys, vals, offsets)
        ts = None if timestamp is None else _checked_timestamp(timestamp, keys, lens)
        object.__setattr__(self, "keys", keys)
        object.__setattr__(self, "values", vals)
        object.__setattr__(self, "lengths", lens)
        object.__setattr__(self, "weights", w)
        object.__setattr__(self, "timestamp", ts)
        object.__setattr__(self, "_offsets", offsets)

    # ----------------------------------------------------------------- views
    @property
    def batch_size(self) -> int:
        """Samples in the batch."""
        return self.lengths.size // len(self.keys) if self.keys else 0

    @property
    def num_values(self) -> int:
        """IDs in the batch, all features."""
        return int(self.values.size)

    def key_offsets(self) -> np.ndarray:
        """Offsets into ``values`` where each key's IDs start; length ``len(keys) + 1`` (int64,
        read-only: computed once, when the batch was built)."""
        return self._offsets  # type: ignore[attr-defined]

    def feature_values(self, key: str) -> np.ndarray:
        """The IDs of one feature (a view, no copy)."""
        i = self.keys.index(key)
        off = self._offsets  # type: ignore[attr-defined]
        return self.values[off[i]:off[i + 1]]

    def feature_lengths(self, key: str) -> np.ndarray:
        """Per-sample lengths of one feature (a view)."""
        i = self.keys.index(key)
        bs = self.batch_size
        return self.lengths[i * bs:(i + 1) * bs]

    def __len__(self) -> int:
        return self.batch_size

    def __repr__(self) -> str:
        return (f"Batch(keys={list(self.keys)}, batch_size={self.batch_size}, "
                f"values={self.num_values}, weights={'yes' if self.weights is not None else 'no'})")

    # ----------------------------------------------------------- constructors
    @classmethod
    def from_features(cls, features: Mapping[str, Any], lengths: Mapping[str, Any] | None = None,
                      timestamp: Any = None) -> "Batch":
        """Build from ``{name: ids}`` (one ID per sample) or ``{name: list of id arrays}``.

        With ``lengths`` given, ``features[name]`` is the flat ID array and ``lengths[name]`` its
        per-sample lengths.
        """
        keys = list(features)
        vals, lens = [], []
        for k in keys:
            if lengths is not None:
                v = _as_id_array(features[k], field=f"values[{k}]")
                l = _as_lengths(lengths[k])
            else:
                f = features[k]
                if isinstance(f, np.ndarray) and f.ndim == 1 and f.dtype != object:
                    v = _as_id_array(f, field=f"values[{k}]")
                    l = np.ones(v.size, dtype=np.int64)
                else:
                    parts = [_as_id_array(np.atleast_1d(np.asarray(x)), field=f"values[{k}]")
                             for x in f]
                    l = np.array([p.size for p in parts], dtype=np.int64)
                    v = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
            vals.append(v)
            lens.append(l)
        sizes = {l.size for l in lens}
        if len(sizes) > 1:
            raise BatchError(f"features have different sample counts {sorted(sizes)}",
                             field="lengths")
        return cls(keys, np.concatenate(vals) if vals else np.zeros(0, np.int64),
                   np.concatenate(lens) if lens else np.zeros(0, np.int64), timestamp=timestamp)

    @classmethod
    def from_dlpack(cls, keys: Sequence[str], values: Any, lengths: Any, weights: Any = None,
                    timestamp: Any = None) -> "Batch":
        """Build from DLPack-capable arrays (torch tensors, cupy on host, numpy ...), zero-copy.

        int64 CPU tensors are viewed, not copied; int32 IDs are widened (one copy).
        """
        def view(x: Any) -> Any:
            if x is None or isinstance(x, np.ndarray):
                return x
            if hasattr(x, "__dlpack__"):
                return np.from_dlpack(x)
            return x
        return cls(keys, view(values), view(lengths), view(weights), timestamp)

    @classmethod
    def from_kjt(cls, kjt: Any, timestamp: Any = None,
                 keys: Sequence[str] | None = None) -> "Batch":
        """Build from a ``torchrec.KeyedJaggedTensor`` (or anything with ``keys()``, ``values()``,
        ``lengths()``, optionally ``weights_or_none()`` and ``stride_per_key()``) through DLPack.

        Zero-copy where the dtype allows: int64 values and lengths and float32 weights of CPU
        tensors are viewed, not copied (the Batch's arrays share the KJT's memory); int32 values or
        lengths are widened to int64 (one copy). A KJT built from offsets computes its lengths
        (TorchRec's copy).

        Parameters
        ----------
        kjt : KeyedJaggedTensor
            On the CPU (submit before ``kjt.to(device)``).
        timestamp : optional
            As in :class:`Batch`.
        keys : sequence of str, optional
            Only these features, in this order (views when they are adjacent in the KJT).

        Raises
        ------
        BatchError
            Tensors not on the CPU; unknown keys; features with different batch sizes (a KJT
            with a variable batch per feature): a Batch has one batch size for all its features
            (TorchRec's non-variable layout, and the ``B`` of every cost), so the error names
            each feature's batch size and asks for the features of one batch size at a time,
            ``Batch.from_kjt(kjt, keys=[...])``.
        """
        all_keys = [str(k) for k in kjt.keys()]
        values = _host_array(kjt.values(), "values")
        lengths = _host_array(kjt.lengths(), "lengths")
        w = kjt.weights_or_none() if hasattr(kjt, "weights_or_none") else None
        weights = None if w is None else _host_array(w, "weights")
        strides = _kjt_strides(kjt, all_keys, lengths.size)
        keys = list(all_keys if keys is None else keys)
        missing = [k for k in keys if k not in all_keys]
        if missing:
            raise BatchError(f"keys {missing} are not in the KeyedJaggedTensor (keys "
                             f"{all_keys})", field="keys")
        idx = [all_keys.index(k) for k in keys]
        if len({strides[i] for i in idx}) > 1:
            sizes = ", ".join(f"{all_keys[i]}: {strides[i]}" for i in idx)
            raise BatchError(f"the KeyedJaggedTensor has a variable batch size per feature "
                             f"({sizes} samples); a Batch has one batch size for all its "
                             f"features: convert the features of each batch size separately, "
                             f"Batch.from_kjt(kjt, keys=[...])", field="lengths")
        if sum(strides) != lengths.size:
            raise BatchError(f"{lengths.size} lengths for batch sizes {strides} of keys "
                             f"{all_keys}", field="lengths")
        if idx == list(range(len(all_keys))):     # the whole KJT: its arrays as they are
            return cls(keys, values, lengths, weights, timestamp)
        return cls(keys, *_kjt_subset(idx, strides, values, lengths, weights), timestamp)

    @classmethod
    def empty(cls, keys: Iterable[str] = ()) -> "Batch":
        """A batch with no samples."""
        return cls(tuple(keys), np.zeros(0, np.int64), np.zeros(0, np.int64))


def _host_array(x: Any, field: str) -> Any:
    """A tensor's CPU memory as a numpy array (DLPack, no copy); a BatchError for another
    device. numpy arrays and lists pass through."""
    device = getattr(x, "device", None)
    kind = getattr(device, "type", "cpu")
    if kind != "cpu":
        raise BatchError(f"KeyedJaggedTensor {field} are on {device}; give the CPU tensors "
                         f"(convert before kjt.to(device))", field=field)
    if hasattr(x, "detach"):
        x = x.detach()
    if hasattr(x, "__dlpack__") and not isinstance(x, np.ndarray):
        return np.from_dlpack(x)
    return np.asarray(x)


def _kjt_subset(idx: list[int], strides: list[int], values: np.ndarray, lengths: np.ndarray,
                weights: np.ndarray | None) -> tuple[Any, Any, Any]:
    """The values, lengths and weights of the KJT's keys ``idx`` (in that order): views when
    they are adjacent in the KJT, else one copy."""
    len_off = np.concatenate([[0], np.cumsum(strides)]).astype(np.int64)
    per_key = np.add.reduceat(lengths, len_off[:-1], dtype=np.int64) if lengths.size else \
        np.zeros(len(strides), np.int64)
    per_key = np.where(np.diff(len_off) > 0, per_key, 0)
    val_off = np.concatenate([[0], np.cumsum(per_key)]).astype(np.int64)

    def pick(arr: Any, off: np.ndarray) -> Any:
        if arr is None:
            return arr
        if idx and idx == list(range(idx[0], idx[-1] + 1)):     # adjacent: a view
            return arr[off[idx[0]]:off[idx[-1] + 1]]
        return np.concatenate([arr[off[i]:off[i + 1]] for i in idx]) if idx else arr[:0]
    return pick(values, val_off), pick(lengths, len_off), pick(weights, val_off)


def _kjt_strides(kjt: Any, keys: Sequence[str], num_lengths: int) -> list[int]:
    """Samples of each key of a KJT: ``stride_per_key()`` where the object has it, else equal
    batch sizes (a BatchError if the lengths do not split evenly)."""
    if hasattr(kjt, "stride_per_key"):
        return [int(s) for s in kjt.stride_per_key()]
    if keys and num_lengths % len(keys):
        raise BatchError(f"{num_lengths} lengths is not a multiple of {len(keys)} keys",
                         field="lengths")
    return [num_lengths // len(keys) if keys else 0] * len(keys)


def slice_batch(batch: Batch, start: int, stop: int) -> Batch:
    """Samples ``[start, stop)`` of ``batch`` as a new Batch (values copied, vectorized)."""
    bs = batch.batch_size
    start, stop = max(0, start), min(bs, stop)
    nk = len(batch.keys)
    if nk == 0:
        return batch
    lens = batch.lengths.reshape(nk, bs)
    offs = batch.key_offsets()
    cum = np.concatenate([np.zeros((nk, 1), np.int64), np.cumsum(lens, axis=1)], axis=1)
    vals, wts = [], []
    for i in range(nk):
        a, b = offs[i] + cum[i, start], offs[i] + cum[i, stop]
        vals.append(batch.values[a:b])
        if batch.weights is not None:
            wts.append(batch.weights[a:b])
    ts = batch.timestamp
    if ts is not None and ts.size > 1:
        ts = ts[start:stop]
    return Batch(batch.keys, np.concatenate(vals), lens[:, start:stop].ravel(),
                 np.concatenate(wts) if wts else None, ts)


def concat_batches(batches: Sequence[Batch]) -> Batch:
    """Samples of several batches with the same keys, in order, as one Batch."""
    batches = [b for b in batches if b.batch_size]
    if not batches:
        raise BatchError("nothing to concatenate")
    keys = batches[0].keys
    for b in batches[1:]:
        if b.keys != keys:
            raise BatchError(f"cannot concatenate batches with keys {list(b.keys)} and "
                             f"{list(keys)}", field="keys")
    if len(batches) == 1:
        return batches[0]
    nk = len(keys)
    vals, lens, wts, tss = [], [], [], []
    for i in range(nk):
        for b in batches:
            o = b.key_offsets()
            vals.append(b.values[o[i]:o[i + 1]])
            lens.append(b.lengths[i * b.batch_size:(i + 1) * b.batch_size])
            if b.weights is not None:
                wts.append(b.weights[o[i]:o[i + 1]])
    has_w = all(b.weights is not None for b in batches)
    has_ts = all(b.timestamp is not None for b in batches)
    if has_ts:
        tss = [np.broadcast_to(b.timestamp, (b.batch_size,)) if b.timestamp.size == 1
               else b.timestamp for b in batches]
    return Batch(keys, np.concatenate(vals), np.concatenate(lens),
                 np.concatenate(wts) if has_w else None,
                 np.concatenate(tss) if has_ts else None)


def rebatch(batches: Iterable[Batch], size: int, *, drop_last: bool = False) -> Iterator[Batch]:
    """Re-cut a stream of batches into batches of exactly ``size`` samples (the last may be
    shorter unless ``drop_last``)."""
    if size <= 0:
        raise BatchError(f"batch size must be > 0, got {size}")
    pending: list[Batch] = []
    have = 0
    for b in batches:
        if b.batch_size == 0:
            continue
        if not pending and b.batch_size == size:
            yield b  # already the right size: no copy
            continue
        pending.append(b)
        have += b.batch_size
        if have < size:
            continue
        whole = concat_batches(pending)
        start = 0
        while whole.batch_size - start >= size:
            yield slice_batch(whole, start, start + size)
            start += size
        pending = [slice_batch(whole, start, whole.batch_size)] if start < whole.batch_size else []
        have = whole.batch_size - start
    if pending and not drop_last:
        yield concat_batches(pending)
