"""The 'blocked' check on API event streams whose stall sits where a capture cuts them: a capture
can end one or two steps after a stall (the tracer switched to a profile's capture id for the
steps around it), so the stall falls before the capture's last, unfinished iteration."""
from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from fleetscope.xputimer.degradation import detect_degradation

STEP_NS, STALL_NS = 50_000_000, 8_000_000_000


def _stream(n_steps: int, stall_after: int, rng) -> pl.DataFrame:
    """dataloader.next then optimizer.step per step; a stall after step `stall_after`'s optimizer."""
    rows, t = [], 0
    for s in range(n_steps):
        d = int(STEP_NS * rng.uniform(0.9, 1.1))
        rows.append(("dataloader.next", t, t + d // 10))
        rows.append(("optimizer.step", t + d - d // 10, t + d))
        t += d + (STALL_NS if s == stall_after else 0)
    return pl.DataFrame(rows, schema=["name", "start_ns", "end_ns"], orient="row").with_columns(
        pl.lit("api").alias("kind"), pl.lit(0).alias("rank"), pl.lit("cap").alias("capture_id"))


@pytest.mark.parametrize("steps_after", [1, 2, 5])
def test_a_stall_before_the_last_iterations_is_blocked(steps_after):
    rng = np.random.default_rng(steps_after)
    t = _stream(30 + steps_after, 29, rng)
    _, deg = detect_degradation(t)
    blocked = deg.filter(pl.col("kind") == "blocked")
    assert blocked.height == 1
    assert blocked["idle_ns"].item() >= STALL_NS


def test_steady_steps_are_not_blocked():
    _, deg = detect_degradation(_stream(40, -1, np.random.default_rng(0)))
    assert deg.filter(pl.col("kind") == "blocked").height == 0
