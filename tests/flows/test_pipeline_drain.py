"""Pipeline-only steps (fleetscope.flows.pipeline): a step of a pipeline hop starts where the hop was
drained (every activation sent forward came back as a gradient), whichever of its two directions
is forward, for a two-stage pipeline that exchanges a gradient with the next activation (gloo's
batched isend/irecv) and for a middle stage of a four-stage 1F1B pipeline whose gaps between steps
are no longer than those inside them. Hand-built flows; the truth is where each step begins."""
import numpy as np
import polars as pl

from fleetscope.flows.changepoint import sequence_gaps
from fleetscope.flows.pipeline import drained_gaps

MS = 1_000_000


def _frame(events, ix=0):
    """events: (t_ms, role, peer) -> rows as split_ip_steps gives drained_gaps."""
    ev = sorted(events)
    start = np.array([int(t * MS) for t, _, _ in ev], dtype=np.int64)
    end = start + MS // 5
    gaps = sequence_gaps(np.full(len(ev), ix), start, end)
    return pl.DataFrame({"ix": [ix] * len(ev), "peer": [p for _, _, p in ev], "role": [r for _, r, _ in ev],
                         "start_ns": start, "end_ns": end, "bytes": [65_536 + 48 * (i % 3) for i in range(len(ev))], "gap": gaps})


def _step_starts(df, g):
    # the drained gaps that stand out: one per step (the rest are instants between a gradient and
    # the activation sent with it)
    return set(np.round(df["start_ns"].to_numpy()[np.nan_to_num(g, nan=0.0) > 10 * MS] / MS).astype(int))


def test_two_stage_batched_exchange_for_both_ends():
    # stage 0 sends F0, then exchanges (B_k in, F_k+1 out) every 50 ms, receives B3; 4 steps of 250 ms
    s0, s1 = [], []
    starts = []
    for k in range(4):
        t = 250 * k
        starts.append(t + 10)
        s0.append((t + 10, "send", "b"))
        for m in range(3):
            s0 += [(t + 60 + 50 * m, "recv", "b"), (t + 60.3 + 50 * m, "send", "b")]
        s0.append((t + 210, "recv", "b"))
    s1 = [(t, "recv" if r == "send" else "send", "a") for t, r, _ in s0]
    for ev in (s0, s1):
        df = _frame(ev)
        assert _step_starts(df, drained_gaps(df)) == set(starts[1:])


def test_middle_stage_of_four_drains_once_per_step():
    # stage 1 of 4 (1F1B, 4 microbatches): F in from stage 0 and out to stage 2, B back in from
    # stage 2 and out to stage 0; each wait inside the step is as long as the one between steps
    ev, starts = [], []
    for k in range(4):
        t = 1000 * k
        starts.append(t)
        for m in range(4):
            ev += [(t + 60 * m, "recv", "prev"), (t + 60 * m + 30, "send", "next")]
        for m in range(4):
            ev += [(t + 400 + 60 * m, "recv", "next"), (t + 400 + 60 * m + 30, "send", "prev")]
    df = _frame(ev)
    g = drained_gaps(df)
    assert _step_starts(df, g) == set(starts[1:])
