"""Lightweight in-job tracer (XPUTimer-style), one import and one call:

    import fleetscope.collectors.tracer as ft
    ft.start(landing_dir="/shared/landing", capture="job42-20261121T1200")

Times key Python APIs (DataLoader next, optimizer.step, Python GC, torch.cuda.synchronize,
torch.save), key kernels (F.linear / matmul family and scaled_dot_product_attention with FLOPs from
shapes, forward and backward; torch.distributed collectives with bytes, group and group size;
send/recv) and framework-level ops the script marks (`ft.op("forward-compute", microbatch=i)`).
Rows are buffered (bounded) and flushed to landing/timings/<capture>/rank<R>-<n>.parquet
(docs/CONTRACT.md 1.4) by a background thread.

Also starts the on-demand profiler watcher (fleetscope.collectors.profiler_capture) and the stack-dump
watcher (fleetscope.collectors.stacks) unless told not to. Extra Python APIs to time:
FLEETSCOPE_TRACED_PYTHON_API="module.func,module.Class.method" (like XPUTimer's TRACED_PYTHON_API;
`module@func` is accepted too).

The tracer is split by concern: what is timed and how (tracer_hooks), the rows, their GPU times and
the files they land in (tracer_rows), the collective progress and the hang watchdog (tracer_watchdog),
incident requests (incidents), on-demand profiles (profiler_capture) and stack dumps (stacks).
"""
from __future__ import annotations

import atexit
import contextlib
import json
import os
import socket
import time
from pathlib import Path

import torch
import torch.distributed as dist

from fleetscope.collectors import stacks as _stacks
from fleetscope.collectors.stacks import write_json
from fleetscope.collectors.tracer_hooks import ENV_TRACED_API, _install  # noqa: F401  (ENV_TRACED_API: public)
from fleetscope.collectors.tracer_rows import COLUMNS, _Tracer  # noqa: F401  (COLUMNS: public)

_now = time.time_ns
_TRACER: _Tracer | None = None   # the process's tracer (start / stop)


def start(landing_dir: str | os.PathLike | None = None, capture: str | None = None, rank: int | None = None,
          *, job_id: str | None = None, max_rows: int = 20000, flush_interval_s: float = 30.0,
          poll_interval_s: float = 0.05, trace_kernels: bool = True, trace_backward: bool = True,
          profiler: bool = True, stacks: bool = True, layout: dict | None = None, watchdog: bool = True,
          hang_min_s: float | None = None, hang_factor: float = 10.0) -> _Tracer:
    """Start tracing this process. landing_dir defaults to $FLEETSCOPE_LANDING or data/landing;
    capture to $FLEETSCOPE_CAPTURE or '<job_id>-<UTC time>' (all ranks of a job must agree: pass it,
    or set FLEETSCOPE_CAPTURE in the launcher). rank defaults to torch.distributed's rank or $RANK.
    layout: this rank's {"stage", "dp_rank", "tp_rank"} (any subset), written on every row.
    watchdog: file a hang incident when a collective stays outstanding past the learned bound
    (max(hang_factor x median step, 2 x the longest completed call of that collective), at least
    hang_min_s, default $FLEETSCOPE_HANG_MIN_S or 10 s)."""
    global _TRACER
    if _TRACER is not None:
        return _TRACER
    landing_dir = landing_dir or os.environ.get("FLEETSCOPE_LANDING", "data/landing")
    job_id = job_id or os.environ.get("FLEETSCOPE_JOB_ID", "job")
    capture = capture or os.environ.get("FLEETSCOPE_CAPTURE") or f"{job_id}-{time.strftime('%Y%m%dT%H%M', time.gmtime())}"
    if rank is None:
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else int(os.environ.get("RANK", 0))
    use_cuda = torch.cuda.is_available()
    if hang_min_s is None:
        hang_min_s = float(os.environ.get("FLEETSCOPE_HANG_MIN_S", 10.0))
    tr = _Tracer(landing_dir, capture, int(rank), socket.gethostname(), max_rows, flush_interval_s,
                 poll_interval_s, use_cuda, hang_min_s=hang_min_s, hang_factor=hang_factor)
    if not watchdog:
        tr.check_hang = lambda now_ns=None: None
    tr.job_id = job_id
    bad = set(layout or {}) - {"stage", "dp_rank", "tp_rank"}
    if bad:
        raise ValueError(f"layout keys must be stage, dp_rank, tp_rank; got {sorted(bad)}")
    tr.layout = dict(layout or {})
    cj = tr.out_dir / "capture.json"
    if not cj.exists():
        cj.write_text(json.dumps({"job_id": job_id, "note": "fleetscope tracer"}))
    _install(tr, trace_kernels, trace_backward)
    tr._thread.start()
    atexit.register(stop)
    _TRACER = tr
    _stacks.add_dumper(_progress_dumper)
    if profiler:
        from fleetscope.collectors import profiler_capture
        profiler_capture.attach(tr)
    if stacks:
        _stacks.install(landing_dir, tr.rank, job_id=job_id)
    return tr


