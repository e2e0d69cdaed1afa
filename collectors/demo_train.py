"""A small real data-parallel training run on CPU (torch.distributed gloo), with optional injected
faults, used by the collectors' tests and benchmarks (and as a usage example of the tracer).

    python -m fleetscope.collectors.demo_train --world 4 --steps 60 --landing /tmp/landing --capture demo-1 \
        [--no-trace] [--gc-stall-rank 1 --gc-stall-every 5] [--sync-in-forward 2] [--slow-dataloader-ms 5]

Model: an MLP (Linear+GELU layers); gradients are all-reduced per layer bucket from backward hooks
(async, like DDP's reducer, so communication overlaps the rest of backward) and awaited before
optimizer.step. Faults:
- GC stall: rank R keeps a large cyclic heap and runs gc.collect() in forward every K steps.
- unnecessary synchronization: N tiny all-reduces of a scalar inside forward through the c10d module
  directly (what a profiling timer or a `.item()` on a synchronized loss does), i.e. not a traced API.
- slow dataloader: the dataset sleeps per batch.
Prints one JSON line per rank at the end: step times and the tracer's summary.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import socket
import sys
import time


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank: int, a, port: int, q):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(a.world))
    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d
    from torch.utils.data import DataLoader, Dataset

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=a.world)
    torch.manual_seed(0)

    class Data(Dataset):
        def __init__(self, n, dim):
            g = torch.Generator().manual_seed(rank)
            self.x = torch.randn(n, dim, generator=g)
            self.y = torch.randn(n, 1, generator=g)

        def __len__(self):
            return len(self.x)

        def __getitem__(self, i):
            return self.x[i], self.y[i]

    n_batches = [0]

    def collate(batch):
        n_batches[0] += 1
        if a.slow_dataloader_ms and n_batches[0] > a.slow_dataloader_from:
            time.sleep(a.slow_dataloader_ms / 1000)
        xs, ys = zip(*batch)
        return torch.stack(xs), torch.stack(ys)

    layers = []
    for _ in range(a.layers):
        layers += [torch.nn.Linear(a.hidden, a.hidden), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(a.hidden, 1))
    sync_t = torch.zeros(1)

    class Forward(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, x, step):
            if a.gc_stall_rank == rank and a.gc_stall_every and step % a.gc_stall_every == 0:
                gc.collect()  # a full collection over the big heap below: a real GC stall
            n = len(self.m)
            every = max(1, n // (a.sync_in_forward + 1)) if a.sync_in_forward else 0
            for i, layer in enumerate(self.m):
                x = layer(x)
                if every and i % every == every - 1 and i // every < a.sync_in_forward:
                    c10d.all_reduce(sync_t)  # unnecessary synchronization (not a traced API)
            return x

    if a.pp > 1:
        return _pipeline_worker(rank, a, q, torch, dist, DataLoader, Data, collate)
    net = Forward(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    # the GC-stall heap: many small cyclic objects make a full collection expensive
    heap = [[i, None] for i in range(a.gc_heap)] if a.gc_stall_rank == rank else []
    for i in range(len(heap) - 1):
        heap[i][1] = heap[i + 1]
    gc.disable() if a.gc_stall_rank == rank else None  # only the injected collections run there

    # per-layer gradient buckets reduced asynchronously as backward produces them (DDP-like)
    works = []
    linears = [m for m in model if isinstance(m, torch.nn.Linear)]

    def hook(p):
        works.append(dist.all_reduce(p.grad, async_op=True))

    for m in linears:
        m.weight.register_post_accumulate_grad_hook(hook)

    op = _op_marker(a)
    if a.trace:
        import fleetscope.collectors.tracer as ft
        ft.start(landing_dir=a.landing, capture=a.capture, rank=rank, job_id=a.job_id,
                 flush_interval_s=a.flush_s, profiler=True, stacks=True)
    loader = DataLoader(Data(a.batch * (a.steps + 2), a.hidden), batch_size=a.batch, collate_fn=collate)
    it = iter(loader)
    times = []
    for step in range(a.steps):
        t0 = time.perf_counter()
        x, y = next(it)
        opt.zero_grad(set_to_none=True)
        with op("forward-compute", microbatch=0):
            loss = torch.nn.functional.mse_loss(net(x, step), y)
        with op("backward-compute", microbatch=0):
            loss.backward()
        with op("grads-all-reduce"):  # the exposed end of the bucket all-reduces issued during backward
            for w in works:
                w.wait()
        works.clear()
        with op("optimizer"):
            opt.step()
        if a.log_loss:  # average the loss over ranks for logging (a synchronous collective per step)
            dist.all_reduce(loss.detach().clone())
        times.append(time.perf_counter() - t0)
        if a.hang_rank == rank and step == a.hang_step:
            if a.hang_marker:
                open(a.hang_marker + ".ns", "w").write(str(time.time_ns()))
                open(a.hang_marker, "w").write(str(os.getpid()))
            time.sleep(a.hang_s)  # a rank stuck outside any collective
    summary = None
    if a.trace:
        import fleetscope.collectors.tracer as ft
        summary = ft.stop()
    q.put(json.dumps({"rank": rank, "step_times": times, "tracer": summary}))
    dist.barrier()
    dist.destroy_process_group()


def _pipeline_worker(rank, a, q, torch, dist, DataLoader, Data, collate):
    """Pipeline (pp stages) x data parallel (world / pp): stage = rank // dp. GPipe-like schedule
    per step: all microbatch forwards (activations sent to the next stage), then all backwards
    (gradients sent back), then the stage's DP all-reduce and optimizer step. `--stage-layers`
    sets the layers per stage (an uneven split is a stage-partitioning imbalance)."""
    dp = a.world // a.pp
    stage, dp_rank = rank // dp, rank % dp
    groups = [dist.new_group(list(range(s * dp, (s + 1) * dp))) for s in range(a.pp)]  # every rank makes every group
    per_stage = [int(x) for x in a.stage_layers.split(",")] if a.stage_layers else [a.layers // a.pp] * a.pp
    layers = []
    for _ in range(per_stage[stage]):
        layers += [torch.nn.Linear(a.hidden, a.hidden), torch.nn.GELU()]
    if stage == a.pp - 1:
        layers.append(torch.nn.Linear(a.hidden, 1))
    model = torch.nn.Sequential(*layers)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    prev_rank, next_rank = rank - dp, rank + dp
    mb = a.batch // a.microbatches
    op = _op_marker(a)
    if a.trace:
        import fleetscope.collectors.tracer as ft
        ft.start(landing_dir=a.landing, capture=a.capture, rank=rank, job_id=a.job_id, flush_interval_s=a.flush_s,
                 profiler=True, stacks=True, layout={"stage": stage, "dp_rank": dp_rank})
    it = iter(DataLoader(Data(a.batch * (a.steps + 2), a.hidden), batch_size=mb, collate_fn=collate))
    times = []
    for step in range(a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        saved = []
        for i in range(a.microbatches):
            x, y = next(it)  # every stage reads its batch (the last one needs the targets)
            if stage > 0:
                x = torch.empty(mb, a.hidden)
                with op("forward-recv", microbatch=i):
                    dist.recv(x, src=prev_rank)
                x.requires_grad_(True)
            with op("forward-compute", microbatch=i):
                out = model(x)
                if stage == a.pp - 1:
                    out = torch.nn.functional.mse_loss(out, y) / a.microbatches
            if stage < a.pp - 1:
                with op("forward-send", microbatch=i):
                    dist.send(out.detach(), dst=next_rank)
            saved.append((x, out))
        for i, (x, out) in reversed(list(enumerate(saved))):
            if stage == a.pp - 1:
                with op("backward-compute", microbatch=i):
                    out.backward()
            else:
                g = torch.empty_like(out)
                with op("backward-recv", microbatch=i):
                    dist.recv(g, src=next_rank)
                with op("backward-compute", microbatch=i):
                    out.backward(g)
            if stage > 0:
                with op("backward-send", microbatch=i):
                    dist.send(x.grad, dst=prev_rank)
        with op("grads-all-reduce"):
            for p in model.parameters():
                dist.all_reduce(p.grad, group=groups[stage])
        with op("optimizer"):
            opt.step()
        times.append(time.perf_counter() - t0)
    summary = None
    if a.trace:
        import fleetscope.collectors.tracer as ft
        summary = ft.stop()
    q.put(json.dumps({"rank": rank, "step_times": times, "tracer": summary}))
    dist.barrier()
    dist.destroy_process_group()


def _op_marker(a):
    """ft.op when tracing (framework-level op rows, docs/CONTRACT.md 1.4), else a no-op."""
    if a.trace:
        import fleetscope.collectors.tracer as ft
        return ft.op
    return lambda *names, **kw: contextlib.nullcontext()


def parse(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--landing", default="data/landing")
    ap.add_argument("--capture", default="demo")
    ap.add_argument("--job-id", default="demo")
    ap.add_argument("--no-trace", dest="trace", action="store_false")
    ap.add_argument("--flush-s", type=float, default=30.0)
    ap.add_argument("--gc-stall-rank", type=int, default=-1)
    ap.add_argument("--gc-stall-every", type=int, default=0)
    ap.add_argument("--gc-heap", type=int, default=300_000)
    ap.add_argument("--sync-in-forward", type=int, default=0)
    ap.add_argument("--slow-dataloader-ms", type=float, default=0.0)
    ap.add_argument("--slow-dataloader-from", type=int, default=0, help="first slow batch (0: all)")
    ap.add_argument("--hang-rank", type=int, default=-1)
    ap.add_argument("--hang-step", type=int, default=-1)
    ap.add_argument("--hang-s", type=float, default=0.0)
    ap.add_argument("--hang-marker", default="")
    ap.add_argument("--log-loss", action="store_true")
    ap.add_argument("--pp", type=int, default=1, help="pipeline stages (world must be a multiple)")
    ap.add_argument("--stage-layers", default="", help="layers per stage, e.g. 2,6 (default: even split)")
    ap.add_argument("--microbatches", type=int, default=4)
    return ap.parse_args(argv)


def run(argv=None) -> list[dict]:
    """Run the job in `world` forked processes; returns each rank's result dict."""
    import torch.multiprocessing as mp

    a = parse(argv)
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=worker, args=(r, a, port, q)) for r in range(a.world)]
    for p in procs:
        p.start()
    out = [json.loads(q.get(timeout=600)) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        if p.exitcode not in (0, None):
            raise RuntimeError(f"a training process failed with exit code {p.exitcode}")
    return sorted(out, key=lambda d: d["rank"])


if __name__ == "__main__":
    res = run(sys.argv[1:])
    for r in res:
        st = sorted(r["step_times"][5:])
        print(json.dumps({"rank": r["rank"], "median_step_ms": 1000 * st[len(st) // 2], "tracer": r["tracer"]}))
