"""Loaders for the real public data sets in ``../shared/data`` (see its README.md).

The folder is found from the environment variable ``FLEXSHARD_SHARED_DATA``, else as
``<repo root>/../shared/data`` next to the package, else ``../shared/data`` or ``shared/data`` from
the working directory. The files are never copied into the project.

Data sets
---------
- MovieLens latest-small: 100,836 ratings of 9,724 movies by 610 users, unix seconds, 1996-2018.
- Amazon review sequences (5-core): ``Beauty``, ``Sports_and_Outdoors``, ``Toys_and_Games``; one line
  per user ``user item item ...`` in interaction order (198,502 / 296,337 / 167,597 events).
- Criteo 1k: the first 1,000 rows of the Criteo display-ads training set: TSV, label, I1..I13,
  C1..C26 (8-hex-digit hashes, often empty; short rows are padded to 40 fields).

All parsing is vectorized (polars); nothing is loaded row by row in Python.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa

from ..errors import FlexShardError, FormatError

__all__ = ["DatasetNotFoundError", "shared_data_dir", "movielens_ratings", "movielens_stream",
           "amazon_sequences", "amazon_stream", "AMAZON_NAMES", "criteo_frame",
           "criteo_categorical", "criteo_stream", "CRITEO_CATEGORICAL", "DATASET_LOGS",
           "write_dataset_log"]

ENV_VAR = "FLEXSHARD_SHARED_DATA"
AMAZON_NAMES: tuple[str, ...] = ("Beauty", "Sports_and_Outdoors", "Toys_and_Games")
CRITEO_INTEGER: tuple[str, ...] = tuple(f"I{i}" for i in range(1, 14))
CRITEO_CATEGORICAL: tuple[str, ...] = tuple(f"C{i}" for i in range(1, 27))
_CRITEO_FIELDS = 40
#: Names accepted by :func:`write_dataset_log`.
DATASET_LOGS: tuple[str, ...] = ("movielens", "amazon-beauty", "amazon-sports", "amazon-toys",
                                 "criteo")


class DatasetNotFoundError(FlexShardError, FileNotFoundError):
    """The shared data folder or one of its files is absent."""


def shared_data_dir() -> Path:
    """The shared data folder.

    Returns
    -------
    Path

    Raises
    ------
    DatasetNotFoundError
        ``FLEXSHARD_SHARED_DATA`` names a missing folder, or no default location exists.
    """
    env = os.environ.get(ENV_VAR)
    if env:
        p = Path(env).expanduser()
        if not p.is_dir():
            raise DatasetNotFoundError(f"{ENV_VAR}={env!r} is not a directory; point it at the "
                                       f"shared data folder (the one holding movielens-latest-small/)")
        return p
    candidates = [Path(__file__).resolve().parents[1].parent / "shared" / "data",
                  Path.cwd().parent / "shared" / "data", Path.cwd() / "shared" / "data"]
    for c in candidates:
        if c.is_dir():
            return c.resolve()
    raise DatasetNotFoundError(f"shared data folder not found (looked in "
                               f"{[str(c) for c in candidates]}); set {ENV_VAR} to its path")


def _file(path: str | os.PathLike[str] | None, default: str) -> Path:
    p = Path(path) if path is not None else shared_data_dir() / default
    if p.is_dir():
        p = p / Path(default).name
    if not p.is_file():
        raise DatasetNotFoundError(f"{p}: data file not found")
    return p


def _lines(path: Path) -> pl.Series:
    """The lines of a text file as a string Series (no quoting, no splitting)."""
    df = pl.read_csv(path, has_header=False, separator="\x1f", quote_char=None,
                     schema={"line": pl.String})
    return df.get_column("line").str.strip_chars_end("\r")


# ----------------------------------------------------------------------------- MovieLens
def movielens_ratings(path: str | os.PathLike[str] | None = None) -> pl.DataFrame:
    """MovieLens ratings in time order.

    Parameters
    ----------
    path : path, optional
        ``ratings.csv`` or its folder; default ``movielens-latest-small/ratings.csv``.

    Returns
    -------
    polars.DataFrame
        Columns ``ts`` (float64, unix seconds), ``user`` (int64), ``movie`` (int64); sorted by
        ``ts`` (stable: ties keep file order). 100,836 rows for latest-small.
    """
    p = _file(path, "movielens-latest-small/ratings.csv")
    try:
        df = pl.read_csv(p, schema_overrides={"userId": pl.Int64, "movieId": pl.Int64,
                                              "timestamp": pl.Int64})
    except pl.exceptions.PolarsError as e:
        raise FormatError(f"{p}: not a MovieLens ratings.csv ({e})") from None
    need = {"userId", "movieId", "timestamp"}
    if not need <= set(df.columns):
        raise FormatError(f"{p}: expected columns {sorted(need)}, found {df.columns}")
    return (df.select(pl.col("timestamp").cast(pl.Float64).alias("ts"),
                      pl.col("userId").alias("user"), pl.col("movieId").alias("movie"))
            .sort("ts", maintain_order=True))


def movielens_stream(path: str | os.PathLike[str] | None = None) -> np.ndarray:
    """Movie IDs of the MovieLens ratings in time order (int64, one per rating)."""
    return movielens_ratings(path).get_column("movie").to_numpy()


# ----------------------------------------------------------------------------- Amazon
def _amazon_name(name: str) -> str:
    key = name.lower().replace(" ", "_").removeprefix("amazon-").removeprefix("amazon:")
    for full in AMAZON_NAMES:
        if key in (full.lower(), full.lower().split("_")[0]):
            return full
    raise ValueError(f"unknown Amazon data set {name!r}; expected one of {AMAZON_NAMES} "
                     f"(or Sports, Toys)")


def amazon_sequences(name: str = "Beauty", path: str | os.PathLike[str] | None = None
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Amazon review histories as one sequence sample per user.

    Parameters
    ----------
    name : str
        ``"Beauty"``, ``"Sports_and_Outdoors"`` (or ``"Sports"``), ``"Toys_and_Games"`` (``"Toys"``).
    path : path, optional
        The ``.txt`` file; default ``amazon-reviews-sequences/<name>.txt``.

    Returns
    -------
    values : ndarray of int64
        Item IDs, user after user, each user's items in interaction order.
    lengths : ndarray of int64
        Items per user (one sample per line, in file order).
    """
    full = _amazon_name(name)
    p = _file(path, f"amazon-reviews-sequences/{full}.txt")
    toks = _lines(p).str.extract_all(r"\S+")
    toks = toks.filter(toks.list.len() > 0)                 # blank lines
    short = (toks.list.len() < 2).arg_true()
    if short.len():
        raise FormatError(f"{p}: line {int(short[0]) + 1}: expected 'user item [item ...]'")
    try:
        items = toks.list.slice(1).list.eval(pl.element().cast(pl.Int64, strict=True))
    except pl.exceptions.PolarsError as e:
        raise FormatError(f"{p}: item IDs must be integers ({e})") from None
    lengths = items.list.len().cast(pl.Int64).to_numpy()
    values = items.explode().to_numpy().astype(np.int64, copy=False)
    return values, lengths


