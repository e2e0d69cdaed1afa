"""One rank of a recorder job: a small real PyTorch training job over gloo, single-threaded,
compute emulated by sleeps (which cost no CPU on a shared box) around real small matmuls.

- `--pp P` (> 1): pipeline stages x data parallelism, Megatron-like: a 1F1B schedule over
  `--micro` microbatches with fused isend/irecv pairs (send_forward_recv_backward), then one
  synchronous all-reduce per gradient tensor in the stage's DP group (buckets of several sizes).
- `--pp 1`: DistributedDataParallel with small buckets, all-reduced asynchronously from a comm
  hook while backward still runs (sleeps inside backward, between layers).
- `--fsdp` (with `--pp 1`): FSDP2 (`fully_shard`) over `--layers` Linear(width, width) units, each
  unit's forward and backward compute emulated per unit (so every unit's all-gather and
  reduce-scatter has its own place in the step); `--micro` > 1 accumulates gradients without
  reduce-scatters (`set_requires_gradient_sync(False)`) until the last microbatch.
- `--tokens N` (with `--pp` > 1): token-sized microbatches. Each stage holds `--stage-layers` real
  Linear(width, width) layers over activations [tokens, width]; a layer's forward / backward costs
  its real matmuls plus emulated accelerator time (`--layer-fwd-ms` / `--layer-bwd-ms` per N
  tokens), both proportional to the microbatch's tokens. `--seq-sigma` draws every microbatch's
  sequence length (log-normal, mean N; the same on every stage of its pipeline: all ranks of a DP
  replica draw it from `--data-seed`, step, replica and microbatch, as a shared sampler does), and
  the rank log records it (`microbatch` rows). `--clip-grad` adds Megatron's
  optimizer-clip-main-grad (a world all-reduce of the gradient norm before the optimizer).

The recorder steers all ranks of a job through `<run-dir>/control.json` (read at every step start,
decisions always name a future step so all ranks agree): `stop_step`, the timing/profile windows
(`windows`: capture id, first step, profiled step), and `straggle` (rank, from/to step, extra ms
of sleep in every microbatch forward). The rank writes what it did to `<run-dir>/rank<R>.jsonl`
(steps, per-microbatch ops, buckets, faults, events): that log is the recording's ground truth.
Into the landing folder it writes the fleetscope tracer's timings with `kind=op` rows per
microbatch (through the tracer's op API, timings/<capture>/) and Kineto traces of the profiled
steps (traces/<capture>/).
"""
from __future__ import annotations

import argparse
import contextlib
import gzip
import importlib
import io
import json
import math
import os
import resource
import shutil
import socket
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from fleetscope.collectors.recorder.services import storage_get, storage_put

now = time.time_ns


def _addr(s: str) -> tuple[str, int]:
    h, p = s.rsplit(":", 1)
    return h, int(p)


class RankLog:
    """Append-only JSON lines, flushed per line (the recorder reads progress from it live)."""

    def __init__(self, path: Path, **fixed):
        self.fh = open(path, "a", buffering=1)
        self.fixed = fixed

    def write(self, kind: str, **row):
        self.fh.write(json.dumps({"kind": kind, **self.fixed, **row}) + "\n")


class Ops:
    """`kind=op` timing rows (docs/CONTRACT.md 1.4) per microbatch, Megatron timer names, recorded
    through the fleetscope tracer's op API (ft.record_op: its timings files carry them, with the
    rank's stage and dp_rank) and into the rank log (the recording's ground truth)."""

    def __init__(self, log: RankLog):
        self.log = log
        self.step = 0

    def add(self, names: tuple[str, ...], t0: int, t1: int, mb: int | None):
        import fleetscope.collectors.tracer as ft

        # a fused op (send_forward_recv_backward) is one slot: its names share the start and end
        ft.record_op(names, t0, t1, microbatch=mb, step=self.step)
        for n in names:
            self.log.write("op", name=n, step=self.step, microbatch=mb, start_ns=t0, end_ns=t1)

    @contextlib.contextmanager
    def timed(self, *names: str, mb: int | None = None):
        t0 = now()
        yield
        self.add(names, t0, now(), mb)


