"""One rank of a small real pipeline x data-parallel training job over gloo (CPU), for checking the
Lumos what-ifs against real re-runs (benchmarks/traces_whatif_rerun.py starts it in network
namespaces). Megatron-like: stage = rank // dp, a 1F1B schedule over `--micro` microbatches with
fused isend/irecv pairs between stages, then one synchronous all-reduce per gradient tensor in the
stage's data-parallel group, then the optimizer.

A layer is a real Linear(width, width) whose forward and backward also sleep (`--fwd-ms`,
`--bwd-ms`: emulated compute that costs no CPU on a shared 2-core box, so running more ranks does
not slow each one down); each layer's forward runs inside record_function("layers.<i>"), the way
module-level annotations mark a model's layers. Kineto traces of `--profile-steps` steps after
`--warmup` steps go to `--out/<host>_<pid>.<ms>.pt.trace.json.gz` (Kineto's own file name, which
carries the host); every step's wall time (end of the
optimizer to end of the optimizer, as the training loop sees it) to `--out/steps/rank<R>.json`.

    python -m benchmarks.traces_whatif_job --rank R --world W --pp P --master IP --port N --out DIR
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import time
from datetime import timedelta

import torch
import torch.distributed as dist

# identity whose backward sleeps: emulated backward compute (the recorder's jobs use the same)
from fleetscope.collectors.recorder.train import SleepGrad


class Stage(torch.nn.Module):
    def __init__(self, first_layer: int, n_layers: int, width: int, fwd_ms: float, bwd_ms: float):
        super().__init__()
        self.first, self.fwd_ms, self.bwd_ms = first_layer, fwd_ms, bwd_ms
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(n_layers))

    def forward(self, x):
        for i, lin in enumerate(self.layers):
            with torch.profiler.record_function(f"layers.{self.first + i}"):
                x = SleepGrad.apply(x, self.bwd_ms)
                x = torch.relu(lin(x))
                time.sleep(self.fwd_ms / 1e3)
        return x


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--stage-layers", default="", help="layers per stage, e.g. 4,4 (default: --layers split evenly)")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--mb", type=int, default=32)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--fwd-ms", type=float, default=6.0)
    ap.add_argument("--bwd-ms", type=float, default=12.0)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--profile-steps", type=int, default=4)
    ap.add_argument("--host", default="localhost", help="the (emulated) host name, for the trace's file name")
    ap.add_argument("--master", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    P, W = a.pp, a.world
    dp = W // P
    stage, dp_rank = a.rank // dp, a.rank % dp
    per_stage = [int(x) for x in a.stage_layers.split(",")] if a.stage_layers else [a.layers // P] * P
    assert len(per_stage) == P, "one layer count per stage"
    torch.manual_seed(stage)
    dist.init_process_group("gloo", init_method=f"tcp://{a.master}:{a.port}", rank=a.rank, world_size=W,
                            timeout=timedelta(seconds=120))
    groups = [dist.new_group([s * dp + i for i in range(dp)]) for s in range(P)]
    model = Stage(sum(per_stage[:stage]), per_stage[stage], a.width, a.fwd_ms, a.bwd_ms)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    prv = a.rank - dp if stage > 0 else None
    nxt = a.rank + dp if stage < P - 1 else None
    shape = (a.mb, a.width)
    M = a.micro

    def p2p(send_t, to, frm):
        r = torch.empty(*shape)
        w = [dist.isend(send_t, to), dist.irecv(r, frm)]
        for x in w:
            x.wait()
        return r

    def recv(frm):
        x = torch.empty(*shape)
        dist.recv(x, frm)
        return x

    def step():
        opt.zero_grad(set_to_none=True)
        ins, outs = [], []

        def fwd(x):
            y = model(x)
            ins.append(x)
            outs.append(y)
            return y

        def bwd(g):
            x, y = ins.pop(0), outs.pop(0)
            if g is None:
                y.pow(2).mean().backward()
            else:
                y.backward(g)
            return x.grad if prv is not None else None

        def first_input():
            return torch.randn(*shape) if prv is None else recv(prv).requires_grad_(True)

        warm = min(P - stage - 1, M)
        for _ in range(warm):
            y = fwd(first_input())
            dist.send(y.detach(), nxt)
        x = first_input() if M - warm > 0 else None
        for i in range(M - warm):
            y = fwd(x)
            g = p2p(y.detach(), nxt, nxt) if nxt is not None else None
            dx = bwd(g)
            if i == M - warm - 1:
                if prv is not None:
                    dist.send(dx, prv)
            elif prv is not None:
                x = p2p(dx, prv, prv).requires_grad_(True)
            else:
                x = first_input()
        for _ in range(warm):
            dx = bwd(recv(nxt))
            if prv is not None:
                dist.send(dx, prv)
        if dp > 1:
            for p in model.parameters():
                dist.all_reduce(p.grad, group=groups[stage])
        opt.step()

    os.makedirs(a.out, exist_ok=True)
    dist.barrier()
    times, prof = [], None
    t_prev = time.time_ns()
    for s in range(a.warmup + a.profile_steps):
        if s == a.warmup:
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
                                          schedule=lambda _: torch.profiler.ProfilerAction.RECORD)
            prof.step_num = s
            prof.start()
        step()
        t = time.time_ns()
        times.append({"step": s, "end_ns": t, "dur_ns": t - t_prev, "profiled": prof is not None})
        t_prev = t
        if prof is not None:
            if s < a.warmup + a.profile_steps - 1:
                prof.step()
            else:
                prof.stop()
    tmp = os.path.join(a.out, f".trace-rank{a.rank}.json")
    prof.export_chrome_trace(tmp)
    name = f"{a.host}_{os.getpid()}.{time.time_ns() // 1_000_000}.pt.trace.json.gz"
    with open(tmp, "rb") as src, gzip.open(os.path.join(a.out, name), "wb", compresslevel=9) as dst:
        shutil.copyfileobj(src, dst)
    os.unlink(tmp)
    os.makedirs(os.path.join(a.out, "steps"), exist_ok=True)
    with open(os.path.join(a.out, "steps", f"rank{a.rank}.json"), "w") as fh:
        json.dump({"rank": a.rank, "stage": stage, "dp_rank": dp_rank, "pp": P, "dp": dp, "stage_layers": per_stage,
                   "steps": times}, fh)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
