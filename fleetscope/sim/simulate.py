"""`simulate`: model a fleet's execution under per-seed conventions, then render it as a landing
folder plus ground truth.

out_dir/landing/topology/*.{csv,parquet}          docs/CONTRACT.md 1.1, in the seed's dialect
out_dir/landing/flows/*.{parquet,csv,csv.gz}      docs/CONTRACT.md 1.2, per collector per period, one late, one resent
out_dir/landing/traces|timings|hw/...             from fleetscope.sim.capture when it is installed
out_dir/ground_truth/jobs.csv, pairs.csv, steps.csv, faults.csv   docs/CONTRACT.md 3 (with added columns)
out_dir/ground_truth/job_layout.csv    per job: layout and communication conventions
out_dir/ground_truth/events.csv        benign events (launch, checkpoint load/save, first step, stall, finish, crash)
out_dir/ground_truth/background.csv    non-job pairs (storage, checkpoint, monitoring, probe, control)
out_dir/ground_truth/background_hosts.csv  service servers (ip, role, in_topology)
out_dir/ground_truth/files.csv         every landed file: collector, format, dialect, role (regular/late/duplicate)
out_dir/ground_truth/conventions.json  every per-seed draw (fleetscope.sim.conventions), as used
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
from fleetscope.sim.background import ROLE, background_flows, slowed_by_faults
from fleetscope.sim.conventions import draw_conventions
from fleetscope.sim.execution import KIND_DP, KIND_PP, run_job
from fleetscope.sim.fabric import GPUS_PER_HOST, build_fabric
from fleetscope.sim.faults import choose_faults, held_while_down
from fleetscope.sim.jobs import place_jobs, records_per_minute
from fleetscope.sim.render import identity, render_flows, transport, write_topology

DEFAULT_START_NS = int(datetime(2026, 11, 21, 12, 0, tzinfo=timezone.utc).timestamp()) * 1_000_000_000
VALIDATE_SAMPLE = 200_000
CAPTURE_STEPS = 3
MAX_TRACE_RANKS = 4
MAX_CAPTURES = 2
TRUTH_FILES = ("jobs.csv", "job_layout.csv", "pairs.csv", "steps.csv", "faults.csv", "events.csv", "background.csv",
               "background_hosts.csv", "files.csv", "conventions.json", "summary.json", "capture_faults.csv")


MIN_BUDGET = 100_000      # records per minute any fleet may make


def record_budget(n_gpus: int) -> float:
    """Flow records per GPU-minute the generator aims to stay under: what per-flowlet collectors
    export (a few hundred to a few thousand per GPU-minute); big fleets stay near the low end so
    generation stays tractable."""
    return 2000.0 if n_gpus <= 256 else (900.0 if n_gpus <= 4096 else 420.0)


def simulate(out_dir, gpus: int = 64, jobs: int | None = None, minutes: float = 1.0, faults: str = "",
             seed: int = 0, start_ns: int | None = None, captures: bool = True, overwrite: bool = False,
             hard_cases: bool = False, conventions: dict | None = None) -> dict:
    """Simulate `gpus` GPUs (a multiple of 8) for `minutes` minutes; deterministic by seed.

    jobs: number of jobs (default: a mix sized to the fleet); faults: "kind[:count],...", "random[:n]"
    or ""/"none"/"healthy" (kinds in fleetscope.sim.faults.KINDS); start_ns: window start (default
    2026-11-21T12:00Z); captures: also render traces / timings / hw / hang stacks through
    fleetscope.sim.capture when it is installed. hard_cases: one pipelined job with variable sequence
    lengths and one with equal padded gradient buckets. conventions: overrides of the per-seed draws
    (fleetscope.sim.conventions), e.g. {"collectors": {"cutting": "flowlet"}}. The same seed gives the
    same fleet, jobs and conventions whatever the fault spec (a healthy twin). Writes out_dir/landing
    and out_dir/ground_truth; returns a summary dict (also written to ground_truth/summary.json)."""
    t0 = time.perf_counter()
    out = Path(out_dir)
    if minutes <= 0:
        raise ValueError(f"minutes must be > 0, got {minutes}")
    if gpus <= 0 or gpus % GPUS_PER_HOST:
        raise ValueError(f"gpus must be a positive multiple of {GPUS_PER_HOST} (hosts of 8 GPUs), got {gpus}")
    from fleetscope.sim.faults import parse_spec
    parse_spec(faults)
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

    conv = draw_conventions(seed, gpus, conventions)
    fab = build_fabric(gpus, conv, seed)
    job_list, idle_hosts = place_jobs(fab, jobs, np.random.default_rng([seed, 1]), window, conv, hard_cases=hard_cases)
    budget = max(record_budget(gpus) * gpus, MIN_BUDGET) * minutes
    _fit_job_budget(job_list, conv, budget, minutes)
    fault_list = choose_faults(faults, job_list, fab, np.random.default_rng([seed, 2]), window)

    # ---- model the execution -----------------------------------------------------------------
    runs = [run_job(j, i, fab, fault_list, window, seed) for i, j in enumerate(job_list)]
    cols = ("job", "kind", "step", "src", "dst", "fh", "start", "dur", "busy", "bytes")
    schema = {"job": pl.Int32, "kind": pl.Int8, "step": pl.Int64, "src": pl.Int32, "dst": pl.Int32, "fh": pl.Int64,
              "start": pl.Int64, "dur": pl.Int64, "busy": pl.Int64, "bytes": pl.Int64}
    parts = []
    for i, r in enumerate(runs):
        f = r.flows
        d = {"job": np.full(f["src"].size, i, np.int32), "step": f["step"].astype(np.int64)}
        d.update({c: f[c] for c in cols if c not in d})
        parts.append(pl.DataFrame(d).select(cols).cast(schema))
    job_flows = pl.concat(parts) if parts else pl.DataFrame(schema=schema)
    for f in fault_list:
        if f.kind == "hang":
            hn = runs[f.job_idx].hang_ns
            f.start_ns = hn if hn is not None else f.start_ns
    in_win = job_flows.filter((pl.col("start") >= W0) & (pl.col("start") < W1))
    del job_flows
    t_model = time.perf_counter() - t0

    # ---- ground truth (true times, before collector noise) ------------------------------------
    job_ids = [j.job_id for j in job_list]
    truth.mkdir(parents=True, exist_ok=True)
    steps = _truth_steps(in_win, runs, job_ids, fab, window)
    pairs = _truth_pairs(in_win, job_ids, fab)
    jobs_df, layout = _truth_jobs(job_list, runs, fab, steps, in_win)
    fault_rows = []
    for f in fault_list:
        aff = _affected(f, in_win, job_ids, fab)
        fault_rows.append(f.row() | {"affected_jobs": aff, "source": "fleet",
                                     "impact": _impact(f, aff, job_list, runs, fault_list, fab, window, seed)})
    events = _truth_events(runs)

    # ---- background traffic (never on a job pair) --------------------------------------------
    bgd = background_flows(fab, job_list, runs, window, conv["background"], conv["life"], np.random.default_rng([seed, 3]))
    bgd = slowed_by_faults(bgd, fab, fault_list)
    bg = pl.DataFrame(bgd).select(cols).cast(schema).filter((pl.col("start") >= W0) & (pl.col("start") < W1))
    if pairs.height and bg.height:
        code = _pair_code(in_win["src"].to_numpy(), in_win["dst"].to_numpy())
        bcode = _pair_code(bg["src"].to_numpy(), bg["dst"].to_numpy())
        bg = bg.filter(pl.Series(~np.isin(bcode, np.unique(code))))
    background = _truth_background(bg, job_ids, fab)

    # ---- a flapping link holds what crosses it while down (pipeline hops, background) -----------
    in_win, bg = (_held(x, fault_list, x["kind"] != KIND_DP) for x in (in_win, bg))

    # ---- render the records ------------------------------------------------------------------
    rcols = ["kind", "tr", "src", "dst", "fh", "start", "dur", "busy", "bytes"]
    tcp_job = pl.Series([j.transport == "tcp" for j in job_list] + [False], dtype=pl.Boolean)
    pt = conv["background"]["probe_transport"]
    allf = pl.concat([
        in_win.with_columns(tr=pl.when(tcp_job.gather(in_win["job"].cast(pl.Int64))).then(pl.lit(1, pl.Int8))
                            .otherwise(pl.lit(0, pl.Int8))).select(rcols),
        bg.with_columns(tr=pl.Series(transport(bg["kind"].to_numpy(), pt))).select(rcols)])
    n_true = allf.height
    del in_win
    _fit_cutting_budget(allf, conv, budget)
    retrans = {int(f.endpoint): f.retrans_mult for f in fault_list if f.kind == "degraded_nic" and f.retrans_mult > 1}
    file_rows, n_records = render_flows(allf, fab, conv["collectors"], landing / "flows", seed, retrans,
                                        check=lambda rec: _validate_rendered(rec.head(VALIDATE_SAMPLE), fab))
    del allf
    file_rows += write_topology(fab, landing / "topology", conv["topology"])
    t_render = time.perf_counter() - t0 - t_model

    # ---- captures from the colleague's renderer (optional) ------------------------------------
    capture_ids, capture_note, capture_truth = [], None, []
    if captures:
        capture_ids, capture_truth, capture_note = _captures(landing, job_list, runs, fab, fault_rows, seed, window, steps)
    shown: dict[str, set] = {}
    for r in capture_truth:
        shown.setdefault(str(r.get("fault_id")), set()).add(str(r.get("capture_id")))
    for r in fault_rows:
        r["captures"] = "|".join(sorted(shown.get(r["fault_id"], ()))) or None

    # ---- write ground truth ------------------------------------------------------------------
    S.TRUTH_JOBS.validate(jobs_df).write_csv(truth / "jobs.csv")
    S.TRUTH_JOB_LAYOUT.validate(layout).write_csv(truth / "job_layout.csv")
    S.TRUTH_PAIRS.validate(pairs).write_csv(truth / "pairs.csv")
    S.TRUTH_STEPS.validate(steps).write_csv(truth / "steps.csv")
    fdf = conform(pl.DataFrame(fault_rows, infer_schema_length=None), S.TRUTH_FAULTS) if fault_rows else empty_frame(S.TRUTH_FAULTS)
    S.TRUTH_FAULTS.validate(fdf).write_csv(truth / "faults.csv")
    S.TRUTH_EVENTS.validate(events).write_csv(truth / "events.csv")
    S.TRUTH_BACKGROUND.validate(background).write_csv(truth / "background.csv")
    S.TRUTH_FILES.validate(conform(pl.DataFrame(file_rows, infer_schema_length=None), S.TRUTH_FILES)).write_csv(truth / "files.csv")
    if capture_truth:
        pl.DataFrame(capture_truth, infer_schema_length=None).write_csv(truth / "capture_faults.csv")
    pl.DataFrame({"ip": fab.ip[fab.n_gpus:], "role": fab.service_role, "host": fab.service_names,
                  "in_topology": np.full(fab.n_bg, bool(conv["topology"]["service_hosts"]))}).write_csv(truth / "background_hosts.csv")
    (truth / "conventions.json").write_text(json.dumps(conv | {"jobs_drawn": _job_summary(layout)}, indent=1, default=str))

    n_files = sum(1 for r in file_rows if r["kind"] == "flows")
    summary = {
        "out_dir": str(out), "landing": str(landing), "ground_truth": str(truth),
        "gpus": fab.n_gpus, "hosts": fab.n_hosts, "jobs": len(job_list), "idle_hosts": int(idle_hosts.size),
        "window": [W0, W1], "seed": seed,
        "flows_modelled": int(n_true - bg.height), "background_flows": int(bg.height), "flow_records": int(n_records),
        "flow_files": n_files, "pairs": int(pairs.height), "steps": int(steps.height), "events": int(events.height),
        "faults": [{k: r[k] for k in ("fault_id", "kind", "subject", "job_id")} for r in fault_rows],
        "captures": capture_ids, "capture_note": capture_note,
        "seconds": round(time.perf_counter() - t0, 3), "seconds_model": round(t_model, 3), "seconds_render": round(t_render, 3),
    }
    (truth / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary


def _fit_job_budget(jobs, conv: dict, budget: float, minutes: float) -> None:
    """Keep the fleet's record count near what collectors really export (a few hundred records per
    GPU-minute): on big fleets, lower the queue pairs, then the channels per NIC and the p2p
    channels, then the number of gradient buckets (bigger buckets, as users of big models configure) of the busiest jobs. The
    values used land in job_layout.csv."""
    mirror = 2.0 if conv["collectors"]["mirror"] == "both" else 1.0
    est = np.array([records_per_minute(j) * minutes * mirror for j in jobs], float)
    order = np.argsort(-est)
    for attr in ("qps", "channels", "p2p_channels", "buckets", "buckets", "buckets", "buckets"):
        for i in order:
            if est.sum() <= 0.8 * budget:
                return
            j = jobs[i]
            if attr == "qps" and j.qps > 1:
                j.qps = 1
            elif attr == "channels" and j.channels > len(j.nic_slots):
                j.channels = len(j.nic_slots)
            elif attr == "p2p_channels":
                j.p2p_channels = 1
            elif attr == "buckets" and j.buckets.size > 3:
                b = j.buckets
                merged = b[: b.size // 2 * 2].reshape(-1, 2).sum(axis=1)
                j.buckets = np.concatenate([merged, b[b.size // 2 * 2:]]).astype(np.int64)
            est[i] = records_per_minute(j) * minutes * mirror


def _fit_cutting_budget(allf: pl.DataFrame, conv: dict, budget: float) -> None:
    """Per-message and active-timeout cutting multiply records: cap them so the fleet stays within
    the budget (the effective values land in conventions.json)."""
    cc = conv["collectors"]
    cuts = {c["cutting"] for c in cc["per_collector"]}
    n = allf.height * (2.0 if cc["mirror"] == "both" else 1.0)
    room = max(1.0, budget / max(n, 1.0))
    rdma = allf["tr"].to_numpy() == 0
    byt = allf["bytes"].to_numpy()
    if "message" in cuts:
        cap = int(cc["message_cap"])
        while cap > 1 and np.where(rdma, np.minimum(cap, np.ceil(byt / cc["message_bytes"])), 1).mean() > room:
            cap -= 1
        cc["message_cap"] = max(1, cap)
    if "active_timeout" in cuts:
        dur = allf["dur"].to_numpy()
        a = int(cc["active_timeout_ns"])
        while np.ceil(dur / a).clip(1, 10_000).mean() > room and a < 5_000_000_000:
            a = int(a * 1.5)
        cc["active_timeout_ns"] = a


def _job_summary(layout: pl.DataFrame) -> dict:
    out = {}
    for c in ("tp", "pp", "dp_style", "algo", "channels", "qps", "p2p_channels", "cross_rail", "bidir", "overlap",
              "variable_seq", "equal_buckets", "transport"):
        if c in layout.columns:
            out[c] = sorted({str(v) for v in layout[c].to_list()})
    return out


def _pair_code(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    a, b = np.minimum(src, dst).astype(np.int64), np.maximum(src, dst).astype(np.int64)
    return a * (1 << 31) + b


def _lookup(names, idx: pl.Series) -> pl.Series:
    """names[idx] as a string Series (vectorized)."""
    return pl.Series(np.asarray(names, dtype=str)).gather(idx.cast(pl.Int64))


def _clear_previous(landing: Path, truth: Path) -> None:
    """Remove only what a previous simulate wrote (never anything else in the folder)."""
    listed = []
    if (truth / "files.csv").is_file():
        try:
            listed = pl.read_csv(truth / "files.csv", infer_schema=False)["file"].to_list()
        except Exception:  # noqa: BLE001 - an unreadable list: fall back to the name patterns
            listed = []
    for rel in listed:
        p = landing / rel
        if p.is_file():
            p.unlink()
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
    for name in TRUTH_FILES:
        if (truth / name).is_file():
            (truth / name).unlink()


def _truth_steps(flows: pl.DataFrame, runs, job_ids, fab, window) -> pl.DataFrame:
    """LLMPrism's step: it ends where the step's DP traffic on an ip ends; it starts where the
    previous one ended (first step after a launch: when its compute began). Only complete steps
    that lie entirely inside the window (start, all their DP traffic, end)."""
    W0, W1 = window
    dp = flows.filter(pl.col("kind") == KIND_DP).select("job", "step", "src", "dst", "start",
                                                        end=pl.col("start") + pl.col("dur"))
    ep = pl.concat([dp.select("job", "step", ep="src", start="start", end="end"),
                    dp.select("job", "step", ep="dst", start="start", end="end")])
    g = (ep.group_by("job", "ep", "step").agg(first=pl.col("start").min(), end_ns=pl.col("end").max())
         .sort("job", "ep", "step"))
    if not runs or g.height == 0:
        return empty_frame(S.TRUTH_STEPS)
    cs = pl.concat([pl.DataFrame({"job": np.full(r.steps.size, i, np.int32), "step": r.steps.astype(np.int64),
                                  "compute_start_ns": r.step_start.astype(np.int64), "complete": r.complete,
                                  "k": np.arange(r.steps.size)}) for i, r in enumerate(runs)])
    g = g.join(cs, on=["job", "step"], how="left").with_columns(
        prev_end=pl.col("end_ns").shift(1).over("job", "ep"), prev_step=pl.col("step").shift(1).over("job", "ep"))
    # the previous step's DP end, even when it began before the window
    prev_run = pl.concat([pl.DataFrame({"job": np.full(r.steps.size, i, np.int32), "step": r.steps.astype(np.int64) + 1,
                                        "run_prev_end": r.step_end.astype(np.int64)}) for i, r in enumerate(runs)])
    g = g.join(prev_run, on=["job", "step"], how="left")
    g = g.with_columns(
        start_ns=pl.when(pl.col("prev_step") == pl.col("step") - 1).then(pl.col("prev_end"))
        .when(pl.col("k") > 0).then(None).otherwise(pl.col("compute_start_ns")),
        start_observed=pl.col("k") > 0)
    g = g.filter(pl.col("complete") & pl.col("start_ns").is_not_null() & (pl.col("first") >= W0)
                 & (pl.col("start_ns") >= W0) & (pl.col("end_ns") < W1))
    return g.select(job_id=_lookup(job_ids, g["job"]), ip=_lookup(fab.ip, g["ep"]), step="step", start_ns="start_ns",
                    end_ns="end_ns", compute_start_ns="compute_start_ns",
                    start_observed="start_observed").sort("job_id", "ip", "step")


def _truth_pairs(flows: pl.DataFrame, job_ids, fab) -> pl.DataFrame:
    g = flows.filter(pl.col("kind").is_in([KIND_DP, KIND_PP])).group_by("job", "src", "dst", "kind").agg(n=pl.len())
    g = g.with_columns(s=_lookup(fab.ip, g["src"]), d=_lookup(fab.ip, g["dst"]))
    g = g.with_columns(ip_a=pl.min_horizontal("s", "d"), ip_b=pl.max_horizontal("s", "d"))
    out = g.group_by("ip_a", "ip_b", "job", "kind").agg(n_flows=pl.col("n").sum())
    # a pair carrying both (possible when a NIC-overload fault funnels everything through one NIC):
    # the type with more flows names it
    out = out.sort("ip_a", "ip_b", "n_flows", "kind", descending=[False, False, True, True]).unique(["ip_a", "ip_b"], keep="first")
    out = (out.with_columns(job_id=_lookup(job_ids, out["job"]),
                            comm_type=pl.when(pl.col("kind") == KIND_PP).then(pl.lit("PP")).otherwise(pl.lit("DP")))
           .select("ip_a", "ip_b", "job_id", "comm_type", pl.col("n_flows").cast(pl.Int64)).sort("job_id", "ip_a", "ip_b"))
    return out


def _truth_jobs(job_list, runs, fab, steps, flows) -> tuple[pl.DataFrame, pl.DataFrame]:
    rows, lay = [], []
    hosts = fab.host_name
    gname = fab.gpu_name()
    med = steps.group_by("job_id", "ip").agg(d=(pl.col("end_ns") - pl.col("start_ns")).median()).group_by("job_id").agg(pl.col("d").median())
    med = dict(zip(med["job_id"].to_list(), med["d"].to_list()))
    jf = flows.filter(pl.col("kind").is_in([KIND_DP, KIND_PP]))
    seen = pl.concat([jf.select("job", ep="src", t="start"), jf.select("job", ep="dst", t="start")]).group_by("job", "ep").agg(
        first=pl.col("t").min(), last=pl.col("t").max())
    for i, (j, r) in enumerate(zip(job_list, runs)):
        rank = np.arange(j.world)
        s = seen.filter(pl.col("job") == i)
        first = np.full(fab.n_gpus, -1, np.int64)
        last = np.full(fab.n_gpus, -1, np.int64)
        first[s["ep"].to_numpy()] = s["first"].to_numpy()
        last[s["ep"].to_numpy()] = s["last"].to_numpy()
        f, la = first[j.gpus], last[j.gpus]
        rows.append(pl.DataFrame({
            "job_id": [j.job_id] * j.world, "ip": fab.ip[j.gpus], "host": hosts[j.gpus // GPUS_PER_HOST], "gpu": gname[j.gpus],
            "tenant": [j.tenant] * j.world, "rank": rank.astype(np.int32), "tp_rank": (rank % j.tp).astype(np.int32),
            "pp_stage": (rank // (j.tp * j.dp)).astype(np.int32), "dp_rank": ((rank // j.tp) % j.dp).astype(np.int32),
            "observed": f >= 0, "first_seen_ns": pl.Series(np.where(f >= 0, f, None).tolist(), dtype=pl.Int64),
            "last_seen_ns": pl.Series(np.where(la >= 0, la, None).tolist(), dtype=pl.Int64)}))
        m = med.get(j.job_id)
        lay.append({"job_id": j.job_id, "tenant": j.tenant, "tp": j.tp, "pp": j.pp, "dp": j.dp, "n_microbatches": j.n_microbatches,
                    "n_gpus": j.world, "n_hosts": int(j.hosts.size), "gpus_per_host": j.gpus_per_host, "dp_style": j.dp_style,
                    "overlap": j.overlap, "algo": j.algo, "n_buckets": int(j.buckets.size), "channels": j.channels, "qps": j.qps,
                    "p2p_channels": j.p2p_channels, "nic_slots": "|".join(map(str, j.nic_slots)), "cross_rail": j.cross_rail,
                    "bidir": j.bidir, "act_bytes": j.act_bytes, "grad_bytes": j.grad_bytes, "target_step_ns": j.target_step_ns,
                    "start_ns": j.start_ns, "launch_ns": j.launch_ns, "stop_ns": j.stop_ns, "crash_ns": j.crash_ns,
                    "hang_ns": r.hang_ns, "median_step_ns": None if m is None else int(m), "variable_seq": j.variable_seq,
                    "equal_buckets": j.equal_buckets, "nic_overload": j.nic_overload, "transport": j.transport})
    if not rows:   # a fleet too small for any job (one host): background traffic only
        return empty_frame(S.TRUTH_JOBS), empty_frame(S.TRUTH_JOB_LAYOUT)
    return (conform(pl.concat(rows), S.TRUTH_JOBS),
            conform(pl.DataFrame(lay, infer_schema_length=None), S.TRUTH_JOB_LAYOUT))


def _truth_events(runs) -> pl.DataFrame:
    rows = [e for r in runs for e in r.events]
    if not rows:
        return empty_frame(S.TRUTH_EVENTS)
    df = pl.DataFrame(rows, infer_schema_length=None).sort("start_ns", "job_id", "kind")
    df = df.with_columns(event_id=pl.format("E{}", pl.int_range(0, df.height).cast(pl.Utf8).str.zfill(3)))
    return conform(df, S.TRUTH_EVENTS)


def _truth_background(bg: pl.DataFrame, job_ids, fab) -> pl.DataFrame:
    if bg.height == 0:
        return empty_frame(S.TRUTH_BACKGROUND)
    g = bg.group_by("src", "dst", "kind").agg(n_flows=pl.len(), job=pl.col("job").max())
    names = pl.Series([ROLE.get(k, "") for k in range(8)])
    jid = pl.Series(list(job_ids) + [None], dtype=pl.Utf8)
    g = g.with_columns(s=_lookup(fab.ip, g["src"]), d=_lookup(fab.ip, g["dst"]), role=names.gather(g["kind"].cast(pl.Int64)),
                       job_id=jid.gather(pl.when(g["job"] >= 0).then(g["job"]).otherwise(len(job_ids)).cast(pl.Int64)))
    g = g.with_columns(ip_a=pl.min_horizontal("s", "d"), ip_b=pl.max_horizontal("s", "d"))
    return (g.group_by("ip_a", "ip_b", "role").agg(pl.col("job_id").drop_nulls().first(), pl.col("n_flows").sum().cast(pl.Int64))
            .sort("ip_a", "ip_b", "role"))


def _held(df: pl.DataFrame, faults, which: pl.Series) -> pl.DataFrame:
    """df's transfers in `which` held by the flapping links they cross (faults.held_while_down): the
    time held is time the transfer was trying to send (busy), as in the DP collectives' stall."""
    if df.height == 0 or not any(f.kind == "flapping_link" and f.flaps for f in faults):
        return df
    dur = df["dur"].to_numpy()
    new = held_while_down(df["start"].to_numpy(), dur, df["src"].to_numpy(), df["dst"].to_numpy(), faults)
    new = np.where(which.to_numpy(), new, dur)
    return df.with_columns(dur=pl.Series(new).cast(df["dur"].dtype),
                           busy=(pl.col("busy") + pl.Series(new - dur)).cast(df["busy"].dtype))


