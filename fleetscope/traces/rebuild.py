"""What-ifs that rebuild the execution graph (Lumos 3.4): layers duplicated or removed with their
tasks, kernels and communication, and pipeline stages re-partitioned with a new 1F1B schedule and
new sends and receives. Both need the trace's layers (graph_tasks.layer / layer_pass: spans named
like `layers.3` and the backward operators of their forward operators, see graph._mark_layers).

A task's *own time* on its thread is its simulated duration plus the lag of its thread_order edge
to the next task of the thread (the untraced work after it; waits for collectives are not part of
that lag, graph._calibrate caps it), so the own times of a layer block add up to the time the
thread spends on that layer."""
from __future__ import annotations

import numpy as np
import polars as pl

from fleetscope.traces.graph import Graph

LAG_COLS = ["lag_ns", "lag_calibrated_ns", "lag_typical_ns"]
ORDER_SUBTYPES = ["thread_order", "stream_order", "comm_order"]


def has_layers(graph: Graph) -> bool:
    t = graph.tasks
    return "layer" in t.columns and t["layer"].null_count() < t.height


def _own_time(graph: Graph) -> pl.DataFrame:
    """task_id -> own time (sim_dur + lag of the thread_order edge leaving it)."""
    out_lag = graph.edges.filter(pl.col("subtype") == "thread_order").group_by("src").agg(_lag=pl.col("lag_ns").max())
    return graph.tasks.select("task_id", "sim_dur_ns").join(out_lag.rename({"src": "task_id"}), on="task_id", how="left").select(
        "task_id", own=pl.col("sim_dur_ns") + pl.col("_lag").fill_null(0))


def _blocks(graph: Graph) -> pl.DataFrame:
    """Layer blocks: maximal runs of consecutive tasks of a thread with the same (layer, pass), plus
    the GPU tasks they launch. -> task_id, rank, iteration, layer, layer_pass, block (id), thread."""
    t = graph.tasks
    thr = t.filter((pl.col("kind") == "cpu") & (pl.col("role") != "comm")).sort(["rank", "processor", "ts_ns", "task_id"]).select(
        "task_id", "rank", "iteration", "processor", "layer", "layer_pass")
    key = pl.concat_str([pl.col("layer").cast(pl.Utf8).fill_null("-"), pl.col("layer_pass").fill_null("-")])
    changed = (key != key.shift(1).over(["rank", "processor"])).fill_null(True)
    thr = thr.with_columns(block=changed.cast(pl.Int64).cum_sum()).filter(pl.col("layer").is_not_null())
    launch = graph.edges.filter(pl.col("subtype") == "launch").select("src", "dst")
    gpu = launch.join(thr.select(src="task_id", block="block"), on="src").select(task_id="dst", block="block").join(
        t.select("task_id", "rank", "iteration", "processor", "layer", "layer_pass"), on="task_id")
    return pl.concat([thr, gpu.select(thr.columns)]).rename({"processor": "proc"})


# ---------------------------------------------------------------- layers
def _stages_by_layers(t: pl.DataFrame, stage_of_rank: dict[int, int] | None) -> dict[int, list[int]]:
    """stage -> its layer numbers (sorted), from the marks of its ranks."""
    per_rank = t.filter(pl.col("layer").is_not_null()).group_by("rank").agg(pl.col("layer").unique().sort())
    out: dict[int, list[int]] = {}
    for r, ls in per_rank.iter_rows():
        s = (stage_of_rank or {}).get(int(r), 0 if stage_of_rank is None else None)
        if stage_of_rank is None:  # ranks with the same layers are one stage
            key = tuple(ls)
            s = next((k for k, v in out.items() if tuple(v) == key), len(out))
        if s is not None:
            out[int(s)] = sorted(set(out.get(int(s), [])) | set(int(x) for x in ls))
    return out


def _new_counts(old: dict[int, list[int]], layers_old: int, layers_new: int) -> dict[int, int]:
    """Layers per stage after the change, proportional to each stage's share (largest remainder)."""
    stages = sorted(old)
    raw = {s: len(old[s]) * layers_new / layers_old for s in stages}
    cnt = {s: int(np.floor(v)) for s, v in raw.items()}
    for s in sorted(stages, key=lambda s: raw[s] - cnt[s], reverse=True)[:layers_new - sum(cnt.values())]:
        cnt[s] += 1
    return cnt


