"""An HTML report with PNG pictures of a replay directory (``flexshard-stream report DIR``).

Reads what :func:`flexshard_stream.online.replay.replay` wrote (``summary.json``, ``cdf.json``,
``traffic/<strategy>.npz``) and writes into the same directory ``report.html`` and five PNGs:

``cdf.png``            per table, the access CDF of the whole log with the tier cut points
``bytes_per_iter.png`` all-to-all and inter-node bytes and communication time per iteration, per
                       window and strategy
``threshold.png``      the re-sharder's replication threshold over time: replicated rows and the
                       access probability of the coldest replicated row, per table
``traffic.png``        mean all-to-all bytes per iteration per GPU pair, node boundaries drawn
``memory.png``         per-GPU peak memory per strategy against the memory budget

and closes with how to apply the plan (export to TorchRec). Windows on a ``ts`` column in epoch
seconds are shown as UTC dates (tables and time axes). matplotlib (Agg backend) is imported only
here, lazily: ``pip install 'flexshard-stream[report]'``.
"""

from __future__ import annotations

import datetime as _dt
import html
import io
import json
import math
import os
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import FormatError
from .formats.directories import check_output_directory, directory_lock
from .formats.files import read_npz, write_atomic
from .formats.units import byte_scale, fmt_bytes, fmt_seconds, time_scale
from .optional import import_optional

__all__ = ["PICTURES", "build_report"]

#: PNG files the report writes, in the order they appear, with their captions' titles.
PICTURES = ("cdf.png", "bytes_per_iter.png", "threshold.png", "traffic.png", "memory.png")

_COLORS = {"rw": "#7f7f7f", "rw-hash": "#bcbd22", "twrw": "#1f77b4", "tw": "#17becf",
           "torchrec": "#2ca02c", "static": "#ff7f0e", "resharder": "#d62728"}
#: Strategies planned within the memory budget (the others are the budget's reference).
_BUDGETED = ("static", "resharder")
_LABELS = {"rw": "row-wise (rw)", "rw-hash": "row-wise, hashed (rw-hash)",
           "twrw": "table-row-wise (twrw)", "tw": "table-wise (tw)",
           "torchrec": "TorchRec's own plan (torchrec)",
           "static": "FlexShard, static (planned on window 0)",
           "resharder": "FlexShard + re-sharder (online)"}
_DPI = 110
#: Line styles: rw and twrw often carry the same all-to-all bytes, so rw is drawn wide underneath.
_STYLE = {"rw": {"lw": 4.0, "alpha": 0.55, "marker": "o", "ms": 6, "zorder": 2},
          "rw-hash": {"lw": 1.2, "ls": ":", "marker": "v", "ms": 4, "zorder": 3},
          "twrw": {"lw": 1.4, "ls": "--", "marker": "s", "ms": 4, "zorder": 3},
          "tw": {"lw": 1.2, "ls": "-.", "marker": "x", "ms": 4, "zorder": 3},
          "static": {"lw": 1.8, "marker": "^", "ms": 5, "zorder": 4},
          "resharder": {"lw": 1.8, "marker": "D", "ms": 4, "zorder": 5}}


# ----------------------------------------------------------------------------- loading
def _mpl():
    matplotlib = import_optional("matplotlib", extra="report", purpose="the report")
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    return plt


def _load_json(path: Path, what: str) -> Any:
    if not path.is_file():
        raise FormatError(f"{path}: missing ({what}); write the directory with "
                          f"`flexshard-stream replay LOG... --topology T --out {path.parent}`")
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise FormatError(f"{path}: damaged {what}: not valid JSON ({e})") from None


def _check_summary(s: Any, path: Path) -> None:
    def bad(msg: str) -> FormatError:
        return FormatError(f"{path}: not a replay summary: {msg}")

    if not isinstance(s, dict):
        raise bad("the top level is not an object")
    for key in ("windows", "totals", "window", "topology", "batch_size"):
        if key not in s:
            raise bad(f"missing key {key!r}")
    if not isinstance(s["windows"], list) or not s["windows"]:
        raise bad("'windows' is not a non-empty list")
    if not isinstance(s["totals"], dict) or not isinstance(s["totals"].get("strategies"), dict):
        raise bad("'totals.strategies' is missing")
    for i, w in enumerate(s["windows"]):
        if not isinstance(w, dict) or not isinstance(w.get("strategies"), dict):
            raise bad(f"window {i} has no 'strategies'")
        for k in ("start", "end", "samples"):
            if k not in w:
                raise bad(f"window {i} has no {k!r}")


def _load_traffic(path: Path) -> dict[str, np.ndarray]:
    if not path.is_file():
        raise FormatError(f"{path}: missing (traffic matrices of the replay)")
    out = read_npz(path, "traffic file")
    if "a2a" not in out or "link_class" not in out or out["a2a"].ndim != 2 \
            or out["a2a"].shape != out["link_class"].shape:
        raise FormatError(f"{path}: damaged traffic file (no G x G 'a2a' and 'link_class')")
    return out


# ----------------------------------------------------------------------------- helpers
#: Epoch seconds in this range (1973 .. 2100) are shown as dates; smaller ``ts`` values (a
#: synthetic trace's seconds from 0) stay seconds.
_EPOCH_RANGE = (1e8, 4.1e9)


def _fmt_bytes(x: float | None, digits: int = 3) -> str:
    return "–" if x is None else fmt_bytes(x, digits)


def _fmt_time(x: float | None) -> str:
    return "–" if x is None else fmt_seconds(x)


