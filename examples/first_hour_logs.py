"""Logs for the first hour (README.md's walkthrough, tests/test_newcomer.py): logs the project
never saw, built from the real public data in ``../shared/data``, each split into a first and a
second half (plan on one, evaluate on the other).

``histories_{first,second}.parquet``
    MovieLens ratings in time order: ``ts``, ``user``, ``movie`` and ``history`` (the user's
    last 20 movies before the rating, a sequence feature).
``shop_{first,second}.csv``
    Amazon Beauty interactions as shop events with raw sparse 9-digit IDs: ``ts``, ``user_id``,
    ``item_id`` and ``recent_items`` (the user's last 5 items, space-separated); 60,000 events
    in a seeded order.
``criteo_{first,second}.parquet``
    Criteo's 26 categorical fields hashed to 63-bit IDs (a missing value hashes like 0).

    python examples/first_hour_logs.py DIR [--shared ../shared/data]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import polars as pl


def histories(path: Path) -> pl.DataFrame:
    """MovieLens ratings in time order with each user's last 20 movies before the rating."""
    from flexshard_stream.sources.datasets import movielens_ratings

    r = movielens_ratings(path / "movielens-latest-small" / "ratings.csv").sort("ts")
    seen: dict[int, list[int]] = {}
    hist = []
    for u, m in zip(r["user"].to_list(), r["movie"].to_list()):
        h = seen.setdefault(u, [])
        hist.append(h[-20:])
        h.append(m)
    return r.select("ts", "user", "movie").with_columns(
        pl.Series("history", hist, dtype=pl.List(pl.Int64)))


def shop(path: Path, rng: np.random.Generator) -> pl.DataFrame:
    """Amazon Beauty interactions as shop events with raw 9-digit user and item IDs and the
    user's last 5 items (space-separated in CSV), in a seeded time order."""
    from flexshard_stream.sources.datasets import amazon_sequences

    values, lengths = amazon_sequences("Beauty", path / "amazon-reviews-sequences" / "Beauty.txt")
    items = np.unique(values)
    raw = _nine_digit(rng, items.size)
    item_of = raw[np.searchsorted(items, values)]
    users = _nine_digit(rng, lengths.size)
    user_of = np.repeat(users, lengths)
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    pos = np.arange(values.size) - starts
    order = rng.permutation(values.size)[:60_000]
    order.sort()
    recent = [" ".join(map(str, item_of[i - min(pos[i], 5):i])) for i in order]
    return pl.DataFrame({"ts": 1.6e9 + np.arange(order.size) * 7.0,
                         "user_id": user_of[order], "item_id": item_of[order],
                         "recent_items": recent})


def _nine_digit(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` distinct random 9-digit integers: the draw of ``rng.choice(np.arange(10**8,
    10**9), n, replace=False)`` (same values, same generator state after) without building
    that 7.2 GB range."""
    return 100_000_000 + rng.choice(900_000_000, size=n, replace=False)


def criteo_hashed(path: Path) -> pl.DataFrame:
    """Criteo's 26 categorical fields as 63-bit hashed IDs (missing values hash like 0)."""
    from flexshard_stream.sources.datasets import criteo_frame

    cf = criteo_frame(path / "criteo-1k" / "train.txt")
    cols = [c for c in cf.columns if c.startswith("C")]
    return cf.select([((pl.col(c).fill_null(0).cast(pl.UInt64) * 0x9E3779B97F4A7C15 + j) // 2)
                      .cast(pl.Int64).alias(c) for j, c in enumerate(cols)])


def write_logs(shared: Path, out: Path, seed: int = 17) -> list[Path]:
    """Write the three logs, each in halves, into ``out``; returns the files written."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    written = []
    for name, df, ext in (("histories", histories(Path(shared)), "parquet"),
                          ("shop", shop(Path(shared), rng), "csv"),
                          ("criteo", criteo_hashed(Path(shared)), "parquet")):
        half = df.height // 2
        for part, frame in (("first", df[:half]), ("second", df[half:])):
            p = out / f"{name}_{part}.{ext}"
            frame.write_parquet(p) if ext == "parquet" else frame.write_csv(p)
            written.append(p)
    return written


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="directory to write the logs into")
    ap.add_argument("--shared", type=Path,
                    default=Path(__file__).resolve().parents[1].parent / "shared" / "data",
                    help="the shared data folder (default: ../shared/data of the repository)")
    args = ap.parse_args()
    for p in write_logs(args.shared, args.out):
        print(p)


if __name__ == "__main__":
    main()