def duplicate_layers(graph: Graph, layers_old: int, layers_new: int, stage_of_rank: dict[int, int] | None = None) -> Graph:
    """layers_old -> layers_new identical layers. Each stage gets its share of the new count; added
    layers are copies of the stage's last layers: every block (a layer's forward or backward on a
    thread, with the kernels it launches and the collectives inside it) is copied with its internal
    edges and inserted right after the original on each of its threads and streams; the copy's
    collectives form their own cross-rank groups. Removed layers (the stage's last ones) keep their
    place in the graph but take no time. The stage's data-parallel gradient collectives scale by
    its new / old layer count (more tensors or buckets of the same kind)."""
    if layers_old < 1 or layers_new < 1:
        raise ValueError("duplicate_layers: layers_old and layers_new must be >= 1")
    if not has_layers(graph):
        raise ValueError("duplicate_layers: the trace marks no numbered layers")
    t, e = graph.tasks, graph.edges
    stages = _stages_by_layers(t, stage_of_rank)
    counts = _new_counts(stages, layers_old, layers_new)
    rank_stage = {int(r): s for s, ls in stages.items() for r in
                  t.filter(pl.col("layer").is_in(ls))["rank"].unique().to_list()} if stage_of_rank is None else dict(stage_of_rank)
    blocks = _blocks(graph)
    new_t = []
    removed: list[pl.DataFrame] = []
    next_id = t.height
    ratio = {}
    e2 = e
    for s, ls in stages.items():
        extra = counts[s] - len(ls)
        ratio[s] = counts[s] / len(ls)
        ranks = [r for r, st in rank_stage.items() if st == s]
        if extra < 0:
            removed.append(blocks.filter(pl.col("rank").is_in(ranks) & pl.col("layer").is_in(ls[extra:])))
        for j in range(max(extra, 0)):
            layer = ls[len(ls) - 1 - (j % len(ls))]
            b = blocks.filter(pl.col("rank").is_in(ranks) & (pl.col("layer") == layer))
            if b.height == 0:
                continue
            tc, ec, next_id = _copy_blocks(t, e2, b, next_id, f"/dup{s}.{j}")
            new_t.append(tc)
            # the order edges each copy was spliced into are replaced by the splice
            cut = ec.filter(pl.col("_cut")).select("src", "dst", "subtype").unique()
            e2 = pl.concat([e2.join(cut, on=["src", "dst", "subtype"], how="anti"), ec.filter(~pl.col("_cut")).drop("_cut")],
                           how="diagonal_relaxed")
    t2 = pl.concat([t, *new_t], how="diagonal_relaxed") if new_t else t
    if removed:
        gone = pl.concat(removed)["task_id"].implode()
        t2 = t2.with_columns(sim_dur_ns=pl.when(pl.col("task_id").is_in(gone)).then(0).otherwise(pl.col("sim_dur_ns")))
        e2 = e2.with_columns([pl.when(pl.col("src").is_in(gone)).then(0).otherwise(pl.col(c)).alias(c) for c in LAG_COLS])
    # data-parallel gradient collectives: count scales with the stage's layers
    factor = pl.col("rank").replace_strict({r: ratio.get(s, 1.0) for r, s in rank_stage.items()}, default=1.0, return_dtype=pl.Float64)
    dp = (pl.col("role") == "comm") & pl.col("collective").is_in(["allreduce", "allgather", "reduce_scatter"]) & pl.col("in_layer").not_()
    t2 = t2.with_columns(sim_dur_ns=pl.when(dp).then((pl.col("sim_dur_ns") * factor).round(0)).otherwise(pl.col("sim_dur_ns")).cast(pl.Int64))
    return Graph(t2.sort("task_id"), e2, dict(graph.meta))


