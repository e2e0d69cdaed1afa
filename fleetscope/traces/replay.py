"""Replay an execution graph by simulation (Lumos Algorithm 1) and report per-iteration accuracy,
time breakdown, SM utilization, and the simulated timeline as a Chrome trace.

Simulation semantics (Algorithm 1): a task starts when all its dependencies are met and its
processor (one per CPU thread, one per GPU stream) is free; processor order is an edge of the
graph (thread_order / stream_order), so "processor free" is the dependency on the previous task
of that processor. Runtime dependencies (which kernel a synchronize waits for) were resolved when
the graph was built (graph.py). For a task v:

    start(v) = max over edges u->v of end(u) + lag(u, v)      (roots keep their traced start)
    end(v)   = start(v) + sim_dur(v)
    collective kernels: start = max over the ranks taking part of their arrival; the kernel's
    end = that start + its own part (sim_dur)

Tasks are visited in the order of their traced start, which is a topological order of the graph
(every dependency starts no later than what depends on it); if an edit breaks that, the visit
order falls back to Kahn's algorithm on the same keys (Lumos' pick())."""
from __future__ import annotations

import heapq
import datetime as _dt
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numba import njit
import polars as pl

from fleetscope.common import union_intervals
from fleetscope.schemas.base import conform
from fleetscope.traces.graph import Graph
from fleetscope.traces.schemas import REPLAY_SM_UTIL, REPLAYS

SM_BUCKET_NS = 1_000_000
_MIN_NS = -(2 ** 63)


@dataclass
class Simulation:
    start: np.ndarray  # simulated start per task_id
    end: np.ndarray
    order_fallback: bool = False


@dataclass
class Prepared:
    """The graph as arrays for the simulation loop (CSR edge lists by dst, visit order). Depends on
    the structure, lags and traced starts only, not on durations: edits that change durations reuse it."""
    n: int
    p1: np.ndarray
    s1: np.ndarray
    l1: np.ndarray
    p2: np.ndarray
    s2: np.ndarray
    l2: np.ndarray
    ref: np.ndarray
    has_w: np.ndarray
    gid: np.ndarray
    gptr: np.ndarray
    gmem: np.ndarray
    nodes: np.ndarray
    phases: np.ndarray
    fallback: bool


