"""What the tracer times and how: Python APIs (DataLoader next, optimizer.step, GC, synchronize,
save, and FLEETSCOPE_TRACED_PYTHON_API), GEMMs and attention with FLOPs from shapes (forward, and
backward through their autograd nodes), torch.distributed collectives with bytes, group and peer.
`_install(tracer, ...)` patches them all; each wrapper records into the tracer (tracer_rows)."""
from __future__ import annotations

import gc
import importlib
import os
import time
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist



from fleetscope.collectors.tracer_watchdog import BACKEND, P2P_FNS

if TYPE_CHECKING:
    from fleetscope.collectors.tracer_rows import _Tracer

ENV_TRACED_API = "FLEETSCOPE_TRACED_PYTHON_API"
_DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64"}
_now = time.time_ns


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
                BACKEND.setdefault("name", "nccl" if b == "nccl" else "gloo")
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
            if out is not None and hasattr(out, "get_future") and fn not in P2P_FNS:
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
    call_kw = kw if fn in P2P_FNS else {**kw, "async_op": True}
    try:
        work = orig(*a, **call_kw)
    except BaseException:
        tr.end_coll(coll, None, "failed")
        raise
    queue = (gid, peer) if fn in P2P_FNS else gid
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