def _affected(f, flows: pl.DataFrame, job_ids, fab) -> str | None:
    """Jobs whose flows cross a network fault while it is active (compute faults: their job)."""
    jf = flows.filter(pl.col("kind").is_in([KIND_DP, KIND_PP]))
    if f.kind in ("degraded_nic", "flapping_link"):
        sel = jf.filter(((pl.col("src") == f.endpoint) | (pl.col("dst") == f.endpoint)))
    elif f.kind == "congested_switch":
        src, dst = jf["src"].to_numpy(), jf["dst"].to_numpy()
        ls, sp, ld = fab.path_switches(src, dst, jf["fh"].to_numpy().view(np.uint64))
        sel = jf.filter(pl.Series((ls == f.switch) | (sp == f.switch) | (ld == f.switch)))
    elif f.gpu_mask is not None:
        sel = jf.filter(pl.Series(f.gpu_mask[jf["src"].to_numpy()]))
    else:
        return f.job_id
    sel = sel.filter((pl.col("start") >= f.start_ns) & (pl.col("start") < f.end_ns))
    js = sorted({job_ids[i] for i in sel["job"].unique().to_list()})
    return "|".join(js) if js else None


def _impact(f, affected, job_list, runs, faults, fab, window, seed) -> float | None:
    """How much this fault slows the job it hurts most: mean step time while it is active, with
    every fault / with every fault but this one (the job re-run without it). 1.0: no visible effect."""
    ids = [j.job_id for j in job_list]
    names = [f.job_id] if f.job_id in ids else [x for x in (affected or "").split("|") if x in ids][:4]
    others = [x for x in faults if x is not f]
    best = None
    for name in names:
        i = ids.index(name)
        j = job_list[i]
        keep = j.nic_overload
        if f.kind == "nic_overload":
            j.nic_overload = False
        try:
            base = run_job(j, i, fab, others, window, seed)
        finally:
            j.nic_overload = keep
        a, b = _median_step(runs[i], f, window), _median_step(base, f, window)
        if a and b:
            best = max(best or 0.0, a / b)
    return None if best is None else round(best, 4)


