"""Sidecar checkpoints: the format, writing, listing, reading and verifying, and what a restart
found (:class:`ResumeReport`).

A checkpoint is a directory built in a temp sibling and renamed into place::

    checkpoints/ckpt-NNNNNNNN/stats/<blob>        the statistics' state() blobs (stats.fss, or
                                                  window-<i>.fss per live sub-window)
    checkpoints/ckpt-NNNNNNNN/plan/, prev_target/ the re-sharder's plans (Plan.save)
    checkpoints/ckpt-NNNNNNNN/manifest.json       everything else, a size and sha256 per file, and
                                                  a checksum of the manifest itself

The manifest's ``stats`` and ``resharder`` sections are the ``state()`` of the statistics and of the
re-sharder (:mod:`flexshard_stream.stats.state`) without their blobs and plans. Checkpoints
written before that protocol carry no ``version`` (stats) and only the budget, migrated bytes and
checks (re-sharder): :func:`stats_state` and :func:`resharder_state` fill in what they lack.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from ...errors import ConfigError, FormatError
from ...formats.fields import (
    field_bool,
    field_int,
    field_mapping,
    field_number,
    field_str,
    mapping,
)
from ...formats.directories import read_directory, remove_output_directory, staging_directory
from ...formats.files import (
    check_json_digest,
    json_digest,
    jsonable,
    read_bytes,
    read_json,
    write_atomic,
    write_json,
)
from ...plans.delta import plan_fingerprint
from ...plans.plan import Plan
from ..resharder import Resharder
from .common import CHECKPOINT_FORMAT, COUNTER_KEYS, FORMAT_VERSION, log, warn
from .ingest import IngestWorker
from .publisher import Publisher

__all__ = ["Checkpoint", "ResumeReport", "Resumed", "checkpoint_number", "count_loss",
           "find_checkpoint", "holds_previous_run", "list_checkpoints", "read_checkpoint", "read_counters",
           "resharder_state", "resume", "stats_state", "write_checkpoint"]

_PLANS = ("plan", "prev_target")
#: What a checkpoint directory holds: all a checkpoint written again under its number replaces.
_CHECKPOINT_FILES = ("manifest.json", "stats/*", *(f"{p}/*" for p in _PLANS))


def list_checkpoints(out_dir: str | os.PathLike) -> list[Path]:
    """Checkpoint directories under ``out_dir/checkpoints``, newest (highest number) first."""
    root = Path(out_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        if p.is_dir() and p.name.startswith("ckpt-") and p.name[5:].isdigit():
            found.append((int(p.name[5:]), p))
    return [p for _, p in sorted(found, reverse=True)]


def holds_previous_run(out_dir: Path) -> bool:
    """Whether ``out_dir`` holds a sidecar run's state (a published plan or a checkpoint)."""
    return (Path(out_dir) / "state.json").exists() or bool(list_checkpoints(out_dir))


def checkpoint_number(path: Path) -> int:
    """The sequence number of a checkpoint directory (``ckpt-NNNNNNNN``)."""
    return int(path.name[5:])


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ------------------------------------------------------------------------------- writing


