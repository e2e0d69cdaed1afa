"""The tracer's GPU timing logic, on a model of CUDA streams (tests/collectors/fake_cuda.py): no GPU
is lent to this project's test machine, so what can be checked here is that the events are recorded
on the streams where they measure the work, and that the times the tracer derives from them equal
the times the stream model gives the kernels (the model's truth, which the tracer never reads)."""
from __future__ import annotations

import polars as pl
import pytest
import torch

from tests.collectors.fake_cuda import FakeCuda, FakeGroup, collective

MS = 1_000_000


@pytest.fixture()
def gpu_tracer(tmp_path):
    from fleetscope.collectors.tracer_rows import _Tracer

    gpu = FakeCuda()
    tr = _Tracer(tmp_path, "cap", 0, "h", max_rows=1000, flush_interval_s=1e9, poll_interval_s=1e9, use_cuda=True, cuda=gpu)
    tr.on_device = lambda t: isinstance(t, torch.Tensor)
    return gpu, tr


def _rows(tr) -> pl.DataFrame:
    tr._poll_gpu()
    cols = ["rank", "host", "kind", "name", "issue_ns", "start_ns", "end_ns", "stream", "flops", "bytes", "group",
            "group_size", "shape", "step", "microbatch", "model_chunk"]
    df = pl.DataFrame(tr.rows, schema=cols, orient="row")
    return df.with_columns(((pl.col("start_ns") - tr._anchor_ns) / MS).alias("s_ms"),
                           ((pl.col("end_ns") - tr._anchor_ns) / MS).alias("e_ms"))


def _truth(gpu, stream_name):
    s = next(s for s in gpu.comm.values() if s.name == stream_name)
    s.times()
    return [(a, b) for _, a, b in s.kernels]


def test_async_collective_timed_on_its_communication_stream(gpu_tracer):
    """An async all-reduce overlapping compute (DDP's bucket reduction during backward): the
    collective runs 30-40 ms on the communication stream while the current stream computes until
    60 ms. Events around the enqueue on the current stream measure nothing (both at 30 ms)."""
    from fleetscope.collectors.tracer_hooks import _timed_collective

    gpu, tr = gpu_tracer
    all_reduce = _timed_collective(tr, "all_reduce", backend="nccl")(collective(gpu, 10.0))
    g = FakeGroup("dp0", 4)
    gpu.kernel(30.0)
    naive = (gpu.Event(), gpu.Event())  # what the old tracer did: both events on the current stream
    naive[0].record()
    w = all_reduce(torch.ones(256), group=g, async_op=True)
    naive[1].record()
    gpu.kernel(30.0)  # overlapping compute
    w.wait()
    gpu.kernel(5.0)
    gpu.finish()
    row = _rows(tr).row(0, named=True)
    (truth,) = _truth(gpu, "comm-dp0")
    assert truth == (30.0, 40.0)
    assert (row["s_ms"], row["e_ms"]) == pytest.approx(truth)
    assert row["name"] == "nccl:AllReduce" and row["bytes"] == 1024 and row["group"] == "dp0" and row["group_size"] == 4
    assert naive[0].elapsed_time(naive[1]) == 0.0  # the measurement the old tracer made
    assert not tr.inflight  # completed: the watchdog has nothing outstanding


def test_back_to_back_collectives_start_after_the_previous_one(gpu_tracer):
    """Two async all-reduces issued together in one group run one after the other on the group's
    stream: the second starts when the first ends, not when it was enqueued."""
    from fleetscope.collectors.tracer_hooks import _timed_collective

    gpu, tr = gpu_tracer
    all_reduce = _timed_collective(tr, "all_reduce", backend="nccl")(collective(gpu, 10.0))
    g = FakeGroup("dp0", 4)
    gpu.kernel(30.0)
    w1 = all_reduce(torch.ones(8), group=g, async_op=True)
    w2 = all_reduce(torch.ones(8), group=g, async_op=True)
    gpu.kernel(50.0)
    w1.wait(), w2.wait()
    gpu.finish()
    rows = _rows(tr).sort("issue_ns")
    truth = _truth(gpu, "comm-dp0")
    assert truth == [(30.0, 40.0), (40.0, 50.0)]
    assert list(zip(rows["s_ms"], rows["e_ms"])) == [pytest.approx(t) for t in truth]