def prepare(tasks: pl.DataFrame, edges: pl.DataFrame, lag_col: str = "lag_ns") -> Prepared:
    """tasks: task_id (0..n-1 in order), sim_start_ref, wait_ref (sync calls, optional), coll_group
    (optional); edges: src, dst, edge_type, <lag_col>, from_start (optional)."""
    n = tasks.height
    tid = tasks["task_id"].to_numpy()
    if not np.array_equal(tid, np.arange(n)):
        raise ValueError("simulate: tasks must be sorted by task_id = 0..n-1")
    ref = tasks["sim_start_ref"].to_numpy().astype(np.int64)
    wref_s = tasks["wait_ref"] if "wait_ref" in tasks.columns else pl.Series([None] * n, dtype=pl.Int64)
    has_w = wref_s.is_not_null().to_numpy()
    wref = wref_s.fill_null(0).to_numpy().astype(np.int64)
    cols = ["src", "dst", "edge_type", lag_col] + (["from_start"] if "from_start" in edges.columns else [])
    flow = edges.select(cols).filter(pl.col("edge_type") != "collective")
    src = flow["src"].to_numpy().astype(np.int64)
    dst = flow["dst"].to_numpy().astype(np.int64)
    lag = flow[lag_col].to_numpy().astype(np.int64)
    fs = flow["from_start"].to_numpy().astype(bool) if "from_start" in flow.columns else np.zeros(src.size, bool)
    is_wait = (flow["edge_type"] == "gpu_cpu").to_numpy()
    # time slots: 2v = start of v, 2v+1 = end of v; an edge reads slot 2src+1 (end) or 2src (start)
    slot = 2 * src + (~fs).astype(np.int64)
    # phase 1 (start) edges and phase 2 (wait) edges, CSR by dst
    def csr(mask):
        d, sl, lg = dst[mask], slot[mask], lag[mask]
        o = np.argsort(d, kind="stable")
        return np.searchsorted(d[o], np.arange(n + 1)).astype(np.int64), sl[o], lg[o]
    p1, s1, l1 = csr(~is_wait)
    p2, s2, l2 = csr(is_wait)
    has_w = has_w | (np.diff(p2) > 0)
    wkey = np.where(has_w, np.maximum(wref, ref), 0)
    # collective groups -> integer ids; the group is visited at the latest traced arrival
    gid = np.full(n, -1, np.int64)
    if "coll_group" in tasks.columns and tasks["coll_group"].null_count() < n:
        codes = tasks.select(pl.col("coll_group").rank("dense").cast(pl.Int64) - 1).to_series()
        m = codes.is_not_null().to_numpy()
        gid[m] = codes.to_numpy()[m]
    key1 = ref.copy()
    gm = gid >= 0
    if gm.any():
        gkey = np.full(int(gid[gm].max()) + 1, np.iinfo(np.int64).min)
        np.maximum.at(gkey, gid[gm], ref[gm])
        key1[gm] = gkey[gid[gm]]
    # events: (node, phase); phase 2 only for waiting calls
    wn = np.flatnonzero(has_w)
    ev_node = np.concatenate([np.arange(n), wn])
    ev_phase = np.concatenate([np.zeros(n, np.int8), np.ones(wn.size, np.int8)])
    ev_key = np.concatenate([key1, wkey[wn]])
    order = np.lexsort((ev_node, gm[ev_node].astype(np.int8), ev_phase, ev_key))
    # check the order is topological: the slot an edge reads is final before the reader's phase
    epos = np.empty(order.size, np.int64)
    epos[order] = np.arange(order.size)
    pos1 = epos[:n].copy()
    if gm.any():  # a group is visited at its first member
        gfirst = np.full(int(gid.max()) + 1, order.size, np.int64)
        np.minimum.at(gfirst, gid[gm], pos1[gm])
        pos1[gm] = gfirst[gid[gm]]
    pos2 = pos1.copy()
    pos2[wn] = epos[n:]
    src_ready = np.where(fs | ~has_w[src], pos1[src], pos2[src])
    dst_need = np.where(is_wait, pos2[dst], pos1[dst])
    same_group = gm[src] & (gid[src] == gid[dst])
    fallback = bool(np.any((src_ready >= dst_need) & ~same_group))
    if fallback:
        nodes, phases = _kahn_order(n, src, dst, fs, is_wait, has_w, ev_key, ev_node, ev_phase, gid)
    else:
        nodes, phases = ev_node[order], ev_phase[order]
    gptr, gmem = _csr_members(gid)
    return Prepared(n, p1, s1, l1, p2, s2, l2, ref, has_w, gid, gptr, gmem, nodes.astype(np.int64), phases.astype(np.int8), fallback)


def run(prep: Prepared, dur: np.ndarray) -> Simulation:
    """Simulate prepared arrays with these durations (int64 ns per task)."""
    if prep.n == 0:
        return Simulation(np.zeros(0, np.int64), np.zeros(0, np.int64))
    dur = np.ascontiguousarray(dur, dtype=np.int64)
    if dur.size != prep.n:
        raise ValueError(f"simulate: {dur.size} durations for {prep.n} tasks")
    t = _run(prep.nodes, prep.phases, prep.p1, prep.s1, prep.l1, prep.p2, prep.s2, prep.l2, dur, prep.ref, prep.has_w,
             prep.gid, prep.gptr, prep.gmem)
    return Simulation(t[0::2], t[1::2], prep.fallback)


def simulate_graph(tasks: pl.DataFrame, edges: pl.DataFrame, sim_dur: np.ndarray | None = None, lag_col: str = "lag_ns") -> Simulation:
    """Simulated start/end (int64 ns, indexed by task_id; task_id must be 0..n-1). See prepare()."""
    if tasks.height == 0:
        return Simulation(np.zeros(0, np.int64), np.zeros(0, np.int64))
    dur = tasks["sim_dur_ns"].to_numpy() if sim_dur is None else np.asarray(sim_dur)
    return run(prepare(tasks, edges, lag_col), dur)


def simulate(graph: Graph, sim_dur: np.ndarray | None = None, lag_col: str = "lag_ns") -> Simulation:
    """simulate_graph with the graph's prepared arrays cached on it (graph.prepared)."""
    if graph.tasks.height == 0:
        return Simulation(np.zeros(0, np.int64), np.zeros(0, np.int64))
    prep = graph.prepared.get(lag_col)
    if prep is None:
        prep = graph.prepared[lag_col] = prepare(graph.tasks, graph.edges, lag_col)
    return run(prep, graph.tasks["sim_dur_ns"].to_numpy() if sim_dur is None else np.asarray(sim_dur))


