"""The tracer's collective progress and hang watchdog (a mixin of tracer_rows._Tracer, run by its
background thread).

A watchdog (the same background thread) notices a collective outstanding past a bound learned from
the job (the longest of 10 x its median step and twice the longest completed call of that
collective, at least `hang_min_s`), then files a hang incident (landing/incidents/<id>.json), asks
every rank for its stacks (landing/requests/<job>.stacks.json) and writes its own stacks and
collective progress (landing/stacks/<id>/rank<R>.txt and fr_rank<R>.json, the Flight Recorder's
JSON layout: torch's own recorder when TORCH_FR_BUFFER_SIZE is set, else the tracer's ring buffer).
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from fleetscope.collectors import stacks as _stacks
from fleetscope.collectors.incidents import file_incident, incident_id

_now = time.time_ns
BACKEND: dict = {}   # {"name": "nccl" | "gloo"}: set by the collective hooks, named in the progress dump
P2P_FNS = {"send", "recv", "isend", "irecv"}


class _Coll:
    """One collective call: kept in the progress ring buffer (Flight Recorder layout) and, while
    outstanding, in the tracer's in-flight set that the watchdog checks."""
    __slots__ = ("rid", "fn", "gid", "seq", "p2p", "peer", "issue", "end", "nbytes", "sizes", "work", "state")

    def __init__(self, rid, fn, gid, seq, p2p, peer, issue, nbytes, sizes):
        self.rid, self.fn, self.gid, self.seq, self.p2p, self.peer = rid, fn, gid, seq, p2p, peer
        self.issue, self.end, self.nbytes, self.sizes = issue, None, nbytes, sizes
        self.work, self.state = None, "scheduled"


