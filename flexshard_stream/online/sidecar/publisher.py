"""Publishing under the sidecar's ``out_dir``: plans, deltas, the ``plan`` link, the pointer
``state.json``, pruning, the decision log and the counters file.

A change is published in this order: the delta file, the plan directory, ``state.json`` (atomic
rename: the commit point), then the ``plan`` symlink (a new symlink renamed over the old one), so a
reader finds a complete plan at every moment. Used by the planner thread only (and at start).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ...errors import ConfigError, FormatError
from ...formats.fields import field_int, field_str
from ...formats.files import fsync_directory, jsonable, read_json, write_json
from ...plans.delta import PlanDelta, plan_fingerprint
from ...plans.plan import Plan
from ..resharder import Decision
from .common import FORMAT_VERSION, STATE_FORMAT, log, remove_temp_entries, warn

__all__ = ["Publisher"]


def _check_state_fields(state: Mapping[str, Any], path: Path) -> None:
    """The fields of ``state.json`` a restart reads: ``seq`` (an integer >= 0), ``plan`` (a plan
    directory of this out_dir, ``plans/NNNNNN``: never a path elsewhere to load or link to) and
    ``plan_fingerprint`` (a string). FormatError naming the field otherwise."""
    field_int(state, "seq", str(path))
    plan = field_str(state, "plan", str(path))
    if re.fullmatch(r"plans/[0-9]{6,}", plan) is None:
        raise FormatError(f"{path}: field 'plan' must name a plan directory plans/NNNNNN of this "
                          f"out_dir, got {plan[:80]!r}")
    field_str(state, "plan_fingerprint", str(path))


def _numbered(directory: Path, suffix: str) -> list[tuple[int, Path]]:
    """Entries ``NNNNNN<suffix>`` of ``directory`` with their numbers."""
    if not directory.is_dir():
        return []
    found = []
    for p in directory.iterdir():
        stem = p.name[:-len(suffix)] if suffix and p.name.endswith(suffix) else p.name
        if stem.isdigit():
            found.append((int(stem), p))
    return found


class Publisher:
    """Publishes the plans the re-sharder moves to, under ``out_dir``.

    ``seq`` is the number of the published plan (0: the first one of a run), ``plan`` and
    ``fingerprint`` the published plan; ``plans_published`` counts changes published by this
    process. ``keep_plans`` plan directories and ``keep_deltas`` deltas (None: all) are kept.
    """

    def __init__(self, out_dir: Path, *, keep_plans: int, keep_deltas: int | None):
        self.out_dir = Path(out_dir)
        self.keep_plans, self.keep_deltas = keep_plans, keep_deltas
        self.seq = 0
        self.plan: Plan | None = None
        self.fingerprint: str | None = None
        self.plans_published = 0
        self.pending = False     # a change whose publication failed: retried by retry()
        self._last_counters: dict | None = None

    def remove_temp_files(self) -> None:
        """Remove the temp files a killed process left behind in ``out_dir``, ``plans/`` and
        ``deltas/``."""
        remove_temp_entries(self.out_dir, (".state.json.", ".counters.json.", ".plan.",
                                           ".probe."))
        remove_temp_entries(self.out_dir / "plans")
        remove_temp_entries(self.out_dir / "deltas")

    # ------------------------------------------------------------------ publishing
    def publish_change(self, decision: Decision, plan: Plan, batches_in_stats: int) -> None:
        """Publish ``plan``, which ``decision`` moved to, with its delta from the published plan
        (the decision's own, unless an earlier publication failed)."""
        delta = decision.delta
        if delta is None or delta.base_fingerprint != self.fingerprint:
            delta = PlanDelta.between(self.plan, plan)
        self.pending = True
        self._publish(plan, delta, decision, batches_in_stats)
        self.pending = False

    def retry(self, plan: Plan, batches_in_stats: int) -> None:
        """After a failed publication: publish ``plan`` (the one in force) now. Raises again on
        failure (still pending)."""
        if self.pending:
            self._publish(plan, PlanDelta.between(self.plan, plan), None, batches_in_stats)
            self.pending = False

    def _publish(self, plan: Plan, delta: PlanDelta, decision: Decision | None,
                 batches_in_stats: int) -> None:
        seq = self.seq + 1
        rel_delta = f"deltas/{seq:06d}.delta"
        (self.out_dir / "deltas").mkdir(exist_ok=True)
        delta.save(self.out_dir / rel_delta)
        rel_plan = f"plans/{seq:06d}"
        plan.save(self.out_dir / rel_plan)
        fp = plan_fingerprint(plan)
        self._write_state(seq, rel_plan, fp, delta=rel_delta, reset=False,
                          batches_in_stats=batches_in_stats, decision=decision)
        self._adopt(seq, plan, fp)
        self.link_plan(rel_plan)
        self.plans_published += 1
        self._prune(self.out_dir / "deltas", self.keep_deltas, ".delta")
        log.info("sidecar published plan %d (%s)", seq, decision.reason if decision else "")

    def publish_full(self, plan: Plan, *, reset: bool, batches_in_stats: int) -> None:
        """Publish ``plan`` without a delta: the first plan of a run (seq 0), or after a restart
        that could not trust the published state (``reset``: readers reload the plan)."""
        seq = self._next_free_seq() if reset else 0
        fp = plan_fingerprint(plan)
        rel_plan = f"plans/{seq:06d}"
        plan.save(self.out_dir / rel_plan)
        self._write_state(seq, rel_plan, fp, delta=None, reset=reset,
                          batches_in_stats=batches_in_stats, decision=None)
        self._adopt(seq, plan, fp)
        self.link_plan(rel_plan)

    def _write_state(self, seq: int, rel_plan: str, fp: str, *, delta: str | None, reset: bool,
                     batches_in_stats: int, decision: Decision | None) -> None:
        write_json(self.out_dir / "state.json", {
            "format": STATE_FORMAT, "version": FORMAT_VERSION, "seq": seq, "plan": rel_plan,
            "plan_fingerprint": fp, "delta": delta,
            "base_fingerprint": None if delta is None else self.fingerprint, "reset": reset,
            "time": time.time(), "pid": os.getpid(), "batches_in_stats": batches_in_stats,
            "decision": None if decision is None else decision.to_json()})

    def _adopt(self, seq: int, plan: Plan, fp: str) -> None:
        self.seq, self.plan, self.fingerprint = seq, plan, fp

    def _next_free_seq(self) -> int:
        seqs = [self.seq] + [n for sub, suffix in (("deltas", ".delta"), ("plans", ""))
                             for n, _ in _numbered(self.out_dir / sub, suffix)]
        return max(seqs) + 1

    def link_plan(self, rel: str) -> None:
        """Point ``out_dir/plan`` at ``rel`` (atomic rename of a new symlink), prune old plans."""
        link = self.out_dir / "plan"
        tmp = self.out_dir / f".plan.{os.getpid()}.link.tmp"
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if os.path.lexists(link) and not link.is_symlink():  # never deleted: not the sidecar's
            raise ConfigError(f"{link}: a real file or directory where the sidecar publishes its "
                              "plan link; the sidecar did not write it and leaves it: move it "
                              "away")
        os.symlink(rel, tmp)
        os.replace(tmp, link)  # readers see the old plan or the new one, never none
        fsync_directory(self.out_dir)
        self._prune(self.out_dir / "plans", self.keep_plans, "")

    @staticmethod
    def _prune(directory: Path, keep: int | None, suffix: str) -> None:
        if keep is None:
            return
        for _, p in sorted(_numbered(directory, suffix))[:-keep]:
            if p.is_dir() and not p.is_symlink():   # a link is removed, never followed
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)

    # ------------------------------------------------------------------ restart
    def take_over(self, usable: Callable[[Plan, Path], None], fallback: str) -> Plan | None:
        """At a restart: adopt the published plan when ``state.json`` and its plan verify
        (``usable(plan, path)`` raises ConfigError for one made for other tables), and return it;
        else None, with a :class:`SidecarWarning` if something was there (the caller republishes
        its ``fallback`` plan as a reset; sequence numbers go on past the unusable one)."""
        path = self.out_dir / "state.json"
        state = None
        try:
            state = read_json(path, "sidecar state file")
            if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
                raise FormatError(f"{path}: not a sidecar state file")
            _check_state_fields(state, path)
            pub = Plan.load(self.out_dir / state["plan"])
            fp = plan_fingerprint(pub)
            if fp != state.get("plan_fingerprint"):
                raise FormatError(f"{self.out_dir / state['plan']}: does not match the "
                                  "fingerprint in state.json")
            usable(pub, self.out_dir / state["plan"])
            self._adopt(int(state["seq"]), pub, fp)
            link = self.out_dir / "plan"
            if not link.is_symlink() or os.readlink(link) != state["plan"]:
                self.link_plan(state["plan"])  # a crash between state.json and the link
            return pub
        except FormatError as e:
            if path.exists() or state is not None:
                warn(f"the published plan cannot be used ({e}); republishing the {fallback} "
                     "plan as a reset")
            if isinstance(state, dict) and isinstance(state.get("seq"), int):
                self.seq = max(self.seq, int(state["seq"]))
        except KeyError as e:
            warn(f"{path} lacks {e}; republishing the plan as a reset")
        return None

    # ------------------------------------------------------------------ logs
    def append_decision(self, decision: Decision, batches_in_stats: int) -> None:
        """One line of ``decisions.jsonl``: the decision, the batches it saw, the time."""
        doc = jsonable(decision.to_json())
        doc["batches_in_stats"] = batches_in_stats
        doc["time"] = time.time()
        fd = os.open(self.out_dir / "decisions.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT
                     | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "a") as f:
            f.write(json.dumps(doc) + "\n")

    def write_counters(self, doc: Mapping[str, Any], *, force: bool = False) -> None:
        """Rewrite ``counters.json`` with ``doc`` (its time and pid added) unless nothing changed
        since the last write (``force``: write anyway). Not fsynced: it survives the process
        (kill -9), not necessarily a power loss."""
        if not force and doc == self._last_counters:
            return
        self._last_counters = dict(doc)
        write_json(self.out_dir / "counters.json", {**doc, "time": time.time(),
                                                     "pid": os.getpid()}, fsync=False)