def _median_step(run, f, window) -> float | None:
    lo, hi = max(f.start_ns, window[0]), min(f.end_ns, window[1])
    d = np.diff(run.step_end)
    ok = run.complete[1:] & (run.step_start[1:] >= lo) & (run.step_start[1:] < hi)
    return float(np.mean(d[ok])) if ok.any() else None


def _validate_rendered(df: pl.DataFrame, fab) -> None:
    ident = identity(df["fh"].to_numpy(), df["kind"].to_numpy(), df["tr"].to_numpy(), df["dst"].to_numpy())
    view = df.select("start_ns", "duration_ns", src_ip=_lookup(fab.ip, df["src"]),
                     dst_ip=_lookup(fab.ip, df["dst"]), bytes="bytes", packets="packets").with_columns(
        src_port=pl.Series(ident["src_port"]), dst_port=pl.Series(ident["dst_port"]),
        src_qp=pl.Series(ident["src_qp"]), dst_qp=pl.Series(ident["dst_qp"]), path=pl.lit("x"))
    S.SIM_FLOWS.validate(view.with_columns(pl.when(pl.col(c) < 0).then(None).otherwise(pl.col(c)).alias(c)
                                           for c in ("src_qp", "dst_qp")))


def _captures(landing, job_list, runs, fab, fault_rows, seed, window, steps):
    """Traces/timings for a few sampled jobs and hw samples, via fleetscope.sim.capture if present."""
    if importlib.util.find_spec("fleetscope.sim.capture") is None:
        return [], [], "fleetscope.sim.capture not installed: no traces/timings/hw rendered"
    cap = importlib.import_module("fleetscope.sim.capture")
    if not hasattr(cap, "render_capture") or not hasattr(cap, "CaptureJob"):
        return [], [], "fleetscope.sim.capture has no render_capture/CaptureJob yet"
    W0, W1 = window
    # the capture renderer knows the kinds that change what happens inside a GPU's trace
    cf = importlib.import_module("fleetscope.sim.capture.faults")
    known = set(getattr(cf, "CAPTURE_KINDS", set())) | set(getattr(cf, "IGNORED_KINDS", set()))
    fault_rows = [r for r in fault_rows if r["kind"] in known]
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
