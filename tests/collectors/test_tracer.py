"""The collectors in real PyTorch runs (CPU, gloo, 4 processes): tracer output, profiler capture on
request, stack dumps during a hang, the NVML sampler without a GPU."""
from __future__ import annotations

import json
from pathlib import Path
import subprocess
import sys

import polars as pl
import pytest

from fleetscope.ingest.timings import read_timings, read_timings_file, timing_files
from tests.collectors.conftest import HANG_STEPS

REPO = Path(__file__).resolve().parents[2]
WORLD = 4

HIDDEN, BATCH, LAYERS, STEPS = 256, 32, 6, 30


def test_timings_follow_the_contract(real_runs):
    landing, res = real_runs
    folder = landing / "timings" / "healthy_a"
    files = timing_files(folder)
    assert sorted(f.name.split("-")[0] for f in files) == [f"rank{r}" for r in range(WORLD)]
    for f in files:  # nothing the platform's ingestion would quarantine
        assert read_timings_file(f, "healthy_a").rejected.height == 0
    t = read_timings(folder)
    assert t["rank"].unique().sort().to_list() == list(range(WORLD))
    assert (t["start_ns"] >= t["issue_ns"]).all() and (t["end_ns"] >= t["start_ns"]).all()
    per_rank = t.group_by("rank", "name").len()
    for name in ("dataloader.next", "optimizer.step"):
        assert per_rank.filter(pl.col("name") == name)["len"].to_list() == [STEPS] * WORLD
    # every step present on every rank
    assert t.group_by("rank").agg(pl.col("step").drop_nulls().n_unique()).sort("rank")["step"].to_list() == [STEPS] * WORLD
    # GEMM FLOPs from shapes: the model's forward linears, x[32,256] @ W[256,256]^T and the head W[1,256]
    g = t.filter(pl.col("name") == "gemm")
    assert set(g["flops"].unique().to_list()) == {2.0 * BATCH * HIDDEN * HIDDEN, 2.0 * BATCH * 1 * HIDDEN}
    assert f"m={BATCH},n={HIDDEN},k={HIDDEN},dtype=fp32" in g["shape"].unique().to_list()
    assert g.height == WORLD * STEPS * (LAYERS + 1)
    # backward GEMMs through autograd's node hooks: one per Linear per step; the first layer's input
    # needs no gradient (one GEMM: the weight's), the others two (input and weight)
    b = t.filter(pl.col("name") == "gemm_bwd")
    assert b.height == WORLD * STEPS * (LAYERS + 1)
    assert set(b["flops"].unique().to_list()) == {2.0 * BATCH * HIDDEN * HIDDEN, 4.0 * BATCH * HIDDEN * HIDDEN, 4.0 * BATCH * HIDDEN}
    # the ops the demo marks with ft.op: one of each per step and rank, inside the step
    ops = t.filter(pl.col("kind") == "op").group_by("rank", "name").agg(pl.len(), pl.col("microbatch").unique())
    assert sorted(ops["name"].unique().to_list()) == ["backward-compute", "forward-compute", "grads-all-reduce", "optimizer"]
    assert (ops["len"] == STEPS).all()
    fb = t.filter(pl.col("kind") == "op").pivot("name", index=["rank", "step"], values="start_ns")
    assert (fb["forward-compute"] < fb["backward-compute"]).all() and (fb["backward-compute"] < fb["optimizer"]).all()
    # a forward GEMM lies inside its step's forward-compute op
    fwd = t.filter(pl.col("name") == "forward-compute").select("rank", "step", pl.col("start_ns").alias("fs"), pl.col("end_ns").alias("fe"))
    g_in = g.join(fwd, on=["rank", "step"]).select(((pl.col("start_ns") >= pl.col("fs")) & (pl.col("end_ns") <= pl.col("fe"))).all()).item()
    assert g_in
    # the job ended: every rank's last row says so (the platform's blocked check tells a finished job from a hung one)
    last = t.sort("end_ns").group_by("rank").agg(pl.col("name").last())
    assert set(last["name"].to_list()) == {"tracer.stop"}
    # gradient all-reduces: one per Linear weight per step, bytes = the weight's size
    c = t.filter(pl.col("name") == "gloo:AllReduce")
    assert set(c["bytes"].unique().to_list()) == {HIDDEN * HIDDEN * 4, HIDDEN * 4}
    assert c["group"].unique().to_list() == ["world"] and c["group_size"].unique().to_list() == [WORLD]
    assert c.height == WORLD * STEPS * (LAYERS + 1)
    # the tracer's own summary matches what landed
    for r in res["healthy_a"]:
        assert r["tracer"]["rows"] == t.filter(pl.col("rank") == r["rank"]).height
        assert r["tracer"]["dropped"] == 0