def _csr_members(gid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Members of each collective group (ascending task id), CSR by group id."""
    m = np.flatnonzero(gid >= 0)
    ng = int(gid[m].max()) + 1 if m.size else 0
    o = m[np.argsort(gid[m], kind="stable")]
    return np.searchsorted(gid[o], np.arange(ng + 1)).astype(np.int64), o.astype(np.int64)


# The two loops below are sequential by nature (a longest path in visit order); numba compiles
# them (cached on disk), which makes a million-task replay take milliseconds instead of seconds.
@njit(cache=True, nogil=True)
def _run(nodes, phases, p1, s1, l1, p2, s2, l2, dur, ref, has_w, gid, gptr, gmem):  # pragma: no cover - compiled
    n = dur.size
    T = np.zeros(2 * n, np.int64)
    done = np.zeros(n, np.bool_)
    for i in range(nodes.size):
        v = nodes[i]
        if phases[i]:  # a synchronizing call ends `dur` after its start and the end of what it waits on
            s = T[2 * v]
            for k in range(p2[v], p2[v + 1]):
                x = T[s2[k]] + l2[k]
                if x > s:
                    s = x
            T[2 * v + 1] = s + dur[v]
            continue
        if done[v]:
            continue
        g = gid[v]
        if g < 0:
            a, b = p1[v], p1[v + 1]
            if a == b:
                s = ref[v]
            else:
                s = T[s1[a]] + l1[a]
                for k in range(a + 1, b):
                    x = T[s1[k]] + l1[k]
                    if x > s:
                        s = x
            T[2 * v] = s
            if not has_w[v]:
                T[2 * v + 1] = s + dur[v]
            done[v] = True
            continue
        # a collective: every member arrives on its own, all finish after the last arrival
        last = _MIN_NS
        for j in range(gptr[g], gptr[g + 1]):
            m = gmem[j]
            a, b = p1[m], p1[m + 1]
            if a == b:
                s = ref[m]
            else:
                s = T[s1[a]] + l1[a]
                for k in range(a + 1, b):
                    x = T[s1[k]] + l1[k]
                    if x > s:
                        s = x
            T[2 * m] = s
            if s > last:
                last = s
        for j in range(gptr[g], gptr[g + 1]):
            m = gmem[j]
            T[2 * m + 1] = last + dur[m]
            done[m] = True
    return T


@njit(cache=True, nogil=True)
def _kahn(ne, a, b, unit, key):  # pragma: no cover - compiled
    """Kahn's algorithm over units (an event, or a collective group's phase-1 events), ready units
    picked by smallest (key, unit); returns the events in visit order."""
    indeg = np.zeros(ne, np.int64)
    for k in range(b.size):
        indeg[b[k]] += 1
    o = np.argsort(a, kind="mergesort")
    a_s, b_s = a[o], b[o]
    ptr = np.searchsorted(a_s, np.arange(ne + 1))
    mo = np.argsort(unit, kind="mergesort")
    mptr = np.searchsorted(unit[mo], np.arange(ne + 1))
    heap = [(key[0], np.int64(0))]
    heap.pop()
    for u in range(ne):
        if unit[u] == u and indeg[u] == 0:
            heapq.heappush(heap, (key[u], np.int64(u)))
    out = np.empty(ne, np.int64)
    c = 0
    while len(heap) > 0:
        _, u = heapq.heappop(heap)
        for j in range(mptr[u], mptr[u + 1]):
            out[c] = mo[j]
            c += 1
        for k in range(ptr[u], ptr[u + 1]):
            w = b_s[k]
            indeg[w] -= 1
            if indeg[w] == 0:
                heapq.heappush(heap, (key[w], np.int64(w)))
    return out[:c]


def _kahn_order(n, src, dst, fs, is_wait, has_w, ev_key, ev_node, ev_phase, gid):
    """Topological order of the (node, phase) events by Kahn's algorithm, ready events picked by
    earliest traced key (Lumos pick()); a collective group is one unit, ready when all members are."""
    ne = ev_node.size
    ev_of = np.full((n, 2), -1, np.int64)
    ev_of[ev_node, ev_phase] = np.arange(ne)
    # unit of each event: groups merge their members' phase-1 events into the first member's
    unit = np.arange(ne)
    gm = gid >= 0
    if gm.any():
        mem = np.flatnonzero(gm)
        e1 = ev_of[mem, 0]
        first = np.full(int(gid.max()) + 1, ne, np.int64)
        np.minimum.at(first, gid[mem], e1)
        unit[e1] = first[gid[mem]]
    # dependencies between events: reading slot (start or end of src) -> needing phase of dst
    src_ev = np.where(fs | ~has_w[src], ev_of[src, 0], ev_of[src, 1])
    dst_ev = np.where(is_wait, ev_of[dst, 1], ev_of[dst, 0])
    a, b = unit[src_ev], unit[dst_ev]
    # phase 2 of a call needs its own phase 1
    a = np.concatenate([a, unit[ev_of[has_w, 0]]])
    b = np.concatenate([b, unit[ev_of[has_w, 1]]])
    keep = a != b
    out = _kahn(ne, a[keep].astype(np.int64), b[keep].astype(np.int64), unit.astype(np.int64), ev_key.astype(np.int64))
    if out.size < ne:
        raise ValueError(f"simulate: the execution graph has a cycle ({ne - out.size} task phases never become ready)")
    return ev_node[out], ev_phase[out]


# ---------------------------------------------------------------- interval helpers
def _union_len(s: np.ndarray, e: np.ndarray, w0: int, w1: int) -> int:
    us, ue = union_intervals(np.clip(s, w0, w1), np.clip(e, w0, w1))
    return int((ue - us).sum())


def _coverage_at(ms: np.ndarray, me: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Covered length of merged intervals up to each x."""
    if ms.size == 0:
        return np.zeros(x.size, np.int64)
    cum = np.concatenate([[0], np.cumsum(me - ms)])
    k = np.searchsorted(ms, x, side="right")  # intervals starting at or before x
    part = np.where(k > 0, np.clip(x - ms[np.maximum(k - 1, 0)], 0, (me - ms)[np.maximum(k - 1, 0)]), 0)
    return cum[np.maximum(k - 1, 0)] * (k > 0) + part


