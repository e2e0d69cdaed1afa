"""The real StragglerAnalysis trace, stack-dump parsing (py-spy and faulthandler), ring.json link
diagnosis, and clear errors on bad input."""
from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from fleetscope.ingest.timings import read_timings
from fleetscope.xputimer import detectors as D
from fleetscope.xputimer import metrics as M
from fleetscope.xputimer.degradation import write_profile_request
from fleetscope.xputimer.hang import diagnose_hang, parse_stack_dump

REAL = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "real"


def test_straggler_analysis_last_stage_too_long():
    t = read_timings(REAL / "straggler_analysis")
    sm = M.stage_metrics(t)
    assert sm.height == 8 and sorted(sm["stage"].unique().to_list()) == [0, 1, 2, 3]
    last = sm.filter(pl.col("stage") == 3)
    assert (last["compute_ratio_to_median"] > 1.3).all()
    assert (sm.filter(pl.col("stage") < 3)["compute_ratio_to_median"] < 1.1).all()
    out = D.analyze(t)
    bad = out["verdicts"].filter(pl.col("severity") != "info")
    assert bad.select("scope", "subject", "team").rows() == [("stage", "3", "algorithm")]
    # step throughput from the op rows: 32 steps around the tool's own ~2.2 s step time
    base = json.loads((REAL / "straggler_analysis" / "result-ST.json").read_text())["step_t_base"]
    st = out["xputimer_step_throughput"]
    assert st.height == len(base)
    mine = dict(zip(st["step"].to_list(), (st["step_ns"] / 1e9).to_list()))
    assert max(abs(mine[int(k)] - v) / v for k, v in base.items()) < 0.1


PYSPY = """Process {pid}: python train.py
Python v3.11.9 (/usr/bin/python3.11)

Thread {pid} (active): "MainThread"
    {inner}
    all_reduce (torch/distributed/distributed_c10d.py:2288)
    wrapper (torch/distributed/c10d_logger.py:83)
    train_step (train.py:40)
    <module> (train.py:100)
Thread 77 (idle): "Thread-2 (_pin_memory_loop)"
    select (selectors.py:415)
    _bootstrap (threading.py:1002)
"""


def test_ring_json_names_the_faulty_link(tmp_path):
    inc = tmp_path / "inc-ring"
    inc.mkdir()
    for r in range(4):
        (inc / f"rank{r}.txt").write_text(PYSPY.format(pid=100 + r, inner="synchronize (torch/cuda/__init__.py:792)"))
    ring = [{"rank": r, "peer": (r + 1) % 4, "channel": c, "step": 900 + 10 * r + c} for r in range(4) for c in range(2)]
    ring[5]["step"] = 311  # rank 2 -> 3, channel 1 stopped early
    (inc / "ring.json").write_text(json.dumps(ring))
    ranks, v, _, _ = diagnose_hang(inc, job_id="j", rank_ips={0: "10.0.0.1", 1: "10.0.0.2", 2: "10.0.0.3", 3: "10.0.0.4"})
    assert ranks["in_collective"].all() and not ranks["culprit"].any()
    assert v.select("scope", "subject", "team", "value").rows() == [("link", "10.0.0.3-10.0.0.4", "operations", 311.0)]
    # without ring.json: a communication hang that says what is missing
    (inc / "ring.json").unlink()
    v = diagnose_hang(inc).verdicts
    assert v["scope"].to_list() == ["job"] and "ring.json" in v["explanation"][0]


def test_faulthandler_format():
    text = """Thread 0x00007f01 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007f02 (most recent call first):
  File "/x/site-packages/torch/distributed/distributed_c10d.py", line 3970 in barrier
  File "/x/train.py", line 12 in main
  File "/x/train.py", line 20 in <module>
"""
    th = parse_stack_dump(text)
    assert [len(t["frames"]) for t in th] == [2, 3]
    from fleetscope.xputimer.hang import collective_frame, main_thread
    assert collective_frame(main_thread(th)["frames"]) == "barrier"
    # a generic name outside torch.distributed is not a collective
    assert collective_frame([("wait", "/usr/lib/python3.11/threading.py")]) is None


def test_bad_inputs_have_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="lacks required column"):
        M.step_throughput(pl.DataFrame({"rank": [0], "kind": ["api"]}))
    with pytest.raises(FileNotFoundError, match="no rank<R>.txt"):
        diagnose_hang(tmp_path)
    (tmp_path / "rank0.txt").write_text(PYSPY.format(pid=1, inner="x (y.py:1)"))
    (tmp_path / "ring.json").write_text(json.dumps([{"rank": 0}]))
    with pytest.raises(ValueError, match="lack rank/peer/step"):
        diagnose_hang(tmp_path)


def test_profile_request_file(tmp_path):
    p = write_profile_request(tmp_path, "job7", {"kind": "degraded", "at_ns": 123, "ratio": 1.08}, steps=4)
    assert p == tmp_path / "requests" / "job7.json"
    req = json.loads(p.read_text())
    assert req["kind"] == "profile" and req["id"] == "degraded-123" and req["steps"] == 4
    assert req["capture"] == "job7-prof-degraded-123" and "1.080" in req["note"]
    assert not list((tmp_path / "requests").glob("*.tmp"))


def test_metrics_over_a_real_gpu_trace():
    """The same metrics from a real A100 profiler trace (HTA test data, rank 0 of 2, NCCL)."""
    from fleetscope.ingest.traces import read_trace
    from fleetscope.ingest.trace_timings import timings_from_trace_events

    ev = read_trace(REAL / "hta" / "nccl_parser_config__nccl_data.json.gz", capture_id="hta").events
    t = timings_from_trace_events(ev)
    comm_k = ev.filter((pl.col("cat") == "kernel") & pl.col("is_comm"))
    steps = ev.filter(pl.col("name").str.starts_with("ProfilerStep#"))
    st = M.step_throughput(t)
    assert st["step"].to_list() == sorted(int(n.split("#")[1]) for n in steps["name"].to_list())
    lat = M.issue_latencies(t)
    # every NCCL kernel inside a profiler step, with the device definition (launch -> start)
    assert lat.height == comm_k.filter(pl.col("ts_ns") >= steps["ts_ns"].min()).height > 0
    assert (lat["mode"] == "device").all() and (lat["latency_ns"] >= 0).all()
    bw = M.comm_bandwidth(M.comm_instances(t))
    assert set(bw["collective"].to_list()) <= {"allreduce", "broadcast"}
    assert (bw.filter(pl.col("collective") == "allreduce")["median_busbw_bps"] > 1e9).all()  # MB-sized all-reduces: GB/s