def _utc(ts: float, seconds: bool = False) -> str:
    """Epoch seconds as a UTC date and time (``2017-11-24 10:03``)."""
    d = _dt.datetime.fromtimestamp(float(ts), _dt.timezone.utc)
    return d.strftime("%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M")


@dataclass(frozen=True)
class _Axis:
    """Where windows sit on the x axis: UTC dates (a ``ts`` column in epoch seconds), seconds
    since the first sample (other ``ts``), or sample indices."""

    label: str
    origin: float
    dates: bool

    def x(self, v: Any) -> Any:
        """Plot coordinate of a window position (seconds, or a sample index)."""
        v = np.asarray(v, dtype=float)
        if self.dates:
            from matplotlib import dates as mdates
            return mdates.date2num(np.datetime64(0, "s")) + v / 86400.0
        return v - self.origin

    def style(self, ax) -> None:
        """Date ticks that fit (matplotlib's concise formatter) when the axis holds dates."""
        if self.dates:
            from matplotlib import dates as mdates
            loc = mdates.AutoDateLocator(minticks=3, maxticks=8)
            ax.xaxis.set_major_locator(loc)
            ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(loc))

    def when(self, v: Any) -> str:
        """A window position for a table cell."""
        if self.dates:
            return _utc(float(v))
        return f"{float(v):,.6g}"


def _axis(summary: dict) -> _Axis:
    """The x axis of the time series: dates, seconds or sample indices."""
    win = summary["window"]
    if win.get("position") == "ts":
        t0 = win.get("t0")
        if t0 is None:
            t0 = summary["windows"][0]["start"]
        t0 = float(t0)
        if _EPOCH_RANGE[0] <= t0 <= _EPOCH_RANGE[1]:
            return _Axis("date (UTC)", t0, True)
        return _Axis("time since the first sample (s)", t0, False)
    return _Axis("sample index", 0.0, False)


def _wrapped(fig, text: str, fontsize: float, share: float = 1.0) -> str:
    """``text`` wrapped to ``share`` of the figure's width at ``fontsize`` (a title that is never
    clipped at the edges)."""
    chars = max(20, int(fig.get_figwidth() * share * 72 / (0.6 * fontsize)))
    return "\n".join(textwrap.wrap(text, chars)) or text


def _nice_log_ticks(vmin: float, vmax: float) -> list[float]:
    """Tick values for a log colour scale from ``vmin`` to ``vmax`` (> 0): 1-2-5 steps, thinned
    to powers of ten over wide ranges and densified to 1..9 over narrow ones, so that the labels
    (at most 9) never overlap."""
    lo, hi = math.floor(math.log10(vmin)), math.ceil(math.log10(vmax))

    def ticks(subs: tuple[float, ...]) -> list[float]:
        return [m * 10.0 ** e for e in range(lo, hi + 1) for m in subs
                if vmin * (1 - 1e-9) <= m * 10.0 ** e <= vmax * (1 + 1e-9)]

    t = ticks((1.0, 2.0, 5.0))
    if len(t) > 8:
        t = ticks((1.0,))
        return t[::math.ceil(len(t) / 8)] if len(t) > 8 else t
    if len(t) < 3:
        dense = ticks(tuple(float(m) for m in range(1, 10)))
        t = dense if len(dense) <= 9 else dense[::2]
    return t if len(t) >= 2 else [float(f"{x:.2g}") for x in np.geomspace(vmin, vmax, 3)]


def _strategies(summary: dict) -> list[str]:
    names = summary.get("strategies") or list(summary["totals"]["strategies"])
    return [n for n in names if n in summary["totals"]["strategies"]]


def _save(fig, path: Path) -> None:
    """The figure as a PNG, replacing ``path`` atomically (not fsynced: a report is redrawn from
    the replay directory at will)."""
    buf = io.BytesIO()
    fig.savefig(buf, dpi=_DPI, format="png")
    write_atomic(path, buf.getvalue(), fsync=False, mode=0o644)


# ----------------------------------------------------------------------------- pictures
def _plot_cdf(plt, cdf: dict, path: Path) -> str:
    tables = cdf.get("tables") or {}
    if not isinstance(tables, dict) or not tables:
        raise FormatError(f"{path.parent / 'cdf.json'}: damaged: no tables")
    n = len(tables)
    cols = min(n, 2)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(max(8.0, 6.2 * cols), 3.9 * rows + 0.4),
                             squeeze=False)
    for ax, (name, t) in zip(axes.flat, tables.items()):
        share = np.asarray(t.get("cumulative_share", []), dtype=float) * 100
        rank = np.arange(1, share.size + 1)
        if share.size:
            ax.plot(rank, share, color="black", lw=1.6, label="whole log, top rows")
        cuts = t.get("cuts", {})
        for s, style in (("static", "--"), ("resharder", ":")):
            c = cuts.get(s)
            if not c:
                continue
            col = _COLORS[s]
            k0, kk = int(c["k0"]), int(c["k0_k1"])
            lbl = cut_label(s, c)
            if k0 > 0:
                ax.axvline(k0, color=col, ls=style, lw=1.2, alpha=0.8)
            if kk > 0:
                ax.axvline(kk, color=col, ls=style, lw=2.0, label=lbl)
            else:
                ax.plot([], [], color=col, ls=style, lw=2.0, label=lbl)
        ax.set_xscale("log")
        ax.set_xlim(1, max(10, share.size))
        ax.set_ylim(0, 100)
        ax.set_xlabel("row rank (hottest first, log scale)")
        ax.set_ylabel("cumulative share of lookups (%)")
        kind = "exact counts" if t.get("exact") else "sketch estimates"
        ax.set_title(_wrapped(fig, f"{name}: {t.get('total', 0):,} lookups, "
                                   f"{t.get('num_rows', 0):,} rows ({kind})", 10, 0.9 / cols),
                     fontsize=10)
        ax.grid(True, which="both", alpha=0.25)
        ax.legend(fontsize=7.5, loc="upper left", framealpha=0.95)
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    fig.suptitle(_wrapped(fig, "Access CDF per table and the replication cut points (thin line: "
                               "global tier ends; thick: node tier ends)", 11), fontsize=11)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
    return ("Cumulative share of each table's lookups carried by its hottest rows (whole log; "
            f"top {cdf.get('top_k', '?')} rows kept). Vertical lines: where the static plan "
            "(dashed) and the re-sharder's final plan (dotted) stop replicating rows on every GPU "
            "(thin) and on every node (thick). The legend gives the share of all lookups those "
            "replicated rows carry.")