def amazon_stream(name: str = "Beauty", path: str | os.PathLike[str] | None = None) -> np.ndarray:
    """All item IDs of an Amazon data set, user after user (int64)."""
    return amazon_sequences(name, path)[0]


# ----------------------------------------------------------------------------- Criteo
def criteo_frame(path: str | os.PathLike[str] | None = None) -> pl.DataFrame:
    """The Criteo TSV as a frame, short rows padded to 40 fields.

    Returns
    -------
    polars.DataFrame
        ``label`` and ``I1..I13`` (int64, null if empty), ``C1..C26`` (int64 parsed from the
        8-hex-digit hashes, null if empty), one row per line in file (time) order.
    """
    p = _file(path, "criteo-1k/train.txt")
    fields = _lines(p).str.split("\t")
    long = (fields.list.len() > _CRITEO_FIELDS).arg_true()
    if long.len():
        raise FormatError(f"{p}: line {int(long[0]) + 1} has more than {_CRITEO_FIELDS} fields")
    names = ("label",) + CRITEO_INTEGER + CRITEO_CATEGORICAL
    frame = pl.DataFrame({"f": fields})
    cols = []
    for i, n in enumerate(names):
        f = pl.col("f").list.get(i, null_on_oob=True)
        f = pl.when(f.str.len_bytes() > 0).then(f)
        cols.append((f.str.to_integer(base=16, strict=True) if i > 13
                     else f.cast(pl.Int64, strict=True)).alias(n))
    try:
        return frame.select(cols)
    except pl.exceptions.PolarsError as e:
        raise FormatError(f"{p}: not a Criteo TSV (label, 13 integers, 26 hex hashes): {e}") \
            from None


