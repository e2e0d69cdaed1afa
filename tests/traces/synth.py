"""A tiny, independent model of a training loop that writes Kineto-style traces, for tests whose ground
truth must come from outside the code under test: run it twice (e.g. with GEMMs 2x faster) and the
second run's measured iteration time is what a what-if on the first trace should predict."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

DTYPE_BYTES = {"Float": 4, "BFloat16": 2}


def comm_us(coll: str, nbytes: int, n: int, lat_us: float = 20.0, gbps: float = 10.0) -> float:
    bus = 2 * (n - 1) / n if coll == "allreduce" else (n - 1) / n
    return lat_us + nbytes * bus / (gbps * 1e3)  # GB/s -> bytes per us = gbps * 1e3


def make_trace(steps: list[list[dict]], rank: int = 0, launch_us: int = 5, gap_us: int = 2, queue_us: int = 3,
               sync: str | None = "device", t0_us: int = 1_700_000_000_000_000, step0: int = 10) -> dict:
    """steps: per iteration, kernels {name, stream, dur (us), [coll, nelems, group], [layer]} launched in order
    by one thread; `sync` ends each iteration with cudaDeviceSynchronize ("device"),
    cudaStreamSynchronize on stream 7 ("stream") or nothing (None)."""
    ev, corr, t = [], 1000, t0_us
    free: dict[int, int] = {}
    pid, tid = 4242, 4242
    for i, kernels in enumerate(steps):
        s0 = t
        for k in kernels:
            corr += 1
            if k.get("layer"):  # the launch happens inside a transformer layer's forward (Python span)
                ev.append({"ph": "X", "cat": "python_function", "name": "megatron/core/transformer/transformer_layer.py(1): forward",
                           "pid": pid, "tid": tid, "ts": t, "dur": launch_us + 1, "args": {}})
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": pid, "tid": tid, "ts": t, "dur": launch_us,
                       "args": {"External id": corr, "correlation": corr}})
            st = max(t + queue_us, free.get(k["stream"], 0))
            dur = int(round(k["dur"]))
            args = {"External id": corr, "device": 0, "stream": k["stream"], "correlation": corr}
            if "coll" in k:
                args.update({"Collective name": k["coll"], "In msg nelems": k["nelems"], "Out msg nelems": k["nelems"], "Group size": k["group"],
                             "dtype": "Float", "Process Group Name": "0", "Process Group Ranks": str(list(range(k["group"])))})
            ev.append({"ph": "X", "cat": "kernel", "name": k["name"], "pid": 0, "tid": k["stream"], "ts": st, "dur": dur, "args": args})
            free[k["stream"]] = st + dur
            t += launch_us + gap_us
        if sync:
            corr += 1
            if sync == "device":
                waited = max(free.values())
                name, kind, stream = "cudaDeviceSynchronize", "Context Sync", -1
            else:
                waited = free.get(7, 0)
                name, kind, stream = "cudaStreamSynchronize", "Stream Sync", 7
            end = max(t + 1, waited) + 2
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": pid, "tid": tid, "ts": t, "dur": end - t,
                       "args": {"External id": corr, "correlation": corr}})
            ev.append({"ph": "X", "cat": "cuda_sync", "name": kind, "pid": 0, "tid": stream, "ts": t + 1, "dur": end - t - 1,
                       "args": {"cuda_sync_kind": kind, "stream": stream, "correlation": corr, "device": 0}})
            t = end + gap_us
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step0 + i}", "pid": pid, "tid": tid, "ts": s0,
                   "dur": t - s0, "args": {}})
        t += gap_us
    return {"schemaVersion": 1, "distributedInfo": {"rank": rank}, "traceEvents": ev}


def write(doc: dict, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as fh:
        json.dump(doc, fh)
    return path


def step_times_us(doc: dict) -> list[int]:
    """Measured iteration times: ProfilerStep start to next start (the last: its duration)."""
    st = sorted((e["ts"], e["dur"]) for e in doc["traceEvents"] if e["name"].startswith("ProfilerStep#"))
    return [b[0] - a[0] for a, b in zip(st, st[1:])] + [st[-1][1]]