def _progress_dumper(out_dir: Path, rank: int) -> None:
    """stacks.dump_now hook: the collective progress beside the stack dump, unless torch's own
    Flight Recorder (TORCH_FR_BUFFER_SIZE) wrote it already."""
    tr = _TRACER
    if tr is not None and not (out_dir / f"fr_rank{rank}.json").exists():
        write_json(out_dir / f"fr_rank{rank}.json", tr.progress_dump())


def stop() -> dict | None:
    """Undo the patches, flush what is buffered and return a summary (rows, bytes, files, dropped).
    A last api row `tracer.stop` tells the platform the job ended (not hung)."""
    global _TRACER
    tr = _TRACER
    if tr is None:
        return None
    _TRACER = None
    tr.unpatch()
    tr._stop.set()
    tr._thread.join(timeout=5)
    if tr.use_cuda:
        tr.cuda.synchronize()
    t = _now()
    tr.add("api", "tracer.stop", t, t, t, step=None)
    tr.flush()
    return {"rows": tr.rows_written, "bytes": tr.bytes_written, "files": tr.n_files, "dropped": tr.dropped,
            "dir": str(tr.out_dir), "steps": tr.step, "incidents": list(tr.incidents)}


def trace_ddp(ddp_model) -> None:
    """DDP reduces gradient buckets from its C++ reducer, out of the tracer's sight; this registers
    the stock all-reduce comm hook, which calls torch.distributed.all_reduce (traced) per bucket.
    Call after ft.start() (the hook calls whatever dist.all_reduce is at that time)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    ddp_model.register_comm_hook(state=None, hook=default_hooks.allreduce_hook)


def current() -> _Tracer | None:
    return _TRACER


def mark_step(step: int | None = None):
    """Optional: set the step counter explicitly (by default it counts optimizer.step calls)."""
    if _TRACER is not None:
        _TRACER.step = _TRACER.step + 1 if step is None else int(step)


# -- framework-level ops (kind=op, docs/CONTRACT.md 1.4) ------------------------------------------
def record_op(names, start_ns: int, end_ns: int, *, microbatch: int | None = None, model_chunk: int | None = None,
              step: int | None = None) -> None:
    """Record an op the script timed itself. `names` may hold several names for one fused slot
    (Megatron's send_forward_recv_backward: `("forward-send", "backward-recv")`), which share the
    same start and end, as Megatron's timers record them."""
    tr = _TRACER
    if tr is None:
        return
    for n in ([names] if isinstance(names, str) else names):
        tr.add("op", n, start_ns, start_ns, end_ns, microbatch=microbatch, model_chunk=model_chunk,
               step=tr.step if step is None else step)


@contextlib.contextmanager
def op(*names: str, microbatch: int | None = None, model_chunk: int | None = None):
    """Time a framework op: `with ft.op("forward-compute", microbatch=i): ...`. Megatron timer names
    (forward-compute, backward-compute, forward-send, forward-recv, backward-send, backward-recv,
    grads-all-reduce, grads-reduce-scatter, params-all-gather, optimizer) let PRISM and PerfTracker
    rebuild the pipeline schedule. On a GPU the op is timed by events on the current stream (the
    span of its kernels there); on CPU by the wall clock."""
    tr = _TRACER
    if tr is None:
        yield
        return
    step = tr.step
    t0 = _now()
    if tr.use_cuda:
        s = tr.cuda.current_stream()
        es, ee = tr.cuda.Event(enable_timing=True), tr.cuda.Event(enable_timing=True)
        es.record(s)
        try:
            yield
        finally:
            ee.record(s)
            with tr.buf_lock:
                for n in names:
                    tr.pending.append((("op", n, t0, s.stream_id, None, None, None, None, None, step, microbatch, model_chunk),
                                       es, ee, None, None, None))
        return
    try:
        yield
    finally:
        t1 = _now()
        for n in names:
            tr.add("op", n, t0, t0, t1, microbatch=microbatch, model_chunk=model_chunk, step=step)