class Control:
    def __init__(self, path: Path):
        self.path, self.mtime, self.data = path, None, {}

    def read(self) -> dict:
        try:
            m = self.path.stat().st_mtime_ns
            if m != self.mtime:
                self.data, self.mtime = json.loads(self.path.read_text()), m
        except (OSError, ValueError):
            pass  # replaced atomically by the recorder; keep the last good copy
        return self.data


class SleepGrad(torch.autograd.Function):
    """Identity whose backward sleeps: emulated backward compute between layers, so DDP's
    buckets become ready (and are all-reduced) while backward is still running."""

    @staticmethod
    def forward(ctx, x, ms):
        ctx.ms = ms
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        time.sleep(ctx.ms / 1e3)
        return g, None


class SleepUnit(torch.nn.Module):
    """An FSDP unit: a real Linear(width, width) whose forward sleeps fwd_ms and whose backward
    sleeps bwd_ms (emulated accelerator time per unit)."""

    def __init__(self, width: int, fwd_ms: float, bwd_ms: float):
        super().__init__()
        self.lin, self.fwd_ms, self.bwd_ms = torch.nn.Linear(width, width), fwd_ms, bwd_ms

    def forward(self, x):
        time.sleep(self.fwd_ms / 1e3)
        return torch.relu(self.lin(SleepGrad.apply(x, self.bwd_ms)))


def _mlp(dims: list[int], bwd_ms: float) -> torch.nn.Module:
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(torch.nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))

        def forward(self, x):
            for i, lin in enumerate(self.layers):
                x = SleepGrad.apply(x, bwd_ms / len(self.layers))
                x = lin(x)
                if i < len(self.layers) - 1:
                    x = torch.relu(x)
            return x
    return M()


class TokenStage(torch.nn.Module):
    """A pipeline stage of `n_layers` real Linear(width, width) layers over [tokens, width]; the
    stage's forward also sleeps fwd_ms and its backward bwd_ms per layer (emulated accelerator
    time), times the microbatch's tokens over the reference `tokens` (set `scale` before the
    forward). One sleep per pass, not per layer: fewer wake-ups for a loaded machine to delay."""

    def __init__(self, n_layers: int, width: int, fwd_ms: float, bwd_ms: float):
        super().__init__()
        self.fwd_ms, self.bwd_ms, self.scale = fwd_ms, bwd_ms, 1.0
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(n_layers))

    def forward(self, x):
        for lin in self.layers:
            x = torch.relu(lin(x))
        n = len(self.layers)
        time.sleep(n * self.fwd_ms * self.scale / 1e3)
        # on the output: it needs a gradient on every stage (the first stage's input does not)
        return SleepGrad.apply(x, n * self.bwd_ms * self.scale)


def seq_tokens(seed: int, step: int, dp_rank: int, mb: int, tokens: int, sigma: float) -> int:
    """Tokens of one microbatch: log-normal around `tokens` (mean preserved), the same on every
    rank of a DP replica (they all draw it from the same key)."""
    if sigma <= 0:
        return tokens
    import numpy as np
    z = np.random.default_rng([seed, step, dp_rank, mb]).standard_normal()
    return max(8, int(round(tokens * math.exp(sigma * z - sigma * sigma / 2))))


