"""Perfetto / Chrome traces people open in ui.perfetto.dev: one file per job across every window,
its reconstructed steps per GPU with the DP phase nested inside each step, and the findings about
the job as instant markers (on the GPU's track when the finding names one, else on a track of their
own). Timestamps are microseconds relative to a stated origin (`otherData.t0_utc`, `t0_ns`), small
enough that float64 keeps every nanosecond."""
from __future__ import annotations

import datetime as dt
import json

import polars as pl


def job_timeline_trace(job_id: str, steps: pl.DataFrame, findings: pl.DataFrame | None = None,
                       topology: pl.DataFrame | None = None) -> bytes:
    """steps: step_timelines rows of the job (any windows; a step seen by two windows counts once);
    findings: rows with start_ns, end_ns, severity, title, ip (nullable)."""
    st = steps.filter(pl.col("job_id") == job_id).unique(["ip", "start_ns", "end_ns"]).sort("ip", "start_ns")
    if st.height == 0:
        raise ValueError(f"no reconstructed steps for job {job_id!r}")
    t0 = int(st["start_ns"].min())
    names = {}
    if topology is not None and topology.height and "gpu" in topology.columns:
        names = dict(zip(topology["ip"].to_list(), topology["gpu"].to_list()))
    ips = st["ip"].unique().sort().to_list()
    tid = {ip: i + 1 for i, ip in enumerate(ips)}
    findings_tid = len(ips) + 1

    def us(ns: int) -> float:
        return round((int(ns) - t0) / 1000.0, 3)

    ev = [{"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": f"job {job_id}"}}]
    ev += [{"ph": "M", "name": "thread_name", "pid": 1, "tid": tid[ip], "args": {"name": f"{names.get(ip) or ip} ({ip})"}}
           for ip in ips]
    ev.append({"ph": "M", "name": "thread_name", "pid": 1, "tid": findings_tid, "args": {"name": "findings"}})
    # a step ends where the next begins; clip each step to the next start so slices never overlap
    st = st.with_columns(next_start=pl.col("start_ns").shift(-1).over("ip"))
    for r in st.iter_rows(named=True):
        end = min(r["end_ns"], r["next_start"]) if r["next_start"] is not None else r["end_ns"]
        if end <= r["start_ns"]:
            continue
        ev.append({"ph": "X", "pid": 1, "tid": tid[r["ip"]], "name": f"step {r['step']}", "cat": "step",
                   "ts": us(r["start_ns"]), "dur": round((end - r["start_ns"]) / 1000.0, 3),
                   "args": {"window": r.get("window_id"), "step_ms": round((r["end_ns"] - r["start_ns"]) / 1e6, 3)}})
        ds, de = r.get("dp_start_ns"), r.get("dp_end_ns")
        if ds is not None and de is not None:
            ds, de = max(ds, r["start_ns"]), min(de, end)  # nested inside its step
            if de > ds:
                ev.append({"ph": "X", "pid": 1, "tid": tid[r["ip"]], "name": "DP communication", "cat": "dp",
                           "ts": us(ds), "dur": round((de - ds) / 1000.0, 3)})
    if findings is not None:
        for f in findings.sort("start_ns").iter_rows(named=True):
            if f.get("start_ns") is None:
                continue
            track = tid.get(f.get("ip"), findings_tid)
            ev.append({"ph": "i", "s": "t", "pid": 1, "tid": track, "name": f"{f['severity']}: {f['title']}",
                       "cat": "finding", "ts": us(f["start_ns"]),
                       "args": {k: f.get(k) for k in ("title", "severity", "team", "problem_id") if f.get(k) is not None}})
    t0_utc = dt.datetime.fromtimestamp(t0 / 1e9, tz=dt.timezone.utc).isoformat(timespec="microseconds")
    return json.dumps({"traceEvents": ev, "displayTimeUnit": "ms",
                       "otherData": {"source": "fleetscope", "job_id": job_id, "t0_ns": t0, "t0_utc": t0_utc,
                                     "time_unit": "microseconds since t0"}}).encode()
