"""Lumos execution graphs (paper section 3.3) from trace_events.

Tasks: CPU tasks are the leaf events of each thread's timeline (runtime calls and the innermost
operators; parents only add the CPU gaps between their children), GPU tasks are kernels, memcpys
and memsets on their stream. Edges (src -> dst, typed):

  cpu_cpu  thread_order   consecutive CPU tasks of a thread (lag = the CPU work between them)
           inter_thread   a significant gap on a thread that ends right after a task of another
                          thread ends (e.g. the backward thread waiting for the forward pass)
  cpu_gpu  launch         runtime call -> the kernel / memcpy / memset with its correlation id
  gpu_cpu  stream_sync    cudaStreamSynchronize waits for the last task launched on its stream
           context_sync   cudaDeviceSynchronize waits for the last task of every stream
           event_sync     cudaEventSynchronize waits for the task recorded by cudaEventRecord
           blocking_copy  a synchronous (pageable) memcpy call waits for its own copy
  gpu_gpu  stream_order   consecutive tasks of a stream
           event_wait     cudaEventRecord on stream A -> cudaStreamWaitEvent on stream B: the next
                          task on B waits for the last task launched on A before the record
           inferred_wait  a task that starts late, right after a task of another stream ended,
                          where the trace shows no record/wait pair
  collective peer         the same collective (process group, sequence) on different ranks

CPU-only ranks (gloo: no kernels) have CPU communication tasks instead of communication kernels: the
collective's work span (gloo:all_reduce on the backend's worker thread, gloo:send / gloo:recv beside
the issuing thread), linked by

  cpu_cpu  comm_issue     the c10d:: operator that issued it -> the span
           comm_wait      the span -> the issuing thread's next task when the thread waited for it
           comm_order     consecutive collectives of a worker thread
  collective peer         matched across ranks by size and overlap in time (gloo traces name no
                          process group or peer), see _cpu_collective_groups

Runtime dependencies of Lumos Algorithm 1 ("a stream sync waits for whatever kernel is last on the
stream") are resolved here, once: streams are FIFO in launch order and a thread's launch order is
fixed, so the kernel that is last at the time of the call is known from the launch order.

Each edge carries `lag_ns`, the delay from src's end to dst's start that the simulator applies.
It is exact for the edge that bound dst in the trace and capped at the typical value of its type
for the others, so replaying the unchanged graph reproduces the trace while edited graphs
(what-if) only keep delays that were real work."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import polars as pl

from fleetscope.common import by_name
from fleetscope.schemas.base import conform
from fleetscope.traces.schemas import EDGE_SUBTYPES, EDGE_TYPES, GRAPH_EDGES, GRAPH_TASKS

CPU_CATS = ["cpu_op", "user_annotation", "python_function", "cuda_runtime", "cuda_driver"]
GPU_CATS = ["kernel", "gpu_memcpy", "gpu_memset"]
INTER_THREAD_GAP_NS = 50_000  # a gap longer than this on a thread is looked at as a wait
INTER_THREAD_WAKE_NS = 20_000  # ... explained by another thread when one of its tasks ended this shortly before
_STEP_RX = r"^ProfilerStep#(\d+)$"


@dataclass
class Graph:
    tasks: pl.DataFrame  # graph_tasks
    edges: pl.DataFrame  # graph_edges
    meta: dict = field(default_factory=dict)
    # simulation arrays per lag column (fleetscope.traces.replay.prepare): they depend on the
    # structure, lags and traced starts, not on durations, so duration edits share them
    prepared: dict = field(default_factory=dict, repr=False, compare=False)

    def copy(self) -> "Graph":
        return Graph(self.tasks.clone(), self.edges.clone(), dict(self.meta))

    def with_durations(self, tasks: pl.DataFrame) -> "Graph":
        """The same graph with these tasks, which differ only in sim_dur_ns (keeps the prepared arrays)."""
        return Graph(tasks, self.edges, dict(self.meta), self.prepared)


def _runtime_role(name: pl.Expr) -> pl.Expr:
    n = name.str.replace(r"^(cuda|hip|cu)", "")
    return (
        pl.when(n.str.contains(r"^StreamSynchronize")).then(pl.lit("stream_sync"))
        .when(n.str.contains(r"^(DeviceSynchronize|CtxSynchronize)")).then(pl.lit("context_sync"))
        .when(n.str.contains(r"^EventSynchronize")).then(pl.lit("event_sync"))
        .when(n.str.contains(r"^EventRecord")).then(pl.lit("event_record"))
        .when(n.str.contains(r"^StreamWaitEvent")).then(pl.lit("stream_wait"))
        .otherwise(pl.lit("runtime"))
    )


def _iterations(ev: pl.DataFrame) -> pl.DataFrame:
    """ProfilerStep#N annotations per rank: rank, iteration, start_ns, end_ns (next step's start)."""
    st = (
        ev.filter((pl.col("cat") == "user_annotation") & pl.col("name").str.contains(_STEP_RX))
        .select("rank", iteration=pl.col("name").str.extract(_STEP_RX, 1).cast(pl.Int64), start_ns=pl.col("ts_ns"), step_end=pl.col("end_ns"))
        .sort(["rank", "start_ns"])
        .unique(["rank", "iteration"], keep="first", maintain_order=True)
    )
    return st.with_columns(end_ns=pl.max_horizontal(pl.col("start_ns").shift(-1).over("rank").fill_null(pl.col("step_end")), pl.col("step_end")))


def _cpu_comm(ev: pl.DataFrame) -> pl.Expr:
    """Communication tasks of ranks without GPU kernels (gloo): the collective's work span (gloo:all_reduce,
    gloo:send, ...), which runs on a worker thread or overlaps its issuing thread's next operators; the
    c10d:: operator that issues it stays a task of its thread."""
    gpu_ranks = ev["rank"].filter(ev["cat"] == "kernel").unique().implode()
    return (pl.col("is_comm") & (pl.col("cat") == "user_annotation") & pl.col("collective").is_not_null() & (pl.col("ph") == "X")
            & ~pl.col("rank").is_in(gpu_ranks))


# the trace_events columns the graph's tasks carry (the others stay in trace_events: narrow frames sort,
# join and filter several times faster on millions of tasks)
TASK_EVENT_COLUMNS = ["rank", "event_id", "cat", "name", "ph", "pid", "tid", "ts_ns", "dur_ns", "end_ns", "device", "stream",
                      "correlation", "is_comm", "collective", "msg_bytes", "out_msg_bytes", "group_size", "group_ranks", "pg_name"]


def _rows(t: pl.DataFrame, cond: pl.Expr, *cols, **named) -> pl.DataFrame:
    """t's rows where cond holds, with only the columns asked for (filtering the whole task table first
    copies its ~30 columns of millions of rows)."""
    return t.lazy().filter(cond).select(*cols, **named).collect()


