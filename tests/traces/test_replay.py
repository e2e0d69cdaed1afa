import json

import numpy as np
import polars as pl
import pytest

from fleetscope.tables import TABLES
from fleetscope.traces.graph import build_graph
from fleetscope.ingest.traces import read_trace
from fleetscope.traces.replay import breakdown, replay, simulate_graph
from tests.traces import synth
from tests.traces.conftest import GPU_TRACES, real


@pytest.mark.parametrize("path", GPU_TRACES, ids=lambda p: p.name[:40])
def test_replay_error_on_real_gpu_traces(path):
    g = build_graph(read_trace(path, "cap").events)
    r = replay(g)
    TABLES["replays"].validate(r.replays)
    assert r.replays.height >= 1
    assert r.replays["error_pct"].mean() <= 2.0, r.replays
    # calibrated lags reproduce the trace of the unchanged graph exactly
    exact = replay(g, calibrated=True)
    assert exact.replays["error_pct"].max() < 1e-9
    t = exact.tasks
    assert (t["sim_start_ns"] == t["sim_start_ref"]).all() and (t["sim_end_ns"] == t["end_ns"]).all()


def _gemm_comm_steps(n_steps, gemm_us, comm_us, streams=(7, 7)):
    return [[{"name": "ampere_sgemm_128x64_nn", "stream": streams[0], "dur": gemm_us},
             {"name": "ncclKernel_AllReduce_RING_LL_Sum_float", "stream": streams[1], "dur": comm_us, "coll": "allreduce",
              "nelems": 1 << 20, "group": 2}] for _ in range(n_steps)]


def test_replay_matches_an_independent_model(tmp_path):
    doc = synth.make_trace(_gemm_comm_steps(6, 300, 500, streams=(7, 20)))
    g = build_graph(read_trace(synth.write(doc, tmp_path / "rank0.json.gz"), "syn").events)
    r = replay(g)
    truth = synth.step_times_us(doc)
    got = r.replays.sort("iteration")["actual_ns"].to_list()
    # completion to completion equals ProfilerStep start to start in steady state; the first
    # iteration starts at its first task
    assert got[1:-1] == [x * 1000 for x in truth[1:-1]]
    assert got[0] == pytest.approx(truth[0] * 1000, rel=0.02) and got[-1] == pytest.approx(truth[-1] * 1000, rel=0.02)
    assert r.replays["error_pct"].max() < 1.0
    # breakdown: per step 300 us compute and 500 us comm on two streams, launched back to back:
    # the allreduce overlaps the gemm except for the launch offset (7 us)
    row = r.replays.sort("iteration").row(1, named=True)
    assert row["overlap_ns"] == pytest.approx(293_000, abs=2_000)
    assert row["exposed_compute_ns"] == pytest.approx(7_000, abs=2_000)
    assert row["exposed_comm_ns"] == pytest.approx(207_000, abs=2_000)
    assert row["exposed_compute_ns"] + row["exposed_comm_ns"] + row["overlap_ns"] + row["idle_ns"] == row["simulated_ns"]


def test_sm_utilization_and_chrome_export(tmp_path):
    # one 2 ms kernel per step, steps 3 ms apart (cpu launch 5 us + device sync)
    steps = [[{"name": "k", "stream": 7, "dur": 2000}] for _ in range(3)]
    doc = synth.make_trace(steps)
    g = build_graph(read_trace(synth.write(doc, tmp_path / "r.json.gz"), "syn").events)
    r = replay(g)
    u = r.sm_util
    TABLES["replay_sm_util"].validate(u)
    a = u["actual_util"].to_numpy()
    assert a[0] == pytest.approx(1.0) and a[1] == pytest.approx(1.0)
    busy = sum(e["dur"] for e in doc["traceEvents"] if e["cat"] == "kernel") * 1000
    assert a.sum() * 1_000_000 == pytest.approx(busy, rel=1e-9)
    assert np.abs(u["simulated_util"].to_numpy() - a).max() < 0.05
    out = tmp_path / "sim.json"
    exported = r.chrome_trace(out)
    doc2 = json.loads(out.read_text())
    assert len(doc2["traceEvents"]) == g.tasks.height == len(exported["traceEvents"])
    # the exported trace is itself readable by the parser
    back = read_trace(out, "sim").events
    assert back.height == g.tasks.height