def _copy_blocks(t: pl.DataFrame, e: pl.DataFrame, b: pl.DataFrame, next_id: int, tag: str):
    """Copies of the tasks of blocks b (new ids from next_id) with the edges inside each block, spliced
    after each block on every processor: x -> y (x the block's last task on a processor, y the next
    task there) becomes x -> copy(first) and copy(last) -> y with the same lag. Returns the copied
    tasks, the new edges plus the replaced ones (marked _cut), and the next free id."""
    ids = b.sort("task_id").with_columns(new=pl.int_range(pl.len()).cast(pl.Int64) + next_id)
    m = ids.select("task_id", "new", "block")
    tc = t.join(m.select("task_id", "new"), on="task_id").with_columns(
        task_id=pl.col("new"), coll_group=pl.when(pl.col("coll_group").is_not_null()).then(pl.col("coll_group") + tag)).drop("new")
    # edges inside a block
    inner = e.join(m.select(src="task_id", s_new="new", s_blk="block"), on="src").join(
        m.select(dst="task_id", d_new="new", d_blk="block"), on="dst").filter(pl.col("s_blk") == pl.col("d_blk"))
    inner = inner.with_columns(src=pl.col("s_new"), dst=pl.col("d_new")).drop("s_new", "d_new", "s_blk", "d_blk")
    # splice per (block, processor): the block's first and last task there and the edge leaving it
    pos = ids.join(t.select("task_id", "processor", "ts_ns"), on="task_id").sort(["block", "processor", "ts_ns", "task_id"])
    ends = pos.group_by(["block", "processor"]).agg(first=pl.col("task_id").first(), last=pl.col("task_id").last(),
                                                    c_first=pl.col("new").first(), c_last=pl.col("new").last())
    order = e.filter(pl.col("subtype").is_in(ORDER_SUBTYPES))
    out = order.join(ends.select(src="last", c_first="c_first", c_last="c_last"), on="src")
    cut = out.with_columns(_cut=pl.lit(True))
    into_copy = out.with_columns(dst=pl.col("c_first")).drop("c_first", "c_last")
    from_copy = out.with_columns(src=pl.col("c_last")).drop("c_first", "c_last")
    # a block with no successor on a processor: its copy still follows it there
    lone = ends.join(out.select(last="src").unique(), on="last", how="anti")
    tail = lone.join(t.select(last="task_id", kind="kind"), on="last").select(
        src="last", dst="c_first", edge_type=pl.when(pl.col("kind") == "gpu").then(pl.lit("gpu_gpu")).otherwise(pl.lit("cpu_cpu")),
        subtype=pl.when(pl.col("kind") == "gpu").then(pl.lit("stream_order")).otherwise(pl.lit("thread_order")))
    for c in LAG_COLS:
        tail = tail.with_columns(pl.lit(0, pl.Int64).alias(c))
    new = pl.concat([inner, into_copy, from_copy, tail], how="diagonal_relaxed").with_columns(_cut=pl.lit(False))
    return tc, pl.concat([new, cut.drop("c_first", "c_last")], how="diagonal_relaxed"), next_id + ids.height