def _plot_bytes(plt, summary: dict, path: Path) -> str:
    axis = _axis(summary)
    wins = summary["windows"]
    strategies = _strategies(summary)
    mid = axis.x([(float(w["start"]) + float(w["end"])) / 2 for w in wins])
    series = {}
    for s in strategies:
        tot, inter, t = [], [], []
        for w in wins:
            m = w["strategies"].get(s) or {}
            b = m.get("bytes_per_iter")
            tot.append(np.nan if not b else b["total"])
            inter.append(np.nan if not b else b["inter_node"])
            c = m.get("comm_time_s_per_iter")
            t.append(np.nan if c is None else c)
        series[s] = (np.array(tot, float), np.array(inter, float), np.array(t, float))
    fig, axes = plt.subplots(3, 1, figsize=(9.5, 9.4), sharex=True)
    allb = np.concatenate([np.concatenate([v[0], v[1]]) for v in series.values()])
    fb, ub = byte_scale(np.nanmax(allb) if np.isfinite(allb).any() else 0.0)
    allt = np.concatenate([v[2] for v in series.values()])
    ft, ut = time_scale(np.nanmax(allt) if np.isfinite(allt).any() else 0.0)
    for s, (tot, inter, t) in series.items():
        kw = dict(color=_COLORS.get(s), label=_LABELS.get(s, s), **_STYLE.get(s, {}))
        axes[0].plot(mid, tot / fb, **kw)
        axes[1].plot(mid, inter / fb, **kw)
        axes[2].plot(mid, t / ft, **kw)
    axes[0].set_ylabel(f"all-to-all\n({ub} / iteration)")
    axes[1].set_ylabel(f"inter-node\n({ub} / iteration)")
    axes[2].set_ylabel(f"comm time\n({ut} / iteration)")
    for ax in axes:
        ax.grid(True, alpha=0.3)
        ax.margins(y=0.15)
        for w in wins:
            ax.axvline(axis.x(float(w["start"])), color="#cccccc", lw=0.6, zorder=0)
        axis.style(ax)
    if not np.isfinite(allt).any():
        axes[1].text(0.5, 0.5, "no window holds a whole iteration (G x B samples): nothing was "
                     "evaluated", ha="center", va="center", transform=axes[1].transAxes)
    axes[2].set_xlabel(axis.label + " (points: window midpoints; grey lines: window starts)")
    B = summary.get("batch_size")
    fig.suptitle(_wrapped(fig, f"Per iteration ({summary.get('samples_per_iteration', '?')} "
                               f"samples = {summary['topology'].get('num_gpus', '?')} GPUs x B "
                               f"{B}), mean over each window (y axes do not start at 0)", 11),
                 fontsize=11)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=2, fontsize=8.5,
               bbox_to_anchor=(0.5, 0.955), frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.9))
    _save(fig, path)
    plt.close(fig)
    return ("Mean bytes per training iteration in each window (index exchange + embeddings "
            "forward + gradients backward, whole cluster), the part of it crossing between nodes, "
            "and the modelled communication time per iteration (slowest GPU; replica sync "
            "included). Trace mode: every window's own samples replayed through each plan.")


def cut_label(strategy: str, cut: dict) -> str:
    """The CDF legend of a plan's replication cut: its tiers' rows and their share of lookups,
    or that it replicates nothing."""
    k0, kk = int(cut["k0"]), int(cut["k0_k1"])
    if kk <= 0:
        return f"{strategy}: no replicated rows"
    return (f"{strategy}: {k0:,} global + {kk - k0:,} node rows "
            f"({100 * cut.get('replicated_share', 0):.0f}% of lookups)")


def _replicates(pts) -> bool:
    """Whether any check's plan replicates a row of any table."""
    return any(th[t]["global_rows"] + th[t]["node_rows"] > 0 for _, th, _ in pts for t in th)


