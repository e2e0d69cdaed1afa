"""Render a simulated job (model.JobSim records) as PyTorch-profiler traces (docs/CONTRACT.md 1.3),
lightweight-tracer timings (1.4) and ground-truth rows."""
from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import numpy as np
import polars as pl

from fleetscope.schemas.base import conform
from fleetscope.sim.capture import model as M
from fleetscope.sim.capture.faults import TEAMS, RankEffects, resolve
from fleetscope.sim.capture.schemas import TIMINGS_OUT, TRUTH

DEVICE_PROPS = {"name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85031714816, "computeMajor": 9, "computeMinor": 0,
                "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048, "regsPerBlock": 65536, "warpSize": 32,
                "sharedMemPerBlock": 49152, "numSms": 132, "regsPerMultiprocessor": 65536,
                "sharedMemPerBlockOptin": 232448, "sharedMemPerMultiprocessor": 233472}


def _device_index(gpu: str, rank: int) -> int:
    tail = str(gpu).rsplit("gpu", 1)[-1] if "gpu" in str(gpu) else ""
    return int(tail) if tail.isdigit() else rank % 8


def micro_batch_for(job) -> int:
    """Micro-batch size (sequences) that makes a healthy step last about job.step_ns."""
    H, tp, pp = M.HIDDEN, job.tp, job.pp
    layers = max(1, job.n_layers // pp)
    m = M.SEQ
    gemm = 2.0 * m * (4 * H * H + 2 * H * M.FFN_PER_TP * tp) / tp
    attn = 2.0 * M.SEQ * M.SEQ * H / tp
    per_layer = 3 * gemm / (M.PEAK_BF16 * M.GEMM_EFF) + 3.5 * attn / (M.PEAK_BF16 * M.ATTN_EFF)
    est = (job.n_microbatches + pp - 1) * layers * per_layer * 1.15 * 1e9
    return int(np.clip(round(job.step_ns / est), 1, 64))


def simulate_job(job, faults: list[dict], seed: int, racks: list[str] | None = None) -> M.JobSim:
    rng = np.random.default_rng([seed, 7])
    window = (int(job.start_ns), int(job.start_ns + job.n_steps * job.step_ns * 2))
    eff = resolve(job, faults, window, rng, racks)
    sim = M.JobSim(job, eff, seed, int(job.start_ns), micro_batch=micro_batch_for(job))
    sim.run()
    return sim


# ------------------------------------------------------------------------------------------ traces
def _pids(job) -> np.ndarray:
    return 2_900_000 + np.arange(len(job.ips)) * 173


def trace_events_for_rank(sim: M.JobSim, rank: int) -> list[dict]:
    return trace_events(sim, [rank])[rank]


def trace_events(sim: M.JobSim, ranks: list[int]) -> dict[int, list[dict]]:
    """Chrome-trace events per requested rank, in one pass over the records."""
    job = sim.job
    want = np.zeros(len(job.ips), bool)
    want[list(ranks)] = True
    pids = _pids(job)
    devs = [_device_index(g, r) for r, g in enumerate(job.gpus)]
    outs: dict[int, list[dict]] = {int(r): [] for r in ranks}
    base = trace_base_ns(sim)
    streams: dict[int, set] = {int(r): set() for r in ranks}
    for r in sim.recs:
        if r.cat == "api":
            continue
        sel = np.nonzero(want[r.ranks])[0]
        if sel.size == 0:
            continue
        # relative microseconds with ns decimals next to baseTimeNanoseconds (as newer Kineto writes):
        # epoch microseconds in a float64 would lose the nanoseconds and make adjacent kernels overlap
        ts_l = ((r.ts[sel] - base) / 1000.0).round(3).tolist()
        dur_l = (r.dur[sel] / 1000.0).round(3).tolist()
        rk_l = r.ranks[sel].tolist()
        if r.cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            launch_l = ((r.issue[sel] - base) / 1000.0).round(3).tolist()
        for j, rank in enumerate(rk_l):
            pid, dev, out = int(pids[rank]), devs[rank], outs[rank]
            tid = pid if r.thread == "main" else pid + 1
            ts_us, dur_us = ts_l[j], dur_l[j]
            if r.cat == "python_function":
                args = {"Python id": r.pyid, "Python thread": 0}
                if r.pyparent is not None:
                    args["Python parent id"] = r.pyparent
                out.append({"ph": "X", "cat": "python_function", "name": r.name, "pid": pid, "tid": pid, "ts": ts_us, "dur": dur_us, "args": args})
            elif r.cat in ("cpu_op", "user_annotation"):
                args = {"External id": r.ext} if r.ext is not None else {}
                args.update(r.args)
                if "Process Group Name" in args:
                    _pg_args(sim, rank, args)
                out.append({"ph": "X", "cat": r.cat, "name": r.name, "pid": pid, "tid": tid, "ts": ts_us, "dur": dur_us, "args": args})
            elif r.cat == "cuda_runtime":
                out.append({"ph": "X", "cat": "cuda_runtime", "name": r.name, "pid": pid, "tid": tid, "ts": ts_us, "dur": dur_us,
                            "args": {"External id": r.ext, "cbid": r.args.get("cbid", 0), "correlation": r.corr}})
            elif r.cat in ("kernel", "gpu_memcpy", "gpu_memset"):
                streams[rank].add(r.stream)
                args = {"External id": r.ext, "queued": 0, "device": dev, "context": 1, "stream": r.stream, "correlation": r.corr}
                if r.cat == "kernel":
                    nccl = "nccl" in r.name
                    args.update({"registers per thread": 96 if nccl else 168, "shared memory": 87568 if nccl else 0,
                                 "blocks per SM": 1.0, "warps per SM": 4.0, "grid": [132, 1, 1], "block": [384, 1, 1],
                                 "est. achieved occupancy %": 0 if nccl else 12})
                else:
                    args["memory bandwidth (GB/s)"] = round(r.args.get("bytes", 0) / max(dur_us, 1e-3) / 1e3, 3)
                args.update(r.args)
                if "Process Group Name" in args:
                    _pg_args(sim, rank, args)
                out.append({"ph": "X", "cat": r.cat, "name": r.name, "pid": dev, "tid": r.stream, "ts": ts_us, "dur": dur_us, "args": args})
                out.append({"ph": "s", "id": r.corr, "pid": pid, "tid": tid, "ts": launch_l[j], "cat": "ac2g", "name": "ac2g"})
                out.append({"ph": "f", "id": r.corr, "pid": dev, "tid": r.stream, "ts": ts_us, "cat": "ac2g", "name": "ac2g", "bp": "e"})
            elif r.cat == "cuda_sync":
                stream = r.stream if r.stream is not None and r.stream >= 0 else 4294967295
                args = {"External id": r.ext, "device": dev, "context": 1, "stream": stream, "correlation": r.corr}
                args.update(r.args)
                out.append({"ph": "X", "cat": "cuda_sync", "name": r.name, "pid": dev, "tid": r.stream if r.stream is not None else -1,
                            "ts": ts_us, "dur": dur_us, "args": args})
    for rank, out in outs.items():
        pid, dev = int(pids[rank]), devs[rank]
        out.sort(key=lambda e: e["ts"])
        t0 = out[0]["ts"] if out else 0
        meta = [
            {"name": "process_name", "ph": "M", "ts": t0, "pid": pid, "tid": 0, "args": {"name": "python3.11"}},
            {"name": "process_labels", "ph": "M", "ts": t0, "pid": pid, "tid": 0, "args": {"labels": "CPU"}},
            {"name": "thread_name", "ph": "M", "ts": t0, "pid": pid, "tid": pid, "args": {"name": f"thread {pid} (pt_main_thread)"}},
            {"name": "thread_name", "ph": "M", "ts": t0, "pid": pid, "tid": pid + 1, "args": {"name": f"thread {pid + 1} (pt_autograd_0)"}},
            {"name": "process_name", "ph": "M", "ts": t0, "pid": dev, "tid": 0, "args": {"name": "python3.11"}},
            {"name": "process_labels", "ph": "M", "ts": t0, "pid": dev, "tid": 0, "args": {"labels": f"GPU {dev}"}},
        ]
        meta += [{"name": "thread_name", "ph": "M", "ts": t0, "pid": dev, "tid": s, "args": {"name": f"stream {s} "}}
                 for s in sorted(streams[rank])]
        if out:  # the profiler's own span and iteration marker, as Kineto writes them
            t1 = max(e["ts"] + e.get("dur", 0) for e in out)
            meta += [{"ph": "X", "cat": "Trace", "ts": t0, "dur": round(t1 - t0, 3), "pid": "Spans", "tid": "PyTorch Profiler",
                      "name": "PyTorch Profiler (0)", "args": {"Op count": 0}},
                     {"name": "Iteration Start: PyTorch Profiler", "ph": "i", "s": "g", "pid": "Traces",
                      "tid": "Trace PyTorch Profiler", "ts": t0}]
        outs[rank] = meta + out
    return outs


def _pg_args(sim: M.JobSim, rank: int, args: dict) -> None:
    name, ranks = sim.pg_of(rank, args["Process Group Name"])
    args["Process Group Name"] = name
    args["Process Group Ranks"] = str(ranks)


def trace_base_ns(sim: M.JobSim) -> int:
    return int(sim.job.start_ns) // 1_000_000_000 * 1_000_000_000 - 1_000_000_000


def distributed_info(sim: M.JobSim, rank: int) -> dict:
    L = sim.layout
    s, d, t = (int(x[rank]) for x in L.coords())
    pgs = [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl", "pg_size": L.world, "ranks": list(range(L.world))}]
    if L.tp > 1:
        pgs.append({"pg_name": f"tp:{s}", "pg_desc": "tp", "backend_config": "cuda:nccl", "pg_size": L.tp,
                    "ranks": [L.rank(s, d, tt) for tt in range(L.tp)]})
    if L.dp > 1:
        pgs.append({"pg_name": f"dp:{s}", "pg_desc": "dp", "backend_config": "cuda:nccl", "pg_size": L.dp,
                    "ranks": [L.rank(s, dd, t) for dd in range(L.dp)]})
    if L.pp > 1:
        pgs.append({"pg_name": "pp", "pg_desc": "pp", "backend_config": "cuda:nccl", "pg_size": L.pp,
                    "ranks": [L.rank(ss, d, t) for ss in range(L.pp)]})
    return {"backend": "nccl", "rank": rank, "world_size": L.world, "pg_count": len(pgs), "pg_config": pgs, "nccl_version": "2.21.5"}


def write_trace(path: Path, sim: M.JobSim, rank: int, capture_id: str, events: list[dict] | None = None) -> None:
    doc = {
        "schemaVersion": 1,
        "deviceProperties": [dict(DEVICE_PROPS, id=i) for i in range(8)],
        "distributedInfo": distributed_info(sim, rank),
        "traceEvents": events if events is not None else trace_events_for_rank(sim, rank),
        "traceName": f"{capture_id}/rank{rank}.json.gz",
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": trace_base_ns(sim),
    }
    tmp = path.with_name("." + path.name + ".tmp")
    # json.dumps uses the C encoder (json.dump to a file does not): ~5x faster
    tmp.write_bytes(gzip.compress(json.dumps(doc, separators=(",", ":")).encode(), compresslevel=4, mtime=0))
    os.replace(tmp, path)


# ------------------------------------------------------------------------------------------ timings
def timings_frame(sim: M.JobSim) -> pl.DataFrame:
    """All docs/CONTRACT.md 1.4 rows of the job (every rank), kernels + api + op rows."""
    L = sim.layout
    stage_of, dp_of, tp_of = L.coords()
    cols: dict[str, list] = {k: [] for k in ("rank", "kind", "name", "issue_ns", "start_ns", "end_ns", "stream", "flops", "bytes",
                                             "group", "group_size", "shape", "step", "microbatch")}
    for r in sim.recs:
        if r.tkind is None:
            continue
        n = len(r.ranks)
        cols["rank"].append(r.ranks)
        cols["kind"].append(np.full(n, r.tkind, dtype=object))
        cols["name"].append(np.full(n, r.tname, dtype=object))
        cols["issue_ns"].append(r.issue if r.issue is not None else r.ts)
        cols["start_ns"].append(r.ts)
        cols["end_ns"].append(r.ts + r.dur)
        cols["stream"].append(np.full(n, r.stream if r.stream is not None else -1))
        cols["flops"].append(np.full(n, np.nan if r.flops is None else r.flops))
        cols["bytes"].append(np.full(n, -1 if r.nbytes is None else r.nbytes))
        cols["group"].append(np.full(n, r.group, dtype=object))
        cols["group_size"].append(np.full(n, -1 if r.group_size is None else r.group_size))
        cols["shape"].append(np.full(n, r.shape, dtype=object))
        cols["step"].append(np.full(n, r.step))
        cols["microbatch"].append(np.full(n, r.microbatch))
    for o in sim.ops:
        n = len(o["ranks"])
        cols["rank"].append(o["ranks"])
        cols["kind"].append(np.full(n, "op", dtype=object))
        cols["name"].append(np.full(n, o["name"], dtype=object))
        cols["issue_ns"].append(o["start"])
        cols["start_ns"].append(o["start"])
        cols["end_ns"].append(np.maximum(o["end"], o["start"]))
        cols["stream"].append(np.full(n, -1))
        cols["flops"].append(np.full(n, np.nan))
        cols["bytes"].append(np.full(n, -1))
        cols["group"].append(np.full(n, None, dtype=object))
        cols["group_size"].append(np.full(n, -1))
        cols["shape"].append(np.full(n, None, dtype=object))
        cols["step"].append(np.full(n, o["step"]))
        cols["microbatch"].append(np.full(n, o["mb"]))
    cat = {k: np.concatenate(v) for k, v in cols.items()}
    grp = cat["group"]
    has = np.array([g is not None for g in grp])
    if has.any():
        names = {}
        for i in np.nonzero(has)[0]:
            key = (int(cat["rank"][i]), grp[i])
            if key not in names:
                names[key] = sim.pg_of(*key)[0]
            grp[i] = names[key]
    df = pl.DataFrame({
        "rank": cat["rank"].astype(np.int32),
        "host": np.array(sim.job.hosts, dtype=object)[cat["rank"]].tolist(),
        "kind": cat["kind"].tolist(), "name": cat["name"].tolist(),
        "issue_ns": cat["issue_ns"].astype(np.int64), "start_ns": cat["start_ns"].astype(np.int64), "end_ns": cat["end_ns"].astype(np.int64),
        "stream": cat["stream"].astype(np.int64), "flops": cat["flops"].astype(np.float64), "bytes": cat["bytes"].astype(np.int64),
        "group": cat["group"].tolist(), "group_size": cat["group_size"].astype(np.int32), "shape": cat["shape"].tolist(),
        "step": cat["step"].astype(np.int64), "microbatch": cat["microbatch"].astype(np.int32),
    }, strict=False)
    rk = cat["rank"].astype(np.int64)
    df = df.with_columns(
        stage=pl.Series(stage_of[rk].astype(np.int32)),
        dp_rank=pl.Series(dp_of[rk].astype(np.int32)),
        tp_rank=pl.Series(tp_of[rk].astype(np.int32)),
    ).with_columns(
        [pl.when(pl.col(c) < 0).then(None).otherwise(pl.col(c)).alias(c) for c in ("stream", "bytes", "group_size", "step", "microbatch")]
    ).with_columns(model_chunk=pl.when(pl.col("kind") == "op").then(pl.lit(0, pl.Int32)).otherwise(None))
    df = conform(df, TIMINGS_OUT).sort("rank", "start_ns", "kind", "name")
    return TIMINGS_OUT.validate(df)


# ------------------------------------------------------------------------------------------ truth
_TRUTH_FUNCTION = {
    "slow_gpu": ("gemm", M.GEMM_KERNEL), "throttled_racks": ("gemm", M.GEMM_KERNEL), "slow_stage_worker": ("gemm", M.GEMM_KERNEL),
    "nvlink_down": ("nccl:AllReduce", M.NCCL_AR),
    "slow_dataloader": (M.PY_RECV_INTO, "dataloader.next"),
    "cpu_bound_forward": (M.PY_MODEL_FWD, "forward-compute"),
    "gc_stall": (M.PY_GRAD_MODE, "gc"),
    "sync_in_forward": (M.PY_SYNC, "cuda.synchronize"),
    "misaligned_gemm": ("gemm", M.GEMM_KERNEL_ALIGN1),
    "hang": ("", ""),
}
_EXPECT = {
    "slow_gpu": "compute kernels slower, lower SM clock and throttle bits on the GPU; its TP/DP peers wait in NCCL",
    "throttled_racks": "compute kernels slower on every GPU of the racks, lower SM clock, HW slowdown throttle bit, lower SM util",
    "slow_stage_worker": "one worker's compute kernels slower than its pipeline-stage peers; no hardware counter says why",
    "nvlink_down": "intra-host collectives of its groups run over PCIe: slower NCCL kernels, PCIe throughput up, NVLink zero",
    "slow_dataloader": "dataloader next() (socket recv_into) holds the critical path on every worker; GPUs idle",
    "cpu_bound_forward": "the model forward Python function runs long CPU work with no kernel running",
    "gc_stall": "long GC pause inside a random Python function on a few workers; their peers wait",
    "sync_in_forward": "an unnecessary cuda synchronize per layer in forward: kernel-issue latency collapses, GPU voids",
    "misaligned_gemm": "fc1 gemm with n=8484 (not a multiple of 64) runs an align1 kernel at far lower FLOPS",
    "hang": "job stops making progress",
}


def truth_rows(sim: M.JobSim, capture_id: str, eff: RankEffects, window: tuple[int, int]) -> list[dict]:
    job = sim.job
    stage_of, dp_of, tp_of = sim.layout.coords()
    rows = []
    for f, mask in eff.applied:
        kind = f["kind"]
        func, kernel = _TRUTH_FUNCTION[kind]
        if kind == "misaligned_gemm":
            func = f"gemm m={sim.tokens},n={M.FFN_MISALIGNED},k={M.HIDDEN}"
        for r in np.nonzero(mask)[0]:
            rows.append({
                "fault_id": str(f.get("fault_id", f"{capture_id}-{kind}")), "kind": kind,
                "scope": str(f.get("scope") or ""), "subject": str(f.get("subject") or ""),
                "start_ns": int(f["start_ns"]) if f.get("start_ns") is not None else window[0],
                "end_ns": int(f["end_ns"]) if f.get("end_ns") is not None else window[1],
                "magnitude": float(f["magnitude"]) if f.get("magnitude") is not None else None,
                "capture_id": capture_id, "job_id": job.job_id, "rank": int(r), "host": job.hosts[r], "gpu": job.gpus[r],
                "ip": job.ips[r], "stage": int(stage_of[r]), "dp_rank": int(dp_of[r]), "tp_rank": int(tp_of[r]),
                "function": func, "kernel": kernel, "team": TEAMS[kind], "expected": _EXPECT[kind],
            })
    if not rows:
        return []
    df = conform(pl.DataFrame(rows, infer_schema_length=None), TRUTH)
    return TRUTH.validate(df).to_dicts()


def render_sim(landing_dir: Path, capture_id: str, sim: M.JobSim, traces: bool, timings: bool,
               trace_ranks: list[int] | None) -> tuple[int, int]:
    landing_dir = Path(landing_dir)
    job = sim.job
    end = max(int(b[2].max()) for v in sim.step_bounds.values() for b in v)
    layout = {"dp": job.dp, "pp": job.pp, "tp": job.tp, "vpp": 1}
    cap = {"job_id": job.job_id, "note": f"simulated capture of {job.n_steps} steps", "parallel": layout,
           "start_ns": int(job.start_ns), "end_ns": end}
    if traces:
        d = landing_dir / "traces" / capture_id
        d.mkdir(parents=True, exist_ok=True)
        ranks = list(range(len(job.ips))) if trace_ranks is None else [int(r) for r in trace_ranks]
        for r in ranks:
            if not 0 <= r < len(job.ips):
                raise ValueError(f"trace rank {r} outside job {job.job_id} of {len(job.ips)} ranks")
        evs = trace_events(sim, ranks)
        for r in ranks:
            write_trace(d / f"rank{r}.json.gz", sim, r, capture_id, evs.pop(r))
        (d / "capture.json").write_text(json.dumps(cap, indent=1))
    if timings:
        d = landing_dir / "timings" / capture_id
        d.mkdir(parents=True, exist_ok=True)
        df = timings_frame(sim)
        for (r,), part in df.group_by(["rank"], maintain_order=True):
            tmp = d / f".rank{r}.parquet.tmp"
            part.write_parquet(tmp)
            os.replace(tmp, d / f"rank{r}.parquet")
        (d / "capture.json").write_text(json.dumps(cap, indent=1))
    return int(job.start_ns), end


def activity_frame(sim: M.JobSim) -> pl.DataFrame:
    """Per-GPU busy intervals by resource (compute kernels; NCCL traffic over NVLink, PCIe or the NIC),
    so hw samples of a capture follow what each GPU actually ran."""
    job = sim.job
    gpus = np.array(job.gpus, dtype=object)
    hosts = np.array(job.hosts, dtype=object)
    parts = []
    for r in sim.recs:
        if r.cat != "kernel":
            continue
        if "nccl" not in r.name:
            res = np.full(len(r.ranks), "compute", dtype=object)
            nb = np.zeros(len(r.ranks))
        else:
            gs = r.group_size or 2
            factor = 2 * (gs - 1) / gs if r.tname == "nccl:AllReduce" else (gs - 1) / gs if r.tname in ("nccl:ReduceScatter", "nccl:AllGather") else 1.0
            nb = np.full(len(r.ranks), (r.nbytes or 0) * factor)
            if r.group and r.group.startswith("pp"):
                res = np.full(len(r.ranks), "nic", dtype=object)
            else:
                # TP and DP groups of these layouts: one host unless the group spans hosts
                axis = "tp" if r.group.startswith("tp") else "dp"
                L = sim.layout
                r2 = r.ranks.reshape(L.dp, L.tp)
                groups = r2 if axis == "tp" else r2.T
                intra = (hosts[groups] == hosts[groups][:, :1]).all(axis=1)
                intra_r = np.broadcast_to(intra[:, None], groups.shape)
                intra_r = (intra_r if axis == "tp" else intra_r.T).reshape(-1)
                res = np.where(intra_r, np.where(sim.eff.nvlink_down[r.ranks], "pcie", "nvlink"), "nic").astype(object)
        parts.append((r.ranks, r.ts, r.ts + r.dur, res, nb))
    if not parts:
        return pl.DataFrame(schema={"gpu": pl.Utf8, "start_ns": pl.Int64, "end_ns": pl.Int64, "resource": pl.Utf8, "bytes": pl.Float64})
    rk, s, e, res, nb = (np.concatenate([p[i] for p in parts]) for i in range(5))
    return pl.DataFrame({"gpu": gpus[rk].tolist(), "start_ns": s.astype(np.int64), "end_ns": e.astype(np.int64),
                         "resource": res.tolist(), "bytes": nb.astype(float)})
