"""PerfTracker 4.1: detect performance degradation from the API events (dataloader.next,
optimizer.step) of each rank, and close the loop with a profiling request for the collector.

- iteration detection: the event stream is cut before each dataloader.next that follows an
  optimizer.step; a name sequence seen `n_identical` (10) times in a row is the iteration sequence;
- degraded: after each matched iteration, the mean of the last `recent` (50) iterations exceeds
  their fast reference by more than `threshold` (5 %); reported when the state turns degraded.
  The paper's reference is the shortest iteration; one unusually fast iteration then makes every
  ordinary one look degraded (healthy runs on a loaded machine crossed 3.5x), so the reference is
  the `reference_q` (0.1) quantile of the window (0: the paper's minimum);
- blocked: no event for longer than `block_factor` mean iterations (the paper uses 1.0; the
  default 3.0 keeps slow iterations on a noisy machine, up to ~2-3x the mean on a loaded shared
  CPU box, from reading as blocked) and for at least `min_idle_ns` (1 s, like XPUTimer's hang
  timeout), between any two events or until `now_ns`;
- after `redetect_after` (200) consecutive unmatched events the sequence is detected again.
The event loop runs per rank in Python: a handful of API events per step, not kernel rows.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import polars as pl

from fleetscope.collectors.incidents import file_incident, incident_id
from fleetscope.schemas.base import conform
from fleetscope.findings.verdicts import make_verdicts
from fleetscope.xputimer import schemas as S
from fleetscope.xputimer.detectors import TEAM_FOR_CAUSE

LOADER, OPT = "dataloader.next", "optimizer.step"


def _candidates(names: list[str]):
    """Split an event-name list into candidate iterations: (first index, last index) pairs."""
    out, start = [], 0
    for i in range(1, len(names)):
        if names[i] == LOADER and names[i - 1] == OPT:
            out.append((start, i - 1))
            start = i
    return out, start


def _rank_degradation(names, starts, ends, n_identical, recent, threshold, redetect_after, block_factor, now_ns, min_idle_ns,
                      reference_q=0.1):
    iters, events = [], []
    cands, tail = _candidates(names)

    def _blocked_gaps(a, b):
        if not durs:
            return
        mean = float(np.mean(durs[-recent:]))
        prev = np.concatenate([[last_end if last_end is not None else starts[a]], ends[a:b]])
        gaps = starts[a:b + 1] - prev
        for j in np.nonzero(gaps > max(block_factor * mean, min_idle_ns))[0]:
            events.append(("blocked", int(prev[j]), len(iters) - 1, mean, float(min(durs[-recent:])),
                           float(gaps[j]) / mean, int(gaps[j])))

    pattern, run_seq, run_len, unmatched = None, None, 0, 0
    durs: list[int] = []
    degraded = False
    last_end = None
    for a, b in cands:
        seq = tuple(names[a:b + 1])
        complete = seq[0] == LOADER and seq[-1] == OPT
        # blocked: no event for longer than block_factor mean iterations, between any two events
        # (a rank waiting in a collective inside the iteration blocks between its own API events)
        _blocked_gaps(a, b)
        last_end = int(max(ends[a:b + 1]))
        if pattern is None:
            if not complete:
                run_seq, run_len = None, 0
                continue
            run_len = run_len + 1 if seq == run_seq else 1
            run_seq = seq
            if run_len >= n_identical:
                pattern, unmatched = seq, 0
            continue
        if seq != pattern:
            unmatched += len(seq)
            if unmatched >= redetect_after:
                pattern, run_seq, run_len, degraded = None, None, 0, False
            continue
        unmatched = 0
        d = int(ends[b] - starts[a])
        durs.append(d)
        iters.append((len(iters), int(starts[a]), int(ends[b]), d))
        win = durs[-recent:]
        if len(win) >= min(recent, n_identical):
            mean, mn = float(np.mean(win)), float(np.quantile(win, reference_q)) if reference_q else float(min(win))
            now_bad = mean > (1 + threshold) * mn
            if now_bad and not degraded:
                events.append(("degraded", int(ends[b]), len(iters) - 1, mean, mn, mean / mn, None))
            degraded = now_bad
    # the unfinished last iteration: a stall before it (or inside it, when the job went on) counts too
    # (a capture that ends one step after a stall, e.g. when a profile took the steps around it)
    if tail < len(names):
        _blocked_gaps(tail, len(names) - 1)
        last_end = int(max(ends[tail:])) if last_end is None else max(last_end, int(max(ends[tail:])))
    if now_ns is not None and durs and last_end is not None:
        mean = float(np.mean(durs[-recent:]))
        if now_ns - last_end > max(block_factor * mean, min_idle_ns):
            events.append(("blocked", int(last_end), len(iters) - 1, mean, float(min(durs[-recent:])),
                           (now_ns - last_end) / mean, int(now_ns - last_end)))
    return iters, events


def detect_degradation(t: pl.DataFrame, n_identical: int = 10, recent: int = 50, threshold: float = 0.05,
                       reference_q: float = 0.1,
                       redetect_after: int = 200, block_factor: float = 3.0, now_ns: int | None = None,
                       min_idle_ns: int = 1_000_000_000
                       ) -> tuple[pl.DataFrame, pl.DataFrame]:
    """timings (api rows are used) -> (xputimer_iterations, xputimer_degradations)."""
    if "capture_id" not in t.columns:
        t = t.with_columns(pl.lit("capture").alias("capture_id"))
    api = t.filter((pl.col("kind") == "api") & pl.col("name").is_in([LOADER, OPT])).sort("start_ns")
    it_rows, ev_rows = [], []
    for (cap, rank), g in api.group_by(["capture_id", "rank"], maintain_order=True):
        iters, events = _rank_degradation(g["name"].to_list(), g["start_ns"].to_numpy(), g["end_ns"].to_numpy(),
                                          n_identical, recent, threshold, redetect_after, block_factor, now_ns, min_idle_ns,
                                          reference_q)
        it_rows += [{"capture_id": cap, "rank": rank, "iteration": i, "start_ns": s, "end_ns": e, "dur_ns": d} for i, s, e, d in iters]
        ev_rows += [{"capture_id": cap, "rank": rank, "kind": k, "at_ns": at, "iteration": i, "recent_mean_ns": m,
                     "recent_min_ns": mn, "ratio": r, "idle_ns": idle} for k, at, i, m, mn, r, idle in events]
    its = conform(pl.DataFrame(it_rows, infer_schema_length=None) if it_rows else pl.DataFrame(), S.ITERATIONS)
    evs = conform(pl.DataFrame(ev_rows, infer_schema_length=None) if ev_rows else pl.DataFrame(), S.DEGRADATIONS)
    return S.ITERATIONS.validate(its.sort("capture_id", "rank", "iteration")), S.DEGRADATIONS.validate(evs.sort("capture_id", "at_ns"))


def degradation_verdicts(deg: pl.DataFrame, job_id: str | None = None) -> pl.DataFrame:
    """One verdict per capture and kind (the earliest event). Degraded is `info` (it triggers
    profiling; the localization of the profile names the owner); blocked is a `warning` to
    operations (a hang is a machine problem until shown otherwise, XPUTimer section 5.1)."""
    if deg.height == 0:
        return make_verdicts([])
    first = deg.sort("at_ns").group_by("capture_id", "kind", maintain_order=True).agg(
        pl.all().first(), pl.col("rank").unique().sort().alias("ranks"))
    rows = []
    for r in first.iter_rows(named=True):
        job = job_id or r["capture_id"]
        if r["kind"] == "degraded":
            rows.append(dict(detector="xputimer.degradation", scope="job", subject=job, job_id=job, capture_id=r["capture_id"],
                             start_ns=r["at_ns"], metric="iteration_mean_over_min", value=r["ratio"], baseline=1.05,
                             severity="info", team=TEAM_FOR_CAUSE["degraded"],
                             explanation=f"iterations slowed: recent mean {r['recent_mean_ns'] / 1e6:.1f} ms is {r['ratio'] - 1:.1%} "
                                         f"above the recent shortest ({r['recent_min_ns'] / 1e6:.1f} ms) on ranks {r['ranks']}; "
                                         f"an on-demand profile was requested for localization."))
        else:
            rows.append(dict(detector="xputimer.degradation", scope="job", subject=job, job_id=job, capture_id=r["capture_id"],
                             start_ns=r["at_ns"], metric="idle_over_mean_iteration", value=r["ratio"], baseline=1.0,
                             severity="warning", team=TEAM_FOR_CAUSE["blocked"],
                             explanation=f"training blocked: no data-loader or optimizer event for {r['idle_ns'] / 1e9:.2f} s "
                                         f"({r['ratio']:.1f} mean iterations) on ranks {r['ranks']}; take stack dumps "
                                         f"(landing/stacks/) to find the hung rank."))
    return make_verdicts(rows)


def write_profile_request(landing_dir: str | os.PathLike, job_id: str, degradation: dict | None = None,
                          steps: int = 3, capture: str | None = None) -> Path:
    """Write landing/requests/<job_id>.json, which the job's fleetscope.collectors.profiler_capture watcher
    serves once (by id) on every rank: a `steps`-step torch.profiler window dropped into
    landing/traces/<capture>/. Atomic (rename), so a rank never reads half a request."""
    degradation = degradation or {}
    rid = f"{degradation.get('kind', 'manual')}-{degradation.get('at_ns', time.time_ns())}"
    req = {"kind": "profile", "id": rid, "steps": int(steps), "capture": capture or f"{job_id}-prof-{rid}",
           "note": f"requested by fleetscope after {degradation.get('kind', 'a manual request')}"
                   + (f" (ratio {degradation['ratio']:.3f})" if degradation.get("ratio") is not None else ""),
           "created_ns": time.time_ns()}
    p = Path(landing_dir) / "requests" / f"{job_id}.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(req))
    os.replace(tmp, p)
    return p


def blocked_jobs(last_events: pl.DataFrame, iterations: pl.DataFrame | None, now_ns: int, block_factor: float = 3.0,
                 min_idle_ns: int = 120_000_000_000, max_age_ns: int = 6 * 3600 * 10**9) -> pl.DataFrame:
    """The 'blocked' check against the current time, for jobs that may be hung right now.

    last_events: per (job_id, capture_id, rank) the rank's last landed event (`last_ns`) and whether
    that event was the tracer's `tracer.stop` (`stopped`: the job ended there). A job is blocked now
    when some rank of its latest capture has not stopped and the job's last event is older than
    max(block_factor x its mean iteration (xputimer_iterations), min_idle_ns) — the idle bound
    must exceed the tracer's flush interval plus ingestion (30 s + a sensor tick), hence 120 s —
    and younger than max_age_ns (older silence is a job that died long ago, not a hang to chase).
    -> job_id, capture_id, last_ns, idle_ns, mean_iteration_ns, ranks_running."""
    cols = {"job_id": pl.Utf8, "capture_id": pl.Utf8, "last_ns": pl.Int64, "idle_ns": pl.Int64,
            "mean_iteration_ns": pl.Float64, "ranks_running": pl.List(pl.Int32)}
    if last_events.height == 0:
        return pl.DataFrame(schema=cols)
    ev = last_events.with_columns(pl.col("rank").cast(pl.Int32))
    latest = ev.group_by("job_id", "capture_id").agg(pl.col("last_ns").max().alias("_cap_last")).sort("_cap_last").group_by(
        "job_id").agg(pl.col("capture_id").last(), pl.col("_cap_last").last().alias("last_ns"))
    ranks = ev.join(latest.select("job_id", "capture_id"), on=["job_id", "capture_id"]).group_by("job_id").agg(
        pl.col("rank").filter(~pl.col("stopped")).sort().alias("ranks_running"))
    out = latest.join(ranks, on="job_id")
    if iterations is not None and iterations.height:
        its = iterations.group_by("capture_id").agg(pl.col("dur_ns").mean().alias("_m"))
        per_job = ev.select("job_id", "capture_id").unique().join(its, on="capture_id").group_by("job_id").agg(
            pl.col("_m").median().alias("mean_iteration_ns"))
        out = out.join(per_job, on="job_id", how="left")
    else:
        out = out.with_columns(pl.lit(None, pl.Float64).alias("mean_iteration_ns"))
    out = out.with_columns(idle_ns=(pl.lit(now_ns) - pl.col("last_ns")).cast(pl.Int64))
    bound = pl.max_horizontal(pl.col("mean_iteration_ns").fill_null(0) * block_factor, pl.lit(float(min_idle_ns)))
    out = out.filter((pl.col("ranks_running").list.len() > 0) & (pl.col("idle_ns") > bound) & (pl.col("idle_ns") < max_age_ns))
    return out.select(list(cols)).sort("job_id")


def write_hang_incident(landing_dir: str | os.PathLike, job_id: str, capture: str | None, from_ns: int, note: str,
                        now_ns: int | None = None) -> str:
    """File a hang incident (landing/incidents/<id>.json, docs/CONTRACT.md 1.7) and ask the job's
    ranks for their stacks and collective progress into landing/stacks/<id>/ (the request file
    the collectors' stack watchers serve, collectors/stacks.py). Returns the incident id."""
    inc = incident_id(job_id, "hang", now_ns or time.time_ns())
    file_incident(landing_dir, inc, {"kind": "hang", "job_id": job_id, "capture": capture, "from_ns": int(from_ns), "note": note},
                  stacks_of=job_id)
    return inc
