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
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from fleetscope.schemas.base import conform
from fleetscope.traces.graph import Graph
from fleetscope.traces.schemas import REPLAY_SM_UTIL, REPLAYS

SM_BUCKET_NS = 1_000_000


@dataclass
class Simulation:
    start: np.ndarray  # simulated start per task_id
    end: np.ndarray
    order_fallback: bool = False


def simulate_graph(tasks: pl.DataFrame, edges: pl.DataFrame, sim_dur: np.ndarray | None = None, lag_col: str = "lag_ns") -> Simulation:
    """Simulated start/end (int64 ns, indexed by task_id; task_id must be 0..n-1).

    tasks: task_id, sim_dur_ns, sim_start_ref, wait_ref (sync calls), coll_group (optional);
    edges: src, dst, edge_type, lag_ns, from_start (optional)."""
    n = tasks.height
    if n == 0:
        return Simulation(np.zeros(0, np.int64), np.zeros(0, np.int64))
    tid = tasks["task_id"].to_numpy()
    if not np.array_equal(tid, np.arange(n)):
        raise ValueError("simulate: tasks must be sorted by task_id = 0..n-1")
    dur = (tasks["sim_dur_ns"].to_numpy() if sim_dur is None else np.asarray(sim_dur)).astype(np.int64)
    ref = tasks["sim_start_ref"].to_numpy().astype(np.int64)
    wref_s = tasks["wait_ref"] if "wait_ref" in tasks.columns else pl.Series([None] * n, dtype=pl.Int64)
    has_w = wref_s.is_not_null().to_numpy()
    wref = wref_s.fill_null(0).to_numpy().astype(np.int64)
    flow = edges.filter(pl.col("edge_type") != "collective")
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
        return np.searchsorted(d[o], np.arange(n + 1)), sl[o], lg[o]
    p1, s1, l1 = csr(~is_wait)
    p2, s2, l2 = csr(is_wait)
    has_w = has_w | (np.diff(p2) > 0)
    wkey = np.where(has_w, np.maximum(wref, ref), 0)
    # collective groups -> integer ids; the group is visited at the latest traced arrival
    gid = np.full(n, -1, np.int64)
    if "coll_group" in tasks.columns and tasks["coll_group"].null_count() < n:
        codes = tasks.select(pl.col("coll_group").cast(pl.Categorical).to_physical()).to_series()
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
        ev_node, ev_phase = _kahn_order(n, src, dst, fs, is_wait, has_w, ev_key, ev_node, ev_phase, gid)
        order = np.arange(ev_node.size)
    times = _run(ev_node[order].tolist(), ev_phase[order].tolist(), p1.tolist(), s1.tolist(), l1.tolist(),
                 p2.tolist(), s2.tolist(), l2.tolist(), dur.tolist(), ref.tolist(), has_w.tolist(), gid.tolist())
    t = np.asarray(times, np.int64)
    return Simulation(t[0::2], t[1::2], fallback)


def _run(nodes, phases, p1, s1, l1, p2, s2, l2, dur, ref, has_w, gid):
    n = len(dur)
    T = [0] * (2 * n)
    done = [False] * n
    members: dict[int, list[int]] = {}
    for i, g in enumerate(gid):
        if g >= 0:
            members.setdefault(g, []).append(i)
    for v, ph in zip(nodes, phases):
        if ph:  # a synchronizing call ends `dur` after its start and the end of what it waits on
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
        last = None
        for m in members[g]:
            a, b = p1[m], p1[m + 1]
            s = ref[m] if a == b else max(T[s1[k]] + l1[k] for k in range(a, b))
            T[2 * m] = s
            if last is None or s > last:
                last = s
        for m in members[g]:
            T[2 * m + 1] = last + dur[m]
            done[m] = True
    return T


def _kahn_order(n, src, dst, fs, is_wait, has_w, ev_key, ev_node, ev_phase, gid):
    """Topological order of the (node, phase) events by Kahn's algorithm, ready events picked by
    earliest traced key (Lumos pick()); a collective group is one unit, ready when all members are."""
    ne = ev_node.size
    ev_of = np.full((n, 2), -1, np.int64)
    ev_of[ev_node, ev_phase] = np.arange(ne)
    # unit of each event: groups merge their members' phase-1 events
    unit = np.arange(ne)
    gm = gid >= 0
    if gm.any():
        first = {}
        for v in np.flatnonzero(gm).tolist():
            e1 = ev_of[v, 0]
            unit[e1] = first.setdefault(int(gid[v]), e1)
    # dependencies between events: reading slot (start or end of src) -> needing phase of dst
    src_ev = np.where(fs | ~has_w[src], ev_of[src, 0], ev_of[src, 1])
    dst_ev = np.where(is_wait, ev_of[dst, 1], ev_of[dst, 0])
    a, b = unit[src_ev], unit[dst_ev]
    # phase 2 of a call needs its own phase 1
    a = np.concatenate([a, unit[ev_of[has_w, 0]]])
    b = np.concatenate([b, unit[ev_of[has_w, 1]]])
    keep = a != b
    a, b = a[keep], b[keep]
    indeg = np.zeros(ne, np.int64)
    np.add.at(indeg, b, 1)
    o = np.argsort(a, kind="stable")
    a, b = a[o], b[o]
    ptr = np.searchsorted(a, np.arange(ne + 1)).tolist()
    bl = b.tolist()
    is_unit = unit == np.arange(ne)
    members = {}
    for e_, u in enumerate(unit.tolist()):
        members.setdefault(u, []).append(e_)
    key = ev_key.tolist()
    heap = [(key[u], u) for u in np.flatnonzero(is_unit & (indeg == 0)).tolist()]
    heapq.heapify(heap)
    indeg = indeg.tolist()
    out = []
    while heap:
        _, u = heapq.heappop(heap)
        out.extend(members[u])
        for k in range(ptr[u], ptr[u + 1]):
            w = bl[k]
            indeg[w] -= 1
            if indeg[w] == 0:
                heapq.heappush(heap, (key[w], w))
    if len(out) < ne:
        raise ValueError(f"simulate: the execution graph has a cycle ({ne - len(out)} task phases never become ready)")
    out = np.asarray(out, np.int64)
    return ev_node[out], ev_phase[out]


