"""Steps by gradient volume (fleetscope.flows.volume): a step whose DP phase stalled longer than its
compute gap comes out of the gap split in pieces, and pieces are joined back; a boundary the gap
split missed leaves a segment with two steps' volume, and it is split where the bytes say; whole
steps are never joined. Hand-built flow sequences of one address, boundaries as a gap split gives."""
import numpy as np

from fleetscope.flows.changepoint import sequence_gaps
from fleetscope.flows.volume import balance_boundaries

MS = 1_000_000


def _sequence(n_steps=12, flows_per_step=4, stall_step=None, stall_ms=700, jitter=None):
    """One address: per step `flows_per_step` gradient flows of 1 MB 20 ms apart after 500 ms of
    compute; a stall of `stall_ms` before the third flow of `stall_step`."""
    rng = np.random.default_rng(0)
    starts, sizes, truth = [], [], []
    t = 0
    for s in range(n_steps):
        t += 500 * MS
        truth.append(len(starts))
        for k in range(flows_per_step):
            if s == stall_step and k == 2:
                t += stall_ms * MS
            starts.append(t)
            sizes.append(1_000_000 + (int(rng.integers(-2000, 2000)) if jitter else 0))
            t += 20 * MS
    start = np.array(starts, dtype=np.int64)
    end = start + 5 * MS
    gid = np.zeros(len(start), dtype=np.int64)
    gaps = sequence_gaps(gid, start, end)
    return gid, gaps, np.array(sizes, dtype=np.int64), np.array(truth)


def _boundaries(gaps, cut_ms):
    b = np.nan_to_num(gaps, nan=np.inf) > cut_ms * MS
    b[0] = True
    return b


def test_pieces_of_a_stalled_step_are_joined():
    gid, gaps, nbytes, truth = _sequence(stall_step=5)
    b = _boundaries(gaps, 300)                 # the stall (700 ms) splits step 5 in two
    assert b.sum() == len(truth) + 1
    out = balance_boundaries(gid, gaps, nbytes, b, 0.01)
    assert np.array_equal(np.flatnonzero(out), truth)


def test_a_segment_with_two_steps_volume_is_split_where_the_bytes_say():
    gid, gaps, nbytes, truth = _sequence(jitter=True)
    b = _boundaries(gaps, 300)
    b[truth[7]] = False                       # the boundary before step 7 missed: steps 6 and 7 as one
    out = balance_boundaries(gid, gaps, nbytes, b, 0.01)
    assert np.array_equal(np.flatnonzero(out), truth)


def test_whole_steps_are_never_joined_and_a_clean_split_is_kept():
    gid, gaps, nbytes, truth = _sequence(jitter=True)
    b = _boundaries(gaps, 300)
    out = balance_boundaries(gid, gaps, nbytes, b, 0.01)
    assert np.array_equal(out, b)
    # a short step (fewer flows: a different volume) is left as it is, not joined to a neighbour
    nb = nbytes.copy()
    nb[truth[4]:truth[5]] //= 2
    out = balance_boundaries(gid, gaps, nb, b, 0.01)
    assert np.array_equal(np.flatnonzero(out), truth)
