"""Lightweight in-job tracer (XPUTimer-style), one import and one call:

    import fleetscope.collectors.tracer as ft
    ft.start(landing_dir="/shared/landing", capture="job42-20261121T1200")

Times key Python APIs (DataLoader next, optimizer.step, Python GC, torch.cuda.synchronize,
torch.save) and key kernels (F.linear / matmul family with FLOPs from shapes; torch.distributed
collectives with bytes, group and group size; send/recv). On GPU, kernels are timed with CUDA
events that a background thread polls (the training thread never waits); on CPU, with the wall
clock around the call. Rows are buffered (bounded) and flushed to
landing/timings/<capture>/rank<R>-<n>.parquet (docs/CONTRACT.md 1.4) by the background thread.

Also starts the on-demand profiler watcher (fleetscope.collectors.profiler_capture) and the stack-dump
watcher (fleetscope.collectors.stacks) unless told not to. Extra Python APIs to time:
FLEETSCOPE_TRACED_PYTHON_API="module.func,module.Class.method" (like XPUTimer's TRACED_PYTHON_API;
`module@func` is accepted too).
"""
from __future__ import annotations

import atexit
import functools
import gc
import importlib
import os
import socket
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

ENV_TRACED_API = "FLEETSCOPE_TRACED_PYTHON_API"
COLUMNS = ["rank", "host", "kind", "name", "issue_ns", "start_ns", "end_ns", "stream", "flops", "bytes",
           "group", "group_size", "shape", "step"]

_DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64"}
_now = time.time_ns