def _tasks(ev: pl.DataFrame) -> pl.DataFrame:
    """CPU leaf tasks, CPU communication tasks (gloo) and GPU tasks of every rank with processors,
    roles and iterations, ordered by (rank, start, kind, event id).

    Which events are tasks and their order are decided on a narrow frame of row numbers, times and keys;
    the events' other columns are gathered once, in the final order (sorting and filtering every
    column of millions of events several times over cost seconds and gigabytes)."""
    ev = ev.select([c for c in TASK_EVENT_COLUMNS if c in ev.columns])
    cc = _cpu_comm(ev)
    k = ev.select("rank", "pid", "tid", "cat", "ph", "ts_ns", "dur_ns", "end_ns", "correlation", "event_id", _cc=cc).with_row_index("_i")
    cpu = k.filter(pl.col("cat").is_in(CPU_CATS) & (pl.col("ph") == "X") & ~pl.col("_cc"))
    # driver calls nested in a runtime call share its correlation: keep the runtime call
    drv = cpu.filter(pl.col("cat") == "cuda_driver")
    if drv.height:
        runtime_corr = cpu.filter(pl.col("cat") == "cuda_runtime").select("rank", "correlation").drop_nulls().unique()
        drv = drv.filter(pl.col("correlation").is_not_null()).join(runtime_corr, on=["rank", "correlation"], how="anti")
        cpu = pl.concat([cpu.filter(pl.col("cat") != "cuda_driver"), drv])
    cpu = cpu.with_columns(_th=pl.struct("rank", "pid", "tid").rank("dense")).sort(["_th", "ts_ns", "dur_ns"], descending=[False, False, True])
    nxt = pl.col("ts_ns").shift(-1).over("_th")
    cpu = cpu.filter(nxt.is_null() | (nxt >= pl.col("end_ns")) | (pl.col("cat") == "cuda_runtime"))
    order = pl.concat([
        cpu.select("_i", "rank", "ts_ns", "event_id", kind=pl.lit("cpu"), _part=pl.lit(0, pl.Int8)),
        k.filter("_cc").select("_i", "rank", "ts_ns", "event_id", kind=pl.lit("cpu"), _part=pl.lit(1, pl.Int8)),
        k.filter(pl.col("cat").is_in(GPU_CATS)).select("_i", "rank", "ts_ns", "event_id", kind=pl.lit("gpu"), _part=pl.lit(2, pl.Int8)),
    ]).sort(["rank", "ts_ns", "kind", "event_id"])
    del k, cpu
    tasks = ev[order["_i"]].with_columns(kind=order["kind"], _part=order["_part"])
    del order
    rt = tasks["name"].filter(tasks["cat"] == "cuda_runtime")
    part = pl.col("_part")
    tasks = tasks.with_columns(
        # thread:<pid>:<tid>, comm:<pid>:<tid>[:p2p], stream:<device>:<stream>, built by one concat_str (a
        # when/then of three concat_str builds all three for every task)
        processor=pl.concat_str([
            pl.when(part == 0).then(pl.lit("thread:")).when(part == 1).then(pl.lit("comm:")).otherwise(pl.lit("stream:")),
            pl.when(part < 2).then(pl.col("pid")).otherwise(pl.col("device").cast(pl.Utf8)), pl.lit(":"),
            pl.when(part < 2).then(pl.col("tid")).otherwise(pl.col("stream").cast(pl.Utf8)),
            # point-to-point work spans overlap each other and their thread's operators: a processor of
            # their own (no order among them); collectives run in order on the backend's worker thread
            pl.when((part == 1) & pl.col("collective").is_in(["send", "recv"])).then(pl.lit(":p2p")).otherwise(pl.lit(""))]),
        role=pl.when(pl.col("_part") == 1).then(pl.lit("comm"))
        .when((pl.col("_part") == 0) & (pl.col("cat") == "cuda_runtime")).then(
            by_name(rt, _runtime_role) if rt.len() else pl.lit(None, pl.Utf8))
        .when(pl.col("_part") == 0).then(pl.lit("cpu_op"))
        .when(pl.col("is_comm")).then(pl.lit("comm"))
        .when(pl.col("cat") == "gpu_memcpy").then(pl.lit("memcpy"))
        .when(pl.col("cat") == "gpu_memset").then(pl.lit("memset"))
        .otherwise(pl.lit("compute")),
    )
    # iteration: CPU tasks by time inside ProfilerStep#N, GPU tasks by their launching call
    its = _iterations(ev)
    if its.height:
        it = pl.Series("iteration", _step_of(tasks["rank"].to_numpy(), tasks["ts_ns"].to_numpy(), its)).fill_nan(None).cast(pl.Int64)
        n = tasks.select("rank", "cat", "correlation", "_part").with_columns(it).with_row_index("_r")
        # a GPU task's launching call: a thread task (_part 0) with its correlation that is not an operator
        launch_it = n.filter((pl.col("_part") == 0) & pl.col("correlation").is_not_null() & (pl.col("cat") != "cpu_op")).group_by(
            ["rank", "correlation"]).agg(_lit=pl.col("iteration").first())
        g = n.filter(pl.col("_part") == 2).select("_r", "rank", "correlation", "iteration").join(
            launch_it, on=["rank", "correlation"], how="left")
        it = it.scatter(g["_r"], g.select(pl.coalesce("_lit", "iteration")).to_series())
        tasks = tasks.with_columns(it)
    else:
        tasks = tasks.with_columns(iteration=pl.lit(None, pl.Int64))
    return tasks.drop("_part")


def _step_of(rank: np.ndarray, ts: np.ndarray, its: pl.DataFrame) -> np.ndarray:
    """Per task (rows sorted by rank, then start): the ProfilerStep it starts in (the latest step of its rank
    starting at or before it, while that step lasts), else NaN; searchsorted per rank on the sorted tasks."""
    out = np.full(rank.size, np.nan)
    bounds = np.flatnonzero(np.r_[True, rank[1:] != rank[:-1], True])
    steps = {r: g.sort("start_ns") for (r,), g in its.partition_by("rank", as_dict=True).items()}
    for a, b in zip(bounds[:-1], bounds[1:]):
        st = steps.get(rank[a])
        if st is None:
            continue
        start, end, num = st["start_ns"].to_numpy(), st["end_ns"].to_numpy(), st["iteration"].to_numpy()
        k = np.searchsorted(start, ts[a:b], side="right") - 1
        ok = (k >= 0) & (ts[a:b] < end[np.maximum(k, 0)])
        out[a:b][ok] = num[k[ok]]
    return out


def _host_expr() -> pl.Expr:
    """The host from Kineto's default trace file name `<host>_<pid>.<ms>.pt.trace.json[.gz]`; null
    for any other name (the trace itself does not name its host)."""
    if_kineto = pl.col("source_file").str.extract(r"([^/\\]+)_\d+\.\d+\.pt\.trace\.json(?:\.gz)?$", 1)
    return if_kineto