def _plot_threshold(plt, summary: dict, path: Path) -> str | None:
    """The threshold chart, or None (nothing drawn) when no plan of the re-sharder replicated a
    row: there is no threshold to show."""
    axis = _axis(summary)
    wins = summary["windows"]
    pts: list[tuple[float, dict, str]] = []
    for w in wins:
        checks = w.get("checks") or []
        if not checks and w.get("thresholds"):
            # no check in this window (the first one): its plan held from its start to its end
            pts.append((float(axis.x(float(w["start"]))), w["thresholds"], ""))
            pts.append((float(axis.x(float(w["end"]))), w["thresholds"], ""))
        for c in checks:
            if c.get("thresholds"):
                pts.append((float(axis.x(float(c["position"]))), c["thresholds"],
                            c.get("action", "")))
    if pts and not _replicates(pts):
        return None
    fig, axes = plt.subplots(2, 1, figsize=(10.5, 7.4), sharex=True)
    tables = list(dict.fromkeys(t for _, th, _ in pts for t in th))
    cmap = plt.get_cmap("Dark2")
    ymax = 1
    any_global = False
    for i, t in enumerate(tables):
        sel = [p for p in pts if t in p[1]]
        xs = [p[0] for p in sel]
        rows = [p[1][t]["global_rows"] + p[1][t]["node_rows"] for p in sel]
        g = [p[1][t]["global_rows"] for p in sel]
        prob = [p[1][t]["threshold_probability"] for p in sel]
        col = cmap(i % 8)
        ymax = max(ymax, max(rows))
        axes[0].step(xs, rows, where="post", color=col, lw=2.0, label=t, marker="o", ms=3)
        if any(g):
            any_global = True
            axes[0].step(xs, g, where="post", color=col, lw=1.0, ls="--")
        pp = np.array([np.nan if (v is None or v <= 0) else v for v in prob], float)
        axes[1].step(xs, pp, where="post", color=col, lw=2.0, label=t, marker="o", ms=3)
    changes = [p for p in pts if p[2] in ("applied", "partial")]
    for x, _, _ in changes:
        for ax in axes:
            ax.axvline(x, color="#d62728", lw=1.2, alpha=0.6, ls="-.", zorder=1)
    for w in wins:
        for ax in axes:
            ax.axvline(axis.x(float(w["start"])), color="#cccccc", lw=0.6, zorder=0)
    for ax in axes:
        axis.style(ax)
    axes[0].set_ylabel("replicated rows\n(global + node tiers)")
    axes[0].set_yscale("symlog", linthresh=10)
    axes[0].set_ylim(0, ymax * 3)
    axes[1].set_ylabel("threshold: access probability\nof the coldest replicated row")
    probs = [p[1][t]["threshold_probability"] for p in pts for t in p[1]]
    if any(v is not None and v > 0 for v in probs):
        axes[1].set_yscale("log")
        axes[1].margins(y=0.15)
    axes[1].set_xlabel(axis.label + " (one point per check; grey lines: window starts)")
    for ax in axes:
        ax.grid(True, which="major", alpha=0.3)
    extra = []
    if changes:
        extra.append(plt.Line2D([], [], color="#d62728", ls="-.", alpha=0.6,
                                label=f"plan changed ({len(changes)} of "
                                      f"{sum(len(w.get('checks') or []) for w in wins)} checks)"))
    if any_global:
        extra.append(plt.Line2D([], [], color="black", ls="--", lw=1.0,
                                label="global tier only"))
    handles = axes[0].get_legend_handles_labels()[0] + extra
    if handles:
        fig.legend(handles, [h.get_label() for h in handles], loc="upper center",
                   ncol=min(len(handles), 4), fontsize=8.5, bbox_to_anchor=(0.5, 0.95),
                   frameon=False)
    if not pts:
        axes[0].text(0.5, 0.5, "no re-sharder check (a single window)", ha="center",
                     transform=axes[0].transAxes)
    fig.suptitle("The re-sharder's replication threshold over time, per table", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.9))
    _save(fig, path)
    plt.close(fig)
    return ("After each re-sharder check: the rows each table replicates (global + node tiers; "
            "dashed: global tier only, when there is one) and the threshold in probability, the "
            "access probability of the coldest replicated row under the statistics of that check "
            "(gaps: nothing replicated). The first window has no check: the static plan holds. "
            "Dash-dotted red lines: checks that changed the plan.")


def _plot_traffic(plt, summary: dict, traffic: dict[str, dict[str, np.ndarray]],
                  path: Path) -> str:
    from matplotlib.colors import LogNorm

    strategies = [s for s in _strategies(summary) if s in traffic]
    n = len(strategies)
    cols = min(n, 2)
    rows = math.ceil(n / cols)
    M = int(summary["topology"].get("gpus_per_node") or 1)
    mats = {s: traffic[s]["a2a"] for s in strategies}
    pos = np.concatenate([m[m > 0] for m in mats.values()]) if mats else np.zeros(0)
    vmax = float(pos.max()) if pos.size else 1.0
    vmin = max(float(pos.min()) if pos.size else 1e-3, vmax * 1e-4)
    f, u = byte_scale(vmax)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols + 1.4, 5.0 * rows + 0.6),
                             squeeze=False, layout="constrained")
    im = None
    for ax, s in zip(axes.flat, strategies):
        m = mats[s]
        lc = traffic[s]["link_class"]
        G = m.shape[0]
        shown = np.where(m > 0, m / f, np.nan)
        im = ax.imshow(shown, cmap="viridis", norm=LogNorm(vmin=vmin / f, vmax=vmax / f),
                       interpolation="nearest", origin="upper")
        for b in range(M, G, M):
            ax.axhline(b - 0.5, color="white", lw=1.5)
            ax.axvline(b - 0.5, color="white", lw=1.5)
        intra = float(m[lc == 1].sum())
        inter = float(m[lc == 2].sum())
        ax.set_title(f"{_LABELS.get(s, s)}\nintra-node {_fmt_bytes(intra)}, inter-node "
                     f"{_fmt_bytes(inter)} per iteration", fontsize=9)
        step = max(1, M * math.ceil(G / M / 8)) if G > 16 else max(1, G // 8)
        ticks = list(range(0, G, step))
        ax.set_xticks(ticks)
        ax.set_yticks(ticks)
        ax.set_xlabel("destination GPU")
        ax.set_ylabel("source GPU")
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    if im is not None:
        from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter
        cb = fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.8)
        cb.set_label(f"all-to-all {u} per iteration (log scale)")
        cb.ax.yaxis.set_major_locator(FixedLocator(_nice_log_ticks(vmin / f, vmax / f)))
        cb.ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.3g}"))
        cb.ax.yaxis.set_minor_formatter(NullFormatter())
    fig.suptitle(_wrapped(fig, "Mean all-to-all traffic per GPU pair over the replay (white "
                               "lines: node boundaries; diagonal blocks = intra-node links, the "
                               "rest inter-node)", 10.5), fontsize=10.5)
    _save(fig, path)
    plt.close(fig)
    return ("Bytes GPU <i>a</i> (row) sends GPU <i>b</i> (column) per iteration, mean over every "
            "evaluated iteration (index exchange, embeddings and gradients; replica sync not "
            "included). The diagonal blocks between the white lines travel over intra-node links "
            "(NVLink), everything else over the slower inter-node network. The diagonal "
            "(a GPU serving itself) costs nothing; empty cells carry no traffic.")