class _Tracer:
    def __init__(self, landing_dir, capture, rank, host, max_rows, flush_interval_s, poll_interval_s, use_cuda):
        self.landing = Path(landing_dir)
        self.capture = capture
        self.rank = rank
        self.host = host
        self.max_rows = max_rows
        self.flush_interval_s = flush_interval_s
        self.poll_interval_s = poll_interval_s
        self.use_cuda = use_cuda
        self.out_dir = self.landing / "timings" / capture
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.rows: list[tuple] = []          # finished rows, appended by the training thread
        self.pending: list[tuple] = []       # (row-prefix, start_event, end_event) awaiting the GPU
        self.lock = threading.Lock()         # one flush at a time
        # short: guards the swaps of `rows` / `pending`; reentrant because a GC callback (which adds a
        # row) can run on a thread that holds it when an allocation inside triggers a collection
        self.buf_lock = threading.RLock()
        self.step = 0
        self.n_files = 0
        self.dropped = 0
        self.bytes_written = 0
        self.rows_written = 0
        self._gc_start = None
        self._patches: list[tuple] = []      # (owner, attr, original) to undo in stop()
        self._hooks = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fleetscope-tracer", daemon=True)
        self._last_flush = time.monotonic()
        self.on_step_end = []                # callbacks(step) run on the training thread (profiler capture)
        self.layout: dict[str, int] = {}     # stage / dp_rank / tp_rank when the job says
        if use_cuda:
            # anchor GPU event times to the wall clock once; elapsed_time() is relative to it
            torch.cuda.synchronize()
            self._anchor_event = torch.cuda.Event(enable_timing=True)
            self._anchor_event.record()
            torch.cuda.synchronize()
            self._anchor_ns = _now()

    # -- recording -------------------------------------------------------------------------
    def add(self, kind, name, issue_ns, start_ns, end_ns, stream=None, flops=None, nbytes=None,
            group=None, group_size=None, shape=None):
        row = (self.rank, self.host, kind, name, issue_ns, start_ns, end_ns, stream, flops, nbytes,
               group, group_size, shape, self.step)
        with self.buf_lock:
            self.rows.append(row)
            if len(self.rows) > self.max_rows * 4:
                # the writer thread is far behind: drop the oldest rows rather than grow without bound
                cut = self.max_rows
                del self.rows[:cut]
                self.dropped += cut

    def add_gpu(self, kind, name, issue_ns, ev_start, ev_end, stream, flops=None, nbytes=None, group=None,
                group_size=None, shape=None):
        with self.buf_lock:
            self.pending.append(((kind, name, issue_ns, stream, flops, nbytes, group, group_size, shape, self.step),
                                 ev_start, ev_end))

    def _poll_gpu(self):
        if not self.pending:
            return
        done, keep = [], []
        with self.buf_lock:
            pend, self.pending = self.pending, []
        for item in pend:
            (done if item[2].query() else keep).append(item)
        out = []
        for (kind, name, issue_ns, stream, flops, nbytes, group, gsize, shape, step), es, ee in done:
            s = self._anchor_ns + int(self._anchor_event.elapsed_time(es) * 1e6)
            e = self._anchor_ns + int(self._anchor_event.elapsed_time(ee) * 1e6)
            out.append((self.rank, self.host, kind, name, issue_ns, s, e, stream, flops, nbytes, group,
                        gsize, shape, step))
        with self.buf_lock:
            self.pending[:0] = keep
            self.rows.extend(out)

    # -- writing ---------------------------------------------------------------------------
    def flush(self):
        import pyarrow as pa
        import pyarrow.parquet as pq

        with self.lock:
            if self.use_cuda:
                self._poll_gpu()
            with self.buf_lock:
                rows, self.rows = self.rows, []
            if not rows:
                return None
            cols = list(zip(*rows))
            table = pa.table({
                "rank": pa.array(cols[0], pa.int32()), "host": pa.array(cols[1], pa.string()),
                "kind": pa.array(cols[2], pa.string()), "name": pa.array(cols[3], pa.string()),
                "issue_ns": pa.array(cols[4], pa.int64()), "start_ns": pa.array(cols[5], pa.int64()),
                "end_ns": pa.array(cols[6], pa.int64()), "stream": pa.array(cols[7], pa.int64()),
                "flops": pa.array(cols[8], pa.float64()), "bytes": pa.array(cols[9], pa.int64()),
                "group": pa.array(cols[10], pa.string()), "group_size": pa.array(cols[11], pa.int32()),
                "shape": pa.array(cols[12], pa.string()), "step": pa.array(cols[13], pa.int64()),
            })
            for col, val in self.layout.items():  # the rank's constant place in the parallel layout
                table = table.append_column(col, pa.array([int(val)] * len(rows), pa.int32()))
            path = self.out_dir / f"rank{self.rank}-{self.n_files:05d}.parquet"
            tmp = path.with_suffix(".parquet.tmp")
            # delta-encoded ns timestamps compress far better than plain int64
            pq.write_table(table, tmp, compression="zstd", compression_level=3, use_dictionary=
                           ["host", "kind", "name", "group", "shape"],
                           column_encoding={c: "DELTA_BINARY_PACKED" for c in ("issue_ns", "start_ns", "end_ns", "step")})
            os.replace(tmp, path)  # atomic: the platform never sees half a file
            self.n_files += 1
            self.rows_written += len(rows)
            self.bytes_written += path.stat().st_size
            return path

    def _loop(self):
        while not self._stop.wait(self.poll_interval_s):
            try:
                if self.use_cuda:
                    with self.lock:
                        self._poll_gpu()
                if (len(self.rows) >= self.max_rows
                        or time.monotonic() - self._last_flush >= self.flush_interval_s):
                    self._last_flush = time.monotonic()
                    self.flush()
            except Exception as exc:  # never take the training job down
                print(f"[fleetscope.tracer] rank {self.rank}: background flush failed: {exc!r}", flush=True)

    # -- patching --------------------------------------------------------------------------
    def patch(self, owner, attr, wrapper_factory):
        orig = getattr(owner, attr)
        if getattr(orig, "_fleetscope_wrapped", False):
            return
        wrapped = functools.wraps(orig)(wrapper_factory(orig))
        wrapped._fleetscope_wrapped = True
        setattr(owner, attr, wrapped)
        self._patches.append((owner, attr, orig))

    def unpatch(self):
        for owner, attr, orig in reversed(self._patches):
            setattr(owner, attr, orig)
        self._patches.clear()
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        if self._gc_cb in gc.callbacks:
            gc.callbacks.remove(self._gc_cb)

    def _gc_cb(self, phase, info):
        if phase == "start":
            self._gc_start = _now()
        elif self._gc_start is not None:
            t = _now()
            self.add("api", "gc", self._gc_start, self._gc_start, t, shape=f"generation={info.get('generation')}")
            self._gc_start = None


_TRACER: _Tracer | None = None