def build_graph(events: pl.DataFrame, capture_id: str | None = None, stage_of_rank: dict[int, int] | None = None,
                places: dict[int, tuple] | None = None) -> Graph:
    """trace_events of one capture (one or many ranks) -> one execution graph. The capture's layout, when
    known: stage_of_rank numbers layers found without names across pipeline stages; places {rank:
    (stage, dp_rank, tp_rank)} confines the matching of CPU collectives (which name no group or peer)
    to ranks of one data- / tensor-parallel group and point-to-point transfers to pipeline neighbours."""
    if events.height == 0:
        raise ValueError("build_graph: no trace events")
    cid = capture_id if capture_id is not None else events["capture_id"][0]
    hosts = events.group_by("rank").agg(pl.col("source_file").first()).with_columns(host=_host_expr())
    tasks = _tasks(events).with_row_index("task_id").with_columns(
        pl.col("task_id").cast(pl.Int64), host=pl.col("rank").replace_strict(hosts["rank"], hosts["host"], default=None),
        _pk=pl.struct("rank", "processor").rank("dense").cast(pl.Int32))  # processor as a number: sorts and windows on it are cheap
    launched = _gpu_by_launch(tasks)
    calls = _sync_info(tasks, events, launched)  # shared by the sync and event-wait edges
    edges = [
        _thread_edges(tasks),
        _launch_edges(tasks),
        _stream_edges(tasks),
        _sync_edges(tasks, events, calls, launched),
        _event_wait_edges(tasks, events, calls, launched),
        _cpu_comm_edges(tasks),
    ]
    del calls, launched  # intermediates go as soon as they are used: the build's peak memory is the run's
    tasks = _collective_groups(tasks)
    tasks = _cpu_collective_groups(tasks, places)
    from fleetscope.traces.layers import training_ops

    top_ops = training_ops(events)  # the training threads' operators with their nesting (layers, gradients)
    tasks = _mark_layers(tasks, events, stage_of_rank=stage_of_rank, ops=top_ops)
    grads = _gradients(tasks, events, top_ops)
    del top_ops
    edges.append(_collective_edges(tasks))
    e = pl.concat([x for x in edges if x.height], how="vertical_relaxed") if any(x.height for x in edges) else pl.DataFrame(
        schema=EDGE_SCHEMA)
    del edges
    # the first of each (src, dst, subtype), by one integer key (a unique over three columns of millions of rows costs seconds)
    bits = max(1, tasks.height.bit_length())
    key = (pl.col("src") * (1 << bits) + pl.col("dst")) * 64 + pl.col("subtype").to_physical().cast(pl.Int64)
    e = e.filter(key.is_first_distinct() & (pl.col("src") != pl.col("dst"))) if 2 * bits + 6 < 63 else e.unique(
        ["src", "dst", "subtype"], keep="first", maintain_order=True).filter(pl.col("src") != pl.col("dst"))
    inferred = _infer_stream_waits(*_calibrate(tasks, e, binding_only=True)[:2])
    if inferred.height:
        e = pl.concat([e, inferred], how="vertical_relaxed")
    tasks, e, dropped = _calibrate(tasks, e)
    tasks = tasks.with_columns(capture_id=pl.lit(cid))
    e = e.with_columns(src_rank=tasks["rank"].gather(e["src"]), rank=tasks["rank"].gather(e["dst"]), capture_id=pl.lit(cid))
    t = GRAPH_TASKS.validate(conform(tasks, GRAPH_TASKS))
    del tasks
    ed = GRAPH_EDGES.validate(conform(e, GRAPH_EDGES))
    del e
    meta = {"capture_id": cid, "ranks": sorted(events["rank"].unique().to_list()), **dropped, **grads}
    return Graph(t, ed, meta)


def _gradients(t: pl.DataFrame, events: pl.DataFrame, ops: pl.DataFrame | None = None) -> dict:
    """What a data-parallel what-if on a job without data parallelism needs: grad_bytes {rank: bytes of the
    parameters its forward operators read per microbatch (trace_events.weight_bytes of one forward
    segment, fleetscope.traces.layers)}, optimizer_tasks {rank: the first task of the training thread at
    or after each Optimizer.step# annotation}. Empty when the trace shows no parameter sizes."""
    from fleetscope.traces.layers import forward_segments

    if "weight_bytes" not in events.columns or events["weight_bytes"].null_count() == events.height:
        return {}
    seg = forward_segments(events, ops)
    if seg.height == 0:
        return {}
    w = events.filter(pl.col("weight_bytes").is_not_null()).select(pl.col("rank").cast(pl.Int32), "ts_ns", "weight_bytes").sort("ts_ns")
    marks = seg.filter("forward").select(pl.col("rank").cast(pl.Int32), "step", "seg", _t="ts_ns").sort("_t")
    per = w.join_asof(marks, left_on="ts_ns", right_on="_t", by="rank", strategy="backward", check_sortedness=False).drop_nulls("seg")
    per = per.group_by("rank", "step", "seg").agg(b=pl.col("weight_bytes").sum()).group_by("rank").agg(b=pl.col("b").median())
    opt = events.filter((pl.col("cat") == "user_annotation") & pl.col("name").str.starts_with("Optimizer.step#")).select(
        pl.col("rank").cast(pl.Int32), "tid", _o="ts_ns").sort("_o")
    cpu = _rows(t, (pl.col("kind") == "cpu") & (pl.col("role") != "comm"), "rank", "tid", "task_id", "ts_ns").sort("ts_ns")
    first = opt.join_asof(cpu, left_on="_o", right_on="ts_ns", by=["rank", "tid"], strategy="forward", check_sortedness=False).drop_nulls(
        "task_id").group_by("rank").agg(pl.col("task_id"))
    return {"grad_bytes": {int(r): int(b) for r, b in per.iter_rows() if b},
            "optimizer_tasks": {int(r): [int(x) for x in ids] for r, ids in first.iter_rows()}}


# ---------------------------------------------------------------- edges
# edge kinds as enums while the graph is built (compared, joined and sorted millions of times); the
# graph_edges table stores them as text
EDGE_TYPE = pl.Enum(EDGE_TYPES)
EDGE_SUBTYPE = pl.Enum(EDGE_SUBTYPES)
EDGE_SCHEMA = {"src": pl.Int64, "dst": pl.Int64, "edge_type": EDGE_TYPE, "subtype": EDGE_SUBTYPE}


def _edge(df: pl.DataFrame, etype: str, sub: str) -> pl.DataFrame:
    return df.select(pl.col("src").cast(pl.Int64), pl.col("dst").cast(pl.Int64), edge_type=pl.lit(etype, EDGE_TYPE),
                     subtype=pl.lit(sub, EDGE_SUBTYPE))


def _thread_edges(t: pl.DataFrame) -> pl.DataFrame:
    # tasks are in task_id order, which is (start, task_id) order on each processor: no sort needed
    cpu = _rows(t, (pl.col("kind") == "cpu") & (pl.col("role") != "comm"), "rank", "pid", "processor", "_pk", "task_id", "ts_ns", "end_ns")
    order = cpu.select(
        "rank", "pid", "processor", "task_id", "ts_ns", "end_ns",
        src=pl.col("task_id").shift(1).over("_pk"),
        prev_end=pl.col("end_ns").shift(1).over("_pk"),
    )
    intra = _edge(order.filter(pl.col("src").is_not_null()).rename({"task_id": "dst"}), "cpu_cpu", "thread_order")
    # inter-thread: a long gap on a thread that starts right after another thread's task ended
    gaps = order.filter(pl.col("src").is_not_null() & ((pl.col("ts_ns") - pl.col("prev_end")) > INTER_THREAD_GAP_NS))
    if gaps.height == 0:
        return intra
    ends = cpu.select("rank", "pid", pl.col("processor").alias("o_proc"), pl.col("task_id").alias("o_id"), pl.col("end_ns").alias("o_end")).sort("o_end")
    cand = gaps.sort("ts_ns").join_asof(ends, left_on="ts_ns", right_on="o_end", by=["rank", "pid"], strategy="backward",
                                        check_sortedness=False)
    # the asof match may be on the same thread; then look at the latest end on another thread
    other = cand.filter(pl.col("o_proc").is_not_null() & (pl.col("o_proc") != pl.col("processor")) & (pl.col("o_end") > pl.col("prev_end"))
                        & (pl.col("ts_ns") - pl.col("o_end") <= INTER_THREAD_WAKE_NS))
    inter = other.select(src=pl.col("o_id"), dst=pl.col("task_id"))
    return pl.concat([intra, _edge(inter, "cpu_cpu", "inter_thread")])


def _launch_edges(t: pl.DataFrame) -> pl.DataFrame:
    cpu = _rows(t, (pl.col("kind") == "cpu") & pl.col("correlation").is_not_null() & pl.col("cat").is_in(["cuda_runtime", "cuda_driver"]),
                "rank", "correlation", src=pl.col("task_id"))
    gpu = _rows(t, (pl.col("kind") == "gpu") & pl.col("correlation").is_not_null(), "rank", "correlation", dst=pl.col("task_id"))
    j = cpu.join(gpu, on=["rank", "correlation"])
    return _edge(j, "cpu_gpu", "launch")