def test_sync_collectives_and_nccl_timing(gpu_tracer):
    """A synchronous call is issued async and waited (what torch.distributed does), so the current
    stream continues after the collective. With NCCL's own timing (Work._get_duration) the start is
    the end minus that duration: here the group's stream first waits for another stream's work the
    tracer cannot see, which only that duration reveals."""
    from fleetscope.collectors.tracer_hooks import _timed_collective

    gpu, tr = gpu_tracer
    all_reduce = _timed_collective(tr, "all_reduce", backend="nccl")(collective(gpu, 7.0, timing=True))
    gpu.kernel(12.0)
    assert all_reduce(torch.ones(8), group=FakeGroup("tp", 2)) is None
    gpu.kernel(3.0, "after")
    # a collective whose communication stream is held back by work on a stream outside the tracer's sight
    other = gpu.default.__class__(gpu, "other")
    other.ops.append(("kernel", 40.0, "hidden"))
    blocker = gpu.Event()
    blocker.record(other)
    gpu.comm["tp"].ops.append(("wait", blocker))
    all_reduce(torch.ones(8), group=FakeGroup("tp", 2), async_op=True)
    gpu.finish()
    rows = _rows(tr).sort("issue_ns")
    assert list(zip(rows["s_ms"], rows["e_ms"])) == [pytest.approx((12.0, 19.0)), pytest.approx((40.0, 47.0))]
    gpu.default.times()
    after = [k for k in gpu.default.kernels if k[0] == "after"][0]
    assert after[1] == pytest.approx(19.0)  # the current stream was made to wait for the collective


def test_in_flight_collective_is_what_the_watchdog_sees(gpu_tracer):
    from fleetscope.collectors.tracer_hooks import _timed_collective

    gpu, tr = gpu_tracer
    all_reduce = _timed_collective(tr, "all_reduce", backend="nccl")(collective(gpu, 10.0))
    all_reduce(torch.ones(8), group=FakeGroup("dp0", 2), async_op=True)
    gpu.now = 5.0  # the device has not finished it
    tr._poll_gpu()
    (c,) = tr.inflight.values()
    assert c.fn == "all_reduce" and c.gid == "dp0" and c.seq == 1
    gpu.finish()
    tr._poll_gpu()
    assert not tr.inflight and c.state == "completed"


def test_backward_and_ops_recorded_on_the_stream_current_when_they_run(gpu_tracer):
    """Autograd runs a node's backward with the current stream set to its forward's stream; the
    tracer's node hooks record there (here a second stream stands for it), and an op marked with
    ft.op is bracketed by events on the current stream."""
    import fleetscope.collectors.tracer as ft
    from fleetscope.collectors.tracer_hooks import _linear_info, _timed_kernel

    gpu, tr = gpu_tracer
    lin = torch.nn.Linear(16, 8)
    linear = _timed_kernel(tr, "gemm", _linear_info)(torch.nn.functional.linear)
    x = torch.randn(4, 16, requires_grad=True)
    y = linear(x, lin.weight, lin.bias)
    gpu.kernel(2.0, "fwd")
    side = gpu.default.__class__(gpu, "autograd")
    with gpu.stream(side):
        y.sum().backward()
    ft._TRACER = tr
    try:
        with ft.op("optimizer"):
            gpu.kernel(4.0, "opt")
    finally:
        ft._TRACER = None
    gpu.finish()
    rows = _rows(tr)
    bwd = rows.filter(pl.col("name") == "gemm_bwd").row(0, named=True)
    assert bwd["stream"] == side.stream_id and bwd["flops"] == 2 * (2.0 * 4 * 8 * 16)  # input and weight gradients
    opt = rows.filter(pl.col("kind") == "op").row(0, named=True)
    assert opt["name"] == "optimizer" and opt["e_ms"] - opt["s_ms"] == pytest.approx(4.0)