def _timed_api(tr: _Tracer, name: str):
    def factory(orig):
        def wrapper(*a, **kw):
            t0 = _now()
            try:
                return orig(*a, **kw)
            finally:
                tr.add("api", name, t0, t0, _now())
        return wrapper
    return factory


def _shape_str(dims: dict, dtype) -> str:
    return ",".join(f"{k}={v}" for k, v in dims.items()) + f",dtype={_DTYPE_NAMES.get(dtype, str(dtype).replace('torch.', ''))}"


def _linear_info(x, w):
    # y = x @ w.T: m = rows of x, n = out features, k = in features
    k = x.shape[-1]
    n = w.shape[0] if w.dim() == 2 else 1
    m = x.numel() // max(k, 1)
    return 2.0 * m * n * k, _shape_str({"m": m, "n": n, "k": k}, x.dtype)


def _matmul_info(a, b):
    if a.dim() < 1 or b.dim() < 1:
        return None, None
    k = a.shape[-1]
    m = a.shape[-2] if a.dim() >= 2 else 1
    n = b.shape[-1] if b.dim() >= 2 else 1
    batch = max(a.numel() // max(m * k, 1), b.numel() // max(k * n, 1), 1)
    dims = {"b": batch, "m": m, "n": n, "k": k} if batch > 1 else {"m": m, "n": n, "k": k}
    return 2.0 * batch * m * n * k, _shape_str(dims, a.dtype)


def _timed_kernel(tr: _Tracer, name: str, info):
    """Compute kernels: FLOPs and shape from the arguments; GPU via events, CPU via wall clock."""
    def factory(orig):
        def wrapper(*a, **kw):
            x = a[0] if a else None
            if not isinstance(x, torch.Tensor):
                return orig(*a, **kw)
            try:
                flops, shape = info(*a[:2], **{})
            except Exception:
                flops, shape = None, None
            issue = _now()
            if tr.use_cuda and x.is_cuda:
                s = torch.cuda.current_stream()
                es, ee = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                es.record(s)
                out = orig(*a, **kw)
                ee.record(s)
                tr.add_gpu("kernel", name, issue, es, ee, s.stream_id, flops=flops, shape=shape)
                return out
            out = orig(*a, **kw)
            tr.add("kernel", name, issue, issue, _now(), flops=flops, shape=shape)
            return out
        return wrapper
    return factory


def _group_of(kw, a, pos):
    g = kw.get("group", a[pos] if len(a) > pos else None)
    return g


def _group_id(g) -> str:
    if g is None or g is dist.GroupMember.WORLD:
        return "world"
    name = getattr(g, "group_name", None)
    return str(name) if name else f"pg{id(g)}"


_COLL_NAMES = {
    "all_reduce": "AllReduce", "all_gather": "AllGather", "all_gather_into_tensor": "AllGather",
    "reduce_scatter": "ReduceScatter", "reduce_scatter_tensor": "ReduceScatter", "broadcast": "Broadcast",
    "all_to_all_single": "AllToAll", "all_to_all": "AllToAll", "reduce": "Reduce", "barrier": "Barrier",
    "send": "Send", "recv": "Recv", "isend": "Send", "irecv": "Recv",
}
# position of the `group` argument in each function's signature (after the tensors)
_GROUP_POS = {"all_reduce": 2, "all_gather": 2, "all_gather_into_tensor": 2, "reduce_scatter": 3,
              "reduce_scatter_tensor": 3, "broadcast": 2, "all_to_all_single": 4, "all_to_all": 2,
              "reduce": 3, "barrier": 0, "send": 2, "recv": 2, "isend": 2, "irecv": 2}


def _payload_bytes(fn, a, kw):
    t = a[0] if a else kw.get("tensor", kw.get("output_tensor", kw.get("output")))
    if fn in ("all_gather", "all_to_all") and isinstance(t, (list, tuple)):
        return sum(x.numel() * x.element_size() for x in t)
    if fn == "reduce_scatter" and len(a) > 1 and isinstance(a[1], (list, tuple)):
        return sum(x.numel() * x.element_size() for x in a[1])
    if fn in ("all_gather_into_tensor", "reduce_scatter_tensor") and isinstance(t, torch.Tensor):
        # the output of all_gather / the input of reduce_scatter: the full buffer (nccl-tests size)
        if fn == "reduce_scatter_tensor" and len(a) > 1 and isinstance(a[1], torch.Tensor):
            t = a[1]
        return t.numel() * t.element_size()
    if isinstance(t, torch.Tensor):
        return t.numel() * t.element_size()
    return 0


class _TracedWork:
    """Proxy of an async collective's Work. wait() records the row on the training thread: the end
    is when wait() returned if the work was still running, else when wait() was called (an upper
    bound). No completion callback: a Python callback on the communication thread must take the
    GIL from the training thread, which cost up to 35 % of a 12 ms CPU step in the benchmark.
    Only get_future() (DDP comm hooks, which never call wait()) falls back to a future callback.
    wait() is also a Python frame in this file, so a stack dump of a rank blocked on it shows that
    it waits for a collective (the C++ wait leaves no Python frame)."""
    __slots__ = ("_work", "_row", "_done")

    def __init__(self, work, row):
        self._work, self._row, self._done = work, row, False

    def _record(self, end_ns):
        if not self._done:
            self._done = True
            tr, kname, issue, nbytes, gid, gsize, step = self._row
            with tr.buf_lock:
                tr.rows.append((tr.rank, tr.host, "kernel", kname, issue, issue, end_ns, None, None, nbytes, gid, gsize,
                                None, step))

    def wait(self, *a, **kw):
        t0 = _now()
        finished = self._done or self._work.is_completed()
        out = self._work.wait(*a, **kw)
        self._record(t0 if finished else _now())
        return out

    def get_future(self):
        fut = self._work.get_future()
        if not self._done:
            fut.then(lambda _f: self._record(_now()))
        return fut

    def is_completed(self):
        return self._work.is_completed()

    def __getattr__(self, name):
        return getattr(self._work, name)


def _timed_collective(tr: _Tracer, fn: str):
    names = {}

    def factory(orig):
        def wrapper(*a, **kw):
            kname = names.get("k")
            if kname is None:  # the backend is known only once the process group exists
                kname = names["k"] = ("nccl:" if dist.get_backend() == "nccl" else "gloo:") + _COLL_NAMES[fn]
            g = _group_of(kw, a, _GROUP_POS[fn]) if fn != "barrier" else kw.get("group", a[0] if a else None)
            gid, gsize = _group_id(g), dist.get_world_size(g) if g is not None else dist.get_world_size()
            nbytes = _payload_bytes(fn, a, kw)
            issue = _now()
            t0 = a[0] if a and isinstance(a[0], torch.Tensor) else None
            if tr.use_cuda and t0 is not None and t0.is_cuda:
                s = torch.cuda.current_stream()
                es, ee = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                es.record(s)
                out = orig(*a, **kw)
                ee.record(s)
                tr.add_gpu("kernel", kname, issue, es, ee, s.stream_id, nbytes=nbytes, group=gid, group_size=gsize)
                return out
            out = orig(*a, **kw)
            if out is not None and hasattr(out, "get_future") and fn not in ("isend", "irecv", "send", "recv"):
                return _TracedWork(out, (tr, kname, issue, nbytes, gid, gsize, tr.step))
            tr.add("kernel", kname, issue, issue, _now(), nbytes=nbytes, group=gid, group_size=gsize)
            return out
        return wrapper
    return factory


def _resolve(dotted: str):
    """'pkg.mod.func' or 'pkg.mod.Class.method' or 'pkg.mod@func' -> (owner, attr)."""
    dotted = dotted.strip().replace("@", ".")
    parts = dotted.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for p in parts[i:-1]:
            obj = getattr(obj, p)
        if not hasattr(obj, parts[-1]):
            break
        return obj, parts[-1]
    raise ValueError(f"{ENV_TRACED_API}: cannot resolve {dotted!r} (expected module.func or module.Class.method)")


def _install(tr: _Tracer, trace_kernels: bool):
    import torch.nn.functional as F
    from torch.utils.data import dataloader as dl

    tr.patch(dl._BaseDataLoaderIter, "__next__", _timed_api(tr, "dataloader.next"))
    # optimizer.step via the global hooks: covers every Optimizer subclass, also ones made later
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
    state = {}

    def pre(opt, args, kwargs):
        state[id(opt)] = _now()

    def post(opt, args, kwargs):
        t0 = state.pop(id(opt), None)
        if t0 is not None:
            tr.add("api", "optimizer.step", t0, t0, _now())
        tr.step += 1
        for cb in list(tr.on_step_end):
            cb(tr.step)

    tr._hooks += [register_optimizer_step_pre_hook(pre), register_optimizer_step_post_hook(post)]
    gc.callbacks.append(tr._gc_cb)
    if hasattr(torch, "cuda"):
        tr.patch(torch.cuda, "synchronize", _timed_api(tr, "cuda.synchronize"))
    tr.patch(torch, "save", _timed_api(tr, "checkpoint.save"))
    if trace_kernels:
        tr.patch(F, "linear", _timed_kernel(tr, "gemm", _linear_info))
        for fn in ("matmul", "mm", "bmm"):
            tr.patch(torch, fn, _timed_kernel(tr, "gemm", _matmul_info))
        if dist.is_available():
            for fn in _COLL_NAMES:
                if hasattr(dist, fn):
                    tr.patch(dist, fn, _timed_collective(tr, fn))
    for spec in filter(None, os.environ.get(ENV_TRACED_API, "").split(",")):
        owner, attr = _resolve(spec)
        tr.patch(owner, attr, _timed_api(tr, spec.strip().replace("@", ".")))


def start(landing_dir: str | os.PathLike | None = None, capture: str | None = None, rank: int | None = None,
          *, job_id: str | None = None, max_rows: int = 20000, flush_interval_s: float = 30.0,
          poll_interval_s: float = 0.05, trace_kernels: bool = True, profiler: bool = True,
          stacks: bool = True, layout: dict | None = None) -> _Tracer:
    """Start tracing this process. landing_dir defaults to $FLEETSCOPE_LANDING or data/landing;
    capture to $FLEETSCOPE_CAPTURE or '<job_id>-<UTC time>' (all ranks of a job must agree: pass it,
    or set FLEETSCOPE_CAPTURE in the launcher). rank defaults to torch.distributed's rank or $RANK.
    layout: this rank's {"stage", "dp_rank", "tp_rank"} (any subset), written on every row."""
    global _TRACER
    if _TRACER is not None:
        return _TRACER
    landing_dir = landing_dir or os.environ.get("FLEETSCOPE_LANDING", "data/landing")
    job_id = job_id or os.environ.get("FLEETSCOPE_JOB_ID", "job")
    capture = capture or os.environ.get("FLEETSCOPE_CAPTURE") or f"{job_id}-{time.strftime('%Y%m%dT%H%M', time.gmtime())}"
    if rank is None:
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else int(os.environ.get("RANK", 0))
    use_cuda = torch.cuda.is_available()
    tr = _Tracer(landing_dir, capture, int(rank), socket.gethostname(), max_rows, flush_interval_s,
                 poll_interval_s, use_cuda)
    tr.job_id = job_id
    bad = set(layout or {}) - {"stage", "dp_rank", "tp_rank"}
    if bad:
        raise ValueError(f"layout keys must be stage, dp_rank, tp_rank; got {sorted(bad)}")
    tr.layout = dict(layout or {})
    cj = tr.out_dir / "capture.json"
    if not cj.exists():
        import json
        cj.write_text(json.dumps({"job_id": job_id, "note": "fleetscope tracer"}))
    _install(tr, trace_kernels)
    tr._thread.start()
    atexit.register(stop)
    _TRACER = tr
    if profiler:
        from fleetscope.collectors import profiler_capture
        profiler_capture.attach(tr)
    if stacks:
        from fleetscope.collectors import stacks as _stacks
        _stacks.install(landing_dir, tr.rank, job_id=job_id)
    return tr


def stop() -> dict | None:
    """Undo the patches, flush what is buffered and return a summary (rows, bytes, files, dropped)."""
    global _TRACER
    tr = _TRACER
    if tr is None:
        return None
    _TRACER = None
    tr.unpatch()
    tr._stop.set()
    tr._thread.join(timeout=5)
    if tr.use_cuda:
        torch.cuda.synchronize()
    tr.flush()
    return {"rows": tr.rows_written, "bytes": tr.bytes_written, "files": tr.n_files, "dropped": tr.dropped,
            "dir": str(tr.out_dir), "steps": tr.step}


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