# ---------------------------------------------------------------- interval helpers
def _union_len(s: np.ndarray, e: np.ndarray, w0: int, w1: int) -> int:
    s = np.clip(s, w0, w1)
    e = np.clip(e, w0, w1)
    k = e > s
    if not k.any():
        return 0
    s, e = s[k], e[k]
    o = np.argsort(s, kind="stable")
    s, e = s[o], e[o]
    run = np.maximum.accumulate(e)
    new = np.empty(s.size, bool)
    new[0] = True
    new[1:] = s[1:] > run[:-1]
    seg_start = s[new]
    seg_end = np.append(run[np.flatnonzero(new)[1:] - 1], run[-1])
    return int((seg_end - seg_start).sum())


def _merged(s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    k = e > s
    s, e = s[k], e[k]
    if s.size == 0:
        return s, e
    o = np.argsort(s, kind="stable")
    s, e = s[o], e[o]
    run = np.maximum.accumulate(e)
    new = np.empty(s.size, bool)
    new[0] = True
    new[1:] = s[1:] > run[:-1]
    return s[new], np.append(run[np.flatnonzero(new)[1:] - 1], run[-1])


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
    it = t.filter(pl.col("iteration").is_not_null()).group_by(["rank", "iteration"]).agg(
        first=pl.col(start_col).min(), w1=pl.col(end_col).max()).sort(["rank", "iteration"])
    return it.with_columns(w0=pl.col("w1").shift(1).over("rank").fill_null(pl.col("first"))).drop("first")


def replay(graph: Graph, sim_dur: np.ndarray | None = None, sm_bucket_ns: int = SM_BUCKET_NS,
           calibrated: bool = False, lag_col: str | None = None) -> ReplayResult:
    """Simulate the graph and compare with the trace per rank and iteration.

    calibrated=False (default) uses the model lags (typical delay per edge type), so the error
    measures how well the graph's structure explains the trace; calibrated=True uses the exact lags
    and reproduces the trace of the unchanged graph; lag_col="lag_typical_ns" also replaces the
    delays no dependency explains by typical ones (how much those unexplained delays matter)."""
    t = graph.tasks
    sim = simulate_graph(t, graph.edges, sim_dur, lag_col or ("lag_calibrated_ns" if calibrated else "lag_ns"))
    t = t.with_columns(sim_start_ns=pl.Series(sim.start), sim_end_ns=pl.Series(sim.end))
    if t["iteration"].null_count() == t.height:  # no ProfilerStep annotations: the whole capture is one
        t = t.with_columns(iteration=pl.lit(0, pl.Int64))
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
    return ReplayResult(t, rep, REPLAY_SM_UTIL.validate(conform(util, REPLAY_SM_UTIL)), sim.order_fallback)


def sm_utilization(t: pl.DataFrame, bucket_ns: int = SM_BUCKET_NS) -> pl.DataFrame:
    """Share of each bucket (from each timeline's own start) with any kernel running, actual vs simulated."""
    out = []
    k = t.filter(pl.col("cat") == "kernel")
    for (r,), g in k.partition_by("rank", as_dict=True).items():
        res = {}
        for name, sc, ec in (("actual_util", "ts_ns", "end_ns"), ("simulated_util", "sim_start_ns", "sim_end_ns")):
            s, e = g[sc].to_numpy(), g[ec].to_numpy()
            ms, me = _merged(s - s.min(), e - s.min())
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


def export_chrome_trace(tasks: pl.DataFrame, path: str | Path | None = None) -> dict:
    """Simulated timeline as a Chrome / Perfetto trace (one process per rank, a row per thread or stream)."""
    t = tasks.select(
        pid=pl.concat_str([pl.lit("rank "), pl.col("rank").cast(pl.Utf8)]),
        tid=pl.col("processor"),
        name="name",
        cat="role",
        ts=pl.col("sim_start_ns") / 1000.0,
        dur=(pl.col("sim_end_ns") - pl.col("sim_start_ns")).clip(lower_bound=0) / 1000.0,
        task_id="task_id",
    )
    ev = [{"ph": "X", "pid": p, "tid": q, "name": n, "cat": c, "ts": ts, "dur": d, "args": {"task_id": i}}
          for p, q, n, c, ts, d, i in t.iter_rows()]
    doc = {"traceEvents": ev, "displayTimeUnit": "ns", "otherData": {"producer": "fleetscope.traces.replay"}}
    if path is not None:
        Path(path).write_text(json.dumps(doc))
    return doc
