"""The tracer's rows: what the training thread records (wall-clock rows, GPU work timed by CUDA
events and finished by the background thread), the parquet files they land in
(landing/timings/<capture>/rank<R>-<n>.parquet, docs/CONTRACT.md 1.4), the background thread itself
(GPU polls, the watchdog's checks, flushes) and the patching of what the hooks time.

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
"""
from __future__ import annotations

import collections
import functools
import gc
import os
import threading
import time
from pathlib import Path

import torch

from fleetscope.collectors.tracer_watchdog import Watchdog, _Coll, _work_duration_ns

COLUMNS = ["rank", "host", "kind", "name", "issue_ns", "start_ns", "end_ns", "stream", "flops", "bytes",
           "group", "group_size", "shape", "step", "microbatch", "model_chunk"]
_I_START, _I_END, _I_STEP = 5, 6, 13
_now = time.time_ns


class _Tracer(Watchdog):
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
        self._before: tuple[Path, int] | None = None   # (earlier capture's folder, switch time): see switch_capture
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

    def switch_capture(self, capture: str, at_ns: int | None = None) -> None:
        """Write the rows buffered so far to the current capture, then record into `capture` (the
        profiler capture uses it so a profile's traces and timings share one capture id). Rows that
        started before `at_ns` but end later (the op around the hook that switched, a GC during the
        profiler's own start) still go to the capture they started in."""
        if capture == self.capture:
            return
        self.flush()
        with self.lock:
            self._before = (self.out_dir, at_ns) if at_ns is not None else None
            self.capture = capture
            self.out_dir = self.landing / "timings" / capture
            self.out_dir.mkdir(parents=True, exist_ok=True)

    # -- writing ---------------------------------------------------------------------------
    def flush(self):
        with self.lock:
            if self.use_cuda:
                self._poll_gpu()
            with self.buf_lock:
                rows, self.rows = self.rows, []
            if not rows:
                return None
            if self._before is not None:
                d, at = self._before
                early = [r for r in rows if r[_I_START] < at]
                if early:
                    self._write(early, d)
                    rows = [r for r in rows if r[_I_START] >= at]
                    if not rows:
                        return None
            return self._write(rows, self.out_dir)

    def _write(self, rows: list[tuple], out_dir: Path) -> Path:
        import pyarrow as pa
        import pyarrow.parquet as pq

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
        path = out_dir / f"rank{self.rank}-{self.n_files:05d}.parquet"
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
