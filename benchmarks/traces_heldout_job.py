"""One rank of a held-out real training job over gloo (CPU) for issue 23: written after the rules that
derive a capture's layout and op rows were designed, and unlike the jobs they were designed on
(benchmarks/traces_whatif_job.py, collectors/recorder/train.py) in every way those rules could
depend on:

- process groups from torch's DeviceMesh (`--groups mesh`: descriptions `mesh_pp`, `mesh_dp`), from
  plain new_group calls (`groups`: described `undefined`), or none (`none`: DDP over the default group);
- the pipeline schedule is torch.distributed.pipelining's Schedule1F1B (`--schedule 1f1b`) or
  ScheduleGPipe (`gpipe`), which batch their sends and receives inside the pipeline group (c10d
  names the peer by its rank in that group, not its global rank);
- data parallelism: one flattened gradient bucket all-reduced per step in the stage's data-parallel
  group when pipelined, torch's DistributedDataParallel when not (or the bucket: `--dp-impl bucket`);
- layers are `Block` modules (LayerNorm, Linear, GELU, Linear, residual) that nobody annotates: no
  record_function spans name a layer; emulated compute sleeps inside the block's forward and backward
  (`--fwd-ms`, `--bwd-ms` per block: costs no CPU on a shared 2-core box);
- the profiler runs as people run it: torch.profiler.schedule(wait, warmup, active) with prof.step()
  and tensorboard_trace_handler(use_gzip=True) naming files `<host>_<pid>.<ms>.pt.trace.json.gz`.

The truth (layout, every step's wall time) goes to `--out/truth/rank<R>.json`; the analyses never
see it (only the trace files are copied into a landing folder).

    python -m benchmarks.traces_heldout_job --rank R --world W --pp P --master IP --port N --out DIR
"""
from __future__ import annotations

import argparse
import json
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist


class _Work(torch.autograd.Function):
    """Identity that sleeps fwd_ms in forward and bwd_ms in backward (emulated compute)."""

    @staticmethod
    def forward(ctx, x, fwd_ms, bwd_ms):
        ctx.bwd_ms = bwd_ms
        time.sleep(fwd_ms / 1e3)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        time.sleep(ctx.bwd_ms / 1e3)
        return g, None, None


class Block(torch.nn.Module):
    def __init__(self, width: int, fwd_ms: float, bwd_ms: float):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 2 * width)
        self.down = torch.nn.Linear(2 * width, width)
        self.fwd_ms, self.bwd_ms = fwd_ms, bwd_ms

    def forward(self, x):
        h = self.down(torch.nn.functional.gelu(self.up(self.norm(x))))
        return x + _Work.apply(h, self.fwd_ms, self.bwd_ms)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--mb", type=int, default=16)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--fwd-ms", type=float, default=5.0)
    ap.add_argument("--bwd-ms", type=float, default=10.0)
    ap.add_argument("--groups", choices=["mesh", "groups", "none"], default="mesh")
    ap.add_argument("--schedule", choices=["1f1b", "gpipe"], default="1f1b")
    ap.add_argument("--dp-impl", choices=["ddp", "bucket"], default="ddp",
                    help="without a pipeline: DistributedDataParallel, or the pipelined jobs' one flattened bucket")
    ap.add_argument("--steps", type=int, default=5, help="steps in all (wait 1, warm-up 1, then profiled)")
    ap.add_argument("--host", default="localhost")
    ap.add_argument("--master", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    P, W = a.pp, a.world
    dp = W // P
    dist.init_process_group("gloo", init_method=f"tcp://{a.master}:{a.port}", rank=a.rank, world_size=W,
                            timeout=timedelta(seconds=120))
    # stage-major rank order (stage = rank // dp), as torch's DeviceMesh lays out ("pp", "dp")
    stage, dp_rank = a.rank // dp, a.rank % dp
    pp_group = dp_group = None
    if a.groups == "mesh":
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh("cpu", (P, dp), mesh_dim_names=("pp", "dp"))
        pp_group, dp_group = mesh.get_group("pp"), mesh.get_group("dp")
    elif a.groups == "groups":
        for s in range(P):
            g = dist.new_group([s * dp + i for i in range(dp)])
            if s == stage:
                dp_group = g
        for i in range(dp):
            g = dist.new_group([s * dp + i for s in range(P)])
            if i == dp_rank:
                pp_group = g
    per = a.layers // P
    torch.manual_seed(1234 + stage)
    model = torch.nn.Sequential(*[Block(a.width, a.fwd_ms, a.bwd_ms) for _ in range(per)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(a.mb * a.micro, a.width)
    target = torch.randn(a.mb * a.micro, a.width)

    def loss_fn(y, t):
        return torch.nn.functional.mse_loss(y, t)

    def reduce_bucket():
        if dp == 1:
            return
        grads = [p.grad for p in model.parameters()]  # one flattened bucket per step
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=dp_group)
        flat /= dp
        off = 0
        for g in grads:
            g.copy_(flat[off:off + g.numel()].view_as(g))
            off += g.numel()

    if P > 1:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
        st = PipelineStage(model, stage, P, torch.device("cpu"), group=pp_group)
        sched = (Schedule1F1B if a.schedule == "1f1b" else ScheduleGPipe)(st, n_microbatches=a.micro, loss_fn=loss_fn)

        def step():
            opt.zero_grad(set_to_none=True)
            if stage == 0:
                sched.step(x)
            elif stage == P - 1:
                sched.step(target=target, losses=[])
            else:
                sched.step()
            reduce_bucket()
            opt.step()
    elif a.dp_impl == "bucket":
        def step():
            opt.zero_grad(set_to_none=True)
            for i in range(a.micro):  # gradient accumulation, then the one bucket
                loss_fn(model(x[i * a.mb:(i + 1) * a.mb]), target[i * a.mb:(i + 1) * a.mb]).backward()
            reduce_bucket()
            opt.step()
    else:
        ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=dp_group)

        def step():
            opt.zero_grad(set_to_none=True)
            for i in range(a.micro):  # gradient accumulation over the microbatches, one reduction at the end
                xs, ts = x[i * a.mb:(i + 1) * a.mb], target[i * a.mb:(i + 1) * a.mb]
                if i < a.micro - 1:
                    with ddp.no_sync():
                        loss_fn(ddp(xs), ts).backward()
                else:
                    loss_fn(ddp(xs), ts).backward()
            opt.step()

    os.makedirs(a.out, exist_ok=True)
    handler = torch.profiler.tensorboard_trace_handler(a.out, worker_name=f"{a.host}_{os.getpid()}", use_gzip=True)
    active = a.steps - 2
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
                                  schedule=torch.profiler.schedule(wait=1, warmup=1, active=active, repeat=1),
                                  on_trace_ready=handler)
    dist.barrier()
    times = []
    t_prev = time.time_ns()
    with prof:
        for s in range(a.steps):
            step()
            t = time.time_ns()
            times.append({"step": s, "end_ns": t, "dur_ns": t - t_prev, "profiled": s >= 2})
            t_prev = t
            prof.step()
    os.makedirs(os.path.join(a.out, "truth"), exist_ok=True)
    with open(os.path.join(a.out, "truth", f"rank{a.rank}.json"), "w") as fh:
        json.dump({"rank": a.rank, "stage": stage, "dp_rank": dp_rank, "tp_rank": 0, "pp": P, "dp": dp, "tp": 1,
                   "world": W, "layers": a.layers, "groups": a.groups, "schedule": a.schedule, "steps": times}, fh)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