def _plot_memory(plt, summary: dict, path: Path) -> str:
    strategies = _strategies(summary)
    tot = summary["totals"]["strategies"]
    mems = {s: np.asarray(tot[s].get("memory_per_gpu_bytes") or [], float) for s in strategies}
    mems = {s: m for s, m in mems.items() if m.size}
    budget = summary.get("budget_bytes")
    vmax = max([float(m.max()) for m in mems.values()] + [float(budget or 0)] + [1.0])
    f, u = byte_scale(vmax)
    G = max((m.size for m in mems.values()), default=0)
    fig, ax = plt.subplots(figsize=(min(14.0, max(8.5, 0.5 * G + 3)), 5.2))
    x = np.arange(G)

    def label(s: str, m: np.ndarray) -> str:
        # only the FlexShard plans were made for the budget (row-wise's modelled peak)
        share = 100 * m.max() / budget if budget else 0.0
        rel = ((f", {share:.1f}% of the budget" + (" (over it on this log: the plan was made "
                                                    "on the first window)" if share > 100 else ""))
               if budget and s in _BUDGETED else "")
        return f"{_LABELS.get(s, s)}: peak {_fmt_bytes(float(m.max()), 4)}{rel}"

    if G <= 32:
        width = 0.8 / max(1, len(mems))
        for i, (s, m) in enumerate(mems.items()):
            ax.bar(x + (i - (len(mems) - 1) / 2) * width, m / f, width, color=_COLORS.get(s),
                   label=label(s, m))
        ax.set_xticks(x)
    else:
        for s, m in mems.items():
            st = {k: v for k, v in _STYLE.get(s, {}).items() if k not in ("marker", "ms")}
            ax.step(x, m / f, where="mid", color=_COLORS.get(s), label=label(s, m), **st)
    if budget:
        ax.axhline(budget / f, color="black", ls=(0, (4, 3)), lw=1.2, zorder=6,
                   label=f"FlexShard's budget {_fmt_bytes(budget, 4)} per GPU (row-wise's "
                         f"modelled peak on window 0)")
    pos = [float(m[m > 0].min()) for m in mems.values() if (m > 0).any()]
    if pos and vmax / min(pos) > 20:
        ax.set_yscale("log")
        ax.set_ylabel(f"peak memory per GPU ({u}, log scale)")
    else:
        ax.set_ylim(0, vmax / f * 1.05)
    M = int(summary["topology"].get("gpus_per_node") or 1)
    for b in range(M, G, M):
        ax.axvline(b - 0.5, color="#999999", lw=0.8)
    ax.set_xlabel("GPU (grey lines: node boundaries)")
    if ax.get_yscale() != "log":
        ax.set_ylabel(f"peak memory per GPU ({u})")
    ax.grid(True, axis="y", alpha=0.3)
    fig.legend(loc="upper center", ncol=2, fontsize=8.5, bbox_to_anchor=(0.5, 0.93),
               frameon=False)
    fig.suptitle(_wrapped(fig, "Peak per-GPU memory over the replay (rows + optimizer state + "
                               "communication buffers)", 11), fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.83))
    _save(fig, path)
    plt.close(fig)
    return ("Largest memory each GPU needed during the replay: embedding rows with their "
            "optimizer state, plus the communication buffers of its busiest iteration. The "
            "dashed line is the budget the FlexShard plans were made for: the row-wise plan's "
            "modelled (expected) peak on the first window, so the legend gives a share of it "
            "for the FlexShard plans only. Replayed peaks, row-wise's included, can sit a little "
            "above it when an iteration's buffers exceed the modelled mean. HBM capacity "
            "(topology) is not drawn.")