def _stream_edges(t: pl.DataFrame) -> pl.DataFrame:
    g = t.filter(pl.col("kind") == "gpu").select("_pk", "ts_ns", "task_id")  # in (start, task_id) order per stream
    e = g.select(src=pl.col("task_id").shift(1).over("_pk"), dst=pl.col("task_id")).filter(pl.col("src").is_not_null())
    return _edge(e, "gpu_gpu", "stream_order")


def _gpu_by_launch(t: pl.DataFrame) -> pl.DataFrame:
    """GPU tasks with the time their launch call started (streams run in launch order)."""
    launches = _rows(t, (pl.col("kind") == "cpu") & pl.col("correlation").is_not_null() & pl.col("cat").is_in(["cuda_runtime", "cuda_driver"]),
                     "rank", "correlation", launch_ts=pl.col("ts_ns"), launch_tid=pl.col("tid"))
    g = _rows(t, pl.col("kind") == "gpu", "rank", "task_id", "device", "stream", "correlation", "ts_ns", "end_ns")
    g = g.join(launches, on=["rank", "correlation"], how="left", maintain_order="left").with_columns(launch_ts=pl.coalesce("launch_ts", "ts_ns"))
    return g.sort("launch_ts")


def _sync_info(t: pl.DataFrame, events: pl.DataFrame, launched: pl.DataFrame | None = None) -> pl.DataFrame:
    """Synchronizing runtime calls (CPU tasks) with what they wait on: the stream from the matching
    cuda_sync event when the trace has one, else the stream of the thread's previous launch."""
    calls = t.filter((pl.col("kind") == "cpu") & pl.col("role").is_in(["stream_sync", "context_sync", "event_sync", "event_record", "stream_wait"]))
    sync = events.filter(pl.col("cat") == "cuda_sync").select(
        "rank", "correlation", s_stream=pl.col("stream"), s_kind=pl.col("sync_kind"), s_wait_stream=pl.col("wait_on_stream"),
        s_rec=pl.col("wait_on_event_corr"), s_device=pl.col("device")).unique(["rank", "correlation"], keep="first")
    calls = calls.join(sync, on=["rank", "correlation"], how="left")
    # the stream of the last task launched by the same thread before the call (fallback)
    g = (_gpu_by_launch(t) if launched is None else launched).filter(pl.col("launch_tid").is_not_null())
    calls = calls.sort("ts_ns").join_asof(
        g.select("rank", pl.col("launch_tid").alias("tid"), "launch_ts", prev_stream=pl.col("stream"), prev_device=pl.col("device")),
        left_on="ts_ns", right_on="launch_ts", by=["rank", "tid"], strategy="backward", check_sortedness=False).drop("launch_ts")
    calls = calls.join_asof(
        g.select("rank", pl.col("launch_tid").alias("tid"), "launch_ts", next_stream=pl.col("stream")),
        left_on="ts_ns", right_on="launch_ts", by=["rank", "tid"], strategy="forward", check_sortedness=False).drop("launch_ts")
    return calls


def _last_launched_before(g: pl.DataFrame, q: pl.DataFrame) -> pl.DataFrame:
    """q: rank, device?, stream, t (query time), qid -> the last GPU task on (rank, stream) launched before t."""
    gg = g.select("rank", "stream", "launch_ts", w=pl.col("task_id")).sort("launch_ts")
    return q.sort("t").join_asof(gg, left_on="t", right_on="launch_ts", by=["rank", "stream"], strategy="backward",
                                 check_sortedness=False).filter(pl.col("w").is_not_null())


def _sync_edges(t: pl.DataFrame, events: pl.DataFrame, calls: pl.DataFrame | None = None, g: pl.DataFrame | None = None) -> pl.DataFrame:
    calls = _sync_info(t, events) if calls is None else calls
    g = _gpu_by_launch(t) if g is None else g
    out = []
    # stream sync: the stream named by the cuda_sync event, else the thread's last launch stream
    ss = calls.filter(pl.col("role") == "stream_sync").select(
        "rank", qid=pl.col("task_id"), t=pl.col("ts_ns"),
        stream=pl.coalesce(pl.when(pl.col("s_stream") >= 0).then(pl.col("s_stream")), pl.col("prev_stream")))
    ss = _last_launched_before(g, ss.filter(pl.col("stream").is_not_null()))
    out.append(_edge(ss.select(src=pl.col("w"), dst=pl.col("qid")), "gpu_cpu", "stream_sync"))
    # context sync: every stream of the rank
    cs = calls.filter(pl.col("role") == "context_sync").select("rank", qid=pl.col("task_id"), t=pl.col("ts_ns"))
    if cs.height:
        streams = g.select("rank", "stream").unique()
        cs = _last_launched_before(g, cs.join(streams, on="rank"))
        out.append(_edge(cs.select(src=pl.col("w"), dst=pl.col("qid")), "gpu_cpu", "context_sync"))
    # event sync: the cudaEventRecord it waits on (by correlation, else the thread's previous record)
    rec = _records(calls)
    es = calls.filter(pl.col("role") == "event_sync").select("rank", "tid", qid=pl.col("task_id"), t=pl.col("ts_ns"), rec_corr=pl.col("s_rec"),
                                                              wait_stream=pl.col("s_wait_stream"))
    if es.height:
        es = _resolve_record(es, rec)
        es = _last_launched_before(g, es.select("rank", "qid", t=pl.col("rec_t"), stream=pl.col("rec_stream")).filter(pl.col("stream").is_not_null()))
        out.append(_edge(es.select(src=pl.col("w"), dst=pl.col("qid")), "gpu_cpu", "event_sync"))
    # synchronous copies: the call returns after its own copy finished
    cpu = t.filter((pl.col("kind") == "cpu") & pl.col("name").str.contains("Memcpy") & pl.col("correlation").is_not_null())
    gpu = t.filter(pl.col("role") == "memcpy")
    bc = cpu.select("rank", "correlation", dst=pl.col("task_id"), c_name=pl.col("name"), c_end=pl.col("end_ns")).join(
        gpu.select("rank", "correlation", src=pl.col("task_id"), g_name=pl.col("name"), g_end=pl.col("end_ns")), on=["rank", "correlation"])
    bc = bc.filter((~pl.col("c_name").str.contains("Async") | pl.col("g_name").str.contains("Pageable")) & (pl.col("g_end") <= pl.col("c_end")))
    out.append(_edge(bc, "gpu_cpu", "blocking_copy"))
    return pl.concat(out)


def _records(calls: pl.DataFrame) -> pl.DataFrame:
    return calls.filter(pl.col("role") == "event_record").select(
        "rank", "tid", rec_corr=pl.col("correlation"), rec_t=pl.col("ts_ns"), rec_prev_stream=pl.col("prev_stream"))


def _resolve_record(q: pl.DataFrame, rec: pl.DataFrame) -> pl.DataFrame:
    """q: rank, tid, t, rec_corr (may be null/-1), wait_stream -> + rec_t, rec_stream."""
    by_corr = q.filter(pl.col("rec_corr") > 0).join(rec.drop("tid"), on=["rank", "rec_corr"], how="inner")
    rest = q.filter(~(pl.col("rec_corr") > 0) | ~pl.col("qid").is_in(by_corr["qid"].implode()))
    by_time = rest.drop("rec_corr").sort("t").join_asof(rec.sort("rec_t"), left_on="t", right_on="rec_t", by=["rank", "tid"],
                                                        strategy="backward", check_sortedness=False).filter(pl.col("rec_t").is_not_null())
    both = pl.concat([by_corr, by_time.select(by_corr.columns)], how="vertical_relaxed")
    return both.with_columns(rec_stream=pl.when(pl.col("wait_stream") >= 0).then(pl.col("wait_stream")).otherwise(pl.col("rec_prev_stream")))


