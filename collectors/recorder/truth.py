"""Ground truth of a recording, from the training scripts' own logs (rank<R>.jsonl) and the
recorder's injection log; never from any analysis. Files (ground_truth/):

- docs/CONTRACT.md 3 (`simulate`'s format, validated with its schemas): jobs.csv, pairs.csv (DP/PP per
  GPU pair that carried job traffic, n_flows counted in the capture), steps.csv (per ip: the
  step's end = the end of its DP gradient traffic as the script logged it, start = the previous
  step's end, compute_start_ns = the script's step start; only steps wholly inside the capture),
  faults.csv (+ unit, team, ips, hosts, ranks, affected_jobs, captures, delay_ns, forward_ratio).
- pairs_other.csv: pairs inside a job that are neither DP nor PP (gloo's full mesh of the world
  group: barriers, rendezvous) with their flow count; background.csv: storage/monitoring ips.
- events.csv (launch, init, checkpoint load/save, finish, profile windows, recorder actions),
  captures.csv (each traces/timings capture: job, steps, whether it shows the fault),
  job_layout.csv, rank_log.parquet (every logged row: steps, microbatch ops, buckets, faults),
  recording.json (summary, written by the recorder).
"""
from __future__ import annotations

import json
import platform
from itertools import combinations

import polars as pl


# what each scenario injects: (kind, scope, team) in the simulator's vocabulary (docs/CONTRACT.md 3)
FAULTS = {"straggler": ("straggler", "gpu", "operations"),
          "slow_link": ("degraded_nic", "link", "operations"),
          "congested_uplink": ("congested_switch", "switch", "operations")}


def _logs(rec) -> pl.DataFrame:
    rows = []
    for j in rec.jobs:
        for r, h in enumerate(j.hosts):
            p = j.run_dir / f"rank{r}.jsonl"
            for line in p.read_text().splitlines() if p.exists() else []:
                try:
                    d = json.loads(line)
                except ValueError:
                    continue   # a line cut by a kill: nothing after it matters
                d["ip"], d["host"] = h.ip, h.name
                rows.append(d)
    cols = {"kind": pl.Utf8, "job_id": pl.Utf8, "rank": pl.Int32, "ip": pl.Utf8, "host": pl.Utf8, "name": pl.Utf8,
            "event": pl.Utf8, "fault": pl.Utf8, "capture": pl.Utf8, "step": pl.Int64, "microbatch": pl.Int32,
            "bucket": pl.Int32, "bytes": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64, "t_ns": pl.Int64,
            "extra_ms": pl.Float64}
    return pl.DataFrame([{k: d.get(k) for k in cols} for d in rows], schema=cols)


def observed(jobs: pl.DataFrame, flows: pl.DataFrame) -> pl.DataFrame:
    """The truth's `observed`, `first_seen_ns`, `last_seen_ns` per address (as the simulator writes
    them): whether the address carried its job's traffic in the capture, and the first and last
    start of such a flow."""
    job_of = jobs.select("ip", "job_id")
    jf = flows.join(job_of.rename({"ip": "src_ip", "job_id": "a"}), on="src_ip").join(
        job_of.rename({"ip": "dst_ip", "job_id": "b"}), on="dst_ip").filter(pl.col("a") == pl.col("b"))
    seen = pl.concat([jf.select(ip="src_ip", t="start_ns"), jf.select(ip="dst_ip", t="start_ns")]).group_by("ip").agg(
        first_seen_ns=pl.col("t").min().cast(pl.Int64), last_seen_ns=pl.col("t").max().cast(pl.Int64))
    return jobs.drop("observed", "first_seen_ns", "last_seen_ns", strict=False).join(seen, on="ip", how="left").with_columns(
        observed=pl.col("first_seen_ns").is_not_null()).select(*[c for c in jobs.columns if c not in ("observed", "first_seen_ns", "last_seen_ns")],
                                                               "observed", "first_seen_ns", "last_seen_ns")


