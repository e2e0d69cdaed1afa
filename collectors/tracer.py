"""Lightweight in-job tracer (XPUTimer-style), one import and one call:

    import fleetscope.collectors.tracer as ft
    ft.start(landing_dir="/shared/landing", capture="job42-20261121T1200")

Times key Python APIs (DataLoader next, optimizer.step, Python GC, torch.cuda.synchronize,
torch.save), key kernels (F.linear / matmul family and scaled_dot_product_attention with FLOPs from
shapes, forward and backward; torch.distributed collectives with bytes, group and group size;
send/recv) and framework-level ops the script marks (`ft.op("forward-compute", microbatch=i)`).
Rows are buffered (bounded) and flushed to landing/timings/<capture>/rank<R>-<n>.parquet
(docs/CONTRACT.md 1.4) by a background thread.

Timing, by where the work runs (the reasons are in the functions below):
- on CPU: the wall clock around the call (an async collective ends when its Work completes, seen by
  the training thread's wait());
- on a GPU: CUDA events on the stream that runs the work, polled by the background thread (the
  training thread never waits). Compute kernels run on the current stream. A collective runs on
  the process group's communication stream: its end event is recorded from a callback of the
  Work's future, which c10 runs on a stream ordered after the collective's completion; its start is
  the later of an event recorded before the enqueue (the communication stream waits for the
  current stream) and the end of the previous collective on the same group (one stream runs them
  in order), or the Work's own duration where NCCL timing is on (TORCH_NCCL_ENABLE_TIMING=1).
  Backward GEMMs and attention are bracketed by hooks on their autograd nodes, which autograd runs
  with the current stream set to the stream that backward runs on.

A watchdog (the same background thread) notices a collective outstanding past a bound learned from
the job (the longest of 10 x its median step and twice the longest completed call of that
collective, at least `hang_min_s`), then files a hang incident (landing/incidents/<id>.json), asks
every rank for its stacks (landing/requests/<job>.stacks.json) and writes its own stacks and
collective progress (landing/stacks/<id>/rank<R>.txt and fr_rank<R>.json, the Flight Recorder's
JSON layout: torch's own recorder when TORCH_FR_BUFFER_SIZE is set, else the tracer's ring buffer).

Also starts the on-demand profiler watcher (fleetscope.collectors.profiler_capture) and the stack-dump
watcher (fleetscope.collectors.stacks) unless told not to. Extra Python APIs to time:
FLEETSCOPE_TRACED_PYTHON_API="module.func,module.Class.method" (like XPUTimer's TRACED_PYTHON_API;
`module@func` is accepted too).
"""
from __future__ import annotations

import atexit
import collections
import contextlib
import functools
import gc
import importlib
import json
import os
import socket
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

from fleetscope.collectors import stacks as _stacks
from fleetscope.collectors.incidents import file_incident, incident_id
from fleetscope.collectors.stacks import write_json

ENV_TRACED_API = "FLEETSCOPE_TRACED_PYTHON_API"
COLUMNS = ["rank", "host", "kind", "name", "issue_ns", "start_ns", "end_ns", "stream", "flops", "bytes",
           "group", "group_size", "shape", "step", "microbatch", "model_chunk"]
_I_END, _I_STEP = 6, 13

_DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64"}
_now = time.time_ns


class _Coll:
    """One collective call: kept in the progress ring buffer (Flight Recorder layout) and, while
    outstanding, in the tracer's in-flight set that the watchdog checks."""
    __slots__ = ("rid", "fn", "gid", "seq", "p2p", "peer", "issue", "end", "nbytes", "sizes", "work", "state")

    def __init__(self, rid, fn, gid, seq, p2p, peer, issue, nbytes, sizes):
        self.rid, self.fn, self.gid, self.seq, self.p2p, self.peer = rid, fn, gid, seq, p2p, peer
        self.issue, self.end, self.nbytes, self.sizes = issue, None, nbytes, sizes
        self.work, self.state = None, "scheduled"