def _event_wait_edges(t: pl.DataFrame, events: pl.DataFrame, calls: pl.DataFrame | None = None,
                      g: pl.DataFrame | None = None) -> pl.DataFrame:
    calls = _sync_info(t, events) if calls is None else calls
    g = _gpu_by_launch(t) if g is None else g
    sw = calls.filter(pl.col("role") == "stream_wait").select(
        "rank", "tid", qid=pl.col("task_id"), t=pl.col("ts_ns"), rec_corr=pl.col("s_rec"), wait_stream=pl.col("s_wait_stream"),
        waiting=pl.when(pl.col("s_stream") >= 0).then(pl.col("s_stream")).otherwise(pl.col("next_stream")))
    if sw.height == 0:
        return pl.DataFrame(schema=EDGE_SCHEMA)
    sw = _resolve_record(sw, _records(calls)).filter(pl.col("rec_stream").is_not_null() & pl.col("waiting").is_not_null()
                                                    & (pl.col("rec_stream") != pl.col("waiting")))
    src = _last_launched_before(g, sw.select("rank", "qid", "waiting", t=pl.col("rec_t"), stream=pl.col("rec_stream")))
    gg = g.select("rank", "stream", "launch_ts", d=pl.col("task_id")).sort("launch_ts")
    dst = sw.select("rank", "qid", t=pl.col("t"), stream=pl.col("waiting")).sort("t").join_asof(
        gg, left_on="t", right_on="launch_ts", by=["rank", "stream"], strategy="forward", check_sortedness=False).filter(pl.col("d").is_not_null())
    e = src.select("qid", src=pl.col("w")).join(dst.select("qid", dst=pl.col("d")), on="qid")
    return _edge(e, "gpu_gpu", "event_wait")


UNEXPLAINED_NS = 20_000  # a GPU task starting this much later than its dependencies allow is "late"


def _late_gpu(t: pl.DataFrame, e: pl.DataFrame) -> pl.DataFrame:
    """GPU tasks whose traced start is later than every modeled dependency explains."""
    b = e.filter(pl.col("binding") & (pl.col("edge_type") != "gpu_cpu") & (pl.col("edge_type") != "collective"))
    typ = e.filter(pl.col("binding")).group_by("subtype").agg(typ=pl.col("slack_ns").clip(lower_bound=0).median())
    b = b.join(typ, on="subtype", how="left").filter(pl.col("slack_ns") > pl.col("typ").fill_null(0) + UNEXPLAINED_NS)
    return _rows(t, pl.col("kind") == "gpu", "rank", "device", "processor", "task_id", "ts_ns").join(b.select(task_id="dst").unique(), on="task_id")


def _infer_stream_waits(t: pl.DataFrame, e: pl.DataFrame) -> pl.DataFrame:
    """Late GPU tasks that start right after a task of another stream of the same device ended:
    an inter-stream dependency the trace does not show (no event record/wait pair), inferred as
    Lumos infers inter-thread dependencies from gaps."""
    late = _late_gpu(t, e)
    if late.height == 0:
        return pl.DataFrame(schema=EDGE_SCHEMA)
    ends = _rows(t, pl.col("kind") == "gpu", "rank", "device", o_proc="processor", o_id="task_id", o_end="end_ns").sort("o_end")
    # the latest end on another stream before the start: look a few candidates back
    cand = late.select("rank", "device", "processor", "task_id", "ts_ns").sort("ts_ns").join_asof(
        ends, left_on="ts_ns", right_on="o_end", by=["rank", "device"], strategy="backward", check_sortedness=False)
    cand = cand.filter(pl.col("o_proc").is_not_null() & (pl.col("o_proc") != pl.col("processor"))
                       & (pl.col("ts_ns") - pl.col("o_end") <= UNEXPLAINED_NS))
    return _edge(cand.select(src="o_id", dst="task_id"), "gpu_gpu", "inferred_wait")


# the layer's number: `layers.3`, `layer_3`, `TransformerLayer3` (not a line number such as `transformer_layer.py(120)`)
LAYER_NUMBER_RX = r"(?i)layers?[._]?(\d+)"
LAYER_RX = r"(?i)(transformer_?layer|decoder_?layer|encoder_?layer|gpt_?block|llama_?decoder|layers\.\d+)"


def _mark_layers(t: pl.DataFrame, events: pl.DataFrame, layer_rx: str = LAYER_RX,
                 stage_of_rank: dict[int, int] | None = None, ops: pl.DataFrame | None = None) -> pl.DataFrame:
    """in_layer: the task belongs to a repeated model layer; layer: its number when the span's name
    carries one (`layers.3`, `TransformerLayer_3`); layer_pass: fwd or bwd. Forward: CPU tasks inside
    a span (Python function, operator or annotation) whose name looks like a layer, and what they
    launch. Backward: the spans of autograd operators whose sequence number is that of a forward
    operator inside a layer (PyTorch tags both with the same number)."""
    from fleetscope.traces.layers import infer_layer_spans, named_spans_numbered

    cpu_ev = _rows(events, pl.col("cat").is_in(["python_function", "cpu_op", "user_annotation"]) & (pl.col("ph") == "X"),
                   "rank", "pid", "tid", "cat", "name", "ts_ns", "end_ns", "sequence_number")
    fwd = cpu_ev.filter(by_name(cpu_ev["name"], lambda n: n.str.contains(layer_rx))).select(
        "rank", "pid", "tid", s0="ts_ns", s1="end_ns", layer=pl.col("name").str.extract(LAYER_NUMBER_RX, 1).cast(pl.Int32, strict=False))
    if fwd.height and fwd["layer"].null_count() == fwd.height:  # named like a layer, without a number: numbered in order
        numbered = named_spans_numbered(fwd.drop("layer"), events, stage_of_rank, ops)
        fwd = numbered if numbered.height else fwd  # no operators to order them by: marked, not numbered
    elif fwd.height == 0:  # no span names a layer: the forward pass's repeated unit (fleetscope.traces.layers)
        fwd = infer_layer_spans(events, stage_of_rank, ops)
    fwd = fwd.with_columns(pl.col("rank").cast(pl.Int32), layer_pass=pl.lit("fwd"))
    if fwd.height == 0:
        return t.with_columns(in_layer=pl.lit(False), layer=pl.lit(None, pl.Int32), layer_pass=pl.lit(None, pl.Utf8))
    ops = cpu_ev.filter(pl.col("sequence_number").is_not_null() & (pl.col("cat") == "cpu_op")).select(
        "rank", "pid", "tid", "sequence_number", "name", o0="ts_ns", o1="end_ns")

    def inside(x: pl.DataFrame, spans: pl.DataFrame, t0: str) -> pl.DataFrame:
        # x rows that lie inside a span of the same thread (the latest span starting before them)
        j = x.sort(t0).join_asof(spans.sort("s0"), left_on=t0, right_on="s0", by=["rank", "pid", "tid"], strategy="backward",
                                 check_sortedness=False)
        return j.filter(pl.col("s1").is_not_null() & (pl.col(t0) < pl.col("s1")))

    fwd_ops = inside(ops, fwd, "o0")
    bwd = ops.join(fwd_ops.select("rank", "sequence_number", "layer").unique(["rank", "sequence_number"]), on=["rank", "sequence_number"]).filter(
        pl.col("name").str.contains(r"(?i)backward")).select("rank", "pid", "tid", "layer", s0="o0", s1="o1", layer_pass=pl.lit("bwd"))
    spans = pl.concat([fwd, bwd.select(fwd.columns)])
    cpu_in = inside(_rows(t, pl.col("kind") == "cpu", "task_id", "rank", "pid", "tid", "correlation", "ts_ns"), spans, "ts_ns")
    launched = _rows(t, pl.col("kind") == "gpu", "task_id", "rank", "correlation").join(
        cpu_in.filter(pl.col("correlation").is_not_null()).select("rank", "correlation", "layer", "layer_pass").unique(["rank", "correlation"]),
        on=["rank", "correlation"]).select("task_id", "layer", "layer_pass")
    marks = pl.concat([cpu_in.select("task_id", "layer", "layer_pass"), launched]).unique("task_id").with_columns(in_layer=pl.lit(True))
    return _attach(t, marks).with_columns(pl.col("in_layer").fill_null(False))