def write_checkpoint(out_dir: Path, seq: int, fields: Mapping[str, Any],
                     stats: Mapping[str, Any], resharder: Mapping[str, Any], *,
                     keep: int) -> Path:
    """Write checkpoint ``seq`` under ``out_dir/checkpoints`` and keep the newest ``keep``.

    ``fields``: the manifest's other entries (batches, counters, source, schedule, ...);
    ``stats``, ``resharder``: their ``state()``. Built in a temp directory, every file fsynced,
    then renamed into place: a crash leaves the previous checkpoints as they were.
    """
    final = Path(out_dir) / "checkpoints" / f"ckpt-{seq:08d}"
    with staging_directory(final, kind="sidecar-checkpoint", legacy=("manifest.json",),
                           owns=_CHECKPOINT_FILES) as tmp:
        for name, blob in stats["blobs"].items():
            if Path(name).name != name or name.startswith("."):
                raise FormatError(f"statistics state blob {name!r} is not a plain file name")
            write_atomic(tmp / "stats" / name, blob)
        for key in _PLANS:
            if resharder[key] is not None:
                resharder[key].save(tmp / key)
        files = {}
        for p in sorted(tmp.rglob("*")):
            if p.is_file():
                data = p.read_bytes()
                files[p.relative_to(tmp).as_posix()] = {"bytes": len(data),
                                                        "sha256": _sha256(data)}
        manifest = jsonable({
            "format": CHECKPOINT_FORMAT, "version": FORMAT_VERSION, "seq": seq,
            "created": time.time(), "pid": os.getpid(), **fields,
            "stats": {k: v for k, v in stats.items() if k != "blobs"},
            "resharder": {k: v for k, v in resharder.items() if k not in _PLANS},
            "has_prev_target": resharder["prev_target"] is not None, "files": files})
        manifest["checksum"] = json_digest(manifest)
        write_json(tmp / "manifest.json", manifest)
    for old in list_checkpoints(out_dir)[keep:]:
        remove_output_directory(old)
    return final


# ------------------------------------------------------------------------------- reading


def _verified_manifest(path: Path) -> dict:
    mpath = path / "manifest.json"
    m = read_json(mpath, "sidecar checkpoint manifest")
    if not isinstance(m, dict) or m.get("format") != CHECKPOINT_FORMAT:
        raise FormatError(f"{mpath}: not a sidecar checkpoint manifest")
    if m.get("version") != FORMAT_VERSION:
        raise FormatError(f"{mpath}: checkpoint version {m.get('version')!r} is not supported "
                          f"(this flexshard_stream reads version {FORMAT_VERSION})")
    check_json_digest(m, mpath, "checkpoint manifest")
    _check_manifest_fields(m, str(mpath))
    return m


def _check_manifest_fields(m: Mapping[str, Any], where: str) -> None:
    """The types and ranges of every manifest entry a restart reads (FormatError naming the
    field): progress, schedule, counters, the statistics' and re-sharder's state envelopes, the
    file list."""
    for key in ("batches", "ids"):
        field_int(m, key, where)
    sch = field_mapping(m, "schedule", where)
    field_int(sch, "position", f"{where} schedule")
    field_number(sch, "next_check", f"{where} schedule", optional=True)
    field_str(sch, "unit", f"{where} schedule")
    counters = field_mapping(m, "counters", where)
    for key in COUNTER_KEYS:
        field_int(counters, key, f"{where} counters")
    for key in ("lost", "source_batches", "source_ids"):
        field_int(m, key, where, default=0)
    field_mapping(m, "source", where, default={})
    field_mapping(m, "stats", where)
    field_mapping(m, "resharder", where)
    field_bool(m, "has_prev_target", where)
    for rel, spec in field_mapping(m, "files", where).items():
        field_int(mapping(spec, f"{where} files[{rel!r}]"), "bytes", f"{where} files[{rel!r}]")
        field_str(spec, "sha256", f"{where} files[{rel!r}]")


def _verified_files(path: Path, files: Mapping[str, Any]) -> dict[str, bytes]:
    """Check every listed file's size (before reading it) and sha256; return the statistics
    blobs by name."""
    mpath = path / "manifest.json"
    blobs: dict[str, bytes] = {}
    for rel, spec in files.items():
        parts = Path(rel).parts
        if not parts or Path(rel).is_absolute() or ".." in parts:
            raise FormatError(f"{mpath}: file name {rel!r} leaves the checkpoint")
        f = path / rel
        try:
            size = f.stat().st_size
        except OSError:
            raise FormatError(f"{f}: missing (listed in {mpath})") from None
        if size != spec["bytes"]:
            raise FormatError(f"{f}: {size} bytes, the manifest says {spec['bytes']}: the "
                              "checkpoint is damaged")
        data = read_bytes(f, "checkpoint file")
        if len(data) != spec["bytes"] or _sha256(data) != spec["sha256"]:
            raise FormatError(f"{f}: checksum mismatch ({len(data)} bytes, manifest says "
                              f"{spec['bytes']}): the checkpoint is damaged")
        if parts[0] == "stats":
            blobs[parts[-1]] = data
    return blobs


