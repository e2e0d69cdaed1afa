"""Simulated captures: trace structure like the real HTA traces, timings per docs/CONTRACT.md 1.4, hw samples,
each fault changing what it should and nothing else, determinism, bad input."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from fleetscope.sim.capture import CaptureJob, render_capture, render_hang, render_hw, scenario_capture
from fleetscope.sim.capture.scenarios import make_job

REAL = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "real" / "hta"
T0 = 1_763_712_000_000_000_000


def small_job(job_id="j1", seed=0) -> CaptureJob:
    return make_job(job_id, 2, tp=2, pp=2, dp=4, start_ns=T0, n_microbatches=4, n_steps=2, n_layers=4, seed=seed)


def fault(kind, subject, job, magnitude=None, scope="gpu", **kw):
    return {"fault_id": f"f-{kind}", "kind": kind, "scope": scope, "subject": subject, "start_ns": job.start_ns,
            "end_ns": job.start_ns + 10**12, "magnitude": magnitude, "job_id": job.job_id, **kw}


def render(tmp: Path, name: str, faults: list[dict], trace_ranks=(0, 5, 9), seed=0):
    job = small_job()
    land = tmp / name
    truth = render_capture(land, "cap", job, faults, seed, trace_ranks=list(trace_ranks))
    t = pl.read_parquet(sorted((land / "timings" / "cap").glob("rank*.parquet"))).with_columns(
        d=pl.col("end_ns") - pl.col("start_ns"))
    return land, truth, t, job


def load_trace(land: Path, rank: int) -> dict:
    return json.loads(gzip.decompress((land / "traces" / "cap" / f"rank{rank}.json.gz").read_bytes()))


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    return render(tmp_path_factory.mktemp("cap"), "healthy", [])


def assert_truth_visible(land: Path, truth: list[dict], t: pl.DataFrame) -> None:
    """The function / kernel a truth row names occurs in what landed for that rank (trace names,
    timings names or gemm shapes), so analyses can be scored against it."""
    seen_t = set(t["name"].unique()) | {f"gemm {x}".replace(",dtype=bf16", "") for x in t["shape"].drop_nulls().unique()}
    checked = 0
    for row in truth:
        p = land / "traces" / "cap" / f"rank{row['rank']}.json.gz"
        if p.exists():  # a traced rank shows both the function and the kernel / api name
            names = seen_t | {e.get("name") for e in load_trace(land, row["rank"])["traceEvents"]}
            assert row["function"] in names, row["function"]
            assert not row["kernel"] or row["kernel"] in names, row["kernel"]
            checked += 1
        else:  # timings only: one of the two names
            assert row["function"] in seen_t or row["kernel"] in seen_t, (row["function"], row["kernel"])
    assert checked or not truth or all(not (land / "traces" / "cap" / f"rank{r['rank']}.json.gz").exists() for r in truth)


def med(t: pl.DataFrame, name: str, ranks=None, kind=None) -> float:
    q = t.filter(pl.col("name") == name)
    if kind:
        q = q.filter(pl.col("kind") == kind)
    if ranks is not None:
        q = q.filter(pl.col("rank").is_in(list(ranks)))
    return float(q["d"].median())


# ------------------------------------------------------------------------------------------ structure
def test_trace_structure_like_real_hta(healthy):
    land, truth, t, job = healthy
    assert truth == []
    doc = load_trace(land, 5)
    assert doc["distributedInfo"]["rank"] == 5 and doc["distributedInfo"]["world_size"] == 16
    assert doc["deviceProperties"] and "baseTimeNanoseconds" in doc
    ev = doc["traceEvents"]
    cats = {e.get("cat") for e in ev}
    assert {"python_function", "cpu_op", "cuda_runtime", "kernel", "cuda_sync", "ac2g", "user_annotation"} <= cats
    runtime = {e["args"]["correlation"]: e for e in ev if e.get("cat") == "cuda_runtime"}
    kernels = [e for e in ev if e.get("cat") == "kernel"]
    # every kernel is linked to its launch by correlation id and starts after it
    assert all(k["args"]["correlation"] in runtime for k in kernels)
    assert all(runtime[k["args"]["correlation"]]["name"] == "cudaLaunchKernel" for k in kernels)
    assert all(k["ts"] >= runtime[k["args"]["correlation"]]["ts"] for k in kernels)
    flows = {(e["ph"], e["id"]) for e in ev if e.get("cat") == "ac2g"}
    assert all(("s", k["args"]["correlation"]) in flows and ("f", k["args"]["correlation"]) in flows for k in kernels)
    # cpu_op -> runtime via External id
    ext_ops = {e["args"]["External id"] for e in ev if e.get("cat") == "cpu_op"}
    assert all(runtime[k["args"]["correlation"]]["args"]["External id"] in ext_ops for k in kernels)
    # cudaEventRecord / cudaStreamWaitEvent pairs: each wait names a recorded event's correlation
    records = {e["args"]["correlation"] for e in ev if e.get("name") == "cudaEventRecord"}
    waits = [e for e in ev if e.get("cat") == "cuda_sync" and e["name"] == "Stream Wait Event"]
    assert waits and all(w["args"]["wait_on_cuda_event_record_corr_id"] in records for w in waits)
    assert {w["args"]["wait_on_stream"] for w in waits} >= {7, 20, 24}
    # kernels of one stream never overlap
    by_stream: dict[int, list] = {}
    for k in kernels:
        by_stream.setdefault(k["tid"], []).append((k["ts"], k["ts"] + k["dur"]))
    assert len(by_stream) >= 4
    for s, iv in by_stream.items():
        a = np.array(sorted(iv))
        assert (a[1:, 0] >= a[:-1, 1] - 1e-6).all(), f"stream {s} has overlapping kernels"
    # python call stacks nest
    py = {e["args"]["Python id"]: e for e in ev if e.get("cat") == "python_function"}
    for e in py.values():
        p = e["args"].get("Python parent id")
        if p is not None:
            assert py[p]["ts"] <= e["ts"] + 1e-3 and e["ts"] + e["dur"] <= py[p]["ts"] + py[p]["dur"] + 1e-3
    assert sum(e["name"].startswith("ProfilerStep#") for e in ev) == job.n_steps


def test_nccl_args_match_real_trace(healthy):
    land, *_ = healthy
    real = json.loads(gzip.decompress((REAL / "nccl_parser_config__nccl_data.json.gz").read_bytes()))
    real_keys = next(set(e["args"]) for e in real["traceEvents"] if e.get("cat") == "kernel" and "nccl" in e["name"].lower())
    ev = load_trace(land, 0)["traceEvents"]
    ours = [e for e in ev if e.get("cat") == "kernel" and e["name"].startswith("nccl")]
    assert {e["args"]["Collective name"] for e in ours} == {"allreduce", "send", "recv"}
    for e in ours:
        missing = real_keys - set(e["args"])
        assert not missing, missing
        ranks = json.loads(e["args"]["Process Group Ranks"])
        assert 0 in ranks and len(ranks) == e["args"]["Group size"]


def test_traces_parse_with_the_trace_reader(healthy):
    import fleetscope.ingest.traces as parse
    land, _, t, job = healthy
    df = parse.read_capture(land / "traces" / "cap", "cap")
    assert sorted(df["rank"].unique().to_list()) == [0, 5, 9]
    k = df.filter((pl.col("cat") == "kernel") & (pl.col("rank") == 5) & ~pl.col("is_comm"))
    tk = t.filter((pl.col("rank") == 5) & (pl.col("name") == "gemm"))
    # the gemm kernels in the trace are the gemm rows of the timings, to the nanosecond
    assert set(tk["start_ns"].to_list()) <= set(k["ts_ns"].to_list())


def test_timings_contract(healthy):
    land, _, t, job = healthy
    files = sorted((land / "timings" / "cap").glob("rank*.parquet"))
    assert len(files) == 16 and (land / "timings" / "cap" / "capture.json").exists()
    assert {"rank", "kind", "name", "issue_ns", "start_ns", "end_ns", "flops", "bytes", "group", "group_size", "shape",
            "step", "stage", "dp_rank", "microbatch"} <= set(t.columns)
    names = set(t["name"].unique())
    assert {"gemm", "flash_attn_fwd", "nccl:AllReduce", "nccl:Send", "nccl:Recv", "dataloader.next", "optimizer.step",
            "cuda.synchronize", "forward-compute", "backward-compute", "forward-send", "forward-recv", "backward-send",
            "backward-recv", "optimizer"} <= names
    assert (t["issue_ns"] <= t["start_ns"]).all() and (t["end_ns"] >= t["start_ns"]).all()
    g = t.filter(pl.col("name") == "gemm").head(50)
    for shape, flops in zip(g["shape"], g["flops"]):
        dims = dict(kv.split("=") for kv in shape.split(","))
        assert flops == pytest.approx(2 * int(dims["m"]) * int(dims["n"]) * int(dims["k"]))
    ops = t.filter(pl.col("kind") == "op")
    assert ops["stage"].null_count() == 0 and ops.filter(pl.col("name") == "forward-compute")["microbatch"].n_unique() == 4
    ar = t.filter(pl.col("name") == "nccl:AllReduce")
    assert set(ar["group_size"].unique()) == {2, 4}
    # every TP group's all-reduce ends at the same time on its members (a real collective)
    tp = ar.filter(pl.col("group_size") == 2).group_by("group", "step", "start_ns").len()
    assert tp.height > 0
    ends = ar.filter(pl.col("group_size") == 2).group_by("group").agg(pl.col("end_ns").n_unique(), pl.len())
    assert (ends["len"] == 2 * ends["end_ns"]).all()


def test_healthy_hw_and_step_time(tmp_path):
    land, truth = scenario_capture(tmp_path, "healthy", seed=1)
    hw = pl.read_parquet(next((land / "hw").glob("*.parquet")))
    assert truth == [] and (hw["throttle_reasons"] == 0).all()
    assert hw["gpu"].n_unique() == 16 and hw["nvlink_tx_bps"].max() > 1e10
    t = pl.read_parquet(sorted((land / "timings").glob("*/rank*.parquet")))
    ends = t.filter(pl.col("name") == "optimizer").group_by("step").agg(pl.col("end_ns").max()).sort("step")["end_ns"]
    step = float(ends.diff().drop_nulls().mean())
    assert 0.7e9 < step < 1.3e9  # the job's typical step time (1 s)


def test_deterministic_by_seed(tmp_path):
    job = small_job()
    a = render_capture(tmp_path / "a", "cap", job, [fault("gc_stall", job.job_id, job, scope="job")], 3, trace_ranks=[1])
    b = render_capture(tmp_path / "b", "cap", job, [fault("gc_stall", job.job_id, job, scope="job")], 3, trace_ranks=[1])
    render_capture(tmp_path / "c", "cap", job, [fault("gc_stall", job.job_id, job, scope="job")], 4, trace_ranks=[1])
    assert a == b
    for rel in ("traces/cap/rank1.json.gz", "timings/cap/rank1.parquet"):
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes()
    assert pl.read_parquet(tmp_path / "a/timings/cap/rank1.parquet")["end_ns"].to_list() != \
        pl.read_parquet(tmp_path / "c/timings/cap/rank1.parquet")["end_ns"].to_list()


# ------------------------------------------------------------------------------------------ faults
def test_slow_gpu_slows_its_compute_and_hw(tmp_path, healthy):
    _, _, th, job = healthy
    land, truth, t, job = render(tmp_path, "slow", [fault("slow_gpu", job.ips[5], job, 1.6)])
    assert_truth_visible(land, truth, t)
    assert [(r["rank"], r["team"], r["function"]) for r in truth] == [(5, "operations", "gemm")]
    others = [r for r in range(16) if r != 5]
    assert med(t, "gemm", [5]) / med(th, "gemm", [5]) == pytest.approx(1.6, rel=0.05)
    assert med(t, "gemm", others) / med(th, "gemm", others) == pytest.approx(1.0, abs=0.02)
    # its TP peer (rank 4) waits for it inside the all-reduce
    assert med(t, "nccl:AllReduce", [4]) > 2 * med(th, "nccl:AllReduce", [4])
    gpus = pl.DataFrame({"host": job.hosts, "gpu": job.gpus, "ip": job.ips})
    render_hw(tmp_path / "slow", gpus, [fault("slow_gpu", job.ips[5], job, 1.6)], T0, T0 + 3 * 10**9, 0, 100_000_000)
    hw = pl.read_parquet(next((tmp_path / "slow" / "hw").glob("*.parquet")))
    bad = hw.filter(pl.col("gpu") == job.gpus[5])
    assert (bad["throttle_reasons"] & 0x40 > 0).all() and bad["sm_clock_mhz"].max() < 1400
    assert (hw.filter(pl.col("gpu") != job.gpus[5])["throttle_reasons"] == 0).all()


def test_nvlink_down_moves_collectives_to_pcie(tmp_path, healthy):
    land, truth, t, job = render(tmp_path, "nvl", [fault("nvlink_down", small_job().ips[1], small_job(), None)])
    assert_truth_visible(land, truth, t)
    _, _, th, _ = healthy
    assert [r["rank"] for r in truth] == [1]
    # rank 1's TP group (0,1) and DP group (1,3,5,7) all-reduces are slower; an unrelated group is not
    assert med(t, "nccl:AllReduce", [0]) > 3 * med(th, "nccl:AllReduce", [0])
    assert med(t, "gemm") == pytest.approx(med(th, "gemm"), rel=0.02)
    tp_other = t.filter((pl.col("name") == "nccl:AllReduce") & (pl.col("group") == "tp:1.2"))
    tp_other_h = th.filter((pl.col("name") == "nccl:AllReduce") & (pl.col("group") == "tp:1.2"))
    assert tp_other["d"].min() <= 1.05 * tp_other_h["d"].min()
    gpus = pl.DataFrame({"host": job.hosts, "gpu": job.gpus, "ip": job.ips})
    render_hw(land, gpus, [fault("nvlink_down", job.ips[1], job)], T0, T0 + 2 * 10**9, 0, 100_000_000)
    hw = pl.read_parquet(next((land / "hw").glob("*.parquet")))
    per = hw.group_by("gpu").agg(pl.col("nvlink_tx_bps").max(), pl.col("pcie_tx_bps").mean())
    assert per.filter(pl.col("nvlink_tx_bps") == 0)["gpu"].to_list() == [job.gpus[1]]
    assert per.filter(pl.col("gpu") == job.gpus[1])["pcie_tx_bps"][0] > 5 * per["pcie_tx_bps"].median()


def test_slow_dataloader_on_every_worker(tmp_path, healthy):
    _, _, th, job = healthy
    land, truth, t, _ = render(tmp_path, "dl", [fault("slow_dataloader", job.job_id, job, 0.04, scope="job")])
    assert_truth_visible(land, truth, t)
    assert {r["rank"] for r in truth} == set(range(16)) and {r["team"] for r in truth} == {"algorithm"}
    dl = t.filter(pl.col("name") == "dataloader.next").group_by("rank").agg(pl.col("d").median())
    assert dl["d"].min() > 35e6 and med(th, "dataloader.next") < 1e6
    assert med(t, "gemm") == pytest.approx(med(th, "gemm"), rel=0.02)
    # the recv_into leaf holds the time in the trace
    ev = load_trace(land, 0)["traceEvents"]
    recv = [e["dur"] for e in ev if e.get("name", "").startswith("<built-in method recv_into")]
    assert len(recv) == 2 * 4 and min(recv) > 35_000


def test_cpu_bound_forward_leaves_gpu_idle(tmp_path, healthy):
    _, _, th, job = healthy
    land, truth, t, _ = render(tmp_path, "cpu", [fault("cpu_bound_forward", job.job_id, job, 0.02, scope="job")])
    assert_truth_visible(land, truth, t)
    assert {r["function"] for r in truth} == {"megatron/core/models/gpt/gpt_model.py(245): forward"}
    for rank, least in ((9, 0.9), (0, 0.2)):
        ev = load_trace(land, rank)["traceEvents"]
        fwd = [e for e in ev if e.get("name") == "megatron/core/models/gpt/gpt_model.py(245): forward"]
        ker = np.array(sorted((e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("cat") == "kernel" and e["tid"] == 7))
        assert len(fwd) == 8
        idle = []
        for f in fwd:  # the first 20 ms of each forward call is Python only: once the GPU queue drains it idles
            lo, hi = f["ts"], f["ts"] + 20_000
            busy = np.clip(np.minimum(ker[:, 1], hi) - np.maximum(ker[:, 0], lo), 0, None).sum()
            idle.append(1 - busy / (hi - lo))
        # stage 1 synchronizes at every recv, so its GPU always idles; stage 0 sometimes still runs queued backward work
        assert min(idle) > least if rank == 9 else np.mean(idle) > least
    assert med(t, "forward-compute", kind="op") > med(th, "forward-compute", kind="op") + 15e6


def test_gc_stall_on_random_workers_only(tmp_path, healthy):
    _, _, th, job = healthy
    land, truth, t, _ = render(tmp_path, "gc", [fault("gc_stall", job.job_id, job, 0.25, scope="job")], trace_ranks=range(16))
    assert_truth_visible(land, truth, t)
    ranks = {r["rank"] for r in truth}
    assert 1 <= len(ranks) < 16
    gc = t.filter(pl.col("name") == "gc")
    assert set(gc["rank"].unique()) == ranks and (gc["d"] == 250_000_000).all()
    assert th.filter(pl.col("name") == "gc").height == 0
    r = min(ranks)
    ev = load_trace(land, r)["traceEvents"]
    gm = [e["dur"] for e in ev if e.get("name") == "torch/autograd/grad_mode.py(84): __init__"]
    assert max(gm) > 240_000 and sorted(gm)[len(gm) // 2] < 100
    other = min(set(range(16)) - ranks)
    gm = [e["dur"] for e in load_trace(land, other)["traceEvents"] if e.get("name") == "torch/autograd/grad_mode.py(84): __init__"]
    assert max(gm) < 100


def test_sync_in_forward_collapses_issue_latency(tmp_path, healthy):
    _, _, th, job = healthy
    land, truth, t, _ = render(tmp_path, "sync", [fault("sync_in_forward", job.job_id, job, scope="job")])
    assert_truth_visible(land, truth, t)
    fwd_ops = t.filter(pl.col("name") == "forward-compute").select("rank", "step", "microbatch", s="start_ns", e="end_ns")

    def syncs_in_forward(tt):
        sy = tt.filter(pl.col("name") == "cuda.synchronize").join(fwd_ops, on=["rank", "step", "microbatch"])
        # the op window is GPU-side (it starts when the GPU drained earlier work): the synchronize ends inside it
        return sy.filter((pl.col("end_ns") > pl.col("s")) & (pl.col("end_ns") <= pl.col("e"))).height

    layers_per_stage = job.n_layers // job.pp
    assert syncs_in_forward(t) == 16 * job.n_steps * job.n_microbatches * layers_per_stage and syncs_in_forward(th) == 0
    lat = lambda tt: float(tt.filter(pl.col("name") == "gemm").select((pl.col("start_ns") - pl.col("issue_ns")).median()).item())
    assert lat(t) < 0.5 * lat(th)
    step = lambda tt: float(tt.filter(pl.col("name") == "optimizer")["end_ns"].max() - tt["start_ns"].min())
    assert 1.0 < step(t) / step(th) < 1.15  # a few percent: throughput barely moves


def test_misaligned_gemm_lower_flops(tmp_path, healthy):
    _, _, th, job = healthy
    land, truth, t, _ = render(tmp_path, "mis", [fault("misaligned_gemm", job.job_id, job, scope="job")])
    assert_truth_visible(land, truth, t)
    assert {r["team"] for r in truth} == {"algorithm"} and "n=8484" in truth[0]["function"]
    g = t.filter(pl.col("name") == "gemm").with_columns(tf=pl.col("flops") / pl.col("d") * 1e-3)
    bad = g.filter(pl.col("shape").str.contains("n=8484"))
    good = g.filter(~pl.col("shape").str.contains("8484"))
    assert bad.height > 0 and th.filter(pl.col("shape").str.contains("8484", literal=True).fill_null(False)).height == 0
    assert bad["tf"].median() < 0.7 * good["tf"].median()
    ev = load_trace(land, 0)["traceEvents"]
    assert any("align1" in e["name"] for e in ev if e.get("cat") == "kernel")


def test_slow_stage_worker_no_hw_signal(tmp_path):
    from fleetscope.sim.capture.scenarios import scenario_job_and_faults

    job, faults = scenario_job_and_faults("slow_stage_worker", 0)
    truth = render_capture(tmp_path, "cap", job, faults, 0, trace_ranks=[])
    slow = job.ips.index(faults[0]["subject"])  # the place is drawn from the seed
    assert [(r["rank"], r["stage"]) for r in truth] == [(slow, slow // 8)] and job.pp == 4 and job.tp * job.dp == 8
    t = pl.read_parquet(sorted((tmp_path / "timings" / "cap").glob("rank*.parquet"))).with_columns(d=pl.col("end_ns") - pl.col("start_ns"))
    g = t.filter(pl.col("name") == "gemm").group_by("rank").agg(pl.col("d").median()).sort("rank")["d"].to_numpy()
    assert g[slow] > 1.4 * np.median(g) and (np.delete(g, slow) < 1.05 * np.median(g)).all()
    gpus = pl.DataFrame({"host": job.hosts, "gpu": job.gpus, "ip": job.ips})
    render_hw(tmp_path, gpus, faults, job.start_ns, job.start_ns + 10**9, 0, 100_000_000)
    hw = pl.read_parquet(next((tmp_path / "hw").glob("*.parquet")))
    assert (hw["throttle_reasons"] == 0).all() and hw["sm_clock_mhz"].min() > 1800


def test_throttled_rack_host_scope(tmp_path, healthy):
    _, _, th, job = healthy
    land, truth, t, _ = render(tmp_path, "rack", [fault("throttled_racks", "h001", job, 1.5, scope="host")])
    assert_truth_visible(land, truth, t)
    assert sorted(r["rank"] for r in truth) == list(range(8, 16))
    assert med(t, "gemm", range(8, 16)) / med(th, "gemm", range(8, 16)) == pytest.approx(1.5, rel=0.05)
    assert med(t, "gemm", range(8)) == pytest.approx(med(th, "gemm", range(8)), rel=0.02)


def test_hang_rank_and_link(tmp_path):
    job = small_job()
    rows = render_hang(tmp_path, "inc1", job, fault("hang", job.ips[6], job), 0)
    assert [(r["rank"], r["team"]) for r in rows] == [(6, "operations")]
    d = tmp_path / "stacks" / "inc1"
    stacks = {r: (d / f"rank{r}.txt").read_text() for r in range(16)}
    assert all(("all_reduce (" in s) == (r != 6) for r, s in stacks.items())
    assert "recv_into" in stacks[6] and stacks[0].startswith("Process ")
    inc = json.loads((tmp_path / "incidents" / "inc1.json").read_text())
    assert inc["kind"] == "hang" and inc["job_id"] == job.job_id
    rows = render_hang(tmp_path, "inc2", job, fault("hang", f"{job.ips[3]}-{job.ips[9]}", job, scope="link"), 0)
    assert sorted(r["rank"] for r in rows) == [3, 9] and rows[0]["scope"] == "link"
    ring = json.loads((tmp_path / "stacks" / "inc2" / "ring.json").read_text())
    low = min(ring, key=lambda x: x["step"])
    assert (low["rank"], low["peer"]) == (3, 9)
    assert all(x["step"] > low["step"] for x in ring if (x["rank"], x["peer"]) != (3, 9))
    assert all("all_reduce (" in (tmp_path / "stacks" / "inc2" / f"rank{r}.txt").read_text() for r in range(16))


def test_scenario_fault_places_change_with_the_seed():
    from fleetscope.sim.capture.scenarios import scenario_job_and_faults

    for scenario in ("slow_gpu", "throttled_racks", "nvlink_down", "slow_stage_worker"):
        places = {tuple(sorted(f["subject"] for f in scenario_job_and_faults(scenario, s)[1])) for s in range(6)}
        assert len(places) >= 3, (scenario, places)
        assert places == {tuple(sorted(f["subject"] for f in scenario_job_and_faults(scenario, s)[1])) for s in range(6)}  # reproducible


def test_bad_input_is_refused(tmp_path):
    job = small_job()
    with pytest.raises(ValueError, match="unknown fault kind"):
        render_capture(tmp_path, "c", job, [fault("melted", job.ips[0], job)], 0, trace_ranks=[])
    bad = CaptureJob("x", 2, 2, 2, 4, job.hosts[:8], job.gpus[:8], job.ips[:7], T0, 2, 10**9)
    with pytest.raises(ValueError, match="ips has 7"):
        render_capture(tmp_path, "c", bad, [], 0)
    with pytest.raises(ValueError, match="unknown scenario"):
        scenario_capture(tmp_path, "nope")
    with pytest.raises(ValueError, match="outside job"):
        render_capture(tmp_path, "c", job, [], 0, timings=False, trace_ranks=[99])
    with pytest.raises(ValueError, match="needs columns"):
        render_hw(tmp_path, pl.DataFrame({"ip": ["a"]}), [], T0, T0 + 10**9, 0)


def test_fleet_style_fault_rows(tmp_path, healthy):
    """Rows as the fleet simulator writes faults.csv: '|'-joined ips/hosts/ranks, extra columns, network kinds."""
    _, _, th, job = healthy
    rows = [
        {"fault_id": "F1", "kind": "gc_stall", "scope": "gpu", "subject": job.ips[3], "start_ns": job.start_ns,
         "end_ns": job.start_ns + 10**12, "magnitude": 0.1, "job_id": job.job_id, "unit": "seconds", "team": "algorithm",
         "ips": f"{job.ips[3]}|{job.ips[12]}", "hosts": None, "ranks": "3|12"},
        {"fault_id": "F2", "kind": "congested_switch", "scope": "switch", "subject": "leaf01", "start_ns": job.start_ns,
         "end_ns": job.start_ns + 10**12, "magnitude": 0.5, "job_id": None},
        {"fault_id": "F3", "kind": "slow_gpu", "scope": "gpu", "subject": job.ips[7], "start_ns": job.start_ns - 10**12,
         "end_ns": job.start_ns - 10**11, "magnitude": 2.0, "job_id": job.job_id},  # over before the capture
        {"fault_id": "F4", "kind": "slow_gpu", "scope": "gpu", "subject": "10.9.9.9", "start_ns": job.start_ns,
         "end_ns": job.start_ns + 10**12, "magnitude": 2.0, "job_id": "another-job"},  # another job's GPU
    ]
    land, truth, t, _ = render(tmp_path, "fleet", rows, trace_ranks=[3])
    assert sorted((r["fault_id"], r["rank"]) for r in truth) == [("F1", 3), ("F1", 12)]
    assert set(t.filter(pl.col("name") == "gc")["rank"].unique()) == {3, 12}
    assert med(t, "gemm") == pytest.approx(med(th, "gemm"), rel=0.02)


def test_zero_mode_reduce_scatter_all_gather(tmp_path, healthy):
    _, _, th, _ = healthy
    job = small_job()
    job.dp_mode = "zero"
    render_capture(tmp_path, "cap", job, [], 0, trace_ranks=[2])
    t = pl.read_parquet(sorted((tmp_path / "timings" / "cap").glob("rank*.parquet")))
    names = set(t["name"].unique())
    assert {"nccl:ReduceScatter", "nccl:AllGather", "grads-reduce-scatter", "params-all-gather"} <= names
    dp = t.filter(pl.col("group_size") == 4)
    assert set(dp["name"].unique()) == {"nccl:ReduceScatter", "nccl:AllGather"}
    assert "nccl:AllReduce" in set(th.filter(pl.col("group_size") == 4)["name"].unique())
    ev = load_trace(tmp_path, 2)["traceEvents"]
    colls = {e["args"]["Collective name"] for e in ev if e.get("cat") == "kernel" and "Collective name" in e.get("args", {})}
    assert {"_reduce_scatter_base", "_allgather_base"} <= colls
    # backward kernels are launched from the autograd thread, forward ones from the main thread
    pid = next(e["pid"] for e in ev if e.get("cat") == "python_function")
    tids = {e["tid"] for e in ev if e.get("cat") == "cuda_runtime"}
    assert tids == {pid, pid + 1}
    mem = {e["cat"] for e in ev if e.get("cat", "").startswith("gpu_mem")}
    assert mem == {"gpu_memcpy", "gpu_memset"}


def test_hw_follows_capture_activity():
    """With a capture's activity, SM utilization is the busy share of each sample and link throughput the
    bytes moved; a throttled GPU keeps its lower clock and throttle bits."""
    from fleetscope.sim.capture.hw import hw_frame

    gpus = pl.DataFrame({"host": ["h0", "h0"], "gpu": ["h0/gpu0", "h0/gpu1"], "ip": ["10.0.0.1", "10.0.0.2"]})
    ms = 1_000_000
    act = pl.DataFrame({"gpu": ["h0/gpu0", "h0/gpu0", "h0/gpu1"], "start_ns": [T0, T0 + 15 * ms, T0],
                        "end_ns": [T0 + 5 * ms, T0 + 20 * ms, T0 + 10 * ms], "resource": ["compute", "nvlink", "compute"],
                        "bytes": [0.0, 1e9, 0.0]})
    f = [{"fault_id": "x", "kind": "slow_gpu", "scope": "gpu", "subject": "10.0.0.2", "start_ns": T0, "end_ns": T0 + 10**9,
          "magnitude": 2.0}]
    hw = hw_frame(gpus, f, T0, T0 + 20 * ms, 0, 10 * ms, activity=act).sort("gpu", "ts_ns")
    g0, g1 = hw.filter(pl.col("gpu") == "h0/gpu0"), hw.filter(pl.col("gpu") == "h0/gpu1")
    assert g0["util_gpu_pct"][0] == pytest.approx(50, abs=5) and g0["util_gpu_pct"][1] < 5
    assert g0["nvlink_tx_bps"][1] == pytest.approx(1e9 / 0.01, rel=0.15) and g0["nvlink_tx_bps"][0] < 1e9
    assert (g1["sm_clock_mhz"] < 1000).all() and (g1["throttle_reasons"] & 0x40 > 0).all()
    assert g1["util_gpu_pct"][0] == pytest.approx(78, abs=5)  # busy all sample, but throttled
    assert (g0["throttle_reasons"] == 0).all() and (g0["sm_clock_mhz"] > 1900).all()