class Rank:
    def __init__(self, a):
        self.a = a
        self.run_dir = Path(a.run_dir)
        self.landing = Path(a.landing)
        self.log = RankLog(self.run_dir / f"rank{a.rank}.jsonl", job_id=a.job, rank=a.rank)
        self.ctl = Control(self.run_dir / "control.json")
        self.dp = a.world // a.pp
        self.stage, self.dp_rank = a.rank // self.dp, a.rank % self.dp
        self.layout = {"stage": self.stage, "dp_rank": self.dp_rank}
        self.ops = Ops(self.log)
        self.capture = None
        self.prof = None
        self.prof_left = 0
        self.extra_ms = 0.0

    # -- windows: the tracer's capture and the Kineto profile ------------------------------------
    def _window(self, step: int, ctl: dict):
        import fleetscope.collectors.tracer as ft

        for w in ctl.get("windows", []):
            if w["from_step"] == step or (self.capture is None and w["from_step"] <= step):
                if self.capture is not None:
                    ft.stop()
                self.capture = w["capture"]
                # before ft.start: the tracer writes its own capture.json only where there is none
                self._capture_json(self.landing / "timings" / self.capture)
                ft.start(landing_dir=self.landing, capture=self.capture, rank=self.a.rank, job_id=self.a.job,
                         profiler=False, stacks=False, layout=self.layout, flush_interval_s=10.0)
                self.log.write("window", capture=self.capture, step=step, t_ns=now())
            if w.get("profile_step") == step and self.prof is None:
                # a schedule makes the profiler annotate ProfilerStep#<n>; step_num = the training
                # step, so every rank's annotations carry the same numbers
                self.prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
                                                   with_stack=self.a.stacks, schedule=lambda s: torch.profiler.ProfilerAction.RECORD)
                self.prof.step_num = step
                self.prof.start()
                self.prof_left = int(w.get("profile_steps", 3))
                self.prof_capture = w["capture"]
                self.log.write("profile", capture=w["capture"], step=step, t_ns=now())
        ft.mark_step(step)

    def _capture_json(self, d: Path):
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f".capture.json.{self.a.rank}"   # every rank writes the same content, atomically
        tmp.write_text(json.dumps({"job_id": self.a.job, "parallel": {"dp": self.dp, "pp": self.a.pp, "tp": 1},
                                   "note": "fleetscope recorder (real gloo job in network namespaces)"}))
        os.replace(tmp, d / "capture.json")

    def _profile_step_end(self):
        if self.prof is None:
            return
        self.prof_left -= 1
        if self.prof_left > 0:
            self.prof.step()   # closes ProfilerStep#n, opens #n+1
            return
        self._profile_export()

    def _profile_export(self):
        """Stop the profile and land its trace (also at a stop that cuts the profile short: a process
        that exits with Kineto still recording segfaults in teardown)."""
        self.prof.stop()       # (a last step() would open an empty ProfilerStep#n+1)
        out = self.landing / "traces" / self.prof_capture
        self._capture_json(out)
        # Kineto's own file name (host_pid.ms.pt.trace.json): the rank is in distributedInfo only
        base = out / f"{self.a.host}_{os.getpid()}.{now() // 1_000_000}.pt.trace.json"
        tmp = self.run_dir / f"trace-rank{self.a.rank}.json"
        self.prof.export_chrome_trace(str(tmp))
        with open(tmp, "rb") as src, gzip.open(str(base) + ".gz.tmp", "wb", compresslevel=9) as dst:
            shutil.copyfileobj(src, dst)
        os.replace(str(base) + ".gz.tmp", str(base) + ".gz")
        tmp.unlink()
        self.prof = None

    # -- the jobs --------------------------------------------------------------------------------
    def setup(self):
        a = self.a
        torch.manual_seed(1000 + self.dp_rank)
        if a.pp > 1:
            self.groups = [dist.new_group([s * self.dp + i for i in range(self.dp)]) for s in range(a.pp)]
            if a.tokens > 0:
                layers = [int(x) for x in a.stage_layers.split(",")] if a.stage_layers else [3] * a.pp
                if len(layers) != a.pp:
                    raise SystemExit(f"--stage-layers needs {a.pp} numbers, got {a.stage_layers!r}")
                self.model = TokenStage(layers[self.stage], a.width, a.layer_fwd_ms, a.layer_bwd_ms)
            else:
                dims = [a.width, 1024, a.width, 384, a.width] if self.stage % 2 == 0 else [a.width, 768, 96, a.width]
                self.model = _mlp(dims, a.bwd_ms)
        elif a.fsdp:
            from torch.distributed.fsdp import fully_shard
            self.model = torch.nn.Sequential(*[SleepUnit(a.width, a.fwd_ms / a.layers, a.bwd_ms / a.layers)
                                               for _ in range(a.layers)])
            for unit in self.model:
                fully_shard(unit)
            fully_shard(self.model)
        else:
            from torch.nn.parallel import DistributedDataParallel as DDP
            self.model = DDP(_mlp([a.width, 512, 384, 256, 10], a.bwd_ms), bucket_cap_mb=0.5)
            self.model.register_comm_hook(state=None, hook=self._bucket_hook)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-4)

    def _bucket_hook(self, state, bucket):
        """DDP's stock all-reduce, through torch.distributed.all_reduce (so the tracer sees each
        bucket), logging launch and completion: the truth of each DP flow's purpose."""
        buf, t0, step, idx = bucket.buffer(), now(), self.ops.step, bucket.index()
        fut = dist.all_reduce(buf, async_op=True).get_future()

        def done(f):
            t1 = now()
            self.buckets.append((t0, t1))
            self.log.write("bucket", step=step, bucket=idx, bytes=buf.numel() * buf.element_size(), start_ns=t0, end_ns=t1)
            return f.value()[0].div_(self.a.world)
        return fut.then(done)

    def _shape(self, step: int, mb: int) -> tuple[int, int]:
        """Activation shape of a microbatch: [mb, width], or [its tokens, width] with --tokens."""
        a = self.a
        if a.tokens <= 0:
            return (a.mb, a.width)
        return (seq_tokens(a.data_seed, step, self.dp_rank, mb, a.tokens, a.seq_sigma), a.width)

    def _fwd(self, x, mb):
        a = self.a
        if a.tokens > 0:  # token model: work per token, in the layers (real matmuls + emulated time)
            self.model.scale = x.shape[0] / a.tokens
            with self.ops.timed("forward-compute", mb=mb):
                y = self.model(x)
            return y
        with self.ops.timed("forward-compute", mb=mb):
            time.sleep((a.fwd_ms + self.extra_ms) / 1e3)
            y = self.model(x)
            torch.mm(torch.randn(160, 160), torch.randn(160, 160))  # a little real compute per microbatch
        return y

    def _bwd(self, y, g, mb):
        with self.ops.timed("backward-compute", mb=mb):
            if g is None:
                y.pow(2).mean().backward()
            else:
                y.backward(g)

    def step_dp(self, step):
        a = self.a
        x = torch.randn(a.mb * a.micro, a.width)
        self.buckets = []
        y = self._fwd(x, 0)
        self._bwd(y, None, 0)  # DDP buckets are all-reduced from the hook during this
        if self.buckets:  # the DP phase as one op, overlapping backward as DDP does
            self.ops.add(("grads-all-reduce",), min(b[0] for b in self.buckets), max(b[1] for b in self.buckets), None)
        with self.ops.timed("optimizer"):
            self.opt.step()

    def step_fsdp(self, step):
        """FSDP2: each unit all-gathers its parameters before its forward and again before its
        backward, and reduce-scatters its gradients after the last microbatch's backward."""
        a = self.a
        for mb in range(a.micro):
            self.model.set_requires_gradient_sync(mb == a.micro - 1)
            with self.ops.timed("forward-compute", mb=mb):
                y = self.model(torch.randn(a.mb, a.width))
            self._bwd(y, None, mb)
        with self.ops.timed("optimizer"):
            self.opt.step()

    def step_pp(self, step):
        """1F1B (Megatron's non-interleaved schedule) for this stage."""
        a = self.a
        P, s, M = a.pp, self.stage, a.micro
        prv = a.rank - self.dp if s > 0 else None
        nxt = a.rank + self.dp if s < P - 1 else None
        ins, outs = [], []
        if a.tokens > 0 and s == 0:  # the data: every microbatch's sequence length (the truth)
            for m in range(M):
                self.log.write("microbatch", step=step, dp_rank=self.dp_rank, microbatch=m, tokens=self._shape(step, m)[0])

        def recv_forward(mb):
            if prv is None:
                return torch.randn(*self._shape(step, mb))
            x = torch.empty(*self._shape(step, mb))
            with self.ops.timed("forward-recv", mb=mb):
                dist.recv(x, prv)
            return x.requires_grad_(True)

        def p2p(send_t, to, recv_shape, frm, names, mb):
            # fused isend + irecv (Megatron's batched p2p): one slot, both names
            r = torch.empty(*recv_shape)
            with self.ops.timed(*names, mb=mb):
                w = [dist.isend(send_t, to), dist.irecv(r, frm)]
                for x in w:
                    x.wait()
            return r

        def backward(mb, g):
            x, y = ins.pop(0), outs.pop(0)
            self._bwd(y, g, mb)
            return x.grad if prv is not None else None

        warm = min(P - s - 1, M)
        fmb = bmb = 0
        for _ in range(warm):
            x = recv_forward(fmb)
            y = self._fwd(x, fmb)
            with self.ops.timed("forward-send", mb=fmb):
                dist.send(y.detach(), nxt)
            ins.append(x), outs.append(y)
            fmb += 1
        x = recv_forward(fmb) if M - warm > 0 else None
        for i in range(M - warm):
            y = self._fwd(x, fmb)
            ins.append(x), outs.append(y)
            g = p2p(y.detach(), nxt, self._shape(step, bmb), nxt, ("forward-send", "backward-recv"), fmb) if nxt is not None else None
            fmb += 1
            dx = backward(bmb, g)
            if i == M - warm - 1:
                if prv is not None:
                    with self.ops.timed("backward-send", mb=bmb):
                        dist.send(dx, prv)
            elif prv is not None:
                x = p2p(dx, prv, self._shape(step, fmb), prv, ("backward-send", "forward-recv"), fmb)
                x.requires_grad_(True)
            else:
                x = recv_forward(fmb)
            bmb += 1
        for _ in range(warm):
            g = torch.empty(*self._shape(step, bmb))
            with self.ops.timed("backward-recv", mb=bmb):
                dist.recv(g, nxt)
            dx = backward(bmb, g)
            if prv is not None:
                with self.ops.timed("backward-send", mb=bmb):
                    dist.send(dx, prv)
            bmb += 1
        # DP: one synchronous all-reduce per gradient tensor (several bucket sizes), after the flush
        with self.ops.timed("grads-all-reduce"):
            for i, p in enumerate(self.model.parameters()):
                t0 = now()
                dist.all_reduce(p.grad, group=self.groups[s])
                self.log.write("bucket", step=step, bucket=i, bytes=p.grad.numel() * 4, start_ns=t0, end_ns=now())
        if a.clip_grad:  # Megatron's grad-norm clipping: one all-reduce over every rank
            with self.ops.timed("optimizer-clip-main-grad"):
                norm = torch.stack([p.grad.pow(2).sum() for p in self.model.parameters()]).sum().reshape(1)
                dist.all_reduce(norm)
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm=1e9)
        with self.ops.timed("optimizer"):
            self.opt.step()

    def run(self):
        a = self.a
        step = 0
        stopped_by = "stop_step"
        while True:
            ctl = self.ctl.read()
            if ctl.get("stop_step") is not None and step >= ctl["stop_step"]:
                break
            if now() > a.hard_deadline_ns:  # the recorder is gone or late: never run forever
                stopped_by = "deadline"
                break
            self._window(step, ctl)
            st = ctl.get("straggle") or {}
            was = self.extra_ms
            self.extra_ms = float(st["extra_ms"]) if (st.get("rank") == a.rank and st["from_step"] <= step
                                                     and step < (st.get("to_step") or 1 << 62)) else 0.0
            if self.extra_ms != was:
                self.log.write("fault", fault="straggle" if self.extra_ms else "straggle_end", step=step,
                               extra_ms=self.extra_ms, t_ns=now())
            if step == a.ckpt_save_step:  # a checkpoint save between steps: a benign slow step
                t0 = now()
                buf = io.BytesIO()
                torch.save(self.model.state_dict(), buf)
                if a.storage:  # to the checkpoint store: storage traffic on the job's NIC
                    storage_put(_addr(a.storage), buf.getvalue())
                time.sleep(a.ckpt_save_s)
                self.log.write("event", event="checkpoint_save", step=step, start_ns=t0, end_ns=now(),
                               bytes=len(buf.getvalue()))
            self.ops.step = step
            t0 = now()
            self.opt.zero_grad()
            (self.step_pp if a.pp > 1 else self.step_fsdp if a.fsdp else self.step_dp)(step)
            self.log.write("step", step=step, start_ns=t0, end_ns=now(), extra_ms=self.extra_ms)
            self._profile_step_end()
            step += 1
        if self.prof is not None:  # stopped inside a profile window: land the steps it recorded
            self._profile_export()
        import fleetscope.collectors.tracer as ft

        ft.stop()
        ru = resource.getrusage(resource.RUSAGE_SELF)
        self.log.write("event", event="finish", step=step, start_ns=now(), end_ns=now(), why=stopped_by,
                       cpu_s=round(ru.ru_utime + ru.ru_stime, 3))
        return stopped_by


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--job", required=True)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--master", required=True)
    ap.add_argument("--port", type=int, default=29500)
    ap.add_argument("--host", default=socket.gethostname())
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--landing", required=True)
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--mb", type=int, default=64)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--fwd-ms", type=float, default=50.0)
    ap.add_argument("--bwd-ms", type=float, default=90.0)
    ap.add_argument("--ckpt-load-s", type=float, default=0.0, help="sleep after init (a checkpoint load)")
    ap.add_argument("--ckpt-save-step", type=int, default=-1)
    ap.add_argument("--ckpt-save-s", type=float, default=1.0)
    ap.add_argument("--ckpt-load-bytes", type=int, default=4 << 20)
    ap.add_argument("--storage", default="", help="IP:PORT of the checkpoint store (services.py)")
    ap.add_argument("--tokens", type=int, default=0, help="token model (--pp > 1): mean tokens per microbatch; 0: the default model")
    ap.add_argument("--stage-layers", default="", help="token model: layers per stage, e.g. 2,2,2,6 (default 3 each)")
    ap.add_argument("--layer-fwd-ms", type=float, default=6.0, help="token model: emulated forward time per layer at --tokens")
    ap.add_argument("--layer-bwd-ms", type=float, default=12.0, help="token model: emulated backward time per layer at --tokens")
    ap.add_argument("--seq-sigma", type=float, default=0.0, help="token model: log-normal spread of the microbatches' lengths")
    ap.add_argument("--data-seed", type=int, default=0, help="token model: seed of the sequence lengths")
    ap.add_argument("--fsdp", action="store_true", help="(--pp 1) FSDP2 over --layers units instead of DDP")
    ap.add_argument("--layers", type=int, default=6, help="--fsdp: units (each fully_shard-ed)")
    ap.add_argument("--clip-grad", action="store_true", help="a world all-reduce of the gradient norm before the optimizer")
    ap.add_argument("--stacks", action="store_true", help="Python stacks in the Kineto traces (~3x larger files)")
    ap.add_argument("--hard-deadline-ns", type=int, required=True)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)  # six ranks share two cores: one intra-op thread each
    # import what setup() and the windows need now: lazy imports (DDP, the profiler, the tracer)
    # take seconds on a busy box and would delay the job inside the capture
    for mod in ("torch.nn.parallel", "torch.distributed.fsdp", "torch.profiler", "fleetscope.collectors.tracer"):
        importlib.import_module(mod)
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)  # the first optimizer imports torch._dynamo (~1 s)
    r = Rank(a)
    r.log.write("event", event="ready", step=None, start_ns=now(), end_ns=now(), host=a.host, pid=os.getpid())
    # torch is imported: wait for the recorder's go (the capture runs), so launch and connection
    # setup are recorded but a slow import on a busy box does not eat the capture
    go = Path(a.run_dir) / "go"
    while not go.exists():
        if now() > a.hard_deadline_ns:
            return 3
        time.sleep(0.05)
    r.log.write("event", event="launch", step=None, start_ns=now(), end_ns=now())
    t0 = now()
    dist.init_process_group("gloo", init_method=f"tcp://{a.master}:{a.port}", rank=a.rank, world_size=a.world,
                            timeout=timedelta(seconds=90))
    r.log.write("event", event="init_process_group", step=None, start_ns=t0, end_ns=now())
    t0 = now()
    r.setup()
    r.log.write("event", event="setup", step=None, start_ns=t0, end_ns=now())
    if a.ckpt_load_s > 0:
        t0 = now()
        got = storage_get(_addr(a.storage), a.ckpt_load_bytes) if a.storage else 0
        time.sleep(max(0.0, a.ckpt_load_s - (now() - t0) / 1e9))
        r.log.write("event", event="checkpoint_load", step=None, start_ns=t0, end_ns=now(), bytes=got)
    dist.barrier()
    r.run()
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