def test_gc_stall_is_timed_on_the_stalled_rank(real_runs):
    landing, _ = real_runs
    t = read_timings(landing / "timings" / "gc")
    gc = t.filter(pl.col("name") == "gc").group_by("rank").agg(pl.col("duration_ns").max().alias("mx"), pl.len())
    stalled = gc.filter(pl.col("rank") == 1)
    assert stalled.height == 1 and stalled["len"][0] >= STEPS // 4
    others = gc.filter(pl.col("rank") != 1)["mx"].max() or 0
    assert stalled["mx"][0] > 10 * max(others, 1)


def test_buffer_is_bounded(tmp_path):
    from fleetscope.collectors.tracer_rows import _Tracer

    tr = _Tracer(tmp_path, "cap", 0, "h", max_rows=100, flush_interval_s=1e9, poll_interval_s=1e9, use_cuda=False)
    for i in range(5000):  # the writer thread is not running: the buffer must not grow without bound
        tr.add("api", "x", i, i, i + 1)
    assert len(tr.rows) <= 4 * 100 + 1 and tr.dropped >= 5000 - 401
    p = tr.flush()
    assert pl.read_parquet(p).height == len(pl.read_parquet(p)) > 0


def test_unknown_traced_api_is_a_clear_error():
    from fleetscope.collectors.tracer_hooks import _resolve

    with pytest.raises(ValueError, match="FLEETSCOPE_TRACED_PYTHON_API: cannot resolve 'nosuchmodule.f'"):
        _resolve("nosuchmodule.f")
    owner, attr = _resolve("torch.nn.functional@mse_loss")
    assert attr == "mse_loss" and owner.__name__ == "torch.nn.functional"


def test_env_traced_python_api(hang_run):
    landing, _ = hang_run
    # the steps of the profile window went to the profile's capture id (test_profiler_capture_on_request)
    t = pl.concat([read_timings(landing / "timings" / "hang"), read_timings(landing / "timings" / "hang-prof")], how="diagonal_relaxed")
    n = t.filter(pl.col("name") == "torch.nn.functional.mse_loss").group_by("rank").len()
    assert n.sort("rank")["len"].to_list() == [HANG_STEPS] * WORLD
    assert t.filter(pl.col("name") == "torch.nn.functional.mse_loss")["kind"].unique().to_list() == ["api"]