def test_simulate_hand_graph_with_collective_and_sync():
    """Two ranks: CPU launch (10) -> kernel (dur 100 on rank 0, 300 on rank 1) -> allreduce (own part 50);
    rank 0's sync call waits for its allreduce. The allreduce ends 50 after the later arrival."""
    tasks = pl.DataFrame({
        "task_id": [0, 1, 2, 3, 4, 5, 6],
        "sim_dur_ns": [10, 100, 50, 10, 300, 50, 5],
        "sim_start_ref": [0, 10, 110, 0, 10, 310, 20],
        "wait_ref": [None, None, None, None, None, None, 360],
        "coll_group": [None, None, "ar#0", None, None, "ar#0", None],
    })
    edges = pl.DataFrame({
        "src": [0, 1, 3, 4, 0, 2], "dst": [1, 2, 4, 5, 6, 6],
        "edge_type": ["cpu_gpu", "gpu_gpu", "cpu_gpu", "gpu_gpu", "cpu_cpu", "gpu_cpu"],
        "lag_ns": [0, 0, 0, 0, 10, 0],
    })
    sim = simulate_graph(tasks, edges)
    assert sim.start.tolist() == [0, 10, 110, 0, 10, 310, 20]
    assert sim.end.tolist() == [10, 110, 360, 10, 310, 360, 365]
    # rank 1's kernel twice as fast: the collective and the sync move with it
    sim2 = simulate_graph(tasks, edges, np.array([10, 100, 50, 10, 150, 50, 5]))
    assert sim2.end[[2, 5, 6]].tolist() == [210, 210, 215]


def test_simulate_falls_back_to_kahn_when_keys_disagree():
    tasks = pl.DataFrame({"task_id": [0, 1, 2], "sim_dur_ns": [5, 5, 5], "sim_start_ref": [100, 0, 50]})
    edges = pl.DataFrame({"src": [0, 1], "dst": [1, 2], "edge_type": ["cpu_cpu", "cpu_cpu"], "lag_ns": [1, 1]})
    sim = simulate_graph(tasks, edges)
    assert sim.order_fallback and sim.start.tolist() == [100, 106, 112]
    cyc = pl.DataFrame({"src": [0, 1], "dst": [1, 0], "edge_type": ["cpu_cpu", "cpu_cpu"], "lag_ns": [0, 0]})
    with pytest.raises(ValueError, match="cycle"):
        simulate_graph(tasks, cyc)


def test_breakdown_hand_intervals():
    comm = np.array([False, True, False])
    s = np.array([0, 50, 200])
    e = np.array([100, 150, 250])
    b = breakdown(comm, s, e, 0, 300)
    assert b == {"exposed_compute_ns": 100, "exposed_comm_ns": 50, "overlap_ns": 50, "idle_ns": 100}


def test_chrome_trace_opens_cleanly_in_perfetto():
    """Relative timestamps from a stated origin, and on every track slices are nested or disjoint
    (partially overlapping work goes to its own track)."""
    from fleetscope.traces.replay import chrome_trace_bytes
    g = build_graph(read_trace(real("nccl_parser_config"), "cap").events)
    r = replay(g)
    doc = json.loads(chrome_trace_bytes(r.tasks))
    t0 = doc["otherData"]["t0_ns"]
    assert t0 == int(r.tasks["sim_start_ns"].min()) and doc["otherData"]["t0_utc"].startswith("20")
    ev = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(ev) == r.tasks.height and min(e["ts"] for e in ev) == 0.0
    assert max(e["ts"] for e in ev) < 1e9  # microseconds since the origin, not since 1970
    by_track: dict = {}
    for e in ev:
        by_track.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_track.values():
        spans.sort(key=lambda x: (x[0], -x[1]))
        open_ends: list[float] = []
        for s, e in spans:
            while open_ends and open_ends[-1] <= s + 1e-3:
                open_ends.pop()
            assert not open_ends or e <= open_ends[-1] + 1e-3, "partially overlapping slices on one track"
            open_ends.append(e)


def test_partially_overlapping_work_goes_to_its_own_track():
    from fleetscope.traces.replay import chrome_trace_bytes
    tasks = pl.DataFrame({"rank": [0] * 4, "processor": ["stream 7"] * 4, "name": ["a", "b", "c", "d"], "role": ["compute"] * 4,
                          "task_id": [0, 1, 2, 3], "sim_start_ns": [1_000, 2_000, 1_500, 9_000],
                          "sim_end_ns": [5_000, 3_000, 6_000, 9_500]})
    ev = {e["name"]: e for e in json.loads(chrome_trace_bytes(tasks))["traceEvents"]}
    assert ev["a"]["tid"] == ev["b"]["tid"] == ev["d"]["tid"] == "stream 7"  # b nested in a, d after both
    assert ev["c"]["tid"] == "stream 7 (overlap 1)"                          # c starts inside a and ends after it
    assert ev["a"]["ts"] == 0.0 and ev["c"]["ts"] == 0.5 and ev["c"]["dur"] == 4.5