# ---------------------------------------------------------------- pipeline re-partition
def _stage_model(graph: Graph, stage_of_rank: dict[int, int], layers_old: list[int]) -> dict:
    """Per-layer forward / backward times, per-stage non-layer work, microbatches, the DP collectives
    per layer and the point-to-point and issue/wait times, all measured on the graph."""
    t, e = graph.tasks, graph.edges
    if not has_layers(graph):
        raise ValueError("pp_repartition: the trace marks no numbered layers")
    own = _own_time(graph)
    blocks = _blocks(graph).filter(pl.col("proc").str.starts_with("thread:")).join(own, on="task_id")
    blk = blocks.group_by(["rank", "iteration", "block", "layer", "layer_pass"]).agg(own=pl.col("own").sum())
    n_it = int(blk.group_by("rank").agg(pl.col("iteration").n_unique())["iteration"].min())
    # microbatches: forward runs of a layer per iteration (a layer's backward may be split in runs
    # by untagged tasks such as AccumulateGrad, its forward is not)
    micro = int(blk.filter(pl.col("layer_pass") == "fwd").group_by(["rank", "iteration", "layer"]).len()["len"].median())
    per_it = blk.group_by(["rank", "iteration", "layer", "layer_pass"]).agg(own=pl.col("own").sum() / micro).with_columns(
        stage=pl.col("rank").replace_strict(stage_of_rank, default=None, return_dtype=pl.Int64))
    per_layer = per_it.group_by(["stage", "layer", "layer_pass"]).agg(t=pl.col("own").mean()).sort(["stage", "layer"])
    f, b = [], []
    for s, n in enumerate(layers_old):
        sub = per_layer.filter(pl.col("stage") == s)
        ls = sorted(sub["layer"].unique().to_list())
        if len(ls) != n:
            raise ValueError(f"pp_repartition: stage {s} shows {len(ls)} numbered layers in the trace, not {n}")
        for layer in ls:
            f.append(float(sub.filter((pl.col("layer") == layer) & (pl.col("layer_pass") == "fwd"))["t"].sum()))
            b.append(float(sub.filter((pl.col("layer") == layer) & (pl.col("layer_pass") == "bwd"))["t"].sum()))
    # non-layer work of a thread per iteration: everything its tasks and untraced gaps take, but
    # the layers and the waits for collectives (cut from the thread_order lags, see graph._calibrate)
    thr = t.filter((pl.col("kind") == "cpu") & (pl.col("role") != "comm") & pl.col("iteration").is_not_null()).join(own, on="task_id")
    main = thr.group_by(["rank", "processor"]).agg(pl.col("own").sum()).sort("own", descending=True).unique("rank", keep="first")
    thr = thr.join(main.select("rank", "processor"), on=["rank", "processor"])
    work = thr.group_by(["rank", "iteration"]).agg(all=pl.col("own").sum(), layers=pl.col("own").filter(pl.col("layer").is_not_null()).sum())
    work = work.with_columns(stage=pl.col("rank").replace_strict(stage_of_rank, default=None, return_dtype=pl.Int64))
    other = work.group_by("stage").agg(o=(pl.col("all") - pl.col("layers")).mean())
    other = {int(s): float(o) for s, o in other.iter_rows()}
    comm = t.filter((pl.col("role") == "comm") & (pl.col("kind") == "cpu"))
    p2p = comm.filter(pl.col("collective").is_in(["send", "recv"]) & pl.col("coll_group").is_not_null()).group_by("coll_group").agg(
        y=pl.col("sim_dur_ns").max())
    dp = comm.filter(pl.col("collective").is_in(["allreduce", "allgather", "reduce_scatter"]) & pl.col("iteration").is_not_null())
    dp = dp.with_columns(stage=pl.col("rank").replace_strict(stage_of_rank, default=None, return_dtype=pl.Int64)).sort("ts_ns").with_columns(
        j=pl.int_range(pl.len()).over(["rank", "iteration"]))
    dp_pos = dp.group_by(["stage", "j"]).agg(y=pl.col("sim_dur_ns").median()).sort(["stage", "j"])
    dp_layer: list[list[float]] = []
    for s, n in enumerate(layers_old):
        ys = dp_pos.filter(pl.col("stage") == s)["y"].to_list()
        per = len(ys) / n if n else 0
        for k in range(n):
            dp_layer.append([float(y) for y in ys[int(round(k * per)):int(round((k + 1) * per))]])
    lag = e.group_by("subtype").agg(pl.col("lag_ns").median())
    lag = {k: int(v) for k, v in lag.iter_rows()}
    issue_op = t.filter(pl.col("is_comm") & (pl.col("kind") == "cpu") & (pl.col("role") != "comm"))["sim_dur_ns"].median()
    return {"f": f, "b": b, "other": other, "micro": micro, "iterations": n_it,
            "p2p_ns": float(p2p["y"].median()) if p2p.height else 0.0, "dp_layer": dp_layer,
            "dp": max(1, len(stage_of_rank) // max(1, len(layers_old))),
            "issue_ns": int(issue_op or 0), "issue_lag": lag.get("comm_issue", 0), "wait_lag": lag.get("comm_wait", 0),
            "order_lag": lag.get("comm_order", 0)}


class _Builder:
    """Tasks and edges of a rebuilt graph, one thread per rank plus its communication processors."""

    def __init__(self):
        self.rows: list[tuple] = []  # task_id, rank, iteration, processor, role, collective, dur, group
        self.edges: list[tuple] = []  # src, dst, subtype, lag, from_start
        self.last: dict[int, int] = {}  # rank -> last thread task
        self.pending: dict[int, list[int]] = {}  # rank -> comm tasks the next thread task waits for
        self.last_dp: dict[int, int] = {}

    def _task(self, rank, it, proc, role, coll, dur, group=None) -> int:
        i = len(self.rows)
        self.rows.append((i, rank, it, proc, role, coll, int(max(0, dur)), group))
        return i

    def work(self, rank, it, dur, lag=0, wait=True):
        """A task of the rank's thread; it waits for the collectives issued before (unless wait=False)."""
        i = self._task(rank, it, f"thread:{rank}", "cpu_op", None, dur)
        if rank in self.last:
            self.edges.append((self.last[rank], i, "thread_order", lag, False))
        if wait:
            for c in self.pending.pop(rank, []):
                self.edges.append((c, i, "comm_wait", self.m["wait_lag"], False))
        self.last[rank] = i
        return i

    def comm(self, rank, it, items, m):
        """Issue the collectives `items` [(collective, own ns, group, processor)] one after another
        (fused: none waits for the other), then the next thread task waits for all of them."""
        self.m = m
        issued = []
        for k, (coll, dur, group, proc) in enumerate(items):
            op = self.work(rank, it, m["issue_ns"], wait=k == 0)
            c = self._task(rank, it, proc, "comm", coll, dur, group)
            issued.append(c)
            self.edges.append((op, c, "comm_issue", m["issue_lag"], True))
            if proc.endswith(":dp"):
                if rank in self.last_dp:
                    self.edges.append((self.last_dp[rank], c, "comm_order", m["order_lag"], False))
                self.last_dp[rank] = c
        self.pending.setdefault(rank, []).extend(issued)

    def graph(self, meta: dict) -> Graph:
        t = pl.DataFrame(self.rows, orient="row", schema={"task_id": pl.Int64, "rank": pl.Int32, "iteration": pl.Int64,
                                                           "processor": pl.Utf8, "role": pl.Utf8, "collective": pl.Utf8,
                                                           "sim_dur_ns": pl.Int64, "coll_group": pl.Utf8})
        t = t.with_columns(kind=pl.lit("cpu"), cat=pl.lit("cpu_op"), name=pl.col("role"), is_comm=pl.col("role") == "comm",
                           wait_ref=pl.lit(None, pl.Int64), sim_start_ref=pl.lit(0, pl.Int64), ts_ns=pl.lit(0, pl.Int64),
                           end_ns=pl.lit(0, pl.Int64), in_layer=pl.lit(False))
        e = pl.DataFrame(self.edges, orient="row", schema={"src": pl.Int64, "dst": pl.Int64, "subtype": pl.Utf8, "lag_ns": pl.Int64,
                                                            "from_start": pl.Boolean})
        e = e.with_columns(edge_type=pl.lit("cpu_cpu"), lag_calibrated_ns=pl.col("lag_ns"), lag_typical_ns=pl.col("lag_ns"))
        return Graph(t, e, meta)


def pp_repartition(graph: Graph, stage_of_rank: dict[int, int], layers_old: list[int], layers_new: list[int]) -> Graph:
    """Pipeline stages re-partitioned (Lumos 3.4): stages of layers_old[s] layers become stages of
    layers_new[s'] layers (same total, contiguous layers, as many data-parallel replicas). The graph
    is rebuilt: per new stage and replica one thread runs a 1F1B schedule (Megatron's non-interleaved
    schedule: warm-up forwards, steady one-forward-one-backward with fused send/recv pairs, cool-down
    backwards) over the trace's microbatches; each layer's forward and backward take the time the
    trace measured for that layer; sends and receives between neighbouring stages are collectives
    of two with the trace's point-to-point time; each stage's data-parallel collectives are the ones
    of its layers (the trace's, by position), grouped across replicas; the non-layer work of the old
    first / last stage goes to the new first / last stage (middle stages: the smaller of the two),
    spread over the microbatches. The new graph has one task per layer and pass, not the layer's
    kernels: it answers for the step time and the schedule, not for kernel overlap."""
    if len(layers_old) < 1 or sum(layers_old) != sum(layers_new) or min(layers_new) < 1:
        raise ValueError("pp_repartition: layers_new must split the same total into stages of >= 1 layer")
    if sorted(set(stage_of_rank.values())) != list(range(len(layers_old))):
        raise ValueError("pp_repartition: stage_of_rank must name every stage of layers_old")
    m = _stage_model(graph, stage_of_rank, layers_old)
    P, M, dp = len(layers_new), m["micro"], m["dp"]
    bounds = np.cumsum([0] + list(layers_new))
    o_first, o_last = m["other"].get(0, 0.0), m["other"].get(len(layers_old) - 1, 0.0)
    bd = _Builder()
    bd.m = m
    for it in range(m["iterations"]):
        for s in range(P):
            lay = range(bounds[s], bounds[s + 1])
            other = (max(o_first, o_last) if P == 1 else o_first if s == 0 else o_last if s == P - 1 else min(o_first, o_last))
            per_mb = other / (2 * M)
            for d in range(dp):
                rank = s * dp + d

                def fwd(mb):
                    for li in lay:
                        bd.work(rank, it, m["f"][li])
                    bd.work(rank, it, per_mb)

                def bwd(mb):
                    for li in reversed(lay):
                        bd.work(rank, it, m["b"][li])
                    bd.work(rank, it, per_mb)

                def p2p(kind, mb, peer_stage):
                    # forward activations s -> s+1, gradients s+1 -> s; one group per (iteration, microbatch, direction, link)
                    lo = min(s, peer_stage)
                    g = f"pp:{it}:{mb}:{kind}:{lo}:{d}"
                    send = (kind == "f" and peer_stage > s) or (kind == "b" and peer_stage < s)
                    return ("send" if send else "recv", m["p2p_ns"], g, f"comm:{rank}:p2p")

                warm = min(P - s - 1, M)
                for k in range(warm):
                    if s > 0:
                        bd.comm(rank, it, [p2p("f", k, s - 1)], m)
                    fwd(k)
                    bd.comm(rank, it, [p2p("f", k, s + 1)], m)
                if M - warm > 0 and s > 0:
                    bd.comm(rank, it, [p2p("f", warm, s - 1)], m)
                for i in range(M - warm):
                    fwd(warm + i)
                    if s < P - 1:
                        bd.comm(rank, it, [p2p("f", warm + i, s + 1), p2p("b", i, s + 1)], m)
                    bwd(i)
                    if s > 0:
                        if i == M - warm - 1:
                            bd.comm(rank, it, [p2p("b", i, s - 1)], m)
                        else:
                            bd.comm(rank, it, [p2p("b", i, s - 1), p2p("f", warm + i + 1, s - 1)], m)
                for k in range(warm):
                    bd.comm(rank, it, [p2p("b", M - warm + k, s + 1)], m)
                    bwd(M - warm + k)
                    if s > 0:
                        bd.comm(rank, it, [p2p("b", M - warm + k, s - 1)], m)
                if dp > 1:
                    ys = [y for li in lay for y in m["dp_layer"][li]]
                    bd.comm(rank, it, [("allreduce", y, f"dp:{it}:{s}:{j}", f"comm:{rank}:dp") for j, y in enumerate(ys)], m)
                bd.work(rank, it, 0)
    g = bd.graph({**graph.meta, "rebuilt": f"pp {len(layers_old)} -> {P}", "ranks": list(range(P * dp))})
    t = g.tasks.with_columns(coll_group=pl.when(pl.col("coll_group").is_not_null() & (pl.col("coll_group").n_unique().over("coll_group") > 0)
                                                & (pl.len().over("coll_group") > 1)).then(pl.col("coll_group")))
    return Graph(t, g.edges, g.meta)
