import polars as pl
import pytest

from fleetscope.tables import TABLES
from fleetscope.traces.graph import build_graph
from fleetscope.ingest.traces import read_trace
from tests.traces.conftest import load_json, real


def _graph(prefix):
    tf = read_trace(real(prefix), "cap")
    return tf.events, build_graph(tf.events)


def _edges_named(g, subtype):
    t = g.tasks.select("task_id", "name", "stream", "correlation", "role", "kind")
    return (g.edges.filter(pl.col("subtype") == subtype)
            .join(t.rename({c: f"s_{c}" for c in t.columns}), left_on="src", right_on="s_task_id")
            .join(t.rename({c: f"d_{c}" for c in t.columns}), left_on="dst", right_on="d_task_id"))


def test_tables_validate_and_every_gpu_task_is_launched():
    for prefix in ["critical_path__alexnet", "critical_path__simple_add", "nccl_parser_config"]:
        ev, g = _graph(prefix)
        TABLES["graph_tasks"].validate(g.tasks)
        TABLES["graph_edges"].validate(g.edges)
        gpu = g.tasks.filter(pl.col("kind") == "gpu")
        launched = g.edges.filter(pl.col("subtype") == "launch")["dst"]
        assert gpu["task_id"].is_in(launched.implode()).all(), prefix
        # one launch edge per GPU op, and the CPU side carries the same correlation id
        le = _edges_named(g, "launch")
        assert (le["s_correlation"] == le["d_correlation"]).all() and le.height == gpu.height


def test_event_sync_trace_dependencies():
    """critical_path__cuda_event_sync: memcpy D2H -> cudaStreamSynchronize; spin kernel recorded by
    cudaEventRecord (corr 1533) -> cudaEventSynchronize; the pageable D2H copy blocks its call."""
    ev, g = _graph("critical_path__cuda_event_sync__")
    doc = load_json(real("critical_path__cuda_event_sync__"))
    names = {e["args"]["correlation"]: e["name"] for e in doc["traceEvents"]
             if e.get("cat") in ("kernel", "gpu_memcpy") and "correlation" in e.get("args", {})}
    ss = _edges_named(g, "stream_sync")
    assert ss.height == 1 and ss["d_name"][0] == "cudaStreamSynchronize"
    assert ss["s_name"][0] == names[1511]  # the D2H copy, last op launched on stream 7 before the sync
    es = _edges_named(g, "event_sync")
    assert es.height == 1 and es["d_name"][0] == "cudaEventSynchronize"
    assert es["s_correlation"][0] == 1526 and "spin_kernel" in es["s_name"][0]
    bc = _edges_named(g, "blocking_copy")
    assert bc.height == 1 and bc["d_name"][0] == "cudaMemcpyAsync" and bc["s_correlation"][0] == 1511
    cs = _edges_named(g, "context_sync")
    assert cs.height == 1 and cs["d_name"][0] == "cudaDeviceSynchronize"
    # CPU thread order: the runtime calls of the single thread form one chain
    th = g.edges.filter(pl.col("subtype") == "thread_order")
    cpu = g.tasks.filter(pl.col("kind") == "cpu")
    assert th.height == cpu.height - cpu["processor"].n_unique()


def test_multi_stream_event_wait():
    """cudaEventRecord (corr 1385) on stream 20, cudaStreamWaitEvent (corr 1389) on stream 24: the
    next op on stream 24 waits for the last op launched on stream 20 before the record."""
    ev, g = _graph("critical_path__cuda_event_sync_multi")
    ew = _edges_named(g, "event_wait")
    assert ew.height == 1
    assert ew["s_stream"][0] == 20 and ew["d_stream"][0] == 24
    rt = ev.filter(pl.col("cat") == "cuda_runtime")
    rec_ts = rt.filter(pl.col("correlation") == 1385)["ts_ns"][0]
    wait_ts = rt.filter(pl.col("correlation") == 1389)["ts_ns"][0]
    launch_ts = dict(rt.select("correlation", "ts_ns").iter_rows())
    assert launch_ts[ew["s_correlation"][0]] < rec_ts < wait_ts < launch_ts[ew["d_correlation"][0]]
    # the event sync on corr 54 waits on the record corr 32 (stream 20): a gpu->cpu edge only when blocking
    assert _edges_named(g, "event_sync").height == 0  # cudaEventQuery never blocks


def test_alexnet_gpu_gpu_and_gpu_cpu_edges():
    ev, g = _graph("critical_path__alexnet")
    waits = ev.filter(pl.col("sync_kind") == "Stream Wait Event")
    ew = _edges_named(g, "event_wait")
    assert ew.height > 0 and (ew["s_stream"] != ew["d_stream"]).all()
    # every resolved wait joins the streams the cuda_sync events name
    pairs = set(zip(waits["wait_on_stream"].to_list(), waits["stream"].to_list()))
    assert set(zip(ew["s_stream"].to_list(), ew["d_stream"].to_list())) <= pairs
    so = _edges_named(g, "stream_order")
    assert (so["s_stream"] == so["d_stream"]).all()
    ss = _edges_named(g, "stream_sync")
    assert ss.height == ev.filter(pl.col("sync_kind") == "Stream Sync").height == 16


def test_nccl_trace_has_inter_thread_and_heuristic_event_waits():
    """nccl_data has no cuda_sync events: record/wait pairs are matched on the calling thread; the
    backward thread's waits on the forward thread are inter-thread edges."""
    ev, g = _graph("nccl_parser_config")
    ew = _edges_named(g, "event_wait")
    assert ew.height > 0 and (ew["s_stream"] != ew["d_stream"]).all()
    it = g.edges.filter(pl.col("subtype") == "inter_thread").join(
        g.tasks.select(src="task_id", sp="processor"), on="src").join(g.tasks.select(dst="task_id", dp="processor"), on="dst")
    assert it.height > 0 and (it["sp"] != it["dp"]).all()
    # dropped heuristic edges are counted, not silent
    assert isinstance(g.meta["dropped_edges"], dict)


def test_cross_rank_collectives_link_ranks():
    a = read_trace(real("timeline_analysis"), "cap").events
    b = read_trace(real("trace_filter"), "cap").events
    g = build_graph(pl.concat([a, b]))
    grp = g.tasks.filter(pl.col("coll_group").is_not_null()).group_by("coll_group").agg(
        n=pl.len(), ranks=pl.col("rank").n_unique(), colls=pl.col("collective").n_unique())
    assert grp.height > 0 and (grp["ranks"] == 2).all() and (grp["n"] == 2).all() and (grp["colls"] == 1).all()
    peer = g.edges.filter(pl.col("edge_type") == "collective")
    assert peer.height == grp.height and (peer["rank"] != peer["src_rank"]).all()


def test_empty_events_rejected():
    with pytest.raises(ValueError, match="no trace events"):
        build_graph(read_trace(real("cpu_only"), "c").events.head(0))