def test_profiler_capture_on_request(hang_run):
    """A profiling request served on the same training steps on every rank (agreed through the
    job's store), with prof.step() per step (ProfilerStep#<training step>) and Python stacks, and
    the tracer's timings of those steps under the profile's capture id (traces, timings and the
    host's hw samples of one window share one id and one time span)."""
    from fleetscope.ingest.traces import read_capture

    landing, req = hang_run
    folder = landing / "traces" / "hang-prof"
    assert sorted(p.name for p in folder.glob("rank*.json.gz")) == [f"rank{r}.json.gz" for r in range(WORLD)]
    meta = json.loads((folder / "capture.json").read_text())
    assert meta["job_id"] == "hang" and meta["request_id"] == json.loads(req.read_text())["id"] and meta["steps"] == 2
    ev = read_capture(folder)
    steps = ev.filter(pl.col("name").str.starts_with("ProfilerStep#")).group_by("rank").agg(
        pl.col("name").str.extract(r"#(\d+)").cast(pl.Int64).sort())
    first = meta["first_step"]
    assert steps["name"].to_list() == [[first, first + 1]] * WORLD
    assert ev.filter(pl.col("cat") == "python_function").height > 0  # Python stacks on
    assert ev.filter(pl.col("name").str.contains("aten::(linear|addmm|mm)")).height > 0
    assert ev.filter(pl.col("is_comm")).height > 0  # the gloo all-reduces inside the window
    # the tracer wrote those same steps under the profile's capture id, on every rank
    t = read_timings(landing / "timings" / "hang-prof")
    per = t.filter(pl.col("name") == "optimizer.step").group_by("rank").agg(pl.col("step").sort())
    assert per.sort("rank")["step"].to_list() == [[first, first + 1]] * WORLD
    span = ev.filter(pl.col("name").str.starts_with("ProfilerStep#")).select(pl.col("ts_ns").min(), pl.col("end_ns").max()).row(0)
    tol = 200_000_000  # the ranks' steps are within one 0.1 s step of each other
    assert t["start_ns"].min() >= span[0] - tol and t["start_ns"].max() <= span[1] + tol
    # the profiler's own start, stop and export are timed and kept out of the profile's capture
    # (starting it with stacks on can take a second on a busy host: that stall lies in the step
    # before the profile); a row of the profile ending well after it encloses that rank's
    # profiler.stop (the user's op around optimizer.step, in which the tracer's hook stops it)
    own = read_timings(landing / "timings" / "hang").filter(pl.col("name").str.starts_with("profiler."))
    assert own.group_by("name").len().sort("name").rows() == [(n, WORLD) for n in ("profiler.export", "profiler.start", "profiler.stop")]
    assert t.filter(pl.col("name").str.starts_with("profiler.")).height == 0
    late = t.filter(pl.col("end_ns") > span[1] + tol).join(own.filter(pl.col("name") == "profiler.stop").select(
        "rank", pl.col("start_ns").alias("s0"), pl.col("end_ns").alias("s1")), on="rank", how="left")
    assert ((late["start_ns"] <= late["s0"]) & (late["end_ns"] >= late["s1"])).all()


def test_stack_dumps_name_the_hung_rank(hang_run):
    from fleetscope.xputimer.hang import diagnose_hang

    landing, _ = hang_run
    inc = landing / "stacks" / "inc-test"
    assert sorted(p.name for p in inc.glob("rank*.txt")) == [f"rank{r}.txt" for r in range(WORLD)]
    h = diagnose_hang(inc, job_id="hang")
    assert h.ranks.filter(pl.col("culprit"))["rank"].to_list() == [2]
    assert h.ranks.filter(pl.col("rank") != 2)["in_collective"].all()
    assert h.verdicts.select("scope", "subject", "team", "severity").rows() == [("rank", "2", "operations", "critical")]


def test_watchdog_files_the_hang_without_a_human(hang_run):
    """Rank 2 stops for 8 s outside any collective; the other ranks' tracers see their gradient
    all-reduce outstanding past the bound learned from the job (here at least 1.5 s) and file one
    incident with every rank's stacks and collective progress; the progress alone names the
    first collective rank 2 never issued."""
    from fleetscope.xputimer.hang import diagnose_hang

    landing, _ = hang_run
    incs = list((landing / "incidents").glob("hang-hang-*.json"))
    assert len(incs) == 1, incs  # one incident per hang, whichever rank saw it first
    body = json.loads(incs[0].read_text())
    # the capture the tracer was writing when the job hung: the run's, or the profile's if the
    # requested profile (test_profiler_capture_on_request) was running then
    assert body["kind"] == "hang" and body["job_id"] == "hang" and body["capture"] in ("hang", "hang-prof")
    folder = landing / "stacks" / incs[0].stem
    assert sorted(p.name for p in folder.glob("*")) == sorted([f"rank{r}.txt" for r in range(WORLD)]
                                                             + [f"fr_rank{r}.json" for r in range(WORLD)])
    h = diagnose_hang(folder, job_id="hang")
    first = h.collectives.filter(pl.col("problem") != "none").row(0, named=True)
    assert first["problem"] == "missing_ranks" and json.loads(first["ranks"]) == [2] and first["collective"] == "all_reduce"
    assert json.loads(first["ranks_present"]) == [0, 1, 3]
    assert h.verdicts.select("scope", "subject", "team").rows() == [("rank", "2", "operations")]
    # without the stack dumps, the progress dumps alone name rank 2
    for p in folder.glob("rank*.txt"):
        p.rename(p.with_suffix(".bak"))
    try:
        assert diagnose_hang(folder, job_id="hang").verdicts["subject"].to_list() == ["2"]
    finally:
        for p in folder.glob("rank*.bak"):
            p.rename(p.with_suffix(".txt"))
    # the collective rank 2 never joined was issued when the stall began (by a rank that went on to it),
    # and the incident came within seconds: the learned bound (at least 1.5 s) plus the watchdog's tick
    stall = int((landing.parent / "hang.marker.ns").read_text())
    assert abs(body["from_ns"] - stall) < 2e9
    assert 1.4e9 < incs[0].stat().st_mtime_ns - stall < 6e9