def breakdown(kind_comm: np.ndarray, s: np.ndarray, e: np.ndarray, w0: int, w1: int) -> dict:
    """Exposed compute / exposed communication / overlap / idle of GPU intervals in [w0, w1)."""
    c = ~kind_comm
    u_all = _union_len(s, e, w0, w1)
    u_c = _union_len(s[c], e[c], w0, w1)
    u_m = _union_len(s[~c], e[~c], w0, w1)
    return {"exposed_compute_ns": u_all - u_m, "exposed_comm_ns": u_all - u_c, "overlap_ns": u_c + u_m - u_all,
            "idle_ns": (w1 - w0) - u_all}


# ---------------------------------------------------------------- replay
@dataclass
class ReplayResult:
    tasks: pl.DataFrame  # graph tasks + sim_start_ns, sim_end_ns
    replays: pl.DataFrame  # docs/CONTRACT.mdreplays + iteration (+ actual_* breakdown)
    sm_util: pl.DataFrame  # replay_sm_util
    order_fallback: bool = False

    def chrome_trace(self, path: str | Path | None = None) -> dict:
        return export_chrome_trace(self.tasks, path)


def _windows(t: pl.DataFrame, start_col: str, end_col: str) -> pl.DataFrame:
    """Per rank and iteration: from the completion of iteration N-1 (its last CPU or GPU task) to the
    completion of N; the first iteration starts at its first task. Completion to completion is the
    throughput the GPU sustains even when the CPU runs ahead (no synchronization per step)."""
    it = t.select("rank", "iteration", start_col, end_col).filter(pl.col("iteration").is_not_null()).group_by(
        ["rank", "iteration"]).agg(first=pl.col(start_col).min(), w1=pl.col(end_col).max()).sort(["rank", "iteration"])
    return it.with_columns(w0=pl.col("w1").shift(1).over("rank").fill_null(pl.col("first"))).drop("first")