def criteo_categorical(path: str | os.PathLike[str] | None = None) -> dict[str, np.ndarray]:
    """The 26 categorical Criteo fields as int64 IDs (the 32-bit hash values).

    Returns
    -------
    dict of str to ndarray of int64
        ``C1..C26``: the values present in that field, in row order (missing values skipped, so
        the arrays have different lengths).
    """
    df = criteo_frame(path)
    return {c: df.get_column(c).drop_nulls().to_numpy().astype(np.int64, copy=False)
            for c in CRITEO_CATEGORICAL}


def criteo_stream(path: str | os.PathLike[str] | None = None) -> np.ndarray:
    """Pooled categorical IDs, row after row and field after field, distinct per field.

    Returns
    -------
    ndarray of int64
        ``(field_index << 32) | hash`` with ``field_index`` 0..25 for C1..C26 (hashes are 32-bit),
        missing values skipped.
    """
    df = criteo_frame(path)
    ids = pl.concat_list([(pl.lit(j, pl.Int64) * (1 << 32) + pl.col(c)).alias(c)
                          for j, c in enumerate(CRITEO_CATEGORICAL)])
    return (df.select(ids.alias("ids")).get_column("ids").explode().drop_nulls()
            .to_numpy().astype(np.int64, copy=False))


# ----------------------------------------------------------------------------- logs
def _dataset_frame(name: str) -> pl.DataFrame:
    key = name.lower()
    if key == "movielens":
        return movielens_ratings().select("ts", "movie", "user")
    if key == "amazon" or key.startswith(("amazon-", "amazon:")):
        values, lengths = amazon_sequences(key.partition("-")[2] or key.partition(":")[2]
                                           or "Beauty")
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        arr = pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), pa.array(values))
        return pl.DataFrame({"item": pl.Series("item", arr)})
    if key == "criteo":
        return criteo_frame().select(CRITEO_CATEGORICAL)
    raise ValueError(f"unknown data set {name!r}; expected one of {DATASET_LOGS}")


def write_dataset_log(name: str, path: str | os.PathLike[str]) -> Path:
    """Write a data set as a log readable by :func:`flexshard_stream.sources.logs.read_log`.

    Parameters
    ----------
    name : str
        ``"movielens"`` (one row per rating in time order: ``ts`` float seconds, ``movie`` and
        ``user`` IDs), ``"amazon-beauty"``, ``"amazon-sports"``, ``"amazon-toys"`` (one row per
        user: ``item``, the list of item IDs), ``"criteo"`` (one row per line: ``C1..C26`` int64,
        null where missing; read it with ``null_as_empty=True``).
    path : path
        Output file; ``.parquet``/``.pq`` or ``.csv``/``.tsv`` (list columns as space-separated
        IDs).

    Returns
    -------
    Path
        The file written.
    """
    p = Path(path)
    ext = p.suffix.lower()
    if ext not in (".parquet", ".pq", ".csv", ".tsv"):
        raise ValueError(f"{p}: unknown log extension {ext!r}; expected .parquet, .pq, .csv, .tsv")
    df = _dataset_frame(name)
    if ext in (".parquet", ".pq"):
        df.write_parquet(p)
    else:
        df = df.with_columns(pl.col(c).list.eval(pl.element().cast(pl.String)).list.join(" ")
                             for c, t in df.schema.items() if isinstance(t, pl.List))
        df.write_csv(p, separator="\t" if ext == ".tsv" else ",")
    return p
