"""A tiny real training job for the real-traffic test: pipeline (2 stages) x data parallelism
(DP ranks) over torch.distributed gloo, one rank per network namespace. It logs its own step
boundaries (end of the gradient all-reduce) to a JSON file: the ground truth of the test.

    python real_job.py --rank R --world W --dp D --master 10.x.y.z --port P --steps N --out log.json
"""
import argparse
import json
import time

import torch
import torch.distributed as dist


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--dp", type=int, required=True)
    ap.add_argument("--master", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--micro", type=int, default=4)
    # emulated compute per step (sleep: costs no CPU on the shared test box) so that a few ms of
    # scheduling jitter is a small share of a step, as on a real cluster
    ap.add_argument("--compute-ms", type=float, default=150.0)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(a.rank % a.dp)
    dist.init_process_group("gloo", init_method=f"tcp://{a.master}:{a.port}", rank=a.rank, world_size=a.world)
    dp, pp = a.dp, a.world // a.dp
    stage, d = a.rank // dp, a.rank % dp
    groups = [dist.new_group([s * dp + i for i in range(dp)]) for s in range(pp)]
    my_dp = groups[stage]
    width, mb = 256, 64
    # layers of different sizes: gradient buckets of different sizes (DP shows several flow sizes)
    layers = torch.nn.Sequential(torch.nn.Linear(width, 512), torch.nn.ReLU(), torch.nn.Linear(512, width),
                                 torch.nn.ReLU(), torch.nn.Linear(width, 96), torch.nn.ReLU(), torch.nn.Linear(96, width))
    opt = torch.optim.SGD(layers.parameters(), lr=1e-3)
    nxt = a.rank + dp if stage + 1 < pp else None
    prv = a.rank - dp if stage > 0 else None
    log = []
    dist.barrier()
    for step in range(a.steps):
        t0 = time.time_ns()
        opt.zero_grad()
        time.sleep(a.compute_ms / 1e3)
        for m in range(a.micro):
            x = torch.randn(mb, width) if prv is None else torch.empty(mb, width)
            if prv is not None:
                dist.recv(x, prv)
                x.requires_grad_(True)
            y = layers(x)
            for _ in range(3):  # some compute per microbatch
                torch.mm(torch.randn(192, 192), torch.randn(192, 192))
            if nxt is not None:
                dist.send(y.detach(), nxt)
                g = torch.empty_like(y)
                dist.recv(g, nxt)
                y.backward(g)
            else:
                y.pow(2).mean().backward()
            if prv is not None:
                dist.send(x.grad, prv)
        # DP: one all-reduce per layer weight and bias (buckets of different sizes), step ends after
        dp_t0 = time.time_ns()
        for p in layers.parameters():
            dist.all_reduce(p.grad, group=my_dp)
        opt.step()
        log.append({"step": step, "start_ns": t0, "dp_start_ns": dp_t0, "end_ns": time.time_ns()})
    dist.barrier()
    with open(a.out, "w") as fh:
        json.dump({"rank": a.rank, "stage": stage, "dp_rank": d, "steps": log}, fh)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