# ---------------------------------------------------------------- collectives across ranks
def _collective_groups(t: pl.DataFrame) -> pl.DataFrame:
    """Number each rank's communication kernels per (process group or stream, collective) in launch
    order; the same (key, sequence) on different ranks is one collective."""
    comm = t.filter((pl.col("kind") == "gpu") & (pl.col("role") == "comm"))
    # point-to-point: a send on rank a matches the recv on its peer b (a 2-rank group): key a->b
    ranks = pl.col("group_ranks").str.extract_all(r"\d+").list.eval(pl.element().cast(pl.Int32))
    peer = ranks.list.set_difference(pl.concat_list(pl.col("rank"))).list.first()
    p2p_ok = pl.col("collective").is_in(["send", "recv"]) & (ranks.list.len() == 2) & peer.is_not_null()
    direction = pl.when(pl.col("collective") == "send").then(
        pl.concat_str([pl.col("rank").cast(pl.Utf8), pl.lit("->"), peer.cast(pl.Utf8)])).otherwise(
        pl.concat_str([peer.cast(pl.Utf8), pl.lit("->"), pl.col("rank").cast(pl.Utf8)]))
    what = pl.when(p2p_ok).then(pl.lit("p2p:") + direction).otherwise(pl.col("collective").fill_null("?"))
    comm = comm.with_columns(
        _key=pl.concat_str([pl.coalesce(pl.col("pg_name"), pl.lit("stream") + pl.col("stream").cast(pl.Utf8)), pl.lit("/"), what]))
    comm = comm.sort("ts_ns").with_columns(coll_seq=pl.int_range(pl.len()).over(["rank", "_key"]).cast(pl.Int64))
    comm = comm.with_columns(coll_group=pl.concat_str([pl.col("_key"), pl.lit("#"), pl.col("coll_seq").cast(pl.Utf8)]))
    # a group is only a cross-rank link when more than one rank has it
    comm = comm.with_columns(coll_group=pl.when(pl.col("rank").n_unique().over("coll_group") > 1).then(pl.col("coll_group")))
    return _attach(t, comm.select("task_id", "coll_seq", "coll_group"))


def _attach(t: pl.DataFrame, cols: pl.DataFrame) -> pl.DataFrame:
    """t with the columns of `cols` (task_id + columns, some tasks) in t's row order (null elsewhere):
    a join on the narrow task_id column, not on every column of t."""
    m = t.select("task_id").join(cols, on="task_id", how="left", maintain_order="left")
    return t.with_columns(m.drop("task_id"))


def _collective_edges(t: pl.DataFrame) -> pl.DataFrame:
    m = t.filter(pl.col("coll_group").is_not_null()).select("coll_group", "rank", "task_id").sort(["coll_group", "rank"])
    if m.height == 0:
        return pl.DataFrame(schema=EDGE_SCHEMA)
    head = m.group_by("coll_group").agg(src=pl.col("task_id").first())
    e = m.join(head, on="coll_group").filter(pl.col("src") != pl.col("task_id")).select("src", dst=pl.col("task_id"))
    return _edge(e, "collective", "peer")


# ---------------------------------------------------------------- CPU collectives (gloo)
CPU_COMM_TOL_NS = 1_000_000  # clock skew allowed between ranks when matching CPU collectives by time


def _empty_edges() -> pl.DataFrame:
    return pl.DataFrame(schema=EDGE_SCHEMA)


def _cpu_comm_edges(t: pl.DataFrame) -> pl.DataFrame:
    """CPU communication tasks (gloo work spans) and their threads:

      comm_issue  the c10d:: operator that issues it -> the work span (the k-th operator of a
                  (rank, collective) issues the k-th span; lag counted from the operator's start)
      comm_wait   the work span -> the issuing thread's next task, when the span ended while the
                  thread was between tasks (blocked in wait(): a synchronous collective, or the
                  wait of an asynchronous one); the gap's part before the span ended was the wait."""
    comm = t.filter((pl.col("kind") == "cpu") & (pl.col("role") == "comm"))
    if comm.height == 0:
        return _empty_edges()
    thread = t.filter((pl.col("kind") == "cpu") & (pl.col("role") != "comm"))
    ops = thread.filter(pl.col("is_comm") & pl.col("collective").is_not_null()).sort(["rank", "ts_ns"]).select(
        "rank", "collective", src="task_id", op_ts="ts_ns", op_proc="processor",
        k=pl.int_range(pl.len()).over(["rank", "collective"]))
    spans = comm.sort(["rank", "ts_ns"]).select("rank", "collective", dst="task_id", c_ts="ts_ns", c_end="end_ns",
                                                k=pl.int_range(pl.len()).over(["rank", "collective"]))
    issue = spans.join(ops, on=["rank", "collective", "k"]).filter(pl.col("op_ts") <= pl.col("c_ts") + CPU_COMM_TOL_NS)
    # the issuing thread's first task starting after the span ended, and the task before it
    order = thread.sort(["rank", "processor", "ts_ns", "task_id"]).select(
        "rank", op_proc="processor", d="task_id", d_ts="ts_ns", p_end=pl.col("end_ns").shift(1).over(["rank", "processor"]))
    wait = issue.select("rank", "op_proc", "dst", "c_end").sort("c_end").join_asof(
        order.sort("d_ts"), left_on="c_end", right_on="d_ts", by=["rank", "op_proc"], strategy="forward", check_sortedness=False)
    wait = wait.filter(pl.col("d").is_not_null() & pl.col("p_end").is_not_null() & (pl.col("p_end") <= pl.col("c_end")))
    # collectives run one after another on the backend's worker thread
    seq = comm.filter(~pl.col("processor").str.ends_with(":p2p")).sort(["rank", "processor", "ts_ns", "task_id"]).select(
        src=pl.col("task_id").shift(1).over(["rank", "processor"]), dst=pl.col("task_id")).filter(pl.col("src").is_not_null())
    return pl.concat([_edge(issue, "cpu_cpu", "comm_issue"), _edge(wait.select(src="dst", dst="d"), "cpu_cpu", "comm_wait"),
                      _edge(seq, "cpu_cpu", "comm_order")])


def _components(pairs: list[tuple[int, int]]) -> dict[int, int]:
    """Union-find over ranks: rank -> smallest rank of its component."""
    parent: dict[int, int] = {}

    def find(x):
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x
    for a, b in pairs:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    return {x: find(x) for x in list(parent)}