class Watchdog:
    """The tracer's collective bookkeeping (begin_coll / end_coll from the hooks and the GPU poller),
    the hang check and the Flight Recorder-style progress dump. The state lives on the tracer."""

    def begin_coll(self, fn, gid, nbytes, sizes, peer=None) -> _Coll:
        p2p = fn in P2P_FNS
        if p2p:  # numbered per group, peer and direction, as the other side numbers its matching calls
            key = (gid, peer, "send" if fn in ("send", "isend") else "recv")
            self.p2p_seq[key] += 1
            seq = self.p2p_seq[key]
        else:
            self.seq[gid] += 1
            seq = self.seq[gid]
        self._rid += 1
        c = _Coll(self._rid, fn, gid, seq, p2p, peer, _now(), nbytes, sizes)
        self.progress.append(c)
        self.inflight[c.rid] = c
        return c

    def end_coll(self, c: _Coll, end_ns: int | None, state: str = "completed"):
        c.end, c.state, c.work = end_ns, state, None
        self.inflight.pop(c.rid, None)
        if end_ns is not None and state == "completed" and len(self.step_ends) >= 2:
            # (not the first steps: their collectives also wait for the ranks' start-up skew)
            self.coll_durs[c.fn].append(end_ns - c.issue)

    def hang_bound_ns(self, fn: str) -> float:
        """How long a collective may stay outstanding before it is a hang, learned from the job:
        the longest of hang_factor x its median step and twice the longest completed call of that
        collective (waits for a slow peer, a checkpointing rank, included), never below hang_min_s;
        before four steps, hang_warmup_s (rendezvous, first compilation)."""
        if len(self.step_ends) < 4:
            return self.hang_warmup_s * 1e9
        ends = list(self.step_ends)
        steps = sorted(b - a for a, b in zip(ends[:-1], ends[1:]))
        longest = max(self.coll_durs.get(fn, ()), default=0)
        return max(self.hang_min_s * 1e9, self.hang_factor * steps[len(steps) // 2], 2.0 * longest)

    def check_hang(self, now_ns: int | None = None) -> str | None:
        """The watchdog: the oldest outstanding collective past its bound -> an incident. One per
        hang: once filed, nothing more until every collective outstanding then has finished."""
        now_ns = now_ns or _now()
        if self._hang_open is not None:
            if any(c.rid <= self._hang_open for c in self.inflight.values()):
                return None
            self._hang_open = None
        for c in sorted(list(self.inflight.values()), key=lambda c: c.issue):
            w = c.work
            if w is not None and _completed(w):
                continue  # done, not waited yet: the training thread records it at wait()
            bound = self.hang_bound_ns(c.fn)
            if now_ns - c.issue > bound:
                self._hang_open = max(self.inflight)
                return self.file_hang(c, now_ns, bound)
            return None
        return None

    def file_hang(self, c: _Coll, now_ns: int, bound_ns: float) -> str:
        inc = _claim_incident(self.landing, self.job_id, now_ns)
        if inc is not None:  # this rank saw it first: the incident request and every rank's dumps
            what = f"{c.fn} #{c.seq} of group {c.gid}" + (f" with peer {c.peer}" if c.peer is not None else "")
            file_incident(self.landing, inc, {
                "kind": "hang", "job_id": self.job_id, "capture": self.capture, "from_ns": c.issue,
                "note": f"fleetscope tracer watchdog on rank {self.rank} ({self.host}): {what} outstanding for "
                        f"{(now_ns - c.issue) / 1e9:.1f} s, past the bound of {bound_ns / 1e9:.1f} s learned from the job"},
                stacks_of=self.job_id)
        else:
            inc = _current_incident(self.landing, self.job_id)
        if inc:
            _stacks.dump_once(self.landing, inc, self.rank)
            self.incidents.append(inc)
        return inc

    def progress_dump(self) -> dict:
        """The collective progress in the Flight Recorder's JSON layout (what torch's
        _dump_fr_trace_json writes), from the tracer's ring buffer."""
        entries = []
        for c in list(self.progress):
            entries.append({
                "record_id": c.rid, "pg_id": c.gid, "process_group": [c.gid, self.groups.get(c.gid, {}).get("desc", "")],
                "collective_seq_id": 0 if c.p2p else c.seq, "p2p_seq_id": c.seq if c.p2p else 0, "op_id": c.rid,
                "profiling_name": f"{BACKEND.get('name') or 'gloo'}:{c.fn}", "is_p2p": c.p2p, "peer": c.peer,
                "input_sizes": c.sizes, "output_sizes": c.sizes, "time_created_ns": c.issue,
                "time_discovered_completed_ns": c.end or 0, "state": c.state, "retired": c.state != "scheduled",
                "bytes": c.nbytes})
        pgs = {gid: {"name": gid, "desc": g.get("desc", ""), "ranks": json.dumps(g.get("ranks", []))} for gid, g in self.groups.items()}
        return {"version": "2.10", "rank": self.rank, "host": self.host, "source": "fleetscope.tracer", "time_ns": _now(),
                "pg_config": pgs, "entries": entries}


def _completed(work) -> bool:
    try:
        return bool(work.is_completed())
    except Exception:
        return False


def _work_duration_ns(work) -> int | None:
    """The collective's own duration measured on its stream (NCCL with TORCH_NCCL_ENABLE_TIMING=1)."""
    if work is None or not hasattr(work, "_get_duration"):
        return None
    try:
        return int(work._get_duration() * 1e6)
    except Exception:  # timing not enabled, or not a NCCL work
        return None


_INCIDENT_REUSE_S = 600.0


def _claim_incident(landing: Path, job_id: str, now_ns: int) -> str | None:
    """One incident per hang whichever rank sees it first: an exclusive lock file names it; a
    rank that finds a lock younger than _INCIDENT_REUSE_S joins that incident (returns None)."""
    lock = landing / "requests" / f"{job_id}.hang.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    inc = incident_id(job_id, "hang", now_ns)
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                if time.time() - lock.stat().st_mtime < _INCIDENT_REUSE_S:
                    return None
                lock.unlink()  # an old hang's lock: this is a new one
            except OSError:
                return None
            continue
        with os.fdopen(fd, "w") as f:
            f.write(inc)
        return inc
    return None


def _current_incident(landing: Path, job_id: str) -> str | None:
    try:
        return (landing / "requests" / f"{job_id}.hang.lock").read_text().strip() or None
    except OSError:
        return None
