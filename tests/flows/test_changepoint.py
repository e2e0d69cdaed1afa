"""The online change-point split on hand-built sequences with known step boundaries."""
import numpy as np

from fleetscope.flows.changepoint import SplitParams, sequence_gaps, split_steps, step_index

MS = 1_000_000


def _run(rows):
    a = np.array(sorted(rows), dtype=np.int64)
    g, s, e = a[:, 0], a[:, 1], a[:, 2]
    b = split_steps(g, sequence_gaps(g, s, e), SplitParams(), durations=(e - s).astype(float))
    return g, step_index(g, b), a


def test_three_gap_levels_channels_buckets_steps():
    # DDP-like: 4 channels overlap, 6 buckets 29 ms apart, steps 3.4 s apart (sim-like); steps
    # must come out whole although there are three gap levels
    rows = []
    for k in range(15):
        t0 = k * 3_400 * MS + (k % 3) * 20 * MS
        for bkt in range(6):
            for c in range(4):
                st = t0 + bkt * 29 * MS + c * 300_000
                rows.append((0, st, st + 1 * MS))
    g, idx, a = _run(rows)
    truth = a[:, 1] // (3_400 * MS)
    assert idx.max() + 1 == 15
    # every flow lands in the step it belongs to (same partition as the truth)
    assert len(set(zip(idx.tolist(), truth.tolist()))) == 15


def test_one_flow_per_step_and_independent_groups():
    rows = [(1, k * 900 * MS, k * 900 * MS + 5 * MS) for k in range(12)]
    rows += [(2, k * 1000 * MS + m * 40 * MS, k * 1000 * MS + m * 40 * MS + MS) for k in range(10) for m in range(6)]
    g, idx, _ = _run(rows)
    assert idx[g == 1].max() + 1 == 12  # each isolated flow is its own step
    assert idx[g == 2].max() + 1 == 10


def test_a_single_huge_pause_does_not_break_later_steps():
    rows = []
    t = 0
    for k in range(20):
        t += (30_000 if k == 8 else 1_000) * MS  # a 30 s pause (job stalled) between two steps
        for m in range(5):
            rows.append((0, t + m * 2 * MS, t + m * 2 * MS + MS))
    g, idx, _ = _run(rows)
    assert idx.max() + 1 == 20