# ----------------------------------------------------------------------------- html
def _totals_table(summary: dict) -> str:
    tot = summary["totals"]["strategies"]
    # the columns that answer "how much faster" first: a wide table scrolls, never clips them
    head = ("<tr><th>strategy</th><th>speed-up vs rw</th><th>vs best baseline</th>"
            "<th>iterations</th><th>all-to-all / iter</th>"
            "<th>inter-node / iter</th><th>sync / iter</th><th>comm time / iter</th>"
            "<th>comm time, total</th><th>peak memory / GPU</th><th>migration</th>"
            "<th>migration + pauses</th><th>total cost</th><th>plan changes</th></tr>")
    rows = []
    for s in _strategies(summary):
        t = tot[s]
        b = t.get("bytes_per_iter") or {}
        sp = t.get("speedup_vs_rw")
        bb = _vs_best(t)
        rows.append(
            "<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in (
                _LABELS.get(s, s), "–" if sp is None else f"{sp:.2f}x", bb,
                f"{t.get('iterations', 0):,}", _fmt_bytes(b.get("total")),
                _fmt_bytes(b.get("inter_node")), _fmt_bytes(b.get("sync")),
                _fmt_time(t.get("comm_time_s_per_iter")), _fmt_time(t.get("comm_time_s")),
                _fmt_bytes(t.get("peak_memory_bytes"), 4),
                _fmt_bytes(t.get("migration_bytes", 0)),
                _fmt_time(t.get("migration_s", 0.0) + t.get("pause_s", 0.0)),
                _fmt_time(t.get("total_cost_s")),
                t.get("deltas", 0))) + "</tr>")
    return f"<div class='wide'><table>{head}{''.join(rows)}</table></div>"


def _vs_best(t: dict) -> str:
    """``"<x>x vs <best baseline>"``: a strategy's speed-up over the fastest baseline replayed
    ("–" for replays written before it was recorded)."""
    sp, name = t.get("speedup_vs_best_baseline"), t.get("best_baseline")
    return "–" if sp is None or not name else f"{sp:.2f}x vs {name} (the best baseline)"


def _windows_table(summary: dict) -> str:
    strategies = _strategies(summary)
    axis = _axis(summary)
    unit = " (UTC)" if axis.dates else (" (s)" if axis.label.endswith("(s)") else " (sample)")
    head = (f"<tr><th>window</th><th>start{unit}</th><th>end{unit}</th><th>samples</th>"
            "<th>iterations</th>"
            + "".join(f"<th>{html.escape(s)} comm / iter</th>" for s in strategies)
            + "<th>re-sharder migration</th><th>checks (applied)</th></tr>")
    rows = []
    for w in summary["windows"]:
        cells = [w.get("index", ""), axis.when(w["start"]), axis.when(w["end"]),
                 f"{w['samples']:,}", w.get("iterations", "")]
        for s in strategies:
            cells.append(_fmt_time((w["strategies"].get(s) or {}).get("comm_time_s_per_iter")))
        dec = w.get("decisions") or {}
        cells += [_fmt_bytes(w.get("migration_bytes", 0)),
                  f"{sum(dec.values())} ({dec.get('applied', 0) + dec.get('partial', 0)})"]
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    return f"<div class='wide'><table>{head}{''.join(rows)}</table></div>"


def _fits(t: dict, summary: dict) -> bool:
    """Whether a strategy's peak memory per GPU fits its budget (the replay's budget, else the
    GPUs' HBM when the summary records neither)."""
    budget = t.get("budget_bytes") or summary.get("budget_bytes")
    peak = t.get("peak_memory_bytes")
    return budget is None or peak is None or peak <= float(budget) * (1 + 1e-9)


def _fastest(summary: dict, names) -> tuple[str, dict] | None:
    """Among ``names``, the strategy with the least total cost per iteration (communication plus
    migrations and pauses: what the re-sharder's moves cost counts) that fits its budget."""
    st = summary["totals"]["strategies"]
    cands = [(s, st[s]) for s in names
             if s in st and st[s].get("comm_time_s_per_iter") is not None and _fits(st[s], summary)]
    return min(cands, key=lambda c: _per_iteration_cost(c[1])) if cands else None


def _per_iteration_cost(t: dict) -> float:
    it = max(int(t.get("iterations") or 0), 1)
    total = t.get("total_cost_s")
    return float(total) / it if total is not None else float(t["comm_time_s_per_iter"])


def _best_flexshard(summary: dict) -> tuple[str, dict] | None:
    """The FlexShard strategy (static or re-sharded) with the least cost per iteration."""
    return _fastest(summary, _BUDGETED)


def _apply_section(summary: dict) -> str:
    """The closing section: the fastest plan that fits (FlexShard's or not, said so), where it
    is, and how to run it in TorchRec."""
    best = _fastest(summary, _strategies(summary))
    if best is None:
        return ("<h2>Apply this plan</h2><p>No plan that fits its memory budget was evaluated (no "
                "window filled an iteration, or none fits); replay with larger windows or a "
                "smaller batch size first.</p>")
    name, t = best
    fs = _best_flexshard(summary)
    where = {"static": "the FlexShard plan made on the first window",
             "resharder": "where the re-sharder ended"}.get(name, f"{_LABELS.get(name, name)}")
    sp = t.get("speedup_vs_rw")
    gain = (f" ({sp:.2f}x less communication time per iteration than row-wise, "
            f"{_vs_best(t)} over this replay)" if sp is not None and name in _BUDGETED else "")
    if name not in _BUDGETED:
        why = (f"; FlexShard's best here ({_LABELS.get(fs[0], fs[0])}) took "
               f"{_per_iteration_cost(fs[1]) / max(_per_iteration_cost(t), 1e-30):.2f}x its "
               f"time per iteration" if fs else "; no FlexShard plan fits")
        gain = (f" (the fastest plan that fits in this replay: FlexShard is not it{why}; "
                "re-plan with more memory or a longer profile, or keep this one)")
    code = f"flexshard-stream export --plan plans/{name} --out torchrec"
    return (
        "<h2>Apply this plan</h2>"
        f"<p>Every strategy's final plan is in <code>plans/</code> of this directory. The one to "
        f"take is <code>plans/{name}</code>, {where}{gain}. To run it in TorchRec, export it "
        "from this directory: per table a replicated hot table, a row-wise cold table, an ID "
        "remap, <code>ParameterConstraints</code> and the <code>ShardingPlan</code> for "
        "<code>DistributedModelParallel</code>, in <code>torchrec/</code>:</p>"
        f"<pre>{html.escape(code)}</pre>"
        "<p>docs/TORCHREC_EXPORT.md describes the files and the data-loader side "
        "(<code>KJTRemap</code> routes each feature's IDs to the hot and cold tables). To "
        "keep the placement current while training, run the sidecar beside the data loaders "
        "(<code>flexshard-stream sidecar</code>, docs/SIDECAR.md).</p>")


