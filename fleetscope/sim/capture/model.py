"""Kernel-level execution model of one Megatron-style training job (TP x PP x DP, 1F1B).

Every rank of a pipeline stage runs the same program, so a stage is simulated as one vector of
ranks (shape dp*tp, index d*tp + t): each program instruction updates all of the stage's ranks at
once with numpy. What couples ranks:
- TP all-reduce: one end time per TP group (max of the members' starts + transfer), so a slow
  rank's peers wait inside their NCCL kernel;
- DP all-reduce buckets at the last microbatch's backward: one end per DP group;
- PP send/recv: a recv ends at max(sender ready, recv posted) + transfer; the receiver's CPU then
  synchronizes (Megatron's batch_p2p_sync does torch.cuda.synchronize after batch_isend_irecv),
  which bounds how far the CPU runs ahead, so CPU stalls (GC, data loading, CPU-bound Python,
  extra synchronizes) turn into GPU idle time as they do on real jobs.
A CPU thread launches kernels (aten op overhead + cudaLaunchKernel); a kernel starts at
max(launch + issue latency, its stream's previous kernel end, event waits).

The result is a list of records (one per program instruction, arrays over the stage's ranks) that
the renderers turn into Chrome traces and timing rows.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fleetscope.sim.capture.faults import RankEffects

# hardware (H100 SXM-like)
PEAK_BF16 = 989e12
GEMM_EFF = 0.62
GEMM_EFF_MISALIGNED = 0.36     # n=8484 is not a multiple of the tile: align1 kernel, poor tensor-core use
ATTN_EFF = 0.42
HBM_BPS = 3.0e12
NVLINK_BUSBW = 360e9
PCIE_BUSBW = 22e9
NIC_BPS = 46e9
NCCL_LAT_NS = 12_000
LAUNCH_NS = 5_000              # cudaLaunchKernel duration
ATEN_NS = 14_000               # python + aten overhead before a launch
ISSUE_MIN_NS = 3_000           # launch end -> earliest kernel start
SMALL_API_NS = 2_000
SPATIAL_SIGMA = 0.005          # per-GPU static speed spread (lognormal sigma)

# model
HIDDEN = 4096
SEQ = 4096
FFN_PER_TP = 8512
FFN_MISALIGNED = 8484

STREAM_COMPUTE, STREAM_TP, STREAM_DP, STREAM_SEND_NEXT, STREAM_SEND_PREV, STREAM_RECV_PREV, STREAM_RECV_NEXT = 7, 20, 24, 28, 32, 36, 40
ALL_STREAMS = (STREAM_COMPUTE, STREAM_TP, STREAM_DP, STREAM_SEND_NEXT, STREAM_SEND_PREV, STREAM_RECV_PREV, STREAM_RECV_NEXT)

GEMM_KERNEL = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas"
GEMM_KERNEL_ALIGN1 = "sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64_stage6_warpsize2x2x1_tensor16x8x16_align1_execute_kernel__5x_cublas"
FLASH_FWD = "flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t, Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> >, false, true, false, false, false, true, false, false>(Flash_fwd_params)"
FLASH_BWD = "flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, false, false, cutlass::bfloat16_t, Flash_kernel_traits<128, 64, 128, 8, cutlass::bfloat16_t> >, true, false, false, false, false, false, true>(Flash_bwd_params)"
LAYERNORM = "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>(int, float, c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, c10::BFloat16*)"
LAYERNORM_BWD = "void at::native::(anonymous namespace)::layer_norm_grad_input_kernel_vectorized<c10::BFloat16, float>(c10::BFloat16 const*, c10::BFloat16 const*, float const*, float const*, c10::BFloat16 const*, c10::BFloat16*, int)"
GELU = "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::operator()() const::{lambda(c10::BFloat16)#1}, at::detail::Array<char*, 2> >(int, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::operator()() const::{lambda(c10::BFloat16)#1}, at::detail::Array<char*, 2>)"
GELU_BWD = "void at::native::vectorized_elementwise_kernel<4, at::native::GeluBackwardCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::operator()() const::{lambda(c10::BFloat16, c10::BFloat16)#1}, at::detail::Array<char*, 3> >(int, at::native::GeluBackwardCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::operator()() const::{lambda(c10::BFloat16, c10::BFloat16)#1}, at::detail::Array<char*, 3>)"
ADD = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, at::detail::Array<char*, 3>)"
ADAM = "void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float, float, float>, float, float, float, float, float, float, adamMode_t, float>(long, int volatile*, TensorListMetadata<4>, AdamFunctor<float, float, float>, float, float, float, float, float, float, adamMode_t, float)"
XENT = "void (anonymous namespace)::cunn_SoftMaxForward<4, c10::BFloat16, float, c10::BFloat16, (anonymous namespace)::LogSoftMaxForwardEpilogue>(c10::BFloat16*, c10::BFloat16 const*, int)"
NCCL_AR = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
NCCL_SENDRECV = "ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)"
NCCL_RS = "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
NCCL_AG = "ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
MEMCPY_H2D = "Memcpy HtoD (Pinned -> Device)"
MEMSET = "Memset (Device)"

PY_STEP = "megatron/training/training.py(812): train_step"
PY_SCHED = "megatron/core/pipeline_parallel/schedules.py(1209): forward_backward_pipelining_without_interleaving"
PY_FWD_STEP = "megatron/core/pipeline_parallel/schedules.py(219): forward_step"
PY_BWD_STEP = "megatron/core/pipeline_parallel/schedules.py(330): backward_step"
PY_GET_BATCH = "pretrain_gpt.py(98): get_batch"
PY_DL_NEXT = "torch/utils/data/dataloader.py(631): __next__"
PY_DL_NEXT_DATA = "torch/utils/data/dataloader.py(1329): _next_data"
PY_RECV_INTO = "<built-in method recv_into of _socket.socket object>"
PY_GRAD_MODE = "torch/autograd/grad_mode.py(84): __init__"
PY_MODEL_FWD = "megatron/core/models/gpt/gpt_model.py(245): forward"
PY_LAYER_FWD = "megatron/core/transformer/transformer_layer.py(172): forward"
PY_SYNC = "torch/cuda/__init__.py(792): synchronize"
PY_AUTOGRAD = "torch/autograd/__init__.py(251): backward"
PY_RUN_BWD = "<built-in method run_backward of torch._C._EngineBase object>"
PY_OPT = "megatron/core/optimizer/optimizer.py(410): step"
PY_RECV_FWD = "megatron/core/pipeline_parallel/p2p_communication.py(383): recv_forward"
PY_RECV_BWD = "megatron/core/pipeline_parallel/p2p_communication.py(406): recv_backward"
PY_SEND_FWD = "megatron/core/pipeline_parallel/p2p_communication.py(429): send_forward"
PY_SEND_BWD = "megatron/core/pipeline_parallel/p2p_communication.py(451): send_backward"
PY_ITEM = "megatron/training/training.py(860): reduce_loss"


@dataclass
class Rec:
    """One program instruction executed by every rank of a stage (arrays over those ranks)."""
    cat: str                 # python_function | cpu_op | cuda_runtime | kernel | gpu_memcpy | cuda_sync | user_annotation | op
    name: str
    ranks: np.ndarray
    ts: np.ndarray
    dur: np.ndarray
    stream: int | None = None
    corr: int | None = None
    ext: int | None = None
    args: dict = field(default_factory=dict)
    step: int = -1
    microbatch: int = -1
    # timings (docs/CONTRACT.md 1.4)
    tkind: str | None = None     # kernel | api | op
    tname: str | None = None
    flops: float | None = None
    nbytes: int | None = None
    group: str | None = None
    group_size: int | None = None
    shape: str | None = None
    issue: np.ndarray | None = None
    pyid: int | None = None
    pyparent: int | None = None
    thread: str = "main"     # main | autograd (backward ops run on the autograd engine's thread)


@dataclass
class Layout:
    tp: int
    pp: int
    dp: int

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    def rank(self, s, d, t):
        # Megatron's default order: tp fastest, then dp, then pp
        return s * self.dp * self.tp + d * self.tp + t

    def coords(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        r = np.arange(self.world)
        return r // (self.dp * self.tp), (r // self.tp) % self.dp, r % self.tp


class Stage:
    """The ranks of one pipeline stage and their CPU / stream clocks."""

    def __init__(self, sim: "JobSim", s: int):
        L = sim.layout
        self.sim, self.s = sim, s
        self.ranks = np.array([L.rank(s, d, t) for d in range(L.dp) for t in range(L.tp)])
        self.n = len(self.ranks)
        self.cpu = np.full(self.n, sim.t0, dtype=np.int64)
        self.streams = {k: np.full(self.n, sim.t0, dtype=np.int64) for k in ALL_STREAMS}
        self.pystack: list[tuple[str, np.ndarray, int, int | None, dict]] = []
        self.pyid = 0
        self.corr = 1000
        self.ext = 100
        self.step = -1
        self.mb = -1
        self.thread = "main"
        self.cf = sim.eff.compute_factor[self.ranks] * sim.spatial[self.ranks]

    # ------------------------------------------------------------------ primitives
    def jit(self, base_ns, sigma=0.03) -> np.ndarray:
        return np.maximum(1, np.asarray(base_ns, dtype=float) * np.exp(self.sim.rng.normal(0, sigma, self.n))).astype(np.int64)

    def rec(self, **kw) -> Rec:
        r = Rec(ranks=self.ranks, step=self.step, microbatch=self.mb, thread=self.thread, **kw)
        self.sim.recs.append(r)
        return r

    def py_enter(self, name: str, api: str | None = None):
        self.pyid += 1
        parent = self.pystack[-1][2] if self.pystack else None
        self.pystack.append((name, self.cpu.copy(), self.pyid, parent, {"api": api, "step": self.step, "mb": self.mb}))
        self.cpu = self.cpu + self.jit(1_500, 0.2)

    def py_exit(self):
        name, t0, pid, parent, meta = self.pystack.pop()
        self.cpu = self.cpu + self.jit(1_000, 0.2)
        r = Rec(cat="python_function", name=name, ranks=self.ranks, ts=t0, dur=self.cpu - t0, pyid=pid, pyparent=parent,
                step=meta["step"], microbatch=meta["mb"])
        if meta["api"]:
            r.tkind, r.tname, r.issue = "api", meta["api"], t0
        self.sim.recs.append(r)

    def cpu_work(self, ns):
        self.cpu = self.cpu + np.asarray(ns, dtype=np.int64)

    def runtime(self, name: str, dur_ns, ext: int, corr: int | None = None) -> np.ndarray:
        ts = self.cpu.copy()
        d = self.jit(dur_ns, 0.15)
        self.cpu = self.cpu + d
        self.corr += 1
        c = self.corr if corr is None else corr
        self.rec(cat="cuda_runtime", name=name, ts=ts, dur=d, corr=c, ext=ext, args={"cbid": _CBID.get(name, 0)})
        return ts + d

    def event_record(self, stream: int, ext: int) -> tuple[np.ndarray, int]:
        self.runtime("cudaEventRecord", SMALL_API_NS, ext)
        return self.streams[stream].copy(), self.corr

    def stream_wait(self, target: int, ev: tuple[np.ndarray, int], src_stream: int, ext: int):
        when, rec_corr = ev
        end = self.runtime("cudaStreamWaitEvent", SMALL_API_NS, ext)
        ts = np.maximum(end, self.streams[target])
        self.rec(cat="cuda_sync", name="Stream Wait Event", ts=ts, dur=np.full(self.n, 1_000, np.int64), stream=target,
                 corr=self.corr, ext=ext, args={"cuda_sync_kind": "Stream Wait Event", "wait_on_stream": src_stream,
                                                "wait_on_cuda_event_record_corr_id": rec_corr})
        self.streams[target] = np.maximum(self.streams[target], when)

    def kernel(self, cpu_op: str, kname: str, stream: int, dur_ns: np.ndarray, *, cat: str = "kernel", tname=None,
               flops=None, nbytes=None, shape=None, group=None, group_size=None, args=None, collective_axis=None,
               ready=None, pre_sync: bool = False) -> Rec:
        """aten op -> cudaLaunchKernel -> kernel. collective_axis 'tp' / 'dp': end aligned over that group."""
        self.ext += 1
        ext = self.ext
        op_ts = self.cpu.copy()
        self.cpu = self.cpu + self.jit(ATEN_NS, 0.25)
        if pre_sync:  # the NCCL stream waits for the compute stream's work (cudaEventRecord + cudaStreamWaitEvent)
            ev = self.event_record(STREAM_COMPUTE, ext)
            self.stream_wait(stream, ev, STREAM_COMPUTE, ext)
        launch_ts = self.cpu.copy()
        api = {"gpu_memcpy": "cudaMemcpyAsync", "gpu_memset": "cudaMemsetAsync"}.get(cat, "cudaLaunchKernel")
        launch_end = self.runtime(api, LAUNCH_NS, ext)
        corr = self.corr
        start = np.maximum(self.streams[stream], launch_end + self.jit(ISSUE_MIN_NS, 0.3))
        if ready is not None:
            start = np.maximum(start, ready)
        dur = self.jit(dur_ns, 0.02)
        end = start + dur
        if collective_axis is not None:
            L = self.sim.layout
            e2 = end.reshape(L.dp, L.tp)
            e2 = np.broadcast_to(e2.max(axis=1 if collective_axis == "tp" else 0, keepdims=True), e2.shape)
            end = e2.reshape(-1).copy()
        self.streams[stream] = end
        self.cpu = self.cpu + self.jit(2_000, 0.2)
        self.rec(cat="cpu_op", name=cpu_op, ts=op_ts, dur=self.cpu - op_ts, ext=ext,
                 args=({k: v for k, v in (args or {}).items()} if cpu_op == "record_param_comms" else {}))
        r = self.rec(cat=cat, name=kname, ts=start, dur=end - start, stream=stream, corr=corr, ext=ext, args=args or {},
                     tname=tname, tkind="kernel" if tname else None, flops=flops, nbytes=nbytes, shape=shape,
                     group=group, group_size=group_size)
        r.issue = launch_ts  # issue_ns: when the CPU called cudaLaunchKernel
        return r

    def device_sync(self, streams=(STREAM_COMPUTE, STREAM_TP, STREAM_DP, STREAM_RECV_PREV, STREAM_RECV_NEXT), kind="Context Sync",
                    api_name="cudaDeviceSynchronize"):
        self.ext += 1
        ts = self.cpu.copy()
        gpu_done = np.max(np.stack([self.streams[k] for k in streams]), axis=0)
        self.corr += 1
        end = np.maximum(ts + self.jit(3_000, 0.2), gpu_done + self.jit(2_000, 0.2))
        self.rec(cat="cuda_runtime", name=api_name, ts=ts, dur=end - ts, corr=self.corr, ext=self.ext,
                 args={"cbid": _CBID[api_name]})
        sync_ts = np.maximum(ts, gpu_done - 1_000)
        self.rec(cat="cuda_sync", name=kind, ts=sync_ts, dur=np.maximum(end - sync_ts, 1_000), stream=-1 if kind == "Context Sync" else STREAM_COMPUTE,
                 corr=self.corr, ext=self.ext, args={"cuda_sync_kind": kind})
        self.cpu = end


_CBID = {"cudaMemsetAsync": 51, "cudaLaunchKernel": 211, "cudaEventRecord": 135, "cudaStreamWaitEvent": 147, "cudaDeviceSynchronize": 165,
         "cudaStreamSynchronize": 131, "cudaMemcpyAsync": 41}


class JobSim:
    """Runs the 1F1B program of every stage over n_steps and collects records."""

    def __init__(self, job, eff: RankEffects, seed: int, t0: int, micro_batch: int = 1):
        self.job, self.eff = job, eff
        self.layout = Layout(job.tp, job.pp, job.dp)
        if self.layout.world != len(job.ips):
            raise ValueError(f"job {job.job_id}: tp*pp*dp = {self.layout.world} but {len(job.ips)} ips were given")
        self.rng = np.random.default_rng(seed)
        # GPUs of one model differ slightly in speed (silicon, cooling): a static per-rank factor
        self.spatial = np.exp(np.random.default_rng([seed, 101]).normal(0, SPATIAL_SIGMA, self.layout.world))
        self.t0 = t0
        self.mb_size = micro_batch
        self.recs: list[Rec] = []
        self.ops: list[dict] = []            # op rows (forward-compute, ...)
        self.layers = max(1, job.n_layers // job.pp)
        self.zero = getattr(job, "dp_mode", "allreduce") == "zero"
        self.sends: dict[tuple, dict] = {}   # (dir, step, mb, src_stage) -> send info
        self.recv_done: dict[tuple, np.ndarray] = {}
        self.stages = [Stage(self, s) for s in range(job.pp)]
        self.step_bounds: dict[int, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
        self.hosts = np.array(job.hosts)
        self._nvl_rank = eff.nvlink_down

    # ------------------------------------------------------------ sizes
    @property
    def tokens(self) -> int:
        return self.mb_size * SEQ

    def gemm_ns(self, st: Stage, m, n, k, eff=GEMM_EFF) -> tuple[np.ndarray, float]:
        flops = 2.0 * m * n * k
        return (flops / (PEAK_BF16 * eff) * 1e9) * st.cf, flops

    def mem_ns(self, st: Stage, nbytes) -> np.ndarray:
        return (nbytes / HBM_BPS * 1e9 + 3_000) * st.cf

    def intra_host(self, ranks_2d: np.ndarray) -> np.ndarray:
        """For groups given as rows of global ranks: True where the group lives on one host."""
        h = self.hosts[ranks_2d]
        return (h == h[:, :1]).all(axis=1)

    def allreduce_ns(self, st: Stage, nbytes: int, axis: str, ring_factor: float | None = None) -> np.ndarray:
        """Per-rank collective time: ring bus bandwidth set by the group's slowest link. ring_factor is the
        share of the buffer each rank moves: 2(n-1)/n for all-reduce (default), (n-1)/n for
        reduce-scatter / all-gather."""
        L = self.layout
        n = L.tp if axis == "tp" else L.dp
        r2 = st.ranks.reshape(L.dp, L.tp)
        groups = r2 if axis == "tp" else r2.T
        intra = self.intra_host(groups)
        nvl_down = self._nvl_rank[groups].any(axis=1)
        bw = np.where(intra, np.where(nvl_down, PCIE_BUSBW, NVLINK_BUSBW), NIC_BPS)
        f = 2 * (n - 1) / n if ring_factor is None else ring_factor
        t = nbytes * f / bw * 1e9 + NCCL_LAT_NS
        per_group = np.broadcast_to(t[:, None], groups.shape)
        out = per_group if axis == "tp" else per_group.T
        return np.ascontiguousarray(out).reshape(-1)

    def nccl_args(self, coll: str, nelems: int, group: str, ranks: list[int]) -> dict:
        return {"Collective name": coll, "In msg nelems": int(nelems), "Out msg nelems": int(nelems), "Group size": len(ranks),
                "dtype": "BFloat16", "In split size": "[]", "Out split size": "[]", "Process Group Name": group,
                "Process Group Description": group.split(":")[0], "Process Group Ranks": str(ranks)}

    def pg_of(self, rank: int, group: str) -> tuple[str, list[int]]:
        """Process-group name and member ranks of `rank` for a group kind (tp, dp) or a pp pair name."""
        L = self.layout
        s, d, t = rank // (L.dp * L.tp), (rank // L.tp) % L.dp, rank % L.tp
        if group == "tp":
            return f"tp:{s}.{d}", [L.rank(s, d, tt) for tt in range(L.tp)]
        if group == "dp":
            return f"dp:{s}.{t}", [L.rank(s, dd, t) for dd in range(L.dp)]
        if group.startswith("pp:"):
            lo, hi = (int(x) for x in group[3:].split("-"))
            return f"{group}.{d}.{t}", [L.rank(lo, d, t), L.rank(hi, d, t)]
        return group, []

    def group_ranks(self, st: Stage, axis: str, d: int = 0, t: int = 0) -> list[int]:
        L = self.layout
        if axis == "tp":
            return [L.rank(st.s, d, tt) for tt in range(L.tp)]
        return [L.rank(st.s, dd, t) for dd in range(L.dp)]

    # ------------------------------------------------------------ collectives
    def tp_allreduce(self, st: Stage, nbytes: int, label: str):
        if self.layout.tp == 1:
            return
        grp = "tp"  # resolved per rank at render time (tp:<stage>.<dp index>)
        ranks = self.group_ranks(st, "tp")
        args = self.nccl_args("allreduce", nbytes // 2, grp, ranks)
        st.kernel("record_param_comms", NCCL_AR, STREAM_TP, self.allreduce_ns(st, nbytes, "tp"), tname="nccl:AllReduce",
                  nbytes=nbytes, group=grp, group_size=self.layout.tp, args=args, collective_axis="tp", pre_sync=True)
        ev = st.event_record(STREAM_TP, st.ext)
        st.stream_wait(STREAM_COMPUTE, ev, STREAM_TP, st.ext)

    # ------------------------------------------------------------ programs
    def layer_forward(self, st: Stage, l: int):
        m, H, tp = self.tokens, HIDDEN, self.layout.tp
        ffn = FFN_MISALIGNED if self.eff.misaligned else FFN_PER_TP
        act = m * H * 2
        st.py_enter(PY_LAYER_FWD)
        st.kernel("aten::native_layer_norm", LAYERNORM, STREAM_COMPUTE, self.mem_ns(st, 2 * act))
        self._gemm(st, "qkv", m, 3 * H // tp, H)
        attn_flops = 4.0 * self.mb_size * SEQ * SEQ * H / tp / 2  # causal
        st.kernel("FlashAttnFunc", FLASH_FWD, STREAM_COMPUTE, attn_flops / (PEAK_BF16 * ATTN_EFF) * 1e9 * st.cf,
                  tname="flash_attn_fwd", flops=attn_flops, shape=f"b={self.mb_size},s={SEQ},h={H // tp},dtype=bf16")
        self._gemm(st, "proj", m, H, H // tp)
        self.tp_allreduce(st, act, "attn")
        st.kernel("aten::add", ADD, STREAM_COMPUTE, self.mem_ns(st, 3 * act))
        st.kernel("aten::native_layer_norm", LAYERNORM, STREAM_COMPUTE, self.mem_ns(st, 2 * act))
        self._gemm(st, "fc1", m, ffn, H, misaligned=self.eff.misaligned)
        st.kernel("aten::gelu", GELU, STREAM_COMPUTE, self.mem_ns(st, 2 * m * ffn * 2))
        self._gemm(st, "fc2", m, H, ffn)
        self.tp_allreduce(st, act, "mlp")
        st.kernel("aten::add", ADD, STREAM_COMPUTE, self.mem_ns(st, 3 * act))
        if self.eff.sync_in_forward_s > 0:
            # an unnecessary torch.cuda.synchronize() (e.g. a .item() for logging) inside the layer's forward
            st.py_enter(PY_SYNC, api="cuda.synchronize")
            st.device_sync()
            st.py_exit()
            # magnitude is per forward microbatch (as the fleet simulator states it), spread over the layers
            st.cpu_work(st.jit(self.eff.sync_in_forward_s * 1e9 / self.layers, 0.1))
        st.py_exit()

    def layer_backward(self, st: Stage, l: int, dp_bucket: bool):
        m, H, tp = self.tokens, HIDDEN, self.layout.tp
        ffn = FFN_MISALIGNED if self.eff.misaligned else FFN_PER_TP
        act = m * H * 2
        self._gemm(st, "fc2_dgrad", m, ffn, H)
        self._gemm(st, "fc2_wgrad", ffn, H, m)
        st.kernel("GeluBackward0", GELU_BWD, STREAM_COMPUTE, self.mem_ns(st, 3 * m * ffn * 2))
        self._gemm(st, "fc1_dgrad", m, H, ffn, misaligned=self.eff.misaligned)
        self._gemm(st, "fc1_wgrad", H, ffn, m, misaligned=self.eff.misaligned)
        self.tp_allreduce(st, act, "mlp_bwd")
        st.kernel("NativeLayerNormBackward0", LAYERNORM_BWD, STREAM_COMPUTE, self.mem_ns(st, 3 * act))
        self._gemm(st, "proj_dgrad", m, H // tp, H)
        self._gemm(st, "proj_wgrad", H, H // tp, m)
        attn_flops = 2.5 * 4.0 * self.mb_size * SEQ * SEQ * H / tp / 2
        st.kernel("FlashAttnFuncBackward", FLASH_BWD, STREAM_COMPUTE, attn_flops / (PEAK_BF16 * ATTN_EFF) * 1e9 * st.cf,
                  tname="flash_attn_bwd", flops=attn_flops, shape=f"b={self.mb_size},s={SEQ},h={H // tp},dtype=bf16")
        self._gemm(st, "qkv_dgrad", m, H, 3 * H // tp)
        self._gemm(st, "qkv_wgrad", 3 * H // tp, H, m)
        self.tp_allreduce(st, act, "attn_bwd")
        st.kernel("NativeLayerNormBackward0", LAYERNORM_BWD, STREAM_COMPUTE, self.mem_ns(st, 3 * act))
        if dp_bucket and self.layout.dp > 1:
            # this layer's gradients are ready: a bucket collective on the DP NCCL stream, overlapping the rest
            # of the backward (DDP all-reduce, or the distributed optimizer's reduce-scatter)
            params = self.layer_params()
            nbytes = params * 2
            grp = "dp"  # resolved per rank at render time (dp:<stage>.<tp index>)
            n = self.layout.dp
            if self.zero:
                args = self.nccl_args("_reduce_scatter_base", params, grp, self.group_ranks(st, "dp"))
                args["Out msg nelems"] = params // n
                st.kernel("record_param_comms", NCCL_RS, STREAM_DP, self.allreduce_ns(st, nbytes, "dp", (n - 1) / n),
                          tname="nccl:ReduceScatter", nbytes=nbytes, group=grp, group_size=n, args=args, collective_axis="dp",
                          pre_sync=True)
            else:
                args = self.nccl_args("allreduce", params, grp, self.group_ranks(st, "dp"))
                st.kernel("record_param_comms", NCCL_AR, STREAM_DP, self.allreduce_ns(st, nbytes, "dp"), tname="nccl:AllReduce",
                          nbytes=nbytes, group=grp, group_size=n, args=args, collective_axis="dp", pre_sync=True)

    def layer_params(self) -> int:
        H, tp = HIDDEN, self.layout.tp
        ffn = FFN_MISALIGNED if self.eff.misaligned else FFN_PER_TP
        return 4 * H * H // tp + 2 * H * ffn

    def _gemm(self, st: Stage, which: str, m: int, n: int, k: int, misaligned: bool = False):
        eff = GEMM_EFF_MISALIGNED if misaligned else GEMM_EFF
        ns, flops = self.gemm_ns(st, m, n, k, eff)
        st.kernel("aten::mm", GEMM_KERNEL_ALIGN1 if misaligned else GEMM_KERNEL, STREAM_COMPUTE, ns, tname="gemm", flops=flops,
                  shape=f"m={m},n={n},k={k},dtype=bf16", args={"grid": [132, 1, 1], "block": [384, 1, 1]})

    def op_row(self, st: Stage, name: str, t_start: np.ndarray, t_end: np.ndarray):
        # an op starts when both the CPU reaches it and the GPU has drained the work queued before it
        start = np.maximum(t_start, self._gpu_at_enter.get(id(t_start), t_start))
        self.ops.append({"name": name, "ranks": st.ranks, "start": start, "end": np.maximum(t_end, start), "step": st.step,
                         "mb": st.mb, "stage": st.s})

    def op_start(self, st: Stage) -> np.ndarray:
        t = st.cpu.copy()
        self._gpu_at_enter[id(t)] = st.streams[STREAM_COMPUTE].copy()
        return t

    def forward_compute(self, st: Stage, mb: int):
        st.mb = mb
        t_op = self.op_start(st)
        st.py_enter(PY_FWD_STEP)
        st.py_enter(PY_GET_BATCH)
        st.py_enter(PY_DL_NEXT, api="dataloader.next")
        st.py_enter(PY_DL_NEXT_DATA)
        st.py_enter(PY_RECV_INTO)
        st.cpu_work(st.jit(250_000 + self.eff.dataloader_s[st.ranks] * 1e9, 0.05))
        st.py_exit()
        st.py_exit()
        st.py_exit()
        st.py_exit()
        # garbage collection fires inside whatever Python runs next (PerfTracker 6.2 problem 3)
        gc = np.where(self.eff.gc_ranks[st.ranks] & (self._gc_pick(st)), self.eff.gc_pause_s * 1e9, 0.0)
        st.kernel("aten::copy_", MEMCPY_H2D, STREAM_COMPUTE, np.full(st.n, self.tokens * 8 / 20e9 * 1e9 + 2_000), cat="gpu_memcpy",
                  args={"bytes": self.tokens * 8})
        st.py_enter(PY_GRAD_MODE)
        t_gc = st.cpu + 1_000
        st.cpu_work(st.jit(3_000 + gc, 0.02))
        st.py_exit()
        if gc.any():
            g = gc > 0
            r = Rec(cat="api", name="gc", ranks=st.ranks[g], ts=t_gc[g], dur=gc[g].astype(np.int64), step=st.step,
                    microbatch=mb, tkind="api", tname="gc")
            r.issue = r.ts
            self.recs.append(r)
        st.py_enter(PY_MODEL_FWD)
        st.cpu_work(st.jit(150_000 + self.eff.forward_cpu_s[st.ranks] * 1e9, 0.05))
        st.kernel("aten::embedding" if st.s == 0 else "aten::copy_", ADD, STREAM_COMPUTE, self.mem_ns(st, self.tokens * HIDDEN * 2))
        for l in range(self.layers):
            self.layer_forward(st, l)
        if st.s == self.layout.pp - 1:
            st.kernel("aten::_log_softmax", XENT, STREAM_COMPUTE, self.mem_ns(st, self.tokens * 32000 * 2 // self.layout.tp))
        st.py_exit()
        st.py_exit()
        self.op_row(st, "forward-compute", t_op, np.maximum(st.cpu, st.streams[STREAM_COMPUTE]))

    def _gc_pick(self, st: Stage) -> np.ndarray:
        # one pause per affected rank and step, at a rank-specific microbatch
        want = (st.ranks * 7 + st.step * 3 + self.job.seed) % max(1, self.job.n_microbatches)
        return want == st.mb

    def backward_compute(self, st: Stage, mb: int):
        st.mb = mb
        t_op = self.op_start(st)
        last = mb == self.job.n_microbatches - 1
        st.py_enter(PY_BWD_STEP)
        st.py_enter(PY_AUTOGRAD)
        st.py_enter(PY_RUN_BWD)
        st.thread = "autograd"  # the main thread blocks in run_backward while the engine's thread launches
        st.cpu_work(st.jit(20_000, 0.2))
        if st.s == self.layout.pp - 1:
            st.kernel("LogSoftmaxBackward0", XENT, STREAM_COMPUTE, self.mem_ns(st, self.tokens * 32000 * 2 // self.layout.tp))
        for l in range(self.layers):
            self.layer_backward(st, l, dp_bucket=last)
        st.thread = "main"
        st.py_exit()
        st.py_exit()
        st.py_exit()
        self.op_row(st, "backward-compute", t_op, np.maximum(st.cpu, st.streams[STREAM_COMPUTE]))
        if last and self.layout.dp > 1:
            self.op_row(st, "grads-reduce-scatter" if self.zero else "grads-all-reduce", t_op, st.streams[STREAM_DP].copy())

    def p2p(self, st: Stage, direction: str, send: bool, mb: int):
        """direction 'fwd' (activations to the next stage) or 'bwd' (gradients to the previous)."""
        L = self.layout
        st.mb = mb
        nbytes = self.tokens * HIDDEN * 2 // L.tp
        peer_stage = st.s + (1 if (direction == "fwd") == send else -1)
        key = (direction, st.step, mb, st.s if send else peer_stage)
        t_op = self.op_start(st)
        name = {("fwd", True): PY_SEND_FWD, ("fwd", False): PY_RECV_FWD, ("bwd", True): PY_SEND_BWD, ("bwd", False): PY_RECV_BWD}[(direction, send)]
        opname = {("fwd", True): "forward-send", ("fwd", False): "forward-recv", ("bwd", True): "backward-send", ("bwd", False): "backward-recv"}[(direction, send)]
        st.py_enter(name)
        lo, hi = sorted((st.s, peer_stage))
        grp = f"pp:{lo}-{hi}"
        peers = [int(L.rank(peer_stage, 0, 0))]
        args = self.nccl_args("send" if send else "recv", nbytes // 2, grp, sorted([int(st.ranks[0]), peers[0]]))
        args["Group size"] = 2
        if send:
            stream = STREAM_SEND_NEXT if peer_stage > st.s else STREAM_SEND_PREV
            r = st.kernel("record_param_comms", NCCL_SENDRECV, stream, np.ones(st.n), tname="nccl:Send", nbytes=nbytes,
                          group=grp, group_size=2, args=args, pre_sync=True)
            self.sends[key] = {"rec": r, "ready": r.ts.copy(), "stream": stream, "stage": st}
            st.py_exit()
            self.op_row(st, opname, t_op, st.cpu.copy())
            self.pending_send_ops.append((key, len(self.ops) - 1))
        else:
            snd = self.sends.pop(key)
            stream = STREAM_RECV_PREV if peer_stage < st.s else STREAM_RECV_NEXT
            transfer = nbytes / NIC_BPS * 1e9 + 8_000
            if (self.hosts[st.ranks] == self.hosts[snd["stage"].ranks]).all():
                transfer = nbytes / NVLINK_BUSBW * 1e9 + 8_000
            r = st.kernel("record_param_comms", NCCL_SENDRECV, stream, np.ones(st.n), tname="nccl:Recv", nbytes=nbytes,
                          group=grp, group_size=2, args=args)
            # the transfer starts when both sides are there; the sender's kernel on its own stream ends with it
            sr = snd["rec"]
            prev_end = self.send_stream_end.get((snd["stage"].s, snd["stream"]), np.zeros(st.n, np.int64))
            s_start = np.maximum(snd["ready"], prev_end)
            end = np.maximum(s_start, r.ts) + st.jit(transfer, 0.03)
            sr.ts, sr.dur = s_start, end - s_start
            self.send_stream_end[(snd["stage"].s, snd["stream"])] = end
            r.dur = end - r.ts
            st.streams[stream] = end
            st.py_enter(PY_SYNC, api="cuda.synchronize")
            st.device_sync()
            st.py_exit()
            st.py_exit()
            self.op_row(st, opname, t_op, st.cpu.copy())

    def optimizer(self, st: Stage):
        st.mb = -1
        t_op = self.op_start(st)
        st.py_enter(PY_OPT, api="optimizer.step")
        if self.layout.dp > 1:
            st.ext += 1
            ev = st.event_record(STREAM_DP, st.ext)
            st.stream_wait(STREAM_COMPUTE, ev, STREAM_DP, st.ext)
        params = self.layers * self.layer_params()
        shard = params // self.layout.dp if self.zero else params  # the distributed optimizer updates its shard
        for _ in range(4):
            st.kernel("aten::_foreach_add_", ADAM, STREAM_COMPUTE, self.mem_ns(st, shard * 16 // 4))
        if self.zero and self.layout.dp > 1:
            t_ag = self.op_start(st)
            n = self.layout.dp
            for _ in range(self.layers):
                p = self.layer_params()
                args = self.nccl_args("_allgather_base", p // n, "dp", self.group_ranks(st, "dp"))
                args["Out msg nelems"] = p
                st.kernel("record_param_comms", NCCL_AG, STREAM_DP, self.allreduce_ns(st, p * 2, "dp", (n - 1) / n),
                          tname="nccl:AllGather", nbytes=p * 2, group="dp", group_size=n, args=args, collective_axis="dp",
                          pre_sync=True)
            st.ext += 1
            ev = st.event_record(STREAM_DP, st.ext)
            st.stream_wait(STREAM_COMPUTE, ev, STREAM_DP, st.ext)
        st.py_exit()
        self.op_row(st, "optimizer", t_op, np.maximum(st.cpu, st.streams[STREAM_COMPUTE]))
        if self.zero and self.layout.dp > 1:
            self.op_row(st, "params-all-gather", t_ag, st.streams[STREAM_DP].copy())
        st.py_enter(PY_ITEM)
        st.kernel("aten::_local_scalar_dense", "Memcpy DtoH (Device -> Pinned)", STREAM_COMPUTE, np.full(st.n, 2_000.0), cat="gpu_memcpy",
                  args={"bytes": 4})
        st.device_sync(streams=(STREAM_COMPUTE,), kind="Stream Sync", api_name="cudaStreamSynchronize")
        st.py_exit()

    # ------------------------------------------------------------ schedule
    def stage_program(self, s: int, step: int) -> list[tuple]:
        L, M = self.layout, self.job.n_microbatches
        warm = min(L.pp - s - 1, M)
        order = [("F", i) for i in range(warm)]
        for i in range(M - warm):
            order += [("F", warm + i), ("B", i)]
        order += [("B", i) for i in range(M - warm, M)]
        prog: list[tuple] = [("begin", step, -1)]
        for kind, m in order:
            if kind == "F":
                if s > 0:
                    prog.append(("recv", "fwd", m))
                prog.append(("F", step, m))
                if s < L.pp - 1:
                    prog.append(("send", "fwd", m))
            else:
                if s < L.pp - 1:
                    prog.append(("recv", "bwd", m))
                prog.append(("B", step, m))
                if s > 0:
                    prog.append(("send", "bwd", m))
        prog.append(("end", step, -1))
        return prog

    def run(self) -> None:
        self.pending_send_ops = []
        self._gpu_at_enter = {}
        self.send_stream_end = {}
        progs = [[(step, ins) for step in range(self.job.n_steps) for ins in self.stage_program(s, step)] for s in range(self.layout.pp)]
        ptr = [0] * self.layout.pp
        step_start: dict[tuple[int, int], np.ndarray] = {}
        while any(p < len(progs[s]) for s, p in enumerate(ptr)):
            progressed = False
            for s, st in enumerate(self.stages):
                while ptr[s] < len(progs[s]):
                    step, ins = progs[s][ptr[s]]
                    st.step = step
                    kind = ins[0]
                    if kind == "recv":
                        src = s - 1 if ins[1] == "fwd" else s + 1
                        if (ins[1], step, ins[2], src) not in self.sends:
                            break
                        self.p2p(st, ins[1], False, ins[2])
                    elif kind == "send":
                        self.p2p(st, ins[1], True, ins[2])
                    elif kind == "F":
                        self.forward_compute(st, ins[2])
                    elif kind == "B":
                        self.backward_compute(st, ins[2])
                    elif kind == "begin":
                        st.mb = -1
                        step_start[(s, step)] = st.cpu.copy()
                        st.user_ann = st.cpu.copy()
                        st.py_enter(PY_STEP)
                        # zero the gradient buffers
                        st.kernel("aten::zero_", MEMSET, STREAM_COMPUTE, self.mem_ns(st, self.layers * self.layer_params() * 4),
                                  cat="gpu_memset", args={"bytes": self.layers * self.layer_params() * 4})
                        st.py_enter(PY_SCHED)
                    elif kind == "end":
                        st.py_exit()
                        self.optimizer(st)
                        st.py_exit()
                        st.mb = -1
                        t0 = step_start[(s, step)]
                        self.recs.append(Rec(cat="user_annotation", name=f"ProfilerStep#{step}", ranks=st.ranks, ts=t0,
                                             dur=st.cpu - t0, step=step))
                        self.step_bounds.setdefault(step, []).append((st.ranks, t0, st.cpu.copy()))
                    ptr[s] += 1
                    progressed = True
            if not progressed:
                raise RuntimeError(f"pipeline schedule of job {self.job.job_id} deadlocked at {ptr}")