def _with_iterations(t: pl.DataFrame) -> pl.DataFrame:
    if t["iteration"].null_count() == t.height:  # no ProfilerStep annotations: the whole capture is one
        return t.with_columns(iteration=pl.lit(0, pl.Int64))
    return t


def iteration_times(graph: Graph, sim_dur: np.ndarray | None = None, lag_col: str = "lag_ns") -> pl.DataFrame:
    """Simulated time per rank and iteration (rank, iteration, simulated_ns): a replay without the
    breakdown and the comparison with the trace (what-if predictions need only this)."""
    sim = simulate(graph, sim_dur, lag_col)
    t = _with_iterations(graph.tasks.select("rank", "iteration").with_columns(s=pl.Series(sim.start), e=pl.Series(sim.end)))
    w = _windows(t, "s", "e")
    return w.select("rank", "iteration", simulated_ns=pl.col("w1") - pl.col("w0"))


def replay(graph: Graph, sim_dur: np.ndarray | None = None, sm_bucket_ns: int = SM_BUCKET_NS,
           calibrated: bool = False, lag_col: str | None = None) -> ReplayResult:
    """Simulate the graph and compare with the trace per rank and iteration.

    calibrated=False (default) uses the model lags (typical delay per edge type), so the error
    measures how well the graph's structure explains the trace; calibrated=True uses the exact lags
    and reproduces the trace of the unchanged graph; lag_col="lag_typical_ns" also replaces the
    delays no dependency explains by typical ones (how much those unexplained delays matter)."""
    sim = simulate(graph, sim_dur, lag_col or ("lag_calibrated_ns" if calibrated else "lag_ns"))
    full = graph.tasks.with_columns(sim_start_ns=pl.Series(sim.start), sim_end_ns=pl.Series(sim.end))
    t = _with_iterations(full.select("rank", "iteration", "kind", "cat", "is_comm", "ts_ns", "end_ns", "sim_start_ns", "sim_end_ns"))
    wa = _windows(t, "ts_ns", "end_ns").rename({"w0": "a0", "w1": "a1"})
    ws = _windows(t, "sim_start_ns", "sim_end_ns").rename({"w0": "s0", "w1": "s1"})
    w = wa.join(ws, on=["rank", "iteration"])
    rows = []
    gpu = t.filter(pl.col("kind") == "gpu")
    per_rank = {r: (g["is_comm"].to_numpy(), g["ts_ns"].to_numpy(), g["end_ns"].to_numpy(), g["sim_start_ns"].to_numpy(),
                    g["sim_end_ns"].to_numpy()) for (r,), g in gpu.partition_by("rank", as_dict=True).items()}
    empty = (np.zeros(0, bool), *[np.zeros(0, np.int64)] * 4)
    for r, it, a0, a1, s0, s1 in w.select("rank", "iteration", "a0", "a1", "s0", "s1").iter_rows():
        comm, ts, te, ss, se = per_rank.get(r, empty)
        sim_b = breakdown(comm, ss, se, s0, s1)
        act_b = breakdown(comm, ts, te, a0, a1)
        actual, simulated = a1 - a0, s1 - s0
        rows.append({"rank": r, "iteration": it, "actual_ns": actual, "simulated_ns": simulated,
                     "error_pct": abs(simulated - actual) / actual * 100 if actual > 0 else 0.0, **sim_b,
                     **{f"actual_{k}": v for k, v in act_b.items()}})
    cid = graph.meta.get("capture_id", "")
    rep = pl.DataFrame(rows, infer_schema_length=None) if rows else pl.DataFrame()
    rep = REPLAYS.validate(conform(rep.with_columns(capture_id=pl.lit(cid)) if rows else rep, REPLAYS))
    util = sm_utilization(t, sm_bucket_ns).with_columns(capture_id=pl.lit(cid))
    if full["iteration"].null_count() == full.height:
        full = full.with_columns(iteration=pl.lit(0, pl.Int64))
    return ReplayResult(full, rep, REPLAY_SM_UTIL.validate(conform(util, REPLAY_SM_UTIL)), sim.order_fallback)