def read_checkpoint(path: str | os.PathLike) -> tuple[dict, Plan, Plan | None, dict[str, bytes]]:
    """Read and verify one checkpoint directory: ``(manifest, plan, prev_target, stats blobs)``.

    Verifies the manifest's checksum, then the size and sha256 of every file it lists; raises
    :class:`FormatError` naming the damaged or missing file.
    """
    return read_directory(path, _read_checkpoint)


def _read_checkpoint(path: Path) -> tuple[dict, Plan, Plan | None, dict[str, bytes]]:
    """:func:`read_checkpoint` of the resolved directory."""
    m = _verified_manifest(path)
    blobs = _verified_files(path, m["files"])
    plan = Plan.load(path / "plan")
    prev = Plan.load(path / "prev_target") if m.get("has_prev_target") else None
    return m, plan, prev, blobs


class Checkpoint(NamedTuple):
    """A checkpoint read and verified by :func:`find_checkpoint`."""

    path: Path
    manifest: dict
    plan: Plan
    prev_target: Plan | None
    blobs: dict[str, bytes]


def find_checkpoint(out_dir: Path, take_up: Callable[[Checkpoint], None],
                    skipped: list[str]) -> Checkpoint | None:
    """The newest checkpoint that verifies and that ``take_up`` accepts; each damaged one (a
    FormatError from reading it or from ``take_up``) is skipped, its reason appended to
    ``skipped``. Any other error of ``take_up`` (a ConfigError: a checkpoint made for other
    tables or another topology) is not a fallback: it propagates."""
    for path in list_checkpoints(out_dir):
        try:
            ckpt = Checkpoint(path, *read_checkpoint(path))
            take_up(ckpt)
        except FormatError as e:
            skipped.append(f"{path.name}: {e}")
            continue
        return ckpt
    return None


def stats_state(ckpt: Checkpoint) -> dict[str, Any]:
    """The statistics' ``state()`` saved in ``ckpt`` (its blobs put back)."""
    # a checkpoint written before the state protocol has no version there: its layout is version 1
    return {"version": 1, **ckpt.manifest["stats"], "blobs": ckpt.blobs}


def resharder_state(ckpt: Checkpoint, fresh: Mapping[str, Any]) -> dict[str, Any]:
    """The re-sharder's ``state()`` saved in ``ckpt``; entries an older checkpoint lacks (the
    envelope, :meth:`Resharder.update`'s schedule) are those of ``fresh``, a new re-sharder's."""
    return {**fresh, **ckpt.manifest["resharder"], "plan": ckpt.plan,
            "prev_target": ckpt.prev_target}


# ------------------------------------------------------------------------------- the loss


def read_counters(path: Path) -> dict | None:
    """``counters.json`` if it holds every cumulative counter, else None (with a warning when
    the file is there but unusable)."""
    try:
        doc = mapping(read_json(path, "sidecar counters file"), str(path))
        for key in COUNTER_KEYS:
            field_int(doc, key, str(path))
        field_number(doc, "time", str(path), lo=0.0)
        field_bool(doc, "closed", str(path), default=False)
        return dict(doc)
    except FormatError as e:
        if path.exists():
            warn(f"counters file unusable ({e}); the loss since the checkpoint is unknown")
        return None