def _period(summary: dict) -> str:
    """``<br>Period: first .. last sample (UTC)`` when the windows sit on epoch dates."""
    axis = _axis(summary)
    if not axis.dates:
        return ""
    wins = summary["windows"]
    first = min(float(w.get("ts_first") or w["start"]) for w in wins)
    last = max(float(w.get("ts_last") or w["end"]) for w in wins)
    return f"<br>Period: {_utc(first, True)} .. {_utc(last, True)} (UTC)"


_CSS = """body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;
max-width:1100px;margin:2em auto;padding:0 1em;color:#222}h1{font-size:1.5em}
h2{font-size:1.2em;margin-top:1.6em}table{border-collapse:collapse;font-size:.9em;margin:.6em 0}
td,th{border:1px solid #ccc;padding:.25em .6em;text-align:right}th{background:#f3f3f3}
td{white-space:nowrap}
td:first-child,th:first-child{text-align:left}figure{margin:1.2em 0}
img{max-width:100%;border:1px solid #ddd}figcaption{font-size:.92em;color:#444;margin-top:.3em}
.meta{color:#555;font-size:.92em}code{background:#f5f5f5;padding:0 .2em}
pre{background:#f5f5f5;padding:.6em;overflow-x:auto}.wide{overflow-x:auto}"""


def build_report(directory: str | os.PathLike) -> Path:
    """Write ``report.html`` and the PNGs (:data:`PICTURES`) into a replay directory.

    Returns the path of ``report.html``. Raises :class:`FormatError` naming the file when
    ``summary.json`` (or ``cdf.json``, a traffic file) is missing or damaged, and
    :class:`FlexShardError` when matplotlib is not installed. Everything is read from, and
    written into, one version of a replaced replay directory, under its writer's lock (a
    ConfigError while a replay writes it).
    """
    d = Path(directory)
    if not d.is_dir():
        raise FormatError(f"{d}: no such replay directory; write one with "
                          f"`flexshard-stream replay LOG... --topology T --out {d}`")
    check_output_directory(d, "replay", legacy=("summary.json",))   # only into a replay's output
    with directory_lock(d) as version:
        _draw(version)
    return d / "report.html"


def _draw(d: Path) -> None:
    """:func:`build_report` into the resolved directory ``d``."""
    spath = d / "summary.json"
    summary = _load_json(spath, "replay summary")
    _check_summary(summary, spath)
    cdf = _load_json(d / "cdf.json", "access CDF")
    if not isinstance(cdf, dict):
        raise FormatError(f"{d / 'cdf.json'}: damaged: the top level is not an object")
    traffic = {s: _load_traffic(d / "traffic" / f"{s}.npz") for s in _strategies(summary)}
    plt = _mpl()
    captions = {}
    try:
        captions["cdf.png"] = _plot_cdf(plt, cdf, d / "cdf.png")
        captions["bytes_per_iter.png"] = _plot_bytes(plt, summary, d / "bytes_per_iter.png")
        captions["threshold.png"] = _plot_threshold(plt, summary, d / "threshold.png")
        captions["traffic.png"] = _plot_traffic(plt, summary, traffic, d / "traffic.png")
        captions["memory.png"] = _plot_memory(plt, summary, d / "memory.png")
    except (KeyError, TypeError, IndexError, AttributeError, ValueError) as e:
        raise FormatError(f"{spath}: damaged replay summary: unexpected content ({e!r})") from None
    finally:
        plt.close("all")
    try:
        page = _page(summary, captions, _cluster_section(d / CLUSTER_FILE))
    except (KeyError, TypeError, IndexError, AttributeError, ValueError) as e:
        raise FormatError(f"{spath}: damaged replay summary: unexpected content ({e!r})") from None
    write_atomic(d / "report.html", page.encode("utf-8"), fsync=False, mode=0o644)


#: Written into a replay directory by ``flexshard-stream cluster --out DIR``: the report then
#: shows what was measured on the emulated cluster beside the model's figures.
CLUSTER_FILE = "cluster.json"


