"""`simulate`: model a fleet's execution, then render it as a landing folder plus ground truth.

out_dir/landing/topology/topology.csv     docs/CONTRACT.md 1.1
out_dir/landing/flows/erspan-cNNN-<minute>.{parquet,csv.gz}   docs/CONTRACT.md 1.2, one per collector per minute
out_dir/landing/traces|timings|hw/...      from fleetscope.sim.capture when it is installed
out_dir/ground_truth/jobs.csv, pairs.csv, steps.csv, faults.csv   docs/CONTRACT.md 3
out_dir/ground_truth/job_layout.csv, background.csv             extra: layouts, out-of-topology ips
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import shutil
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import polars as pl

from fleetscope.schemas.base import conform, empty_frame
from fleetscope.sim import schemas as S
from fleetscope.sim.execution import KIND_DP, KIND_PP, run_job
from fleetscope.sim.fabric import GPUS_PER_HOST, build_fabric
from fleetscope.sim.faults import choose_faults
from fleetscope.sim.jobs import place_jobs
from fleetscope.sim.render import add_collector_noise, background_flows, write_flow_files

DEFAULT_START_NS = int(datetime(2026, 11, 21, 12, 0, tzinfo=timezone.utc).timestamp()) * 1_000_000_000
VALIDATE_SAMPLE = 200_000
CAPTURE_STEPS = 3
MAX_TRACE_RANKS = 4
MAX_CAPTURES = 2


def simulate(out_dir, gpus: int = 64, jobs: int | None = None, minutes: float = 1.0, faults: str = "",
             seed: int = 0, start_ns: int | None = None, captures: bool = True, overwrite: bool = False,
             hard_cases: bool = False) -> dict:
    """Simulate `gpus` GPUs (a multiple of 8) for `minutes` minutes; deterministic by seed.

    jobs: number of jobs (default: a mix sized to the fleet); faults: "kind[:count],..." or ""/"none"
    (kinds in fleetscope.sim.faults.KINDS); start_ns: window start (default 2026-11-21T12:00Z);
    captures: also render traces / timings / hw / hang stacks through fleetscope.sim.capture when it
    is installed. hard_cases: one pipelined job with variable sequence lengths (PP flow sizes vary)
    and one with equal padded gradient buckets (one DP flow size per step), for the flow analytics'
    fallbacks. Writes out_dir/landing and out_dir/ground_truth; returns a summary dict (also
    written to ground_truth/summary.json)."""
    t0 = time.perf_counter()
    out = Path(out_dir)
    if minutes <= 0:
        raise ValueError(f"minutes must be > 0, got {minutes}")
    landing, truth = out / "landing", out / "ground_truth"
    # a folder holding a previous simulation (its summary.json) is replaced file by file; anything
    # else that is not empty is refused rather than mixed with new data
    previous = (truth / "summary.json").is_file()
    for d in (landing, truth):
        if d.exists() and any(d.iterdir()) and not (overwrite or previous):
            raise FileExistsError(f"{d} is not empty and holds no previous simulation; simulate into a new folder "
                                  f"or pass overwrite=True")
    if overwrite or previous:
        _clear_previous(landing, truth)
    W0 = DEFAULT_START_NS if start_ns is None else int(start_ns)
    W1 = W0 + int(round(minutes * 60e9))
    window = (W0, W1)

    fab = build_fabric(gpus)
    job_list, idle_hosts = place_jobs(fab, jobs, np.random.default_rng([seed, 1]), window, hard_cases=hard_cases)
    fault_list = choose_faults(faults, job_list, fab, np.random.default_rng([seed, 2]), window)

    # ---- model the execution -----------------------------------------------------------------
    runs = [run_job(j, i, fab, fault_list, window, seed) for i, j in enumerate(job_list)]
    parts = []
    for i, r in enumerate(runs):
        f = r.flows
        parts.append(pl.DataFrame({"job": np.full(f["src"].size, i, np.int32), "kind": f["kind"], "step": f["step"].astype(np.int64),
                                   "src": f["src"], "dst": f["dst"], "start": f["start"], "dur": f["dur"],
                                   "bytes": f["bytes"], "ch": f["ch"]}))
    job_flows = pl.concat(parts) if parts else pl.DataFrame(schema={"job": pl.Int32, "kind": pl.Int8, "step": pl.Int64, "src": pl.Int32,
                                                                     "dst": pl.Int32, "start": pl.Int64, "dur": pl.Int64, "bytes": pl.Int64, "ch": pl.Int8})
    for f in fault_list:
        if f.kind == "hang":
            hn = runs[f.job_idx].hang_ns
            f.start_ns = hn if hn is not None else f.start_ns
    t_model = time.perf_counter() - t0

    # ---- ground truth (true times, before collector noise) ------------------------------------
    job_ids = [j.job_id for j in job_list]
    truth.mkdir(parents=True, exist_ok=True)
    steps = _truth_steps(job_flows, runs, job_ids, fab, window)
    in_win = job_flows.filter((pl.col("start") >= W0) & (pl.col("start") < W1))
    pairs = _truth_pairs(in_win, job_ids, fab)
    jobs_df, layout = _truth_jobs(job_list, runs, fab, steps)
    fault_rows = [f.row() | {"affected_jobs": _affected(f, in_win, job_ids, fab), "source": "fleet"} for f in fault_list]

    # ---- render the flows --------------------------------------------------------------------
    bg = pl.DataFrame(background_flows(fab, window, np.random.default_rng([seed, 3])))
    allf = pl.concat([in_win, bg.select(in_win.columns)])
    noisy = add_collector_noise(allf, fab, np.random.default_rng([seed, 4]))
    _validate_rendered(noisy.head(VALIDATE_SAMPLE), fab)
    flow_files = write_flow_files(noisy, fab, landing / "flows", W0)
    (landing / "topology").mkdir(parents=True, exist_ok=True)
    fab.topology().write_csv(landing / "topology" / "topology.csv")
    t_render = time.perf_counter() - t0 - t_model

    # ---- captures from the colleague's renderer (optional) ------------------------------------
    capture_ids, capture_note, capture_truth = [], None, []
    if captures:
        capture_ids, capture_truth, capture_note = _captures(landing, job_list, runs, fab, fault_rows, seed, window, steps)
    # faults.csv keeps one row per fault; the capture renderer's per-rank rows (which function /
    # kernel / rank shows it) go beside it, and each fault names the captures that show it
    shown: dict[str, set] = {}
    for r in capture_truth:
        shown.setdefault(str(r.get("fault_id")), set()).add(str(r.get("capture_id")))
    for r in fault_rows:
        r["captures"] = "|".join(sorted(shown.get(r["fault_id"], ()))) or None

    # ---- write ground truth ------------------------------------------------------------------
    S.TRUTH_JOBS.validate(jobs_df).select("job_id", "ip", pl.exclude("job_id", "ip")).write_csv(truth / "jobs.csv")
    S.TRUTH_JOB_LAYOUT.validate(layout).write_csv(truth / "job_layout.csv")
    S.TRUTH_PAIRS.validate(pairs).write_csv(truth / "pairs.csv")
    S.TRUTH_STEPS.validate(steps).write_csv(truth / "steps.csv")
    fdf = conform(pl.DataFrame(fault_rows, infer_schema_length=None), S.TRUTH_FAULTS) if fault_rows else empty_frame(S.TRUTH_FAULTS)
    S.TRUTH_FAULTS.validate(fdf).write_csv(truth / "faults.csv")
    if capture_truth:
        pl.DataFrame(capture_truth, infer_schema_length=None).write_csv(truth / "capture_faults.csv")
    n_st = fab.n_bg - 2
    pl.DataFrame({"ip": fab.ip[fab.n_gpus:], "role": ["storage"] * n_st + ["monitoring"] * 2}).write_csv(truth / "background.csv")

    summary = {
        "out_dir": str(out), "landing": str(landing), "ground_truth": str(truth),
        "gpus": fab.n_gpus, "hosts": fab.n_hosts, "jobs": len(job_list), "idle_hosts": int(idle_hosts.size),
        "window": [W0, W1], "seed": seed,
        "flows_modelled": int(in_win.height), "background_flows": int(bg.height), "flow_records": int(noisy.height),
        "flow_files": len(flow_files), "pairs": int(pairs.height), "steps": int(steps.height),
        "faults": [{k: r[k] for k in ("fault_id", "kind", "subject", "job_id")} for r in fault_rows],
        "captures": capture_ids, "capture_note": capture_note,
        "seconds": round(time.perf_counter() - t0, 3), "seconds_model": round(t_model, 3), "seconds_render": round(t_render, 3),
    }
    (truth / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary


def _lookup(names, idx: pl.Series) -> pl.Series:
    """names[idx] as a string Series (vectorized)."""
    return pl.Series(np.asarray(names, dtype=str)).gather(idx.cast(pl.Int64))


def _clear_previous(landing: Path, truth: Path) -> None:
    """Remove only what a previous simulate wrote (never anything else in the folder)."""
    for p in (list((landing / "flows").glob("erspan-c*")) + [landing / "topology" / "topology.csv"]
              + list((landing / "hw").glob("hw-*"))):
        if p.is_file():
            p.unlink()
    for kind in ("traces", "timings", "stacks"):   # capture folders: <job_id>-<start time>, hang-<job_id>-<time>
        for d in list((landing / kind).glob("job-*-*T*")) + list((landing / kind).glob("hang-job-*")):
            if d.is_dir():
                shutil.rmtree(d)
    for p in (landing / "incidents").glob("hang-job-*.json"):
        p.unlink()
    for name in ("jobs.csv", "job_layout.csv", "pairs.csv", "steps.csv", "faults.csv", "background.csv", "summary.json",
                 "capture_faults.csv"):
        if (truth / name).is_file():
            (truth / name).unlink()


def _truth_steps(job_flows: pl.DataFrame, runs, job_ids, fab, window) -> pl.DataFrame:
    """LLMPrism's step: it ends where the step's DP traffic on an ip ends; it starts where the
    previous one ended (first step of a job: when its compute began). Only steps that lie entirely
    inside the window (start, all their DP traffic, end)."""
    W0, W1 = window
    dp = job_flows.filter(pl.col("kind") == KIND_DP).select("job", "step", "src", "dst", "start",
                                                            end=pl.col("start") + pl.col("dur"))
    ep = pl.concat([dp.select("job", "step", ep="src", start="start", end="end"),
                    dp.select("job", "step", ep="dst", start="start", end="end")])
    g = (ep.group_by("job", "ep", "step").agg(first=pl.col("start").min(), end_ns=pl.col("end").max())
         .sort("job", "ep", "step"))
    cs = pl.concat([pl.DataFrame({"job": np.full(r.steps.size, i, np.int32), "step": r.steps.astype(np.int64),
                                  "compute_start_ns": r.step_start.astype(np.int64)}) for i, r in enumerate(runs)]) if runs else None
    if cs is None or g.height == 0:
        return empty_frame(S.TRUTH_STEPS)
    g = g.join(cs, on=["job", "step"], how="left").with_columns(
        prev_end=pl.col("end_ns").shift(1).over("job", "ep"), prev_step=pl.col("step").shift(1).over("job", "ep"))
    g = g.with_columns(start_ns=pl.when(pl.col("prev_step") == pl.col("step") - 1).then(pl.col("prev_end"))
                       .otherwise(pl.col("compute_start_ns")))
    g = g.filter((pl.col("first") >= W0) & (pl.col("start_ns") >= W0) & (pl.col("end_ns") < W1))
    return g.select(job_id=_lookup(job_ids, g["job"]), ip=_lookup(fab.ip, g["ep"]), step="step", start_ns="start_ns", end_ns="end_ns", compute_start_ns="compute_start_ns").sort("job_id", "ip", "step")


def _truth_pairs(flows: pl.DataFrame, job_ids, fab) -> pl.DataFrame:
    g = flows.group_by("job", "src", "dst", "kind").agg(n=pl.len())
    g = g.with_columns(s=_lookup(fab.ip, g["src"]), d=_lookup(fab.ip, g["dst"]))
    g = g.with_columns(ip_a=pl.min_horizontal("s", "d"), ip_b=pl.max_horizontal("s", "d"))
    out = g.group_by("ip_a", "ip_b", "job", "kind").agg(n_flows=pl.col("n").sum())
    out = (out.with_columns(job_id=_lookup(job_ids, out["job"]),
                         comm_type=pl.when(pl.col("kind") == KIND_PP).then(pl.lit("PP")).otherwise(pl.lit("DP")))
           .select("ip_a", "ip_b", "job_id", "comm_type", pl.col("n_flows").cast(pl.Int64)).sort("job_id", "ip_a", "ip_b"))
    return out


def _truth_jobs(job_list, runs, fab, steps) -> tuple[pl.DataFrame, pl.DataFrame]:
    rows, lay = [], []
    hosts = fab.host_name
    gname = fab.gpu_name()
    med = steps.group_by("job_id", "ip").agg(d=(pl.col("end_ns") - pl.col("start_ns")).median()).group_by("job_id").agg(pl.col("d").median())
    med = dict(zip(med["job_id"].to_list(), med["d"].to_list()))
    for j, r in zip(job_list, runs):
        rank = np.arange(j.world)
        rows.append(pl.DataFrame({
            "job_id": [j.job_id] * j.world, "ip": fab.ip[j.gpus], "host": hosts[j.gpus // GPUS_PER_HOST], "gpu": gname[j.gpus],
            "tenant": [j.tenant] * j.world, "rank": rank.astype(np.int32), "tp_rank": (rank % j.tp).astype(np.int32),
            "pp_stage": (rank // (j.tp * j.dp)).astype(np.int32), "dp_rank": ((rank // j.tp) % j.dp).astype(np.int32)}))
        m = med.get(j.job_id)
        lay.append({"job_id": j.job_id, "tenant": j.tenant, "tp": j.tp, "pp": j.pp, "dp": j.dp, "n_microbatches": j.n_microbatches,
                    "n_gpus": j.world, "n_hosts": int(np.unique(j.gpus // GPUS_PER_HOST).size), "dp_style": j.dp_style,
                    "n_buckets": int(j.buckets.size), "channels": j.channels, "act_bytes": j.act_bytes, "grad_bytes": j.grad_bytes,
                    "start_ns": j.start_ns, "stop_ns": j.stop_ns, "hang_ns": r.hang_ns, "median_step_ns": None if m is None else int(m),
                    "variable_seq": j.variable_seq, "equal_buckets": j.equal_buckets})
    if not rows:   # a fleet too small for any job (one host): background traffic only
        return empty_frame(S.TRUTH_JOBS), empty_frame(S.TRUTH_JOB_LAYOUT)
    return pl.concat(rows), conform(pl.DataFrame(lay, infer_schema_length=None), S.TRUTH_JOB_LAYOUT)


def _affected(f, flows: pl.DataFrame, job_ids, fab) -> str | None:
    """Jobs whose flows cross a network fault while it is active (compute faults: their job)."""
    if f.kind == "degraded_nic":
        sel = flows.filter(((pl.col("src") == f.endpoint) | (pl.col("dst") == f.endpoint)))
    elif f.kind == "congested_switch":
        src, dst = flows["src"].to_numpy(), flows["dst"].to_numpy()
        ls, sp, ld = fab.path_switches(src, dst)
        sel = flows.filter(pl.Series((ls == f.switch) | (sp == f.switch) | (ld == f.switch)))
    elif f.gpu_mask is not None:
        sel = flows.filter(pl.Series(f.gpu_mask[flows["src"].to_numpy()]))
    else:
        return f.job_id
    sel = sel.filter((pl.col("start") >= f.start_ns) & (pl.col("start") < f.end_ns))
    js = sorted({job_ids[i] for i in sel["job"].unique().to_list()})
    return "|".join(js) if js else None


def _validate_rendered(df: pl.DataFrame, fab) -> None:
    view = df.select("start_ns", "duration_ns", src_ip=_lookup(fab.ip, df["src"]),
                     dst_ip=_lookup(fab.ip, df["dst"]), bytes="bytes", packets="packets",
                     src_port="src_port", dst_port="dst_port", src_qp="src_qp", dst_qp="dst_qp", path=pl.lit("x"))
    S.SIM_FLOWS.validate(view)


def _captures(landing, job_list, runs, fab, fault_rows, seed, window, steps):
    """Traces/timings for a few sampled jobs and hw samples, via fleetscope.sim.capture if present."""
    if importlib.util.find_spec("fleetscope.sim.capture") is None:
        return [], [], "fleetscope.sim.capture not installed: no traces/timings/hw rendered"
    cap = importlib.import_module("fleetscope.sim.capture")
    if not hasattr(cap, "render_capture") or not hasattr(cap, "CaptureJob"):
        return [], [], "fleetscope.sim.capture has no render_capture/CaptureJob yet"
    W0, W1 = window
    # sample: jobs a compute / host fault touches (captured from when it starts, so the trace shows
    # it), then a small pipelined job
    ids_of = [j.job_id for j in job_list]
    pick: list[tuple[int, int]] = []
    for r in fault_rows:
        if r.get("job_id") in ids_of and r["kind"] not in ("congested_switch", "degraded_nic", "hang"):
            i = ids_of.index(r["job_id"])
            if i not in [p[0] for p in pick] and job_list[i].world <= 512:
                pick.append((i, max(W0, int(r["start_ns"]))))
    pick = pick[:MAX_CAPTURES - 1]
    small = [i for i, j in enumerate(job_list) if j.pp > 1 and j.world <= 64 and i not in [p[0] for p in pick]]
    pick += [(i, W0) for i in small[:MAX_CAPTURES - len(pick)]]
    ids, extra = [], []
    hosts, gname = fab.host_name, fab.gpu_name()
    for i, t_from in pick:
        j, r = job_list[i], runs[i]
        ok = (r.step_start >= t_from) & (r.step_start < W1)
        if not ok.any():
            continue
        k0 = int(np.argmax(ok))
        t = datetime.fromtimestamp(int(r.step_start[k0]) / 1e9, tz=timezone.utc)
        step_ns = int(np.median(np.diff(r.step_start))) if r.step_start.size > 1 else int(j.nominal_step_ns())
        cj = cap.CaptureJob(job_id=j.job_id, tp=j.tp, pp=j.pp, dp=j.dp, n_microbatches=j.n_microbatches,
                            hosts=[str(h) for h in hosts[j.gpus // GPUS_PER_HOST]], gpus=[str(g) for g in gname[j.gpus]],
                            ips=[str(x) for x in fab.ip[j.gpus]], start_ns=int(r.step_start[k0]),
                            n_steps=int(min(CAPTURE_STEPS, ok.sum())), step_ns=step_ns)
        cid = f"{j.job_id}-{t:%Y%m%dT%H%M%S}"
        kw = {}
        if "trace_ranks" in inspect.signature(cap.render_capture).parameters:
            # full profiler traces are big: rank 0, the last rank and the ranks a fault names
            ips = list(fab.ip[j.gpus])
            named = [ips.index(x) for r in fault_rows for x in str(r.get("ips") or "").split("|") if x in ips]
            kw["trace_ranks"] = sorted(set([0, j.world - 1] + named))[:MAX_TRACE_RANKS]
        # `ranks` are ranks of the fault's own job: never hand them to another job's capture
        fr = [dict(x) if x.get("job_id") == j.job_id else {k: v for k, v in x.items() if k != "ranks"} for x in fault_rows]
        rows = cap.render_capture(landing, cid, cj, fr, seed, **kw) or []
        extra += [dict(x) | {"capture_id": cid} for x in rows]
        ids.append(cid)
    # stack dumps and an incident for each hung job (small enough to dump every rank)
    if hasattr(cap, "render_hang"):
        for fr in fault_rows:
            if fr["kind"] != "hang" or fr.get("job_id") not in ids_of:
                continue
            i = ids_of.index(fr["job_id"])
            j, r = job_list[i], runs[i]
            if j.world > 1024 or r.hang_ns is None:
                continue
            step_ns = int(np.median(np.diff(r.step_start))) if r.step_start.size > 1 else int(j.nominal_step_ns())
            cj = cap.CaptureJob(job_id=j.job_id, tp=j.tp, pp=j.pp, dp=j.dp, n_microbatches=j.n_microbatches,
                                hosts=[str(h) for h in hosts[j.gpus // GPUS_PER_HOST]], gpus=[str(g) for g in gname[j.gpus]],
                                ips=[str(x) for x in fab.ip[j.gpus]], start_ns=int(r.hang_ns), n_steps=1, step_ns=step_ns)
            t = datetime.fromtimestamp(r.hang_ns / 1e9, tz=timezone.utc)
            iid = f"hang-{j.job_id}-{t:%Y%m%dT%H%M%S}"
            rows = cap.render_hang(landing, iid, cj, dict(fr), seed) or []
            extra += [dict(x) | {"capture_id": iid} for x in rows]
            ids.append(iid)
    note = None
    if hasattr(cap, "render_hw") and fab.n_gpus <= 2048:
        gdf = pl.DataFrame({"host": hosts[np.arange(fab.n_gpus) // GPUS_PER_HOST], "gpu": gname, "ip": fab.ip[:fab.n_gpus]})
        period = 1_000_000_000 if fab.n_gpus <= 256 else 10_000_000_000
        cap.render_hw(landing, gdf, [dict(x) for x in fault_rows], W0, W1, seed, period)
        note = f"hw samples every {period / 1e9:g} s"
    return ids, extra, note