def sm_utilization(t: pl.DataFrame, bucket_ns: int = SM_BUCKET_NS) -> pl.DataFrame:
    """Share of each bucket (from each timeline's own start) with any kernel running, actual vs simulated."""
    out = []
    k = t.select("rank", "cat", "ts_ns", "end_ns", "sim_start_ns", "sim_end_ns").filter(pl.col("cat") == "kernel")
    for (r,), g in k.partition_by("rank", as_dict=True).items():
        res = {}
        for name, sc, ec in (("actual_util", "ts_ns", "end_ns"), ("simulated_util", "sim_start_ns", "sim_end_ns")):
            s, e = g[sc].to_numpy(), g[ec].to_numpy()
            ms, me = union_intervals(s - s.min(), e - s.min())
            nb = int(me.max() // bucket_ns) + 1 if me.size else 0
            edges = np.arange(nb + 1, dtype=np.int64) * bucket_ns
            res[name] = np.diff(_coverage_at(ms, me, edges)) / bucket_ns
        nb = max(len(v) for v in res.values())
        res = {kk: np.pad(v, (0, nb - len(v))) for kk, v in res.items()}
        out.append(pl.DataFrame({"rank": np.full(nb, r, np.int32), "bucket": np.arange(nb, dtype=np.int64),
                                 "bucket_start_ns": np.arange(nb, dtype=np.int64) * bucket_ns, **res}))
    if not out:
        return pl.DataFrame(schema={"rank": pl.Int32, "bucket": pl.Int64, "bucket_start_ns": pl.Int64,
                                    "actual_util": pl.Float64, "simulated_util": pl.Float64})
    return pl.concat(out)


def _lanes(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Lane per slice of one track (slices sorted by start, longer first): a slice stays on a lane
    where it fits entirely inside the open slice or after it (properly nested), else the next lane
    (Perfetto draws partially overlapping slices of one thread wrongly)."""
    if len(start) < 2 or np.all(start[1:] >= np.maximum.accumulate(end)[:-1]):
        return np.zeros(len(start), dtype=np.int64)  # nothing overlaps (the usual track)
    return _lanes_loop(np.ascontiguousarray(start, dtype=np.int64), np.ascontiguousarray(end, dtype=np.int64))


@njit(cache=True)
def _lanes_loop(start, end):
    # lane k's open slices as a stack of end times: stack[k, :depth[k]]; lanes and depth grow as needed
    n = len(start)
    lane = np.zeros(n, dtype=np.int64)
    stack = np.zeros((4, 16), dtype=np.int64)
    depth = np.zeros(4, dtype=np.int64)
    n_lanes = 0
    for i in range(n):
        s, e = start[i], end[i]
        placed = False
        for k in range(n_lanes):
            while depth[k] > 0 and stack[k, depth[k] - 1] <= s:
                depth[k] -= 1
            if depth[k] == 0 or e <= stack[k, depth[k] - 1]:
                if depth[k] == stack.shape[1]:
                    grown = np.zeros((stack.shape[0], 2 * stack.shape[1]), dtype=np.int64)
                    grown[:, :stack.shape[1]] = stack
                    stack = grown
                stack[k, depth[k]] = e
                depth[k] += 1
                lane[i] = k
                placed = True
                break
        if not placed:
            if n_lanes == stack.shape[0]:
                grown = np.zeros((2 * stack.shape[0], stack.shape[1]), dtype=np.int64)
                grown[:stack.shape[0]] = stack
                stack = grown
                d2 = np.zeros(2 * depth.shape[0], dtype=np.int64)
                d2[:depth.shape[0]] = depth
                depth = d2
            stack[n_lanes, 0] = e
            depth[n_lanes] = 1
            lane[i] = n_lanes
            n_lanes += 1
    return lane


def chrome_trace_bytes(tasks: pl.DataFrame) -> bytes:
    """The simulated timeline as Chrome / Perfetto trace JSON: one process per rank, a track per
    thread or stream (overlapping work on extra tracks `<thread> (overlap k)`), timestamps in
    microseconds from a stated origin (otherData.t0_ns / t0_utc: float64 keeps every ns), written by
    polars' JSON writer (no Python object per event)."""
    if tasks.height == 0:
        return b'{"traceEvents": [], "displayTimeUnit": "ms", "otherData": {"producer": "fleetscope.traces.replay"}}'
    t0 = int(tasks["sim_start_ns"].min())
    t = tasks.select("rank", "processor", "name", "role", "task_id", s=pl.col("sim_start_ns"),
                     e=pl.max_horizontal("sim_start_ns", "sim_end_ns")).sort("rank", "processor", "s", pl.col("e"), descending=[False, False, False, True])
    new_track = t.select((pl.col("rank") != pl.col("rank").shift(1)) | (pl.col("processor") != pl.col("processor").shift(1)))
    s, e = t["s"].to_numpy(), t["e"].to_numpy()
    lane = np.zeros(len(t), dtype=np.int64)
    bounds = np.flatnonzero(np.r_[new_track.to_series().fill_null(True).to_numpy(), True])
    for a, b in zip(bounds[:-1], bounds[1:]):
        lane[a:b] = _lanes(s[a:b], e[a:b])
    t = t.with_columns(lane=pl.Series(lane))
    out = t.select(
        ph=pl.lit("X"),
        pid=pl.concat_str([pl.lit("rank "), pl.col("rank").cast(pl.Utf8)]),
        tid=pl.when(pl.col("lane") == 0).then(pl.col("processor").cast(pl.Utf8))
        .otherwise(pl.format("{} (overlap {})", pl.col("processor").cast(pl.Utf8), pl.col("lane"))),
        name="name",
        cat="role",
        ts=((pl.col("s") - t0) / 1000.0).round(3),
        dur=((pl.col("e") - pl.col("s")) / 1000.0).round(3),
        args=pl.struct(task_id="task_id"),
    )
    t0_utc = _dt.datetime.fromtimestamp(t0 / 1e9, tz=_dt.timezone.utc).isoformat(timespec="microseconds")
    return (b'{"traceEvents": ' + out.write_json().encode() + b', "displayTimeUnit": "ms", '
            b'"otherData": {"producer": "fleetscope.traces.replay", "time_unit": "microseconds since t0", '
            + f'"t0_ns": {t0}, "t0_utc": "{t0_utc}"'.encode() + b"}}")


def export_chrome_trace(tasks: pl.DataFrame, path: str | Path | None = None) -> dict:
    """The simulated timeline (chrome_trace_bytes) as a dict, written to `path` when given."""
    raw = chrome_trace_bytes(tasks)
    if path is not None:
        Path(path).write_bytes(raw)
    return json.loads(raw)


def holdout_lags(graph: Graph, fit_iteration: int | None = None) -> tuple[Graph, int]:
    """The graph with every edge delay taken from one iteration only (for an out-of-sample replay
    error: fit on that iteration, replay the others). Per rank, the edges into tasks of the other
    iterations get the lag of the same edge in the fit iteration (same rank, processor, subtype and
    position of the task on its processor within the iteration), else the median lag of the subtype
    in the fit iteration. fit_iteration: default the first iteration every rank has in full (the
    second one traced). Returns the graph (lag_ns replaced) and the fit iteration."""
    t = graph.tasks.select("task_id", "rank", "iteration", "processor", "ts_ns")
    its = sorted(t["iteration"].drop_nulls().unique().to_list())
    if not its:
        raise ValueError("holdout_lags: the graph has no iterations")
    fit = fit_iteration if fit_iteration is not None else its[1 if len(its) > 2 else 0]
    pos = t.sort(["rank", "processor", "iteration", "ts_ns", "task_id"]).with_columns(
        k=pl.int_range(pl.len()).over(["rank", "processor", "iteration"]))
    e = graph.edges.join(pos.select(dst="task_id", d_rank="rank", d_it="iteration", d_proc="processor", d_k="k"), on="dst", how="left")
    ref = e.filter(pl.col("d_it") == fit).group_by(["d_rank", "d_proc", "subtype", "d_k"]).agg(fit_lag=pl.col("lag_ns").median())
    typ = e.filter(pl.col("d_it") == fit).group_by("subtype").agg(typ_lag=pl.col("lag_ns").median())
    e = e.join(ref, on=["d_rank", "d_proc", "subtype", "d_k"], how="left", maintain_order="left").join(
        typ, on="subtype", how="left", maintain_order="left")
    lag = pl.when(pl.col("d_it") == fit).then(pl.col("lag_ns")).otherwise(
        pl.coalesce("fit_lag", "typ_lag", "lag_ns")).round(0).cast(pl.Int64)
    e = e.with_columns(lag_ns=lag).drop("d_rank", "d_it", "d_proc", "d_k", "fit_lag", "typ_lag")
    return Graph(graph.tasks, e, dict(graph.meta)), fit
