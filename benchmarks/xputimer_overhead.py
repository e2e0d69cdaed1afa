"""Tracer overhead and log volume on a real CPU training loop (torch.distributed gloo, 2 ranks).

    .venv/bin/python -m benchmarks.xputimer_overhead [--hidden 1024] [--blocks 20] [--block-steps 4]

Interleaved in one job: blocks of `block-steps` steps alternate tracer on / off (ft.start / ft.stop
patch and unpatch) in ABBA order, `blocks` of each; overhead = median of the on-blocks' median step
time / the same for the off-blocks - 1, and the median over adjacent on/off block pairs (robust to
load drift on a shared machine). Also the wrappers' own cost per traced call (tiny F.linear, 5000
calls, 7 on / 7 off repetitions) times the traced calls per step. Log volume: bytes the tracer wrote per step and rank, scaled to
an hour at the measured step rate and at 1 step/s.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import tempfile
import time



def worker(rank, a, port, q, landing):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch
    import torch.distributed as dist

    import fleetscope.collectors.tracer as ft

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=a.world)
    torch.manual_seed(0)
    layers = []
    for _ in range(a.layers):
        layers += [torch.nn.Linear(a.hidden, a.hidden), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(a.hidden, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    ds = torch.utils.data.TensorDataset(torch.randn(a.batch * 64, a.hidden), torch.randn(a.batch * 64, 1))
    loader = torch.utils.data.DataLoader(ds, batch_size=a.batch)

    def batches():
        while True:
            yield from loader

    it = batches()
    params = [p for p in model.parameters()]

    def step():
        x, y = next(it)
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(model(x), y).backward()
        works = [dist.all_reduce(p.grad, async_op=True) for p in params]
        for w in works:
            w.wait()
        opt.step()

    for _ in range(10):  # warm-up
        step()
    on, off, summ = [], [], []
    traced_steps = 0
    for b in range(2 * a.blocks):
        traced = (b % 2 == 0) if (b // 2) % 2 == 0 else (b % 2 == 1)  # ABBA order against drift
        if traced:
            ft.start(landing_dir=landing, capture="overhead", rank=rank, job_id="overhead", profiler=False, stacks=False)
        dist.barrier()
        ts = []
        for _ in range(a.block_steps):
            t0 = time.perf_counter()
            step()
            ts.append(time.perf_counter() - t0)
        if traced:
            s = ft.stop()
            summ.append(s)
            traced_steps += a.block_steps
            on.append(statistics.median(ts))
        else:
            off.append(statistics.median(ts))
    # log volume in steady state: one long traced segment written as one file (as with the default
    # 30 s flush interval), so parquet's fixed per-file cost does not dominate as in the short blocks
    ft.start(landing_dir=landing, capture="overhead-volume", rank=rank, job_id="overhead", profiler=False, stacks=False,
             flush_interval_s=1e9)
    tv = time.perf_counter()
    for _ in range(a.volume_steps):
        step()
    vol_dt = (time.perf_counter() - tv) / a.volume_steps
    vol = ft.stop()
    # per-call cost of the wrappers, interleaved on/off on a tiny GEMM (robust to machine load)
    cost = []
    if rank == 0:
        x, w = torch.randn(4, 8), torch.randn(8, 8)
        F = torch.nn.functional
        for rep in range(14):
            traced = rep % 2 == 0
            if traced:
                ft.start(landing_dir=landing, capture="overhead-call", rank=rank, job_id="overhead", profiler=False, stacks=False)
            t0 = time.perf_counter()
            for _ in range(5000):
                F.linear(x, w)
            dt = (time.perf_counter() - t0) / 5000
            if traced:
                ft.stop()
            cost.append((traced, dt))
    q.put(json.dumps({"rank": rank, "on": on, "off": off, "bytes": sum(s["bytes"] for s in summ),
                      "rows": sum(s["rows"] for s in summ), "traced_steps": traced_steps, "cost": cost,
                      "vol_bytes": vol["bytes"], "vol_rows": vol["rows"], "vol_step_s": vol_dt}))
    dist.barrier()
    dist.destroy_process_group()


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--blocks", type=int, default=20)
    ap.add_argument("--block-steps", type=int, default=4)
    ap.add_argument("--volume-steps", type=int, default=150)
    a = ap.parse_args(argv)
    import torch.multiprocessing as mp

    ctx = mp.get_context("fork")
    q = ctx.Queue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        ps = [ctx.Process(target=worker, args=(r, a, port, q, tmp)) for r in range(a.world)]
        for p in ps:
            p.start()
        res = sorted((json.loads(q.get(timeout=1800)) for _ in ps), key=lambda d: d["rank"])
        for p in ps:
            p.join()
    on = [x for r in res for x in r["on"]]
    off = [x for r in res for x in r["off"]]
    m_on, m_off = statistics.median(on), statistics.median(off)
    overhead = m_on / m_off - 1
    # adjacent on/off blocks share the machine's load at that moment: the median of their ratios
    pairs = [a_ / b_ - 1 for r in res for a_, b_ in zip(r["on"], r["off"])]
    paired = statistics.median(pairs)
    cost = res[0]["cost"]
    c_on = statistics.median(d for t_, d in cost if t_)
    c_off = statistics.median(d for t_, d in cost if not t_)
    per_step = statistics.mean(r["bytes"] / r["traced_steps"] for r in res)
    print(f"model: {a.layers}x Linear({a.hidden}) batch {a.batch}, {a.world} ranks gloo, {a.blocks} on + {a.blocks} off "
          f"blocks x {a.block_steps} steps, interleaved ABBA")
    print(f"median step off {m_off * 1e3:.2f} ms, on {m_on * 1e3:.2f} ms -> overhead {overhead * 100:+.2f} % (target <= 1 %)")
    print(f"paired (adjacent on/off blocks) median overhead {paired * 100:+.2f} % over {len(pairs)} pairs")
    per_call = c_on - c_off
    calls = res[0]["rows"] / res[0]["traced_steps"]
    print(f"wrapper cost per traced call {per_call * 1e6:.2f} us (tiny F.linear {c_off * 1e6:.2f} -> {c_on * 1e6:.2f} us); "
          f"x {calls:.0f} traced calls/step = {per_call * calls * 1e3:.3f} ms per step = "
          f"{100 * per_call * calls / m_off:.2f} % of this loop's step")
    print(f"per-block medians off: {[round(x * 1e3, 2) for x in off]}")
    print(f"per-block medians on : {[round(x * 1e3, 2) for x in on]}")
    vb = statistics.mean(r["vol_bytes"] / a.volume_steps for r in res)
    vr = statistics.mean(r["vol_rows"] / a.volume_steps for r in res)
    vs = statistics.median(r["vol_step_s"] for r in res)
    print(f"log volume (one {a.volume_steps}-step file per rank): {vr:.1f} rows/step, {vb / vr:.1f} B/row, {vb:.0f} B/step/rank -> "
          f"{vb * 3600 / vs / 1e6:.2f} MB/rank/hour at this loop's {1 / vs:.1f} steps/s, "
          f"{vb * 3600 / 1e6:.2f} MB/rank/hour at 1 step/s (target < 2 MB)")
    print(f"(short {a.block_steps}-step blocks, one file each: {per_step:.0f} B/step: parquet's per-file cost dominates)")


if __name__ == "__main__":
    main()
