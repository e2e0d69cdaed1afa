"""Real PyTorch runs (CPU, torch.distributed gloo, 4 processes) shared by the collector tests:
each run takes a few seconds and is made once per session."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
WORLD = 4
HANG_STEPS = 40
COMMON = ["--world", str(WORLD), "--layers", "6", "--hidden", "256", "--batch", "32"]


def demo(landing: Path, capture: str, *extra: str, steps: int = 30, env: dict | None = None) -> list[dict]:
    """Run fleetscope.collectors.demo_train in-process (it forks its ranks) and return each rank's result."""
    from fleetscope.collectors import demo_train

    old = dict(os.environ)
    os.environ.update(env or {})
    try:
        return demo_train.run([*COMMON, "--steps", str(steps), "--landing", str(landing), "--capture", capture,
                               "--job-id", capture, *extra])
    finally:
        os.environ.clear()
        os.environ.update(old)


@pytest.fixture(scope="session")
def real_runs(tmp_path_factory):
    """landing dir and per-run results of: two healthy runs, a GC stall on rank 1, an unnecessary
    synchronization in forward, and a data loader that turns slow from step 15. The two healthy
    runs run back to back (their comparison is the false-alarm check) and the sync run right after
    them (its history is both)."""
    landing = tmp_path_factory.mktemp("real") / "landing"
    res = {
        "healthy_a": demo(landing, "healthy_a"),
        "healthy_b": demo(landing, "healthy_b"),
        # 8 untraced all-reduces per forward (after each of the first 8 of its 13 modules): the ranks
        # are aligned through the whole forward, not only at a few points (4 gave one-sided KS of
        # 0.11-0.29 under this machine's load, straddling the 0.15 bar; 8 gave 0.35)
        "sync": demo(landing, "sync", "--sync-in-forward", "8"),
        "gc": demo(landing, "gc", "--gc-stall-rank", "1", "--gc-stall-every", "4", "--gc-heap", "200000"),
        "slowdl": demo(landing, "slowdl", "--slow-dataloader-ms", "500", "--slow-dataloader-from", "15", steps=40),
    }
    return landing, res


@pytest.fixture(scope="session")
def hang_run(tmp_path_factory):
    """A run with a profiling request waiting for it (served a few steps in, on the same steps on
    every rank), an extra traced Python API from the environment, a per-step loss all-reduce, and
    rank 2 stuck outside any collective for 8 s at step 36: the other ranks' watchdogs (bound at
    least 1.5 s) file a hang incident with every rank's stacks; after it, a human asks for stacks
    too (incident inc-test)."""
    from fleetscope.xputimer.degradation import write_profile_request

    landing = tmp_path_factory.mktemp("hang") / "landing"
    req = write_profile_request(landing, "hang", {"kind": "degraded", "at_ns": 1, "ratio": 1.2}, steps=2, capture="hang-prof")
    marker = landing.parent / "hang.marker"
    code = ("from fleetscope.collectors import demo_train; "
            f"demo_train.run({[*COMMON, '--steps', str(HANG_STEPS), '--landing', str(landing), '--capture', 'hang', '--job-id', 'hang', '--log-loss', '--hang-rank', '2', '--hang-step', '36', '--hang-s', '8', '--hang-marker', str(marker)]!r})")
    env = dict(os.environ, FLEETSCOPE_TRACED_PYTHON_API="torch.nn.functional.mse_loss,torch.nn.init@zeros_",
               FLEETSCOPE_HANG_MIN_S="1.5")
    p = subprocess.Popen([sys.executable, "-c", code], env=env, cwd=REPO)
    t0 = time.time()
    while not marker.exists() and time.time() - t0 < 120:
        time.sleep(0.2)
    assert marker.exists(), "the hang was never reached"
    t1 = time.time()
    while not list((landing / "incidents").glob("*.json")) and time.time() - t1 < 7:
        time.sleep(0.1)
    time.sleep(0.8)  # every rank's watcher has served the watchdog's request (they poll every 0.5 s)
    from fleetscope.collectors import stacks
    stacks.request(landing, "hang", "inc-test")
    assert p.wait(timeout=180) == 0
    return landing, req
