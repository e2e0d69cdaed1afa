"""The straggler-case runner for real (fleetscope.collectors.recorder.cases): a CPU quota slows a
process for real, and a short real gloo job with variable sequence lengths writes op rows whose
compute follows the lengths its ranks logged. Needs root and network namespaces; skips saying so."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import polars as pl
import pytest

from fleetscope.collectors.recorder.cases import CGROUP_CPU, CpuQuota, case_timings, record

pytestmark = [pytest.mark.netns, pytest.mark.slow]


def _need_root():
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 (network namespaces, cgroups)")


def test_a_cpu_quota_slows_a_process_for_real():
    _need_root()
    if not (CGROUP_CPU / "cpu.cfs_quota_us").exists():
        pytest.skip(f"no cgroup v1 cpu controller at {CGROUP_CPU}")
    spin = "import time\nt=time.process_time()\nw=time.time()\nwhile time.time()-w<1.0: pass\nprint(time.process_time()-t)"
    with CpuQuota(f"fstest{os.getpid()}", 10.0, period_ms=20) as q:
        p = subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE, text=True)
        q.add(p.pid)
        out, _ = p.communicate(timeout=30)
        stat = q.stats()
    cpu = float(out)
    assert cpu < 0.35, cpu            # 1 s of spinning got about 10 % of a core (plus the time before it joined)
    assert int(stat["nr_throttled"]) > 10
    assert not (CGROUP_CPU / f"fstest{os.getpid()}").exists()   # the group is gone afterwards


@pytest.mark.torch
def test_a_short_seq_case_records_ops_that_follow_the_logged_lengths(tmp_path):
    _need_root()
    pytest.importorskip("torch")
    t0 = time.time()
    d = record(tmp_path, "seq-test", "seq", steps=8, seed=5, pp=2, warmup=2, seq_sigma=0.5, timeout_s=300)
    truth = json.loads((d / "truth.json").read_text())
    assert truth["kind"] == "seq" and truth["pp"] == 2 and truth["dp"] == 4 and "load average" in truth["uptime_after"]
    t = case_timings(d)
    assert t.height == truth["op_rows"] and set(t["step"].unique()) == set(range(2, 10))
    assert {"forward-compute", "backward-compute", "optimizer-clip-main-grad", "grads-all-reduce"} <= set(t["name"])
    mbs = pl.read_parquet(d / "microbatches.parquet")
    fwd = (t.filter((pl.col("name") == "forward-compute") & (pl.col("stage") == 1))
           .with_columns(ms=(pl.col("end_ns") - pl.col("start_ns")) / 1e6)
           .join(mbs.with_columns(pl.col("dp_rank").cast(pl.Int32), pl.col("microbatch").cast(pl.Int32)),
                 on=["step", "dp_rank", "microbatch"]))
    assert fwd.height == 8 * 4 * 4   # steps x replicas x microbatches, each with its logged length
    # (a loaded shared machine jitters the rest: without the lengths the correlation would be ~0)
    assert np.corrcoef(fwd["ms"].to_numpy(), fwd["tokens"].to_numpy())[0, 1] > 0.6
    assert time.time() - t0 < 300