def test_blocked_training_is_detected(hang_run):
    """After the fact, from the landed timings (the degradation detector's 'blocked')."""
    from fleetscope.xputimer.degradation import degradation_verdicts, detect_degradation

    landing, _ = hang_run
    t = read_timings(landing / "timings" / "hang")
    its, deg = detect_degradation(t, threshold=10.0)  # only 'blocked' matters here
    assert its.height > 0
    blocked = deg.filter(pl.col("kind") == "blocked").group_by("rank").agg(pl.col("idle_ns").max())
    assert set(blocked["rank"].to_list()) == set(range(WORLD))
    assert blocked["idle_ns"].min() > 5e9  # the 8 s stall, seen by every rank
    v = degradation_verdicts(deg, "hang")
    assert v.filter(pl.col("severity") == "warning")["team"].to_list() == ["operations"]


def test_nvml_sampler_without_gpu_exits_cleanly(tmp_path):
    p = subprocess.run([sys.executable, "-m", "fleetscope.collectors.nvml_sampler", "--landing", str(tmp_path), "--duration-s", "1"],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0
    try:
        import pynvml
        pynvml.nvmlInit()
        has_gpu = pynvml.nvmlDeviceGetCount() > 0
    except Exception:
        has_gpu = False
    if has_gpu:
        files = list((tmp_path / "hw").glob("*.parquet"))
        assert files and {"ts_ns", "host", "gpu"} <= set(pl.read_parquet(files[0]).columns)
    else:
        assert "no NVIDIA GPU" in p.stdout or "found no GPU" in p.stdout


def _ddp_worker(rank, port, landing, q):
    import os

    import torch
    import torch.distributed as dist

    import fleetscope.collectors.tracer as ft

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    ft.start(landing_dir=landing, capture="ddp", rank=rank, job_id="ddp", profiler=False, stacks=False)
    m = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 1)))
    ft.trace_ddp(m)
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    for _ in range(5):
        opt.zero_grad()
        m(torch.randn(8, 64)).sum().backward()
        opt.step()
    q.put(ft.stop()["rows"])
    dist.destroy_process_group()


def test_ddp_buckets_traced_through_comm_hook(tmp_path):
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    ps = [ctx.Process(target=_ddp_worker, args=(r, port, str(tmp_path), q)) for r in range(2)]
    for p in ps:
        p.start()
    rows = [q.get(timeout=300) for _ in ps]
    for p in ps:
        p.join(timeout=60)
    assert all(r > 0 for r in rows)
    t = read_timings(tmp_path / "timings" / "ddp")
    ar = t.filter(pl.col("name") == "gloo:AllReduce")
    # one DDP bucket per step holding every parameter: (64*64 + 64) + (64 + 1) floats
    assert ar.height == 2 * 5 and ar["bytes"].unique().to_list() == [(64 * 64 + 64 + 64 + 1) * 4]