def write(rec, flows: pl.DataFrame) -> dict:
    from fleetscope.sim import schemas as S

    T0, T1 = rec.T0, rec.T1
    out = rec.truth
    out.mkdir(parents=True, exist_ok=True)
    log = _logs(rec)
    log.write_parquet(out / "rank_log.parquet", compression="zstd")

    # -- topology (landing) and jobs ---------------------------------------------------------------
    topo = pl.DataFrame({"ip": [h.ip for h in rec.hosts], "host": [h.name for h in rec.hosts],
                         "gpu": [f"{h.name}/cpu0" for h in rec.hosts], "leaf": [h.leaf for h in rec.hosts],
                         "spine": [rec.spine] * len(rec.hosts)})
    (rec.landing / "topology").mkdir(parents=True, exist_ok=True)
    topo.write_csv(rec.landing / "topology" / "topology.csv")
    jrows = []
    for j in rec.jobs:
        for r, h in enumerate(j.hosts):
            jrows.append({"job_id": j.job_id, "ip": h.ip, "host": h.name, "gpu": f"{h.name}/cpu0", "tenant": j.tenant,
                          "rank": r, "tp_rank": 0, "pp_stage": r // j.dp, "dp_rank": r % j.dp})
    jobs = observed(pl.DataFrame(jrows).with_columns(pl.col("rank", "tp_rank", "pp_stage", "dp_rank").cast(pl.Int32)), flows)
    S.TRUTH_JOBS.validate(jobs).write_csv(out / "jobs.csv")

    # -- pairs: the layout says which pair is DP or PP; the capture says it carried traffic -------
    fl = flows.with_columns(ip_a=pl.min_horizontal("src_ip", "dst_ip"), ip_b=pl.max_horizontal("src_ip", "dst_ip"))
    nf = fl.group_by("ip_a", "ip_b").agg(n_flows=pl.len().cast(pl.Int64))
    prow = []
    for j in rec.jobs:
        for (ra, ha), (rb, hb) in combinations(enumerate(j.hosts), 2):
            sa, sb, da, db = ra // j.dp, rb // j.dp, ra % j.dp, rb % j.dp
            typ = "DP" if sa == sb else "PP" if da == db and abs(sa - sb) == 1 else "other"
            prow.append({"ip_a": min(ha.ip, hb.ip), "ip_b": max(ha.ip, hb.ip), "job_id": j.job_id, "comm_type": typ})
    pairs = pl.DataFrame(prow).join(nf, on=["ip_a", "ip_b"], how="left").with_columns(pl.col("n_flows").fill_null(0))
    S.TRUTH_PAIRS.validate(pairs.filter((pl.col("comm_type") != "other") & (pl.col("n_flows") > 0))
                           .sort("job_id", "ip_a", "ip_b")).write_csv(out / "pairs.csv")
    pairs.filter(pl.col("comm_type") == "other").sort("job_id", "ip_a", "ip_b").write_csv(out / "pairs_other.csv")
    bg = [{"ip": rec.svc.ip, "role": "storage"}, {"ip": rec.svc_monitor_ip(), "role": "monitoring"}] if rec.background else []
    pl.DataFrame(bg, schema={"ip": pl.Utf8, "role": pl.Utf8}).write_csv(out / "background.csv")

    # -- steps (LLMPrism's step: ends where the step's DP traffic ends) ---------------------------
    st = log.filter(pl.col("kind") == "step").select("job_id", "ip", "rank", "step", compute_start_ns="start_ns",
                                                     script_end_ns="end_ns", extra_ms="extra_ms")
    dp = (log.filter((pl.col("kind") == "op") & (pl.col("name") == "grads-all-reduce"))
          .group_by("job_id", "rank", "step").agg(dp_end=pl.col("end_ns").max()))
    # a job without data parallelism has no gradient traffic: its step's communication ends with its
    # last pipeline send or receive (LLMPrism's step of a pipeline-only address)
    pp_only = [j.job_id for j in rec.jobs if j.dp == 1]
    p2p = (log.filter((pl.col("kind") == "op") & pl.col("job_id").is_in(pp_only)
                      & pl.col("name").str.contains("send|recv"))
           .group_by("job_id", "rank", "step").agg(p2p_end=pl.col("end_ns").max()))
    dp = dp.join(p2p, on=["job_id", "rank", "step"], how="left").with_columns(
        dp_end=pl.coalesce("p2p_end", "dp_end")).drop("p2p_end")
    st = (st.join(dp, on=["job_id", "rank", "step"], how="left")
          .with_columns(end_ns=pl.coalesce("dp_end", "script_end_ns")).sort("job_id", "ip", "step")
          .with_columns(prev_end=pl.col("end_ns").shift(1).over("job_id", "ip"),
                        prev_step=pl.col("step").shift(1).over("job_id", "ip"))
          .with_columns(start_ns=pl.when(pl.col("prev_step") == pl.col("step") - 1).then("prev_end")
                        .otherwise("compute_start_ns"),
                        # False: the first step seen after a launch, which starts at its first forward
                        start_observed=(pl.col("prev_step") == pl.col("step") - 1).fill_null(False)))
    steps = st.filter((pl.col("compute_start_ns") >= T0) & (pl.col("start_ns") >= T0) & (pl.col("end_ns") <= T1))
    S.TRUTH_STEPS.validate(steps.select("job_id", "ip", "step", "start_ns", "end_ns", "compute_start_ns", "start_observed")).write_csv(out / "steps.csv")

    # -- events, captures ------------------------------------------------------------------------
    ev = log.filter(pl.col("kind") == "event").select("job_id", "rank", "ip", "event", "step", "start_ns", "end_ns")
    ev = pl.concat([ev, log.filter(pl.col("kind").is_in(["profile", "window"])).select(
        "job_id", "rank", "ip", event=pl.col("kind") + ":" + pl.col("capture"), step="step", start_ns="t_ns", end_ns="t_ns")])
    recev = pl.DataFrame([{"job_id": e.get("job_id"), "rank": None, "ip": None, "event": "recorder:" + e["event"],
                           "step": e.get("stop_step") or e.get("from_step") or e.get("to_step"), "start_ns": e["t_ns"],
                           "end_ns": e["t_ns"]} for e in rec.events], schema=ev.schema)
    pl.concat([ev, recev]).sort("start_ns").write_csv(out / "events.csv")

    fault = _fault(rec, log, st)
    caps = []
    for j in rec.jobs:
        for k, w in enumerate(j.windows):
            nxt = j.windows[k + 1]["from_step"] if k + 1 < len(j.windows) else None
            prof = st.filter((pl.col("job_id") == j.job_id) & pl.col("step").is_between(w["profile_step"], w["profile_step"] + w["profile_steps"] - 1))
            traced = rec.landing / "traces" / w["capture"]
            caps.append({"capture_id": w["capture"], "job_id": j.job_id, "window": k + 1, "from_step": w["from_step"],
                         "to_step": (nxt - 1) if nxt is not None else None, "profile_step": w["profile_step"],
                         "profile_steps": w["profile_steps"],
                         "trace_files": len(list(traced.glob("*.json.gz"))) if traced.exists() else 0,
                         "profile_start_ns": prof["compute_start_ns"].min(), "profile_end_ns": prof["script_end_ns"].max(),
                         "shows_fault": bool(fault and prof.height and j.job_id in (fault["affected_jobs"] or "")
                                             and prof["compute_start_ns"].min() >= fault["start_ns"]
                                             and prof["script_end_ns"].max() <= fault["end_ns"])})
    caps = pl.DataFrame(caps, infer_schema_length=None)
    caps.write_csv(out / "captures.csv")
    if fault:
        fault["captures"] = "|".join(caps.filter(pl.col("shows_fault"))["capture_id"].to_list()) or None
    if fault:
        fault["impact"] = fault_impact(fault, steps)
    fdf = pl.DataFrame([fault] if fault else [], schema=_FAULT_SCHEMA)
    S.TRUTH_FAULTS.validate(fdf).write_csv(out / "faults.csv")

    # -- layout (simulate's job_layout.csv, as far as it applies) ------------------------------------
    med = steps.group_by("job_id").agg(median_step_ns=(pl.col("end_ns") - pl.col("start_ns")).median().cast(pl.Int64),
                                       first_step_ns=pl.col("compute_start_ns").min())
    lay = pl.DataFrame([{"job_id": j.job_id, "tenant": j.tenant, "tp": 1, "pp": j.pp, "dp": j.dp,
                         "n_microbatches": int(j.args[j.args.index("--micro") + 1]), "n_gpus": len(j.hosts),
                         "n_hosts": len({h.name for h in j.hosts}), "dp_style": "megatron" if j.pp > 1 else "fsdp" if "--fsdp" in j.args else "ddp",
                         "cut_by_capture_end": j.stop_s is None} for j in rec.jobs]).join(med, on="job_id", how="left")
    lay.write_csv(out / "job_layout.csv")

    return {"scenario": rec.scenario, "layout": rec.layout, "seed": rec.seed, "seconds": rec.seconds, "capture_start_ns": T0, "capture_end_ns": T1,
            "command": f"python -m fleetscope.collectors.recorder --scenario {rec.scenario} --layout {rec.layout} "
                       f"--seconds {rec.seconds:g} "
                       f"--seed {rec.seed}" + ("" if rec.background else " --no-background") + (" --stacks" if rec.stacks else "")
                       + " --out DIR",
            "fault": fault, "jobs": lay.to_dicts(), "steps_in_capture": steps.group_by("job_id").len().to_dicts(),
            "flows": flows.height, "recorder_events": rec.events, "kernel": platform.release(),
            "torch": _torch_version()}


_FAULT_SCHEMA = {"fault_id": pl.Utf8, "kind": pl.Utf8, "scope": pl.Utf8, "subject": pl.Utf8, "start_ns": pl.Int64,
                 "end_ns": pl.Int64, "magnitude": pl.Float64, "job_id": pl.Utf8, "unit": pl.Utf8, "team": pl.Utf8,
                 "ips": pl.Utf8, "hosts": pl.Utf8, "ranks": pl.Utf8, "affected_jobs": pl.Utf8, "source": pl.Utf8,
                 "captures": pl.Utf8, "delay_ns": pl.Int64, "forward_ratio": pl.Float64, "impact": pl.Float64}


def fault_impact(fault: dict, steps: pl.DataFrame) -> float | None:
    """The simulator's `impact`: mean step time of the job the fault hurts most, steps inside the
    fault over steps outside it (1.0: no visible effect; None: no steps on one side)."""
    jobs = [j for j in (fault.get("affected_jobs") or "").split("|") if j]
    d = steps.filter(pl.col("job_id").is_in(jobs)).with_columns(
        d=pl.col("end_ns") - pl.col("start_ns"),
        inside=(pl.col("start_ns") < fault["end_ns"]) & (pl.col("end_ns") > fault["start_ns"]))
    r = d.group_by("job_id").agg(a=pl.col("d").filter("inside").mean(), b=pl.col("d").filter(~pl.col("inside")).mean()) \
        .drop_nulls().with_columns(r=pl.col("a") / pl.col("b"))
    return float(r["r"].max()) if r.height else None


def _fault(rec, log: pl.DataFrame, st: pl.DataFrame) -> dict | None:
    if rec.scenario == "healthy":
        return None
    kind, scope, team = FAULTS[rec.scenario]
    A = rec.jobs[0]
    f = {k: None for k in _FAULT_SCHEMA} | {"fault_id": f"{rec.scenario}-1", "kind": kind, "scope": scope, "team": team,
                                            "source": "recorder"}
    ev = {e["event"]: e["t_ns"] for e in rec.events}
    if rec.scenario == "straggler":
        r = rec.fault["rank"]
        h = A.hosts[r]
        hit = st.filter((pl.col("job_id") == A.job_id) & (pl.col("rank") == r) & (pl.col("extra_ms") > 0))
        if hit.height == 0:
            raise RuntimeError("the straggler fault never took effect (no step logged it)")
        s0, s1 = hit["step"].min(), hit["step"].max()
        fw = log.filter((pl.col("job_id") == A.job_id) & (pl.col("name") == "forward-compute") & pl.col("step").is_between(s0, s1)
                        ).with_columns(d=pl.col("end_ns") - pl.col("start_ns"))
        ratio = fw.filter(pl.col("rank") == r)["d"].median() / fw.filter(pl.col("rank") != r)["d"].median()
        f |= {"subject": h.ip, "start_ns": hit["compute_start_ns"].min(), "end_ns": hit["script_end_ns"].max(),
              "magnitude": rec.fault["extra_ms"] / 1e3, "unit": "seconds", "job_id": A.job_id, "ips": h.ip, "hosts": h.name,
              "ranks": str(r), "affected_jobs": A.job_id, "forward_ratio": round(float(ratio), 2)}
    elif rec.scenario == "slow_link":
        h = rec.fault["host"]
        on = [j.job_id for j in rec.jobs if h in j.hosts]
        f |= {"subject": h.ip, "start_ns": ev["fault_applied"], "end_ns": ev["fault_removed"],
              "magnitude": rec.fault["rate_bps"] / 8, "unit": "bytes_per_s", "job_id": on[0], "ips": h.ip, "hosts": h.name,
              "ranks": str(A.hosts.index(h)), "affected_jobs": "|".join(on), "delay_ns": int(rec.fault["delay_ms"] * 1e6)}
    else:   # the spine: every job with a pair across the leaves is hit
        hit = [j.job_id for j in rec.jobs if len({h.leaf for h in j.hosts}) > 1]
        f |= {"subject": rec.spine, "start_ns": ev["fault_applied"], "end_ns": ev["fault_removed"],
              "magnitude": rec.fault["rate_bps"] / 8, "unit": "bytes_per_s", "affected_jobs": "|".join(hit)}
    return f


def _torch_version() -> str | None:
    try:
        import importlib.metadata as md
        return md.version("torch")
    except Exception:
        return None