def count_loss(report: ResumeReport, at_checkpoint: Mapping[str, int] | None,
               counters: Mapping[str, Any] | None) -> dict[str, int]:
    """Fill ``report``'s loss from the counters file against the checkpoint's counters (None: no
    checkpoint); return the cumulative counters the restarted sidecar goes on from (batches lost
    count as processed: the dead process's queue is gone)."""
    mc = at_checkpoint if at_checkpoint is not None else dict.fromkeys(COUNTER_KEYS, 0)
    if counters is not None and counters["accepted"] >= mc["accepted"] \
            and counters["processed"] >= mc["processed"]:
        report.lost_batches = counters["accepted"] - mc["processed"]
        report.lost_ids = counters["accepted_ids"] - mc["processed_ids"]
        report.dropped_after_checkpoint = counters["dropped"] - mc["dropped"]
        report.counted_at = float(counters["time"])
        report.source = "counters"
        # written at a clean shutdown (nothing was accepted after it): the count is exact
        report.exact = bool(counters.get("closed"))
        base = {k: int(counters[k]) for k in COUNTER_KEYS}
    else:
        base = {k: int(mc[k]) for k in COUNTER_KEYS}
    base["processed"], base["processed_ids"] = base["accepted"], base["accepted_ids"]
    return base


@dataclass
class ResumeReport:
    """What a restart found (``Sidecar.resume_report``; also logged).

    checkpoint : str | None       the checkpoint resumed from (None: started empty)
    skipped : list[str]           damaged checkpoints skipped, each with the reason (file named)
    batches_in_checkpoint : int   batches whose statistics the checkpoint holds
    lost_batches, lost_ids : int | None   batches (IDs) accepted after the checkpoint whose
                                  statistics were lost with the previous process; None: unknown
    dropped_after_checkpoint : int | None  batches dropped by the queue policy after the checkpoint
    exact : bool                  True when the counts are exact (ring counters in shared memory);
                                  False: from ``counters.json`` (a lower bound: batches submitted
                                  after its last write, at most ``counters_every_s`` before the
                                  crash, are not counted)
    counted_at : float | None     unix time (s) of the counter record used
    source : str | None           "ring" or "counters"
    plan_seq : int                published plan sequence number in force after the restart
    plan_from : str               "published" (out_dir/plan), "checkpoint" or "initial"
    message : str                 all of the above in one sentence
    """

    checkpoint: str | None = None
    skipped: list[str] = field(default_factory=list)
    batches_in_checkpoint: int = 0
    lost_batches: int | None = None
    lost_ids: int | None = None
    dropped_after_checkpoint: int | None = None
    exact: bool = False
    counted_at: float | None = None
    source: str | None = None
    plan_seq: int = 0
    plan_from: str = "initial"
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        return jsonable(dataclasses.asdict(self))

    def describe(self) -> str:
        """The report in one sentence (what :attr:`message` holds once the restart is done)."""
        if self.checkpoint is None:
            head, since = "no usable checkpoint: statistics start empty", "the previous run(s)"
        else:
            head = (f"resumed from {Path(self.checkpoint).name} ({self.batches_in_checkpoint} "
                    "batches in its statistics)")
            since = "it"
        return f"{head}; {self._loss(since)}; plan {self.plan_seq} from the {self.plan_from} state"

    def _loss(self, since: str) -> str:
        if self.lost_batches is None:
            return (f"batches accepted after {since} are lost; how many is unknown (no usable "
                    "counters)")
        when = (time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.counted_at))
                if self.counted_at else "?")
        kind = "exactly" if self.exact else "at least"
        ids = "" if self.lost_ids is None else f" ({self.lost_ids} IDs)"
        loss = (f"{kind} {self.lost_batches} batches{ids} accepted after {since} were lost" +
                ("" if self.exact else f" (counted up to {when}; batches submitted after that "
                 "are not counted)"))
        if self.dropped_after_checkpoint:
            loss += f"; {self.dropped_after_checkpoint} were dropped by the queue policy"
        return loss

    def count_exactly(self, batches: int, ids: int, source: str) -> None:
        """Replace the loss counted from the counters file by an exact count from ``source`` (the
        ring's read counter in shared memory), and :meth:`finish` again."""
        self.lost_batches, self.lost_ids = int(batches), int(ids)
        self.exact, self.source, self.counted_at = True, source, time.time()
        self.finish()

    def finish(self) -> None:
        """Set :attr:`message` and log it (a warning when batches were lost or checkpoints
        skipped)."""
        self.message = self.describe()
        (log.warning if (self.lost_batches or self.skipped) else log.info)("%s", self.message)


