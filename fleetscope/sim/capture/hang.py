"""Stack dumps of a hung job (docs/CONTRACT.md 1.6, py-spy dump text) and the incident request (1.7).

Two ways a job hangs:
- mode "rank": one rank is stuck outside the collective (here: in the data loader's socket read, a
  storage hang); every other rank waits inside the same NCCL all_reduce.
- mode "link": every rank is inside the same collective; ring.json gives the loop step each ring
  connection reached and the connection over the faulty link has the lowest step.
The mode comes from fault["mode"], else "link" when the subject / ips name two addresses, else "rank".
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import polars as pl

from fleetscope.schemas.base import conform
from fleetscope.sim.capture.schemas import TRUTH

from fleetscope.sim.capture.faults import _as_list, fault_mask

_COMMON_TAIL = [
    ("train_step", "megatron/training/training.py", 812),
    ("train", "megatron/training/training.py", 1180),
    ("pretrain", "megatron/training/training.py", 290),
    ("<module>", "pretrain_gpt.py", 243),
]
IN_COLLECTIVE = [
    ("synchronize", "torch/cuda/__init__.py", 792),
    ("all_reduce", "torch/distributed/distributed_c10d.py", 2288),
    ("wrapper", "torch/distributed/c10d_logger.py", 83),
    ("get_grad_norm_fp32", "megatron/core/optimizer/clip_grads.py", 98),
    ("clip_grad_norm", "megatron/core/optimizer/optimizer.py", 215),
    ("step", "megatron/core/optimizer/optimizer.py", 410),
] + _COMMON_TAIL
OUTSIDE = [
    ("recv_into", "<built-in method recv_into of _socket.socket object>", 0),
    ("_recv", "s3fs/core.py", 1287),
    ("read", "fsspec/spec.py", 1898),
    ("__getitem__", "megatron/core/datasets/gpt_dataset.py", 202),
    ("fetch", "torch/utils/data/_utils/fetch.py", 52),
    ("_next_data", "torch/utils/data/dataloader.py", 1329),
    ("__next__", "torch/utils/data/dataloader.py", 631),
    ("get_batch", "pretrain_gpt.py", 98),
    ("forward_step", "megatron/core/pipeline_parallel/schedules.py", 219),
    ("forward_backward_pipelining_without_interleaving", "megatron/core/pipeline_parallel/schedules.py", 1209),
] + _COMMON_TAIL


def _dump(pid: int, frames: list[tuple[str, str, int]], rank: int, layout: str) -> str:
    lines = [f"Process {pid}: /usr/bin/python3.11 -u pretrain_gpt.py {layout} --rank {rank}",
             "Python v3.11.9 (/usr/bin/python3.11)", "", f'Thread {pid} (active): "MainThread"']
    for fn, file, line in frames:
        lines.append(f"    {fn} ({file}:{line})" if line else f"    {fn} ({file})")
    lines += [f'Thread {pid + 41} (idle): "Thread-2 (_pin_memory_loop)"',
              "    select (selectors.py:415)", "    _pin_memory_loop (torch/utils/data/_utils/pin_memory.py:53)",
              "    run (threading.py:982)", "    _bootstrap_inner (threading.py:1045)", "    _bootstrap (threading.py:1002)", ""]
    return "\n".join(lines)


def render_hang(landing_dir: Path, incident_id: str, job, fault: dict, seed: int) -> list[dict]:
    landing_dir = Path(landing_dir)
    rng = np.random.default_rng([seed, 31])
    n = len(job.ips)
    names = _as_list(fault.get("subject")) + _as_list(fault.get("ips"))
    names += [p for x in names if "-" in x for p in x.split("-")]  # a link subject "ip_a-ip_b"
    ip_hits = [x for x in dict.fromkeys(names) if x in job.ips]
    mode = fault.get("mode") or ("link" if len(ip_hits) >= 2 else "rank")
    if mode not in ("rank", "link"):
        raise ValueError(f"hang fault {fault.get('fault_id')!r}: mode must be 'rank' or 'link', got {mode!r}")
    d = landing_dir / "stacks" / incident_id
    d.mkdir(parents=True, exist_ok=True)
    pids = 2_900_000 + np.arange(n) * 173
    layout = f"--tensor-model-parallel-size {job.tp} --pipeline-model-parallel-size {job.pp}"
    if mode == "rank":
        mask = fault_mask(fault, job)
        if mask.all() or not mask.any():  # job-wide row: one seeded culprit
            mask = np.zeros(n, bool)
            mask[int(rng.integers(n))] = True
        culprits = np.nonzero(mask)[0]
        for r in range(n):
            (d / f"rank{r}.txt").write_text(_dump(int(pids[r]), OUTSIDE if mask[r] else IN_COLLECTIVE, r, layout))
        truth_ranks, func, subj_scope = culprits, OUTSIDE[0][1], "rank"
    else:
        a, b = job.ips.index(ip_hits[0]), job.ips.index(ip_hits[1])
        ring = [r for r in range(n) if r != b]
        ring.insert(ring.index(a) + 1, b)
        nxt = {ring[i]: ring[(i + 1) % n] for i in range(n)}
        low = int(rng.integers(20, 200))
        rows = []
        for r in ring:
            for ch in range(4):
                step = low if (r == a and nxt[r] == b) else low + int(rng.integers(2, 9))
                rows.append({"rank": int(r), "peer": int(nxt[r]), "channel": ch, "step": step})
        tmp = d / ".ring.json.tmp"
        tmp.write_text(json.dumps(rows))
        os.replace(tmp, d / "ring.json")
        for r in range(n):
            (d / f"rank{r}.txt").write_text(_dump(int(pids[r]), IN_COLLECTIVE, r, layout))
        truth_ranks, func, subj_scope = np.array([a, b]), "all_reduce", "link"
    start = int(fault.get("start_ns") or job.start_ns)
    inc = {"kind": "hang", "job_id": job.job_id, "ips": list(job.ips), "hosts": sorted(set(job.hosts)), "from_ns": start,
           "to_ns": int(fault.get("end_ns") or start + 600_000_000_000),
           "note": f"no training progress; stack dumps in stacks/{incident_id}"}
    (landing_dir / "incidents").mkdir(parents=True, exist_ok=True)
    (landing_dir / "incidents" / f"{incident_id}.json").write_text(json.dumps(inc, indent=1))
    subject = f"{job.ips[truth_ranks[0]]}-{job.ips[truth_ranks[1]]}" if mode == "link" else None
    rows = []
    stage_of = np.arange(n) // (job.dp * job.tp)
    dp_of, tp_of = (np.arange(n) // job.tp) % job.dp, np.arange(n) % job.tp
    for r in truth_ranks:
        rows.append({
            "fault_id": str(fault.get("fault_id", f"{incident_id}-hang")), "kind": "hang",
            "scope": subj_scope, "subject": subject or str(int(r)), "start_ns": inc["from_ns"], "end_ns": inc["to_ns"],
            "magnitude": None, "capture_id": incident_id, "job_id": job.job_id, "rank": int(r), "host": job.hosts[r],
            "gpu": job.gpus[r], "ip": job.ips[r], "stage": int(stage_of[r]), "dp_rank": int(dp_of[r]), "tp_rank": int(tp_of[r]),
            "function": func, "kernel": "",
            "team": "operations", "mode": mode,
            "expected": "rank stuck outside the collective (data loader socket read)" if mode == "rank"
            else "all ranks in the same all_reduce; the ring connection with the lowest step is the faulty link",
        })
    return TRUTH.validate(conform(pl.DataFrame(rows, infer_schema_length=None), TRUTH)).to_dicts()