def _cpu_collective_groups(t: pl.DataFrame, places: dict[int, tuple] | None = None) -> pl.DataFrame:
    """Cross-rank collectives among CPU communication tasks, which carry no process group or peer (gloo
    traces): ranks whose k-th collectives of a kind have the same sizes and all overlap in time (every
    member is inside the collective while the others are) form a group; a send matches the recv of
    another rank with the same size that overlaps it and ends closest to it (one to one), never between
    ranks of one collective group (data-parallel replicas of a stage), to one rank per other group (the
    one most of the sender's first-pass matches went to), on channels carrying at least a quarter of
    them. Each
    collective gets coll_group (and group_size where the trace had none)."""
    comm = t.filter((pl.col("kind") == "cpu") & (pl.col("role") == "comm")).select(
        "task_id", "rank", "collective", "msg_bytes", "ts_ns", "end_ns")
    if comm.height == 0:
        return t
    out = []
    peers: set[tuple[int, int]] = set()  # ranks in one collective group (data-parallel replicas of a stage)
    group_of: dict[int, tuple] = {}
    coll = comm.filter(~pl.col("collective").is_in(["send", "recv"])).sort(["rank", "ts_ns"]).with_columns(
        seq=pl.int_range(pl.len()).over(["rank", "collective"]))
    if coll.height:
        n = coll.group_by(["rank", "collective"]).agg(n=pl.len())
        j = coll.join(coll, on=["collective", "seq"], suffix="_b").filter(pl.col("rank") < pl.col("rank_b"))
        ok = (pl.col("msg_bytes").eq_missing(pl.col("msg_bytes_b"))
              & (pl.max_horizontal("ts_ns", "ts_ns_b") <= pl.min_horizontal("end_ns", "end_ns_b") + CPU_COMM_TOL_NS))
        pair = j.group_by(["rank", "rank_b", "collective"]).agg(m=pl.len(), good=ok.all()).join(
            n, on=["rank", "collective"]).join(n.rename({"rank": "rank_b", "n": "n_b"}), on=["rank_b", "collective"])
        pair = pair.filter(pl.col("good") & (pl.col("m") == pl.col("n")) & (pl.col("n") == pl.col("n_b")))
        if places:  # the capture's layout: a collective runs among ranks of one data- or tensor-parallel group
            same = {(a, b) for a in places for b in places if a != b and places[a][0] == places[b][0]
                    and (places[a][1] == places[b][1] or places[a][2] == places[b][2])}
            pair = pair.filter(pl.struct("rank", "rank_b").map_elements(lambda x: (x["rank"], x["rank_b"]) in same, return_dtype=pl.Boolean))
        for (c,), g in pair.partition_by("collective", as_dict=True).items():
            comp = _components(list(zip(g["rank"].to_list(), g["rank_b"].to_list())))
            peers |= {(a, b) for a in comp for b in comp if a != b and comp[a] == comp[b]}
            group_of.update({a: (c, root) for a, root in comp.items()})
            size = {r: sum(1 for v in comp.values() if v == root) for r, root in comp.items()}
            m = pl.DataFrame({"rank": list(comp), "_root": list(comp.values()), "_size": [size[r] for r in comp]},
                             schema={"rank": pl.Int32, "_root": pl.Int64, "_size": pl.Int32})
            sub = coll.filter(pl.col("collective") == c).join(m, on="rank")
            out.append(sub.select("task_id", _g=pl.concat_str([pl.lit(f"cpu/{c}/"), pl.col("_root").cast(pl.Utf8), pl.lit("#"),
                                                                pl.col("seq").cast(pl.Utf8)]), _n=pl.col("_size")))
    sends = comm.filter(pl.col("collective") == "send")
    recvs = comm.filter(pl.col("collective") == "recv")
    if sends.height and recvs.height:
        cand = sends.join(recvs, on="msg_bytes", suffix="_r").filter(
            (pl.col("rank") != pl.col("rank_r")) & (pl.col("ts_ns_r") <= pl.col("end_ns") + CPU_COMM_TOL_NS)
            & (pl.col("ts_ns") <= pl.col("end_ns_r") + CPU_COMM_TOL_NS)
            # data arrives after it was sent: a recv does not end before its send started
            & (pl.col("end_ns_r") >= pl.col("ts_ns") - CPU_COMM_TOL_NS))
        if places:  # pipeline neighbours: adjacent stages, same replica and tensor-parallel place
            nb = [(a, b) for a in places for b in places if abs((places[a][0] or 0) - (places[b][0] or 0)) == 1
                  and places[a][1] == places[b][1] and places[a][2] == places[b][2]]
            nb = pl.DataFrame(nb, schema={"rank": pl.Int32, "rank_r": pl.Int32}, orient="row")
            cand = cand.join(nb, on=["rank", "rank_r"], how="semi")
        cand = cand.with_columns(cost=(pl.col("end_ns_r") - pl.col("end_ns")).abs()).sort(["cost", "task_id", "task_id_r"])
        # replicas of one stage (the same collective group) exchange no point-to-point messages
        rows = [x for x in cand.select("task_id", "task_id_r", "rank", "rank_r", "ts_ns").iter_rows() if (x[2], x[3]) not in peers]

        def greedy(allowed=None):
            used_s, used_r, out = set(), set(), []
            for s_id, r_id, a, b, ts in rows:
                if s_id in used_s or r_id in used_r or (allowed is not None and (a, b) not in allowed):
                    continue
                used_s.add(s_id)
                used_r.add(r_id)
                out.append((s_id, r_id, a, b, ts))
            return out
        # a rank sends to few peers (its pipeline neighbours): channels carrying under a quarter of a
        # sender's first-pass matches are coincidences of replicas running in step
        first = greedy()
        per = {}
        for _, _, a, b, _ in first:
            per[(a, b)] = per.get((a, b), 0) + 1
        # and a rank talks to one replica of each other stage: per sender and receiving group, the
        # channel with the most first-pass matches
        best: dict[tuple, tuple[int, int]] = {}
        for (a, b), n in per.items():
            key = (a, group_of.get(b, b))
            if key not in best or n > per[best[key]]:
                best[key] = (a, b)
        tot = {}
        for (a, _), n in per.items():
            tot[a] = tot.get(a, 0) + n
        pairs = greedy({k for k in best.values() if per[k] >= 0.25 * tot[k[0]]})
        if pairs:
            pm = pl.DataFrame(pairs, schema={"s": pl.Int64, "r": pl.Int64, "a": pl.Int32, "b": pl.Int32, "ts": pl.Int64}, orient="row")
            pm = pm.sort("ts").with_columns(k=pl.int_range(pl.len()).over(["a", "b"]))
            key = pl.concat_str([pl.lit("p2p:"), pl.col("a").cast(pl.Utf8), pl.lit("->"), pl.col("b").cast(pl.Utf8), pl.lit("#"),
                                 pl.col("k").cast(pl.Utf8)])
            pm = pm.with_columns(_g=key)
            out.append(pl.concat([pm.select(task_id="s", _g="_g"), pm.select(task_id="r", _g="_g")]).with_columns(_n=pl.lit(2, pl.Int32)))
    if not out:
        return t
    g = pl.concat(out, how="vertical_relaxed")
    t = t.join(g, on="task_id", how="left", maintain_order="left")
    return t.with_columns(coll_group=pl.coalesce("coll_group", "_g"),
                          group_size=pl.coalesce(pl.col("group_size"), pl.col("_n").cast(pl.Int32))).drop("_g", "_n")


# ---------------------------------------------------------------- lags and simulation durations
CONTRADICTION_NS = 1_000  # a dependency whose dst started this much before src ended was not one
KEPT_LAGS = ["thread_order", "comm_wait"]  # untraced CPU work: the observed delay is kept as the lag


