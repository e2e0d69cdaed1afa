"""A model of CUDA streams and events for testing the tracer's device timing on a machine with no
GPU. It models what the timing depends on, ordering: each stream runs its work in order; an event
completes when its stream has run everything enqueued before the record; a stream that waits on an
event starts nothing after the wait until the event completed. Kernels take the durations the test
gives them, so every event has a known time (ms from 0). The API is the part of torch.cuda the
tracer uses (current_stream, Event(enable_timing=True).record/query/elapsed_time, synchronize), plus
a NCCL-like process group whose collectives run on their own communication stream and whose Work's
future runs callbacks on a pool stream ordered after the collective (c10::ivalue::Future semantics).
"""
from __future__ import annotations

import contextlib
import itertools
import math


class Stream:
    _ids = itertools.count(1)

    def __init__(self, gpu: "FakeCuda", name: str):
        self.gpu, self.name, self.stream_id = gpu, name, next(Stream._ids)
        self.ops: list[tuple] = []      # ("kernel", ms, label) | ("wait", event) | ("record", event)
        self.kernels: list[tuple] = []  # (label, start_ms, end_ms), filled as times are computed

    def time_at(self, pos: int) -> float:
        """Time after op `pos` (ms), running the stream in order up to it (a prefix never changes:
        ops are only appended, so times are cached)."""
        cache = self.__dict__.setdefault("_t", [])
        t = cache[-1] if cache else 0.0
        for op in self.ops[len(cache):pos + 1]:
            if op[0] == "kernel":
                self.kernels.append((op[2], t, t + op[1]))
                t += op[1]
            elif op[0] == "wait":
                t = max(t, op[1].time())
            cache.append(t)
        return cache[pos]

    def times(self) -> list[float]:
        if self.ops:
            self.time_at(len(self.ops) - 1)
        return list(self.__dict__.get("_t", []))


class Event:
    def __init__(self, gpu: "FakeCuda", enable_timing: bool = True):
        self.gpu, self.stream, self.pos = gpu, None, None

    def record(self, stream: Stream | None = None):
        s = stream or self.gpu.current_stream()
        s.ops.append(("record", self))
        self.stream, self.pos = s, len(s.ops) - 1

    def time(self) -> float:
        if self.stream is None:
            raise RuntimeError("event never recorded")
        return self.stream.time_at(self.pos)

    def query(self) -> bool:
        return self.time() <= self.gpu.now

    def elapsed_time(self, other: "Event") -> float:
        return other.time() - self.time()


class FakeCuda:
    def __init__(self):
        self.default = Stream(self, "default")
        self._current = self.default
        self.now = 0.0           # device time reached: events up to it have completed
        self.comm: dict[str, Stream] = {}

    # -- the torch.cuda surface the tracer uses
    def current_stream(self) -> Stream:
        return self._current

    def Event(self, enable_timing: bool = True) -> Event:  # noqa: N802 (torch.cuda.Event)
        return Event(self, enable_timing)

    def synchronize(self):
        pass

    # -- what the test drives
    @contextlib.contextmanager
    def stream(self, s: Stream):
        prev, self._current = self._current, s
        try:
            yield s
        finally:
            self._current = prev

    def kernel(self, ms: float, label: str = "compute"):
        self._current.ops.append(("kernel", ms, label))

    def finish(self):
        self.now = math.inf


class FakeGroup:
    def __init__(self, name: str, n: int):
        self.group_name, self._n = name, n

    def size(self) -> int:
        return self._n


class FakeFuture:
    def __init__(self, gpu: FakeCuda, done: Event):
        self.gpu, self.done = gpu, done

    def then(self, cb):
        # c10::ivalue::Future::then on a CUDA future: the callback runs with a pool stream current,
        # made to wait for the future's completion events first
        pool = Stream(self.gpu, "pool")
        pool.ops.append(("wait", self.done))
        with self.gpu.stream(pool):
            cb(self)
        ev = Event(self.gpu)
        ev.record(pool)
        return FakeFuture(self.gpu, ev)


class FakeWork:
    def __init__(self, gpu: FakeCuda, done: Event, ms: float, timing: bool):
        self.gpu, self.done, self.ms, self.timing = gpu, done, ms, timing

    def wait(self):
        # WorkNCCL::wait: the current stream waits for the collective (the CPU does not)
        self.gpu.current_stream().ops.append(("wait", self.done))
        return True

    def is_completed(self) -> bool:
        return self.done.query()

    def get_future(self) -> FakeFuture:
        return FakeFuture(self.gpu, self.done)

    def _get_duration(self) -> float:
        if not self.timing:  # as torch: only with TORCH_NCCL_ENABLE_TIMING=1
            raise RuntimeError("Work._get_duration needs TORCH_NCCL_ENABLE_TIMING=1")
        return self.ms


def collective(gpu: FakeCuda, ms: float, label: str = "allreduce", timing: bool = False):
    """A NCCL-like collective taking `ms` on its group's communication stream; the communication
    stream waits for the current stream at the enqueue (the inputs are ready). timing: its Work
    reports its duration (NCCL with TORCH_NCCL_ENABLE_TIMING=1)."""
    def fn(tensor, group=None, async_op=False):
        name = getattr(group, "group_name", "world")
        cs = gpu.comm.setdefault(name, Stream(gpu, f"comm-{name}"))
        ready = Event(gpu)
        ready.record(gpu.current_stream())
        cs.ops.append(("wait", ready))
        cs.ops.append(("kernel", ms, label))
        done = Event(gpu)
        done.record(cs)
        work = FakeWork(gpu, done, ms, timing)
        if async_op:
            return work
        work.wait()
        return None
    return fn
