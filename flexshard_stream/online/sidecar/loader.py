"""What a data loader yields, made into a :class:`~flexshard_stream.stats.batch.Batch`, and the
loader wrapper that submits every item (:class:`AttachedLoader`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

import numpy as np

from ...stats.batch import Batch

__all__ = ["AttachedLoader", "batch_bytes", "copy_batch", "to_batch"]


def _np(x: Any) -> Any:
    """A numpy view of a CPU tensor / DLPack array (zero-copy), or ``x`` unchanged."""
    if x is None or isinstance(x, np.ndarray):
        return x
    if hasattr(x, "__dlpack__"):
        return np.from_dlpack(x)
    return np.asarray(x)


def to_batch(item: Any) -> Batch:
    """Convert what a data loader yields into a :class:`Batch`.

    Accepted: a ``Batch``; a TorchRec ``KeyedJaggedTensor`` (anything with ``keys()``,
    ``values()``, ``lengths()``), through :meth:`Batch.from_kjt` (zero-copy for int64 CPU
    tensors); an object with a ``sparse_features`` KJT (TorchRec's ``datasets.utils.Batch``); a
    mapping ``{feature: ids}`` (one ID per sample; torch tensors, numpy or lists) or
    ``{feature: (values, lengths)}``; a tuple or list holding one of these (the first found).
    Tensors must be on the CPU. Raises TypeError otherwise (pass ``convert=`` to
    :meth:`Sidecar.attach`).
    """
    if isinstance(item, Batch):
        return item
    if all(callable(getattr(item, a, None)) for a in ("keys", "values", "lengths")) \
            and not isinstance(item, Mapping):
        return Batch.from_kjt(item)
    sf = getattr(item, "sparse_features", None)
    if sf is not None:
        return to_batch(sf)
    if isinstance(item, Mapping) and item:
        if all(isinstance(v, tuple) and len(v) == 2 for v in item.values()):
            return Batch.from_features({k: _np(v[0]) for k, v in item.items()},
                                       {k: _np(v[1]) for k, v in item.items()})
        return Batch.from_features({k: np.ravel(_np(v)) for k, v in item.items()})
    if isinstance(item, (tuple, list)):
        for x in item:
            try:
                return to_batch(x)
            except TypeError:
                continue
    raise TypeError(f"cannot make a flexshard_stream Batch from a {type(item).__name__}: expected "
                    "a Batch, a KeyedJaggedTensor, {feature: ids}, or a tuple holding one; pass "
                    "convert= to Sidecar.attach for other layouts")


def batch_bytes(b: Batch) -> int:
    """Bytes a queued batch holds: values, lengths, weights and timestamps."""
    n = b.values.nbytes + b.lengths.nbytes
    if b.weights is not None:
        n += b.weights.nbytes
    if b.timestamp is not None:
        n += b.timestamp.nbytes
    return int(n)


def copy_batch(b: Batch) -> Batch:
    """A copy of ``b`` owning its arrays (for loaders that reuse their buffers)."""
    return Batch(b.keys, b.values.copy(), b.lengths.copy(),
                 None if b.weights is None else b.weights.copy(),
                 None if b.timestamp is None else b.timestamp.copy())


class SupportsSubmit(Protocol):
    """What :class:`AttachedLoader` feeds: a :class:`Sidecar` (anything with ``submit``)."""

    def submit(self, batch: Any) -> bool: ...


class AttachedLoader:
    """An iterable wrapping a data loader: yields its items unchanged, submitting each one to the
    sidecar first. ``len()`` and other attributes are the loader's."""

    def __init__(self, sidecar: SupportsSubmit, loader: Iterable[Any],
                 convert: Callable[[Any], Batch] | None = None):
        self.sidecar, self.loader, self.convert = sidecar, loader, convert or to_batch

    def __iter__(self) -> Iterator[Any]:
        for item in self.loader:
            self.sidecar.submit(self.convert(item))
            yield item

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)