# ------------------------------------------------------------------------------- restart


@dataclass
class Resumed:
    """What :func:`resume` found, for the sidecar to go on from."""

    taken_up: bool                 # a checkpoint or the published plan was taken up
    counters: dict[str, int]       # cumulative counters of the earlier runs
    lost_before: int               # batches lost in crashes before the checkpoint's run
    lost_total: int                # ... and since it (as far as counted)
    checkpoint_seq: int            # the highest checkpoint number on disk


def resume(out_dir: Path, report: ResumeReport, *, stats: Any, resharder: Resharder,
           ingest: IngestWorker, publisher: Publisher,
           check_plan: Callable[[Plan, Path], None]) -> Resumed:
    """Restart from ``out_dir``: restore the newest good checkpoint into ``stats``,
    ``resharder`` and ``ingest`` (their ``restore``), take over the published plan when it
    verifies (it is what the training job has), count the loss since the checkpoint; fill
    ``report``. ``check_plan(plan, where)`` raises ConfigError for a plan made for other tables
    or another topology."""
    ckpt = find_checkpoint(out_dir, lambda c: _take_up(c, stats, resharder, ingest, report),
                           report.skipped)
    if report.skipped:
        where = f"resuming from {ckpt.path.name}" if ckpt else "no good checkpoint left"
        warn("skipped damaged checkpoint(s): " + "; ".join(report.skipped) + f"; {where}")
    published = publisher.take_over(check_plan, "checkpoint" if ckpt else "initial")
    if published is not None:
        if ckpt is None or plan_fingerprint(ckpt.plan) != publisher.fingerprint:
            # plans moved on after the checkpoint: the training job has the published one
            resharder.restore({**resharder.state(), "plan": published, "prev_target": None})
        report.plan_from = "published"
    report.plan_seq = publisher.seq
    counters = count_loss(report, ckpt.manifest["counters"] if ckpt else None,
                          read_counters(out_dir / "counters.json"))
    lost_before = int(ckpt.manifest.get("lost", 0)) if ckpt else 0
    report.finish()
    return Resumed(ckpt is not None or published is not None, counters, lost_before,
                   lost_before + (report.lost_batches or 0),
                   max([0] + [checkpoint_number(p) for p in list_checkpoints(out_dir)]))


def _take_up(ckpt: Checkpoint, stats: Any, resharder: Resharder, ingest: IngestWorker,
             report: ResumeReport) -> None:
    """Restore ``ckpt`` into the re-sharder, the statistics (which must be empty) and the
    ingestion's progress. A FormatError means: try the previous checkpoint."""
    if stats.view().batches:
        raise ConfigError("resume=True needs empty statistics: the checkpoint's are loaded "
                          "into them")
    try:
        notes = resharder.restore(resharder_state(ckpt, resharder.state()))
        notes += stats.restore(stats_state(ckpt))
    except ConfigError as e:
        raise ConfigError(f"checkpoint {ckpt.path}: {e}; use a new out_dir (or resume=False) "
                          "after changing tables, topology or sketch sizes") from e
    except FormatError as e:
        raise FormatError(f"{ckpt.path}: {e}") from e
    for note in notes:
        warn(f"checkpoint {ckpt.path}: {note}; continuing with the new setting")
    ingest.restore_progress(ckpt.manifest)
    report.checkpoint, report.plan_from = str(ckpt.path), "checkpoint"
    report.batches_in_checkpoint = int(ckpt.manifest["batches"])