def _calibrate(t: pl.DataFrame, e: pl.DataFrame, binding_only: bool = False) -> tuple[pl.DataFrame, pl.DataFrame, dict]:
    """Edge lags and task simulation durations from the trace (see module doc).

    Synchronizing calls have two phases: they start when the thread issues them and end `post`
    after the later of that and the end of what they wait on (post = traced end - max(issue,
    wait end)); gpu_cpu edges feed the second phase (`wait_ref` = when the wait ended in the trace).
    A blocking copy launches the copy it then waits for: its launch edge counts from the call's
    start (`from_start`). Collectives end `sim_dur` after the last peer arrived.
    Heuristic dependencies that the trace contradicts (dst clearly started, or a waiting call
    clearly returned, before src ended) are dropped and counted in graph.meta."""
    flow = e.filter(pl.col("edge_type") != "collective")
    # task_id is the row number (build_graph): the ends' times by position, not by two joins of millions of edges
    ts, te = t["ts_ns"], t["end_ns"]
    flow = flow.with_columns(s_end=te.gather(flow["src"]), s_ts=ts.gather(flow["src"]), d_ts=ts.gather(flow["dst"]),
                             d_end=te.gather(flow["dst"]))
    is_wait = pl.col("edge_type") == "gpu_cpu"
    checked = ~pl.col("subtype").is_in(["thread_order", "stream_order", "launch", "comm_issue"])
    contradicted = checked & pl.when(is_wait).then(pl.col("s_end") > pl.col("d_end") + CONTRADICTION_NS).otherwise(
        pl.col("d_ts") < pl.col("s_end") - CONTRADICTION_NS)
    dropped = flow.filter(contradicted).group_by("subtype").len()
    flow = flow.filter(~contradicted)
    wait_end = flow.filter(is_wait).group_by("dst").agg(c=pl.col("s_end").max())
    # on a narrow frame (task_id, times, group): joins on every column of millions of tasks cost seconds
    c = pl.repeat(None, t.height, dtype=pl.Int64, eager=True).alias("c").scatter(wait_end["dst"], wait_end["c"])
    # a call that waits (c: when its wait ended) launches from its start
    flow = flow.with_columns(
        from_start=(c.is_not_null().gather(flow["src"]) & (pl.col("subtype") == "launch")) | (pl.col("subtype") == "comm_issue"))
    flow = flow.with_columns(slack=pl.when(is_wait).then(pl.lit(0, pl.Int64)).otherwise(
        pl.col("d_ts") - pl.when(pl.col("from_start")).then(pl.col("s_ts")).otherwise(pl.col("s_end"))))
    start_edges = ~is_wait
    flow = flow.with_columns(binding=pl.when(start_edges).then(
        pl.col("slack") == pl.col("slack").filter(start_edges).min().over("dst")).otherwise(pl.lit(True)))
    if binding_only:  # what _infer_stream_waits reads: which edge bound each task, and its slack
        return t, flow.select("src", "dst", "edge_type", "subtype", "binding", slack_ns="slack"), {}
    # a collective's members start together (the last arrival), computed on the members only
    gs = t.lazy().select("task_id", "ts_ns", "coll_group").filter(pl.col("coll_group").is_not_null()).select(
        "task_id", g=pl.col("ts_ns").max().over("coll_group")).collect()
    g_start = pl.repeat(None, t.height, dtype=pl.Int64, eager=True).alias("g_start").scatter(gs["task_id"], gs["g"])
    n = t.select("ts_ns", "end_ns", "dur_ns").with_columns(c, g_start)
    wait_ref = pl.max_horizontal("ts_ns", "c")
    t = t.with_columns(n.select(
        sim_dur_ns=pl.when(pl.col("c").is_not_null()).then(pl.col("end_ns") - wait_ref)
        .when(pl.col("g_start").is_not_null()).then(pl.col("end_ns") - pl.max_horizontal("ts_ns", "g_start"))
        .otherwise(pl.col("dur_ns")).clip(lower_bound=0),
        sim_start_ref=pl.col("ts_ns"),
        wait_ref=pl.when(pl.col("c").is_not_null()).then(wait_ref),
    ))
    typical = flow.filter(pl.col("binding") & start_edges).group_by("subtype").agg(typ=pl.col("slack").clip(lower_bound=0).median())
    flow = flow.join(typical, on="subtype", how="left").with_columns(pl.col("typ").fill_null(0))
    lag = (
        pl.when(is_wait).then(pl.lit(0, pl.Int64))
        # CPU work between consecutive tasks of a thread is real work: keep it (and the work after a
        # wait for a CPU collective)
        .when(pl.col("subtype").is_in(KEPT_LAGS)).then(pl.col("slack"))
        .when(pl.col("binding")).then(pl.col("slack"))
        .otherwise(pl.min_horizontal("slack", pl.col("typ").cast(pl.Int64)))
    )
    # model lags: the typical delay of the edge's type everywhere except the CPU work between a
    # thread's tasks and the waits of synchronizing calls (used by replay and what-if); calibrated
    # lags: exact for the binding edge, so the unchanged graph reproduces the trace exactly
    unexplained = (pl.col("binding") & ~is_wait & ~pl.col("subtype").is_in(KEPT_LAGS)
                   & (pl.col("slack") > pl.col("typ") + UNEXPLAINED_NS))
    model = (pl.when(is_wait).then(pl.lit(0, pl.Int64))
             .when(pl.col("subtype").is_in(KEPT_LAGS)).then(pl.col("slack"))
             # a delay no modeled dependency explains is kept as observed (counted in graph.meta)
             .when(unexplained).then(pl.col("slack"))
             .otherwise(pl.col("typ").cast(pl.Int64)))
    strict = (pl.when(is_wait).then(pl.lit(0, pl.Int64))
              .when(pl.col("subtype").is_in(KEPT_LAGS)).then(pl.col("slack"))
              .otherwise(pl.col("typ").cast(pl.Int64)))
    flow = flow.with_columns(lag_calibrated_ns=lag.cast(pl.Int64), lag_ns=model.cast(pl.Int64), lag_typical_ns=strict.cast(pl.Int64))
    # a thread gap explained by another thread: the thread edge keeps only a short gap
    inter = flow.filter(pl.col("subtype").is_in(["inter_thread", "comm_wait"]) & pl.col("binding")).select("dst").unique().with_columns(
        _it=pl.lit(True))
    cap = (pl.col("subtype") == "thread_order") & pl.col("_it").fill_null(False)
    flow = flow.join(inter, on="dst", how="left").with_columns(
        lag_ns=pl.when(cap).then(pl.min_horizontal("lag_ns", pl.lit(INTER_THREAD_GAP_NS))).otherwise("lag_ns"),
        lag_calibrated_ns=pl.when(cap).then(pl.min_horizontal("lag_calibrated_ns", pl.lit(INTER_THREAD_GAP_NS))).otherwise("lag_calibrated_ns"),
        lag_typical_ns=pl.when(cap).then(pl.min_horizontal("lag_typical_ns", pl.lit(INTER_THREAD_GAP_NS))).otherwise("lag_typical_ns"),
    ).drop("_it")
    coll = e.filter(pl.col("edge_type") == "collective").with_columns(
        lag_ns=pl.lit(0, pl.Int64), lag_calibrated_ns=pl.lit(0, pl.Int64), lag_typical_ns=pl.lit(0, pl.Int64), slack=pl.lit(None, pl.Int64),
        binding=pl.lit(None, pl.Boolean), from_start=pl.lit(False))
    cols = ["src", "dst", "edge_type", "subtype", "lag_ns", "lag_calibrated_ns", "lag_typical_ns", "slack", "binding", "from_start"]
    e = pl.concat([flow.select(cols), coll.select(cols)], how="vertical_relaxed").rename({"slack": "slack_ns"})
    info = {"dropped_edges": dict(dropped.iter_rows()),
            "unexplained_delays": flow.filter(unexplained).height,
            "unexplained_delay_ns": int(flow.filter(unexplained)["slack"].sum() or 0)}
    return t, e.sort(["dst", "src"]), info