def _cluster_section(path: Path) -> str:
    """The HTML of the emulated cluster's measurements (``cluster.json``), or "" without it:
    per plan the measured step and network time and wire bytes beside each model's."""
    if not path.exists():
        return ""
    doc = _load_json(path, "emulated cluster result")
    try:
        run, rows = doc["run"], []
        for label, c in doc["comparison"].items():
            m = c["measured"]
            for name, mm in c["models"].items():
                rows.append(
                    f"<tr><td>{html.escape(label)}</td><td>{html.escape(name)}</td>"
                    f"<td>{_fmt_time(m['step_s']['median'])} (IQR "
                    f"{_fmt_time(m['step_s']['iqr'])})</td>"
                    f"<td>{_fmt_time(m['network_s']['median'])}</td>"
                    f"<td>{_fmt_time(mm['network_s'])}</td>"
                    f"<td>{(mm['network_measured_over_model'] or 0):.2f}</td>"
                    f"<td>{_fmt_bytes(m['wire_bytes_mean']['inter_node'])}</td>"
                    f"<td>{_fmt_bytes(mm['wire_bytes']['inter_node'])}</td>"
                    f"<td>{m['cpu_share']:.0%}</td></tr>")
        head = (f"<p class='meta'>{run['nodes']} x {run['gpus_per_node']} ranks in network "
                f"namespaces, inter-node {run['inter_rate_bits_per_s'] / 1e6:g} Mbit/s per rank "
                f"and direction; B = {run['batch_size']}; load average "
                f"{run['load_average_before'][0]:.1f}; docs/CLUSTER.md.</p>")
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise FormatError(f"{path}: damaged emulated cluster result ({e!r})") from None
    return ("<h2>Measured on the emulated cluster</h2>" + head
            + "<table><tr><th>plan</th><th>model</th><th>step (measured)</th>"
            "<th>network measured</th><th>network modelled</th><th>measured / modelled</th>"
            "<th>inter-node wire measured</th><th>modelled</th><th>CPU share</th></tr>"
            + "".join(rows) + "</table>")


def _page(summary: dict[str, Any], captions: dict[str, str], cluster: str = "") -> str:
    """The HTML of the report: the run's description, the totals, the pictures with their
    captions, the windows (and the emulated cluster's measurements when given)."""
    titles = {"cdf.png": "Access CDF and tier cut points",
              "bytes_per_iter.png": "Bytes per iteration over time",
              "threshold.png": "Re-sharder threshold over time",
              "traffic.png": "Traffic per GPU pair",
              "memory.png": "Per-GPU memory against the budget"}
    topo = summary["topology"]
    win = summary["window"]
    tot = summary["totals"]
    skipped = tot.get("skipped_rows", 0)
    st = tot["strategies"]
    best = st.get("resharder") or st.get("static") or {}
    sp = best.get("speedup_vs_rw")
    dedup = "on" if (summary.get("model") or {}).get("dedup", True) else "off"
    # figures of replays written before execution profiles were idealized
    profile = (summary.get("model") or {}).get("profile", "ideal")
    label = "TorchRec 1.8 execution profile" if profile == "torchrec" else "idealized (custom " \
        "runtime) profile"
    logs = ", ".join(f"<code>{html.escape(str(p))}</code>" for p in summary.get("logs", []))
    wdesc = html.escape(str(win.get("describe") or win.get("spec") or win.get("size")))
    skipped_txt = ""
    if skipped:
        reasons = ", ".join(f"{k} {v:,}" for k, v in (tot.get("skipped") or {}).items() if v)
        skipped_txt = f"<br>Bad rows skipped: {skipped:,} ({html.escape(reasons)})"
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        "<title>flexshard-stream replay report</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>flexshard-stream replay report</h1>",
        f"<p class='meta'>Logs: {logs}<br>",
        f"Topology: {html.escape(str(topo.get('summary', '')))}{_period(summary)}<br>",
        (f"B = {summary['batch_size']} samples per GPU per iteration "
         f"({summary.get('samples_per_iteration', '?')} samples per iteration); "
         f"{tot.get('windows', len(summary['windows']))} windows of {wdesc}; "
         f"{tot.get('samples', 0):,} samples, {tot.get('iterations', 0):,} iterations evaluated "
         f"per strategy; de-duplication {dedup}; cost model: {label}; "
         f"{tot.get('checks', 0)} re-sharder checks; "
         f"FlexShard memory budget {_fmt_bytes(summary.get('budget_bytes'), 4)} per GPU."),
        skipped_txt,
        "</p>",
    ]
    for w in summary.get("warnings") or []:
        parts.append(f"<p><b>Warning:</b> {html.escape(str(w))}</p>")
    if sp is not None:
        parts.append(f"<p><b>FlexShard with the re-sharder: {sp:.2f}x less communication time "
                     f"per iteration than row-wise, {html.escape(_vs_best(best))}</b> over the "
                     f"whole replay.</p>")
    parts += ["<h2>Totals over the replay</h2>", _totals_table(summary),
              ("<p class='meta'>Per-iteration figures are means over every evaluated iteration; "
               "peak memory is the largest over the replay; migration is what the re-sharder's "
               "plan changes moved (bytes received by GPUs).</p>")]
    for i, name in enumerate(PICTURES, 1):
        if captions.get(name) is None:        # nothing to draw (threshold: nothing replicated)
            parts.append(f"<h2>{i}. {html.escape(titles[name])}</h2><p>No plan of the "
                         "re-sharder replicated a row: there is no threshold to draw.</p>")
            continue
        parts.append(f"<h2>{i}. {html.escape(titles[name])}</h2><figure><img src='{name}' "
                     f"alt='{html.escape(titles[name])}'><figcaption>{captions[name]}"
                     f"</figcaption></figure>")
    parts += [cluster, "<h2>Windows</h2>", _windows_table(summary), _apply_section(summary),
              ("<p class='meta'>Written by <code>flexshard-stream report</code> from "
               "<code>summary.json</code>, <code>cdf.json</code> and <code>traffic/</code> in "
               "this directory; docs/REPLAY.md describes them.</p></body></html>")]
    return "\n".join(p for p in parts if p)
