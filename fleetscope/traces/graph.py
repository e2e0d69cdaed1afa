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

Runtime dependencies of Lumos Algorithm 1 ("a stream sync waits for whatever kernel is last on the
stream") are resolved here, once: streams are FIFO in launch order and a thread's launch order is
fixed, so the kernel that is last at the time of the call is known from the launch order.

Each edge carries `lag_ns`, the delay from src's end to dst's start that the simulator applies.
It is exact for the edge that bound dst in the trace and capped at the typical value of its type
for the others, so replaying the unchanged graph reproduces the trace while edited graphs
(what-if) only keep delays that were real work."""
from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from fleetscope.schemas.base import conform
from fleetscope.traces.schemas import GRAPH_EDGES, GRAPH_TASKS

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

    def copy(self) -> "Graph":
        return Graph(self.tasks.clone(), self.edges.clone(), dict(self.meta))


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
    """ProfilerStep#N annotations of one rank: iteration, start_ns, end_ns (next step's start)."""
    st = (
        ev.filter((pl.col("cat") == "user_annotation") & pl.col("name").str.contains(_STEP_RX))
        .select(iteration=pl.col("name").str.extract(_STEP_RX, 1).cast(pl.Int64), start_ns=pl.col("ts_ns"), step_end=pl.col("end_ns"))
        .sort("start_ns")
        .unique("iteration", keep="first", maintain_order=True)
    )
    return st.with_columns(end_ns=pl.max_horizontal(pl.col("start_ns").shift(-1).fill_null(pl.col("step_end")), pl.col("step_end")))


def _rank_tasks(ev: pl.DataFrame) -> pl.DataFrame:
    """CPU leaf tasks and GPU tasks of one rank with processors, roles and iterations."""
    runtime_corr = ev.filter(pl.col("cat") == "cuda_runtime")["correlation"].drop_nulls().implode()
    cpu = ev.filter(
        pl.col("cat").is_in(CPU_CATS) & (pl.col("ph") == "X")
        # driver calls nested in a runtime call share its correlation: keep the runtime call
        & ~((pl.col("cat") == "cuda_driver") & (pl.col("correlation").is_null() | pl.col("correlation").is_in(runtime_corr)))
    ).sort(["pid", "tid", "ts_ns", "dur_ns"], descending=[False, False, False, True])
    nxt = pl.col("ts_ns").shift(-1).over(["pid", "tid"])
    cpu = cpu.filter(nxt.is_null() | (nxt >= pl.col("end_ns")) | (pl.col("cat") == "cuda_runtime"))
    cpu = cpu.with_columns(
        kind=pl.lit("cpu"),
        processor=pl.concat_str([pl.lit("thread:"), pl.col("pid"), pl.lit(":"), pl.col("tid")]),
        role=pl.when(pl.col("cat") == "cuda_runtime").then(_runtime_role(pl.col("name"))).otherwise(pl.lit("cpu_op")),
    )
    gpu = ev.filter(pl.col("cat").is_in(GPU_CATS)).with_columns(
        kind=pl.lit("gpu"),
        processor=pl.concat_str([pl.lit("stream:"), pl.col("device").cast(pl.Utf8), pl.lit(":"), pl.col("stream").cast(pl.Utf8)]),
        role=pl.when(pl.col("is_comm")).then(pl.lit("comm"))
        .when(pl.col("cat") == "gpu_memcpy").then(pl.lit("memcpy"))
        .when(pl.col("cat") == "gpu_memset").then(pl.lit("memset"))
        .otherwise(pl.lit("compute")),
    )
    tasks = pl.concat([cpu, gpu], how="diagonal_relaxed").sort(["ts_ns", "kind", "event_id"])
    # iteration: CPU tasks by time inside ProfilerStep#N, GPU tasks by their launching call
    its = _iterations(ev)
    if its.height:
        tasks = tasks.join_asof(its.select("start_ns", "end_ns", "iteration").rename({"start_ns": "_it_start", "end_ns": "_it_end"}),
                                left_on="ts_ns", right_on="_it_start", strategy="backward", check_sortedness=False)
        tasks = tasks.with_columns(iteration=pl.when(pl.col("ts_ns") < pl.col("_it_end")).then(pl.col("iteration"))).drop("_it_start", "_it_end")
        launch_it = tasks.filter((pl.col("kind") == "cpu") & pl.col("correlation").is_not_null() & (pl.col("cat") != "cpu_op")).select(
            "correlation", _lit=pl.col("iteration")).unique("correlation", keep="first")
        tasks = tasks.join(launch_it, on="correlation", how="left", maintain_order="left").with_columns(
            iteration=pl.when(pl.col("kind") == "gpu").then(pl.coalesce("_lit", "iteration")).otherwise(pl.col("iteration"))).drop("_lit")
    else:
        tasks = tasks.with_columns(iteration=pl.lit(None, pl.Int64))
    return tasks


def build_graph(events: pl.DataFrame, capture_id: str | None = None) -> Graph:
    """trace_events of one capture (one or many ranks) -> one execution graph."""
    if events.height == 0:
        raise ValueError("build_graph: no trace events")
    cid = capture_id if capture_id is not None else events["capture_id"][0]
    parts = [_rank_tasks(events.filter(pl.col("rank") == r)) for r in sorted(events["rank"].unique().to_list())]
    tasks = pl.concat(parts, how="diagonal_relaxed").with_row_index("task_id").with_columns(pl.col("task_id").cast(pl.Int64))
    edges = [
        _thread_edges(tasks),
        _launch_edges(tasks),
        _stream_edges(tasks),
        _sync_edges(tasks, events),
        _event_wait_edges(tasks, events),
    ]
    tasks = _collective_groups(tasks)
    tasks = _mark_layers(tasks, events)
    edges.append(_collective_edges(tasks))
    e = pl.concat([x for x in edges if x.height], how="vertical_relaxed") if any(x.height for x in edges) else pl.DataFrame(
        schema={"src": pl.Int64, "dst": pl.Int64, "edge_type": pl.Utf8, "subtype": pl.Utf8})
    e = e.unique(["src", "dst", "subtype"], keep="first", maintain_order=True).filter(pl.col("src") != pl.col("dst"))
    tasks0, e0, _ = _calibrate(tasks, e)
    inferred = _infer_stream_waits(tasks0, e0)
    if inferred.height:
        e = pl.concat([e, inferred], how="vertical_relaxed")
    tasks, e, dropped = _calibrate(tasks, e)
    tasks = tasks.with_columns(capture_id=pl.lit(cid))
    rank_of = tasks.select(pl.col("task_id"), pl.col("rank"))
    e = (e.join(rank_of.rename({"task_id": "src", "rank": "src_rank"}), on="src", how="left")
          .join(rank_of.rename({"task_id": "dst", "rank": "rank"}), on="dst", how="left")
          .with_columns(capture_id=pl.lit(cid)))
    t = GRAPH_TASKS.validate(conform(tasks, GRAPH_TASKS))
    ed = GRAPH_EDGES.validate(conform(e, GRAPH_EDGES))
    return Graph(t, ed, {"capture_id": cid, "ranks": sorted(events["rank"].unique().to_list()), **dropped})


# ---------------------------------------------------------------- edges
def _edge(df: pl.DataFrame, etype: str, sub: str) -> pl.DataFrame:
    return df.select(pl.col("src").cast(pl.Int64), pl.col("dst").cast(pl.Int64), edge_type=pl.lit(etype), subtype=pl.lit(sub))


def _thread_edges(t: pl.DataFrame) -> pl.DataFrame:
    cpu = t.filter(pl.col("kind") == "cpu").sort(["rank", "processor", "ts_ns", "task_id"])
    order = cpu.select(
        "rank", "pid", "processor", "task_id", "ts_ns", "end_ns",
        src=pl.col("task_id").shift(1).over(["rank", "processor"]),
        prev_end=pl.col("end_ns").shift(1).over(["rank", "processor"]),
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
    cpu = t.filter((pl.col("kind") == "cpu") & pl.col("correlation").is_not_null() & pl.col("cat").is_in(["cuda_runtime", "cuda_driver"]))
    gpu = t.filter((pl.col("kind") == "gpu") & pl.col("correlation").is_not_null())
    j = cpu.select("rank", "correlation", src=pl.col("task_id")).join(gpu.select("rank", "correlation", dst=pl.col("task_id")), on=["rank", "correlation"])
    return _edge(j, "cpu_gpu", "launch")


def _stream_edges(t: pl.DataFrame) -> pl.DataFrame:
    g = t.filter(pl.col("kind") == "gpu").sort(["rank", "processor", "ts_ns", "task_id"])
    e = g.select(src=pl.col("task_id").shift(1).over(["rank", "processor"]), dst=pl.col("task_id")).filter(pl.col("src").is_not_null())
    return _edge(e, "gpu_gpu", "stream_order")


def _gpu_by_launch(t: pl.DataFrame) -> pl.DataFrame:
    """GPU tasks with the time their launch call started (streams run in launch order)."""
    launches = t.filter((pl.col("kind") == "cpu") & pl.col("correlation").is_not_null() & pl.col("cat").is_in(["cuda_runtime", "cuda_driver"])).select(
        "rank", "correlation", launch_ts=pl.col("ts_ns"), launch_tid=pl.col("tid"))
    g = t.filter(pl.col("kind") == "gpu").select("rank", "task_id", "device", "stream", "correlation", "ts_ns", "end_ns")
    g = g.join(launches, on=["rank", "correlation"], how="left").with_columns(launch_ts=pl.coalesce("launch_ts", "ts_ns"))
    return g.sort("launch_ts")


def _sync_info(t: pl.DataFrame, events: pl.DataFrame) -> pl.DataFrame:
    """Synchronizing runtime calls (CPU tasks) with what they wait on: the stream from the matching
    cuda_sync event when the trace has one, else the stream of the thread's previous launch."""
    calls = t.filter((pl.col("kind") == "cpu") & pl.col("role").is_in(["stream_sync", "context_sync", "event_sync", "event_record", "stream_wait"]))
    sync = events.filter(pl.col("cat") == "cuda_sync").select(
        "rank", "correlation", s_stream=pl.col("stream"), s_kind=pl.col("sync_kind"), s_wait_stream=pl.col("wait_on_stream"),
        s_rec=pl.col("wait_on_event_corr"), s_device=pl.col("device")).unique(["rank", "correlation"], keep="first")
    calls = calls.join(sync, on=["rank", "correlation"], how="left")
    # the stream of the last task launched by the same thread before the call (fallback)
    g = _gpu_by_launch(t).filter(pl.col("launch_tid").is_not_null())
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


def _sync_edges(t: pl.DataFrame, events: pl.DataFrame) -> pl.DataFrame:
    calls = _sync_info(t, events)
    g = _gpu_by_launch(t)
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


def _event_wait_edges(t: pl.DataFrame, events: pl.DataFrame) -> pl.DataFrame:
    calls = _sync_info(t, events)
    g = _gpu_by_launch(t)
    sw = calls.filter(pl.col("role") == "stream_wait").select(
        "rank", "tid", qid=pl.col("task_id"), t=pl.col("ts_ns"), rec_corr=pl.col("s_rec"), wait_stream=pl.col("s_wait_stream"),
        waiting=pl.when(pl.col("s_stream") >= 0).then(pl.col("s_stream")).otherwise(pl.col("next_stream")))
    if sw.height == 0:
        return pl.DataFrame(schema={"src": pl.Int64, "dst": pl.Int64, "edge_type": pl.Utf8, "subtype": pl.Utf8})
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
    return t.filter(pl.col("kind") == "gpu").join(b.select(task_id="dst").unique(), on="task_id")


def _infer_stream_waits(t: pl.DataFrame, e: pl.DataFrame) -> pl.DataFrame:
    """Late GPU tasks that start right after a task of another stream of the same device ended:
    an inter-stream dependency the trace does not show (no event record/wait pair), inferred as
    Lumos infers inter-thread dependencies from gaps."""
    late = _late_gpu(t, e)
    if late.height == 0:
        return pl.DataFrame(schema={"src": pl.Int64, "dst": pl.Int64, "edge_type": pl.Utf8, "subtype": pl.Utf8})
    ends = t.filter(pl.col("kind") == "gpu").select("rank", "device", o_proc="processor", o_id="task_id", o_end="end_ns").sort("o_end")
    # the latest end on another stream before the start: look a few candidates back
    cand = late.select("rank", "device", "processor", "task_id", "ts_ns").sort("ts_ns").join_asof(
        ends, left_on="ts_ns", right_on="o_end", by=["rank", "device"], strategy="backward", check_sortedness=False)
    cand = cand.filter(pl.col("o_proc").is_not_null() & (pl.col("o_proc") != pl.col("processor"))
                       & (pl.col("ts_ns") - pl.col("o_end") <= UNEXPLAINED_NS))
    return _edge(cand.select(src="o_id", dst="task_id"), "gpu_gpu", "inferred_wait")


LAYER_RX = r"(?i)(transformer_?layer|decoder_?layer|encoder_?layer|gpt_?block|llama_?decoder|layers\.\d+)"


def _mark_layers(t: pl.DataFrame, events: pl.DataFrame, layer_rx: str = LAYER_RX) -> pl.DataFrame:
    """in_layer: the task belongs to a repeated model layer. Forward: CPU tasks inside a span (Python
    function, operator or annotation) whose name looks like a layer, and what they launch. Backward:
    the spans of autograd operators whose sequence number is that of a forward operator inside a
    layer (PyTorch tags both with the same number)."""
    cpu_ev = events.filter(pl.col("cat").is_in(["python_function", "cpu_op", "user_annotation"]) & (pl.col("ph") == "X"))
    fwd = cpu_ev.filter(pl.col("name").str.contains(layer_rx)).select("rank", "pid", "tid", s0="ts_ns", s1="end_ns")
    if fwd.height == 0:
        return t.with_columns(in_layer=pl.lit(False))
    ops = cpu_ev.filter(pl.col("sequence_number").is_not_null() & (pl.col("cat") == "cpu_op")).select(
        "rank", "pid", "tid", "sequence_number", "name", o0="ts_ns", o1="end_ns")

    def inside(x: pl.DataFrame, spans: pl.DataFrame, t0: str) -> pl.DataFrame:
        # x rows that lie inside a span of the same thread (the latest span starting before them)
        j = x.sort(t0).join_asof(spans.sort("s0"), left_on=t0, right_on="s0", by=["rank", "pid", "tid"], strategy="backward",
                                 check_sortedness=False)
        return j.filter(pl.col("s1").is_not_null() & (pl.col(t0) < pl.col("s1")))

    fwd_ops = inside(ops, fwd, "o0")
    bwd = ops.join(fwd_ops.select("rank", "sequence_number").unique(), on=["rank", "sequence_number"]).filter(
        pl.col("name").str.contains(r"(?i)backward")).select("rank", "pid", "tid", s0="o0", s1="o1")
    spans = pl.concat([fwd, bwd])
    cpu_in = inside(t.filter(pl.col("kind") == "cpu").select("task_id", "rank", "pid", "tid", "correlation", "ts_ns"), spans, "ts_ns")
    launched = t.filter(pl.col("kind") == "gpu").join(
        cpu_in.filter(pl.col("correlation").is_not_null()).select("rank", "correlation"), on=["rank", "correlation"]).select("task_id")
    ids = pl.concat([cpu_in.select("task_id"), launched])["task_id"].implode()
    return t.with_columns(in_layer=pl.col("task_id").is_in(ids))


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
    t = t.join(comm.select("task_id", "coll_seq", "coll_group"), on="task_id", how="left")
    # a group is only a cross-rank link when more than one rank has it
    n = t.filter(pl.col("coll_group").is_not_null()).group_by("coll_group").agg(_n=pl.col("rank").n_unique())
    t = t.join(n, on="coll_group", how="left").with_columns(
        coll_group=pl.when(pl.col("_n") > 1).then(pl.col("coll_group"))).drop("_n")
    return t.sort("task_id")


def _collective_edges(t: pl.DataFrame) -> pl.DataFrame:
    m = t.filter(pl.col("coll_group").is_not_null()).select("coll_group", "rank", "task_id").sort(["coll_group", "rank"])
    if m.height == 0:
        return pl.DataFrame(schema={"src": pl.Int64, "dst": pl.Int64, "edge_type": pl.Utf8, "subtype": pl.Utf8})
    head = m.group_by("coll_group").agg(src=pl.col("task_id").first())
    e = m.join(head, on="coll_group").filter(pl.col("src") != pl.col("task_id")).select("src", dst=pl.col("task_id"))
    return _edge(e, "collective", "peer")


# ---------------------------------------------------------------- lags and simulation durations
CONTRADICTION_NS = 1_000  # a dependency whose dst started this much before src ended was not one


def _calibrate(t: pl.DataFrame, e: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame, dict]:
    """Edge lags and task simulation durations from the trace (see module doc).

    Synchronizing calls have two phases: they start when the thread issues them and end `post`
    after the later of that and the end of what they wait on (post = traced end - max(issue,
    wait end)); gpu_cpu edges feed the second phase (`wait_ref` = when the wait ended in the trace).
    A blocking copy launches the copy it then waits for: its launch edge counts from the call's
    start (`from_start`). Collectives end `sim_dur` after the last peer arrived.
    Heuristic dependencies that the trace contradicts (dst clearly started, or a waiting call
    clearly returned, before src ended) are dropped and counted in graph.meta."""
    ts = t.select("task_id", "ts_ns", "end_ns", "kind", "role")
    flow = e.filter(pl.col("edge_type") != "collective").join(
        ts.select(src="task_id", s_end="end_ns", s_ts="ts_ns"), on="src").join(
        ts.select(dst="task_id", d_ts="ts_ns", d_end="end_ns"), on="dst")
    is_wait = pl.col("edge_type") == "gpu_cpu"
    checked = ~pl.col("subtype").is_in(["thread_order", "stream_order", "launch"])
    contradicted = checked & pl.when(is_wait).then(pl.col("s_end") > pl.col("d_end") + CONTRADICTION_NS).otherwise(
        pl.col("d_ts") < pl.col("s_end") - CONTRADICTION_NS)
    dropped = flow.filter(contradicted).group_by("subtype").len()
    flow = flow.filter(~contradicted)
    wait_end = flow.filter(is_wait).group_by("dst").agg(c=pl.col("s_end").max())
    t = t.join(wait_end.rename({"dst": "task_id"}), on="task_id", how="left")
    peers = t.filter(pl.col("coll_group").is_not_null()).group_by("coll_group").agg(g_start=pl.col("ts_ns").max())
    t = t.join(peers, on="coll_group", how="left")
    wait_ref = pl.max_horizontal("ts_ns", "c")
    t = t.with_columns(
        sim_dur_ns=pl.when(pl.col("c").is_not_null()).then(pl.col("end_ns") - wait_ref)
        .when(pl.col("g_start").is_not_null()).then(pl.col("end_ns") - pl.max_horizontal("ts_ns", "g_start"))
        .otherwise(pl.col("dur_ns")).clip(lower_bound=0),
        sim_start_ref=pl.col("ts_ns"),
        wait_ref=pl.when(pl.col("c").is_not_null()).then(wait_ref),
    ).drop("c", "g_start")
    waiting = t.filter(pl.col("wait_ref").is_not_null()).select(src="task_id").with_columns(from_start=pl.lit(True))
    flow = flow.join(waiting, on="src", how="left").with_columns(
        from_start=(pl.col("from_start").fill_null(False) & (pl.col("subtype") == "launch")))
    flow = flow.with_columns(slack=pl.when(is_wait).then(pl.lit(0, pl.Int64)).otherwise(
        pl.col("d_ts") - pl.when(pl.col("from_start")).then(pl.col("s_ts")).otherwise(pl.col("s_end"))))
    start_edges = ~is_wait
    flow = flow.with_columns(binding=pl.when(start_edges).then(
        pl.col("slack") == pl.col("slack").filter(start_edges).min().over("dst")).otherwise(pl.lit(True)))
    typical = flow.filter(pl.col("binding") & start_edges).group_by("subtype").agg(typ=pl.col("slack").clip(lower_bound=0).median())
    flow = flow.join(typical, on="subtype", how="left").with_columns(pl.col("typ").fill_null(0))
    lag = (
        pl.when(is_wait).then(pl.lit(0, pl.Int64))
        # CPU work between consecutive tasks of a thread is real work: keep it
        .when(pl.col("subtype") == "thread_order").then(pl.col("slack"))
        .when(pl.col("binding")).then(pl.col("slack"))
        .otherwise(pl.min_horizontal("slack", pl.col("typ").cast(pl.Int64)))
    )
    # model lags: the typical delay of the edge's type everywhere except the CPU work between a
    # thread's tasks and the waits of synchronizing calls (used by replay and what-if); calibrated
    # lags: exact for the binding edge, so the unchanged graph reproduces the trace exactly
    unexplained = (pl.col("binding") & ~is_wait & (pl.col("subtype") != "thread_order")
                   & (pl.col("slack") > pl.col("typ") + UNEXPLAINED_NS))
    model = (pl.when(is_wait).then(pl.lit(0, pl.Int64))
             .when(pl.col("subtype") == "thread_order").then(pl.col("slack"))
             # a delay no modeled dependency explains is kept as observed (counted in graph.meta)
             .when(unexplained).then(pl.col("slack"))
             .otherwise(pl.col("typ").cast(pl.Int64)))
    strict = (pl.when(is_wait).then(pl.lit(0, pl.Int64))
              .when(pl.col("subtype") == "thread_order").then(pl.col("slack"))
              .otherwise(pl.col("typ").cast(pl.Int64)))
    flow = flow.with_columns(lag_calibrated_ns=lag.cast(pl.Int64), lag_ns=model.cast(pl.Int64), lag_typical_ns=strict.cast(pl.Int64))
    # a thread gap explained by another thread: the thread edge keeps only a short gap
    inter = flow.filter((pl.col("subtype") == "inter_thread") & pl.col("binding")).select("dst").unique().with_columns(_it=pl.lit(True))
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