class _Tracer:
    def __init__(self, landing_dir, capture, rank, host, max_rows, flush_interval_s, poll_interval_s, use_cuda,
                 cuda=None, hang_min_s=10.0, hang_factor=10.0, progress_entries=2000):
        self.landing = Path(landing_dir)
        self.capture = capture
        self.rank = rank
        self.host = host
        self.job_id = "job"
        self.max_rows = max_rows
        self.flush_interval_s = flush_interval_s
        self.poll_interval_s = poll_interval_s
        self.use_cuda = use_cuda
        self.cuda = cuda if cuda is not None else (torch.cuda if use_cuda else None)
        self.out_dir = self.landing / "timings" / capture
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.rows: list[tuple] = []          # finished rows, appended by the training thread
        self.pending: list[tuple] = []       # device work awaiting the GPU: (prefix, ev_start, ev_end, queue, coll, work)
        self.lock = threading.Lock()         # one flush / poll at a time
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
        # collective progress and the hang watchdog
        self.progress: collections.deque = collections.deque(maxlen=progress_entries)
        self.inflight: dict[int, _Coll] = {}
        self.seq: dict[str, int] = collections.defaultdict(int)
        self.p2p_seq: dict[tuple, int] = collections.defaultdict(int)
        self.queue_end: dict[object, int] = {}          # device: end of the last collective per communication queue
        self.coll_durs: dict[str, collections.deque] = collections.defaultdict(lambda: collections.deque(maxlen=256))
        self.step_ends: collections.deque = collections.deque(maxlen=64)
        self.groups: dict[str, dict] = {}               # gid -> {"desc", "ranks"} for the progress dump
        self.hang_min_s, self.hang_factor = float(hang_min_s), float(hang_factor)
        self.hang_warmup_s = max(600.0, self.hang_min_s)  # before 3 steps: rendezvous, first compilation
        self.incidents: list[str] = []
        self._rid = 0
        self._last_watch = 0.0
        self._hang_open: int | None = None   # last record id outstanding when a hang was filed
        if use_cuda:
            # anchor GPU event times to the wall clock once; elapsed_time() is relative to it
            self.cuda.synchronize()
            self._anchor_event = self.cuda.Event(enable_timing=True)
            self._anchor_event.record()
            self.cuda.synchronize()
            self._anchor_ns = _now()

    def on_device(self, t) -> bool:
        return self.use_cuda and isinstance(t, torch.Tensor) and t.is_cuda

    # -- recording -------------------------------------------------------------------------
    def add(self, kind, name, issue_ns, start_ns, end_ns, stream=None, flops=None, nbytes=None,
            group=None, group_size=None, shape=None, microbatch=None, model_chunk=None, step=-1):
        row = (self.rank, self.host, kind, name, issue_ns, start_ns, end_ns, stream, flops, nbytes,
               group, group_size, shape, self.step if step == -1 else step, microbatch, model_chunk)
        with self.buf_lock:
            self.rows.append(row)
            if len(self.rows) > self.max_rows * 4:
                # the writer thread is far behind: drop the oldest rows rather than grow without bound
                cut = self.max_rows
                del self.rows[:cut]
                self.dropped += cut

    def add_gpu(self, kind, name, issue_ns, ev_start, ev_end, stream, flops=None, nbytes=None, group=None,
                group_size=None, shape=None, microbatch=None, model_chunk=None, queue=None, coll=None, work=None):
        """Device-timed row: finished by _poll_gpu once ev_end has completed. queue: the
        communication queue (stream) a collective runs on, whose previous collective must end
        before this one starts; coll: its progress record; work: its Work (NCCL duration)."""
        with self.buf_lock:
            self.pending.append(((kind, name, issue_ns, stream, flops, nbytes, group, group_size, shape, self.step,
                                  microbatch, model_chunk), ev_start, ev_end, queue, coll, work))

    def _ns(self, ev) -> int:
        return self._anchor_ns + int(self._anchor_event.elapsed_time(ev) * 1e6)

    def _poll_gpu(self):
        if not self.pending:
            return
        with self.buf_lock:
            pend, self.pending = self.pending, []
        keep, out, blocked = [], [], set()
        for item in pend:  # in issue order
            prefix, es, ee, q, coll, work = item
            # a communication queue runs its collectives in order: finish them in order, so each
            # start can be bounded by the previous end on that queue
            if (q is not None and q in blocked) or not ee.query():
                keep.append(item)
                if q is not None:
                    blocked.add(q)
                continue
            (kind, name, issue_ns, stream, flops, nbytes, group, gsize, shape, step, mb, mc) = prefix
            e = self._ns(ee)
            s = self._ns(es)
            if q is not None:
                s = max(s, self.queue_end.get(q, s))
                d = _work_duration_ns(work)
                if d is not None:
                    s = max(s, e - d)
                self.queue_end[q] = e
            if coll is not None:
                self.end_coll(coll, e)
            out.append((self.rank, self.host, kind, name, issue_ns, s, e, stream, flops, nbytes, group, gsize,
                        shape, step, mb, mc))
        with self.buf_lock:
            self.pending[:0] = keep
            self.rows.extend(out)

    # -- collective progress ---------------------------------------------------------------
    def begin_coll(self, fn, gid, nbytes, sizes, peer=None) -> _Coll:
        p2p = fn in _P2P_FNS
        if p2p:  # numbered per group, peer and direction, as the other side numbers its matching calls
            key = (gid, peer, "send" if fn in ("send", "isend") else "recv")
            self.p2p_seq[key] += 1
            seq = self.p2p_seq[key]
        else:
            self.seq[gid] += 1
            seq = self.seq[gid]
        self._rid += 1
        c = _Coll(self._rid, fn, gid, seq, p2p, peer, _now(), nbytes, sizes)
        self.progress.append(c)
        self.inflight[c.rid] = c
        return c

    def end_coll(self, c: _Coll, end_ns: int | None, state: str = "completed"):
        c.end, c.state, c.work = end_ns, state, None
        self.inflight.pop(c.rid, None)
        if end_ns is not None and state == "completed" and len(self.step_ends) >= 2:
            # (not the first steps: their collectives also wait for the ranks' start-up skew)
            self.coll_durs[c.fn].append(end_ns - c.issue)

    def hang_bound_ns(self, fn: str) -> float:
        """How long a collective may stay outstanding before it is a hang, learned from the job:
        the longest of hang_factor x its median step and twice the longest completed call of that
        collective (waits for a slow peer, a checkpointing rank, included), never below hang_min_s;
        before four steps, hang_warmup_s (rendezvous, first compilation)."""
        if len(self.step_ends) < 4:
            return self.hang_warmup_s * 1e9
        ends = list(self.step_ends)
        steps = sorted(b - a for a, b in zip(ends[:-1], ends[1:]))
        longest = max(self.coll_durs.get(fn, ()), default=0)
        return max(self.hang_min_s * 1e9, self.hang_factor * steps[len(steps) // 2], 2.0 * longest)

    def check_hang(self, now_ns: int | None = None) -> str | None:
        """The watchdog: the oldest outstanding collective past its bound -> an incident. One per
        hang: once filed, nothing more until every collective outstanding then has finished."""
        now_ns = now_ns or _now()
        if self._hang_open is not None:
            if any(c.rid <= self._hang_open for c in self.inflight.values()):
                return None
            self._hang_open = None
        for c in sorted(list(self.inflight.values()), key=lambda c: c.issue):
            w = c.work
            if w is not None and _completed(w):
                continue  # done, not waited yet: the training thread records it at wait()
            bound = self.hang_bound_ns(c.fn)
            if now_ns - c.issue > bound:
                self._hang_open = max(self.inflight)
                return self.file_hang(c, now_ns, bound)
            return None
        return None

    def file_hang(self, c: _Coll, now_ns: int, bound_ns: float) -> str:
        inc = _claim_incident(self.landing, self.job_id, now_ns)
        if inc is not None:  # this rank saw it first: the incident request and every rank's dumps
            what = f"{c.fn} #{c.seq} of group {c.gid}" + (f" with peer {c.peer}" if c.peer is not None else "")
            file_incident(self.landing, inc, {
                "kind": "hang", "job_id": self.job_id, "capture": self.capture, "from_ns": c.issue,
                "note": f"fleetscope tracer watchdog on rank {self.rank} ({self.host}): {what} outstanding for "
                        f"{(now_ns - c.issue) / 1e9:.1f} s, past the bound of {bound_ns / 1e9:.1f} s learned from the job"},
                stacks_of=self.job_id)
        else:
            inc = _current_incident(self.landing, self.job_id)
        if inc:
            _stacks.dump_once(self.landing, inc, self.rank)
            self.incidents.append(inc)
        return inc

    def progress_dump(self) -> dict:
        """The collective progress in the Flight Recorder's JSON layout (what torch's
        _dump_fr_trace_json writes), from the tracer's ring buffer."""
        entries = []
        for c in list(self.progress):
            entries.append({
                "record_id": c.rid, "pg_id": c.gid, "process_group": [c.gid, self.groups.get(c.gid, {}).get("desc", "")],
                "collective_seq_id": 0 if c.p2p else c.seq, "p2p_seq_id": c.seq if c.p2p else 0, "op_id": c.rid,
                "profiling_name": f"{_BACKEND.get('name') or 'gloo'}:{c.fn}", "is_p2p": c.p2p, "peer": c.peer,
                "input_sizes": c.sizes, "output_sizes": c.sizes, "time_created_ns": c.issue,
                "time_discovered_completed_ns": c.end or 0, "state": c.state, "retired": c.state != "scheduled",
                "bytes": c.nbytes})
        pgs = {gid: {"name": gid, "desc": g.get("desc", ""), "ranks": json.dumps(g.get("ranks", []))} for gid, g in self.groups.items()}
        return {"version": "2.10", "rank": self.rank, "host": self.host, "source": "fleetscope.tracer", "time_ns": _now(),
                "pg_config": pgs, "entries": entries}

    def switch_capture(self, capture: str) -> None:
        """Write the rows buffered so far to the current capture, then record into `capture` (the
        profiler capture uses it so a profile's traces and timings share one capture id)."""
        if capture == self.capture:
            return
        self.flush()
        with self.lock:
            self.capture = capture
            self.out_dir = self.landing / "timings" / capture
            self.out_dir.mkdir(parents=True, exist_ok=True)

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
                "microbatch": pa.array(cols[14], pa.int32()), "model_chunk": pa.array(cols[15], pa.int32()),
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
                if time.monotonic() - self._last_watch >= 0.25:
                    self._last_watch = time.monotonic()
                    self.check_hang()
                if (len(self.rows) >= self.max_rows
                        or time.monotonic() - self._last_flush >= self.flush_interval_s):
                    self._last_flush = time.monotonic()
                    self.flush()
            except Exception as exc:  # never take the training job down
                print(f"[fleetscope.tracer] rank {self.rank}: background work failed: {exc!r}", flush=True)

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
_BACKEND: dict = {}
_P2P_FNS = {"send", "recv", "isend", "irecv"}


def _completed(work) -> bool:
    try:
        return bool(work.is_completed())
    except Exception:
        return False


def _work_duration_ns(work) -> int | None:
    """The collective's own duration measured on its stream (NCCL with TORCH_NCCL_ENABLE_TIMING=1)."""
    if work is None or not hasattr(work, "_get_duration"):
        return None
    try:
        return int(work._get_duration() * 1e6)
    except Exception:  # timing not enabled, or not a NCCL work
        return None


_INCIDENT_REUSE_S = 600.0


def _claim_incident(landing: Path, job_id: str, now_ns: int) -> str | None:
    """One incident per hang whichever rank sees it first: an exclusive lock file names it; a
    rank that finds a lock younger than _INCIDENT_REUSE_S joins that incident (returns None)."""
    lock = landing / "requests" / f"{job_id}.hang.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    inc = incident_id(job_id, "hang", now_ns)
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                if time.time() - lock.stat().st_mtime < _INCIDENT_REUSE_S:
                    return None
                lock.unlink()  # an old hang's lock: this is a new one
            except OSError:
                return None
            continue
        with os.fdopen(fd, "w") as f:
            f.write(inc)
        return inc
    return None


def _current_incident(landing: Path, job_id: str) -> str | None:
    try:
        return (landing / "requests" / f"{job_id}.hang.lock").read_text().strip() or None
    except OSError:
        return None


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


def _sdpa_info(q, k, *rest, is_causal=False, **kw):
    # q [.., L, E], k [.., S, E]: two batched GEMMs (QK^T and PV) of 2*L*S*E each; causal masks half
    if q.dim() < 2:
        return None, None
    L, E, S = q.shape[-2], q.shape[-1], k.shape[-2]
    b = q.numel() // max(L * E, 1)
    f = 4.0 * b * L * S * E * (0.5 if is_causal else 1.0)
    return f, _shape_str({"b": b, "l": L, "s": S, "e": E}, q.dtype)


_COMPUTE_NODE = ("mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "attention", "flash", "efficient", "cudnn")


def _bracket_backward(out, rec) -> None:
    """Time an op's backward from autograd's own hooks on the op's compute node (below the
    view/reshape nodes F.linear adds for 3D inputs, which an in-place op on the output may
    replace): a pre-hook opens it (the output's gradient has arrived), a post-hook closes it. No
    wrapper tensors, so in-place ops on the output stay legal. Autograd runs both on the engine
    thread with the current stream set to the one the forward ran on."""
    comp = out.grad_fn
    if comp is None:
        return
    for _ in range(4):  # follow single-input chains to the GEMM / attention node
        if any(k in type(comp).__name__.lower() for k in _COMPUTE_NODE):
            break
        nxt = [f for f, _ in comp.next_functions if f is not None]
        if len(nxt) != 1:
            break
        comp = nxt[0]
    if not any(k in type(comp).__name__.lower() for k in _COMPUTE_NODE):
        comp = out.grad_fn
    comp.register_prehook(lambda grad_outputs: rec.open())
    comp.register_hook(lambda grad_inputs, grad_outputs: rec.close())


class _BwdRecord:
    __slots__ = ("tr", "name", "flops", "shape", "device", "t0", "es", "step")

    def __init__(self, tr, name, flops, shape, device):
        self.tr, self.name, self.flops, self.shape, self.device = tr, name, flops, shape, device
        self.t0, self.es, self.step = None, None, tr.step

    def open(self):
        self.t0 = _now()
        if self.device:
            self.es = self.tr.cuda.Event(enable_timing=True)
            self.es.record(self.tr.cuda.current_stream())

    def close(self):
        if self.t0 is None:
            return
        tr = self.tr
        if self.device:
            s = tr.cuda.current_stream()
            ee = tr.cuda.Event(enable_timing=True)
            ee.record(s)
            tr.add_gpu("kernel", self.name, self.t0, self.es, ee, s.stream_id, flops=self.flops, shape=self.shape)
        else:
            tr.add("kernel", self.name, self.t0, self.t0, _now(), flops=self.flops, shape=self.shape, step=self.step)
        self.t0 = None


def _timed_kernel(tr: _Tracer, name: str, info, backward: bool = True):
    """Compute kernels: FLOPs and shape from the arguments. On a GPU, events on the current stream
    (where the kernel runs); on CPU, the wall clock. With autograd on, the op's backward is
    bracketed by hooks on its autograd nodes and recorded as `<family>_bwd` (gemm_bwd, attn_bwd)."""
    family = name.split("_")[0]

    def factory(orig):
        def wrapper(*a, **kw):
            x = a[0] if a else None
            if not isinstance(x, torch.Tensor):
                return orig(*a, **kw)
            try:
                flops, shape = info(*a[:2], **({"is_causal": kw.get("is_causal", False)} if family == "attn" else {}))
            except Exception:
                flops, shape = None, None
            dev = tr.on_device(x)
            rec = None
            if backward and torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in a):
                # a GEMM's backward computes one GEMM per operand that needs a gradient (input, weight);
                # attention's recomputes and differentiates (2.5x, FlashAttention's count)
                factor = sum(1 for t in a[:2] if isinstance(t, torch.Tensor) and t.requires_grad) if family == "gemm" else 2.5
                rec = _BwdRecord(tr, f"{name.removesuffix('_fwd')}_bwd", flops * factor if flops else None, shape, dev)
            issue = _now()
            if dev:
                s = tr.cuda.current_stream()
                es, ee = tr.cuda.Event(enable_timing=True), tr.cuda.Event(enable_timing=True)
                es.record(s)
                out = orig(*a, **kw)
                ee.record(s)
                tr.add_gpu("kernel", name, issue, es, ee, s.stream_id, flops=flops, shape=shape)
            else:
                out = orig(*a, **kw)
                tr.add("kernel", name, issue, issue, _now(), flops=flops, shape=shape)
            if rec is not None and isinstance(out, torch.Tensor):
                _bracket_backward(out, rec)
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


def _group_size(g):
    if g is not None and hasattr(g, "size"):
        return g.size()
    return dist.get_world_size(g) if g is not None else dist.get_world_size()


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
# position of the peer argument of p2p calls (dst / src)
_PEER_POS = {"send": 1, "recv": 1, "isend": 1, "irecv": 1}


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
    """Proxy of an async collective's Work (CPU). wait() records the row on the training thread: the
    end is when wait() returned if the work was still running, else when wait() was called (an upper
    bound). No completion callback: a Python callback on the communication thread must take the
    GIL from the training thread, which cost up to 35 % of a 12 ms CPU step in the benchmark.
    Only get_future() (DDP comm hooks, which never call wait()) falls back to a future callback.
    wait() is also a Python frame in this file, so a stack dump of a rank blocked on it shows that
    it waits for a collective (the C++ wait leaves no Python frame)."""
    __slots__ = ("_work", "_row", "_done", "_coll")

    def __init__(self, work, row, coll=None):
        self._work, self._row, self._done, self._coll = work, row, False, coll

    def _record(self, end_ns):
        if not self._done:
            self._done = True
            tr, kname, issue, nbytes, gid, gsize, step = self._row
            if self._coll is not None:
                tr.end_coll(self._coll, end_ns)
            with tr.buf_lock:
                tr.rows.append((tr.rank, tr.host, "kernel", kname, issue, issue, end_ns, None, None, nbytes, gid, gsize,
                                None, step, None, None))

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


def _tensor_sizes(a, kw) -> list:
    t = a[0] if a else kw.get("tensor")
    ts = t if isinstance(t, (list, tuple)) else [t]
    return [list(x.shape) for x in ts if isinstance(x, torch.Tensor)]


def _timed_collective(tr: _Tracer, fn: str, backend: str | None = None):
    names = {}

    def factory(orig):
        def wrapper(*a, **kw):
            kname = names.get("k")
            if kname is None:  # the backend is known only once the process group exists
                b = backend or dist.get_backend()
                _BACKEND.setdefault("name", "nccl" if b == "nccl" else "gloo")
                kname = names["k"] = ("nccl:" if b == "nccl" else "gloo:") + _COLL_NAMES[fn]
            g = _group_of(kw, a, _GROUP_POS[fn]) if fn != "barrier" else kw.get("group", a[0] if a else None)
            gid, gsize = _group_id(g), _group_size(g)
            if gid not in tr.groups:
                tr.groups[gid] = _group_info(g)
            nbytes = _payload_bytes(fn, a, kw)
            peer = None
            if fn in _PEER_POS:
                peer = kw.get("dst", kw.get("src", a[_PEER_POS[fn]] if len(a) > _PEER_POS[fn] else None))
            coll = tr.begin_coll(fn, gid, nbytes, _tensor_sizes(a, kw), peer)
            issue = coll.issue
            t0 = a[0] if a and isinstance(a[0], torch.Tensor) else None
            if t0 is not None and tr.on_device(t0):
                return _device_collective(tr, fn, orig, a, kw, kname, coll, gid, gsize, nbytes, peer)
            try:
                out = orig(*a, **kw)
            except BaseException:
                tr.end_coll(coll, None, "failed")
                raise
            if out is not None and hasattr(out, "get_future") and fn not in _P2P_FNS:
                coll.work = out
                return _TracedWork(out, (tr, kname, issue, nbytes, gid, gsize, tr.step), coll)
            if out is not None and hasattr(out, "wait") and fn in ("isend", "irecv"):
                coll.work = out
                return _TracedWork(out, (tr, kname, issue, nbytes, gid, gsize, tr.step), coll)
            end = _now()
            tr.end_coll(coll, end)
            tr.add("kernel", kname, issue, issue, end, nbytes=nbytes, group=gid, group_size=gsize)
            return out
        return wrapper
    return factory


def _device_collective(tr, fn, orig, a, kw, kname, coll, gid, gsize, nbytes, peer):
    """A collective on GPU tensors. It runs on the process group's communication stream, which
    the current stream does not wait for: events recorded on the current stream around the enqueue
    of an async collective measure nothing. So: the start event goes on the current stream before
    the enqueue (the communication stream waits for it), the end event is recorded from a callback
    of the Work's future (c10 runs it on a stream that waited for the collective's completion
    events), and synchronous calls are issued async and waited here, which is what
    torch.distributed does for them (so every call has a Work)."""
    cuda = tr.cuda
    s = cuda.current_stream()
    es, ee = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
    es.record(s)
    is_async = kw.get("async_op", False) or fn in ("isend", "irecv")
    call_kw = kw if fn in _P2P_FNS else {**kw, "async_op": True}
    try:
        work = orig(*a, **call_kw)
    except BaseException:
        tr.end_coll(coll, None, "failed")
        raise
    queue = (gid, peer) if fn in _P2P_FNS else gid
    if work is None:  # send/recv: synchronous, the current stream is ordered after them
        ee.record(s)
    else:
        fut = work.get_future()
        fut.then(lambda _f: ee.record())
        coll.work = work
    tr.add_gpu("kernel", kname, coll.issue, es, ee, s.stream_id, nbytes=nbytes, group=gid, group_size=gsize,
               queue=queue, coll=coll, work=work)
    if work is not None and not is_async:
        work.wait()
        return None
    return work


def _group_info(g) -> dict:
    try:
        ranks = dist.get_process_group_ranks(g) if g is not None else list(range(dist.get_world_size()))
    except Exception:
        ranks = []
    return {"desc": getattr(g, "group_desc", "") if g is not None else "default_pg", "ranks": ranks}


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


def _install(tr: _Tracer, trace_kernels: bool, trace_backward: bool = True):
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
        t1 = _now()
        if t0 is not None:
            tr.add("api", "optimizer.step", t0, t0, t1)
        tr.step_ends.append(t1)
        tr.step += 1
        for cb in list(tr.on_step_end):
            cb(tr.step)

    tr._hooks += [register_optimizer_step_pre_hook(pre), register_optimizer_step_post_hook(post)]
    gc.callbacks.append(tr._gc_cb)
    if hasattr(torch, "cuda"):
        tr.patch(torch.cuda, "synchronize", _timed_api(tr, "cuda.synchronize"))
    tr.patch(torch, "save", _timed_api(tr, "checkpoint.save"))
    if trace_kernels:
        tr.patch(F, "linear", _timed_kernel(tr, "gemm", _linear_info, trace_backward))
        for fn in ("matmul", "mm", "bmm"):
            tr.patch(torch, fn, _timed_kernel(tr, "gemm", _matmul_info, trace_backward))
        if hasattr(F, "scaled_dot_product_attention"):  # fused attention (flash / memory-efficient kernels)
            tr.patch(F, "scaled_dot_product_attention", _timed_kernel(tr, "attn_fwd", _sdpa_info, trace_backward))
        if dist.is_available():
            for fn in _COLL_NAMES:
                if hasattr(dist, fn):
                    tr.patch(dist, fn, _timed_collective(tr, fn))
    for spec in filter(None, os.environ.get(ENV_TRACED_API, "").split(",")):
        owner, attr = _resolve(spec)
        tr.patch(owner, attr, _timed_api(tr, spec.strip().replace("@", ".")))


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
