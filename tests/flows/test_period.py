"""Step periods from an address's gaps (fleetscope.flows.period.gap_ladder): hand-built flow
sequences whose step starts are known."""
import numpy as np

from fleetscope.flows.period import autocorr_period, gap_ladder, step_warp

MS = 1_000_000


def _sequence(step_ms: list[float], mids: int, mid_gap_ms: float, bnd_gap_ms: float, seed: int = 0):
    """Flow starts and the gap before each: per step one boundary gap, then `mids` flows closer."""
    rng = np.random.default_rng(seed)
    t, g, starts = [], [], []
    now = 0.0
    for d in step_ms:
        starts.append(now)
        t.append(now)
        g.append(bnd_gap_ms * (1 + 0.05 * rng.standard_normal()))
        for k in range(mids):
            t.append(now + (k + 1) * d / (mids + 2))
            g.append(mid_gap_ms * (1 + 0.05 * rng.standard_normal()))
        now += d
    return np.array(t) * MS, np.array(g) * MS, np.array(starts) * MS


def test_a_stretch_of_slower_steps_keeps_one_boundary_per_step():
    """65 steps of 256 ms, 21 of 870 ms (a straggler), 23 of 256 ms: the slow stretch is 42 % of
    the time; judged against the median spacing it was irregular and a multiple was taken."""
    t, g, starts = _sequence([256] * 65 + [870] * 21 + [256] * 23, mids=3, mid_gap_ms=0.3, bnd_gap_ms=50)
    period, tb = gap_ladder(t, g)
    assert abs(period / (256 * MS) - 1) < 0.02
    # the step clock built on the ladder's boundaries counts one unit per true step throughout
    kt, ku, _, _ = step_warp(tb)
    per_step = np.diff(np.interp(starts[1:-1], kt, ku))
    assert np.all(np.abs(per_step - 1) < 0.25), per_step


def test_many_flows_of_one_burst_are_not_steps():
    """Steps of 2 s whose traffic is one burst of 30 flows 3 ms apart: the burst's spacings are
    regular too, but far under the level that holds the time."""
    t, g, starts = _sequence([2000] * 40, mids=30, mid_gap_ms=2.9, bnd_gap_ms=1700)
    # the burst: its flows right after the step's start, 3 ms apart
    k = np.arange(len(t)) % 31
    t2 = np.repeat(starts, 31) + k * 3 * MS
    period, tb = gap_ladder(t2, g)
    assert abs(period / (2000 * MS) - 1) < 0.02 and abs(len(tb) - 40) <= 2


def test_the_step_clock_counts_one_unit_per_step_through_a_slower_stretch_and_a_pause():
    """Step starts with a slower stretch and one 5 s pause (a checkpoint): one unit per step, the
    pause as the steps it could have held."""
    tb = np.cumsum([0] + [256] * 40 + [870] * 10 + [256] * 20 + [5000] + [256] * 10).astype(float) * MS
    kt, ku, _, _ = step_warp(tb)
    du = np.diff(ku)
    pause = 70
    assert np.allclose(np.delete(du, pause), 1.0, atol=0.01) and abs(du[pause] - 5000 / 256) < 0.1, du


def _buckets(n_steps: int, seed: int = 1):
    """Steps of 4.2 s: a 1.4 s forward pass with no traffic, then 40 gradient buckets 70 ms apart
    over the backward pass (64-GPU seed 2183: a TP2 x DP20 Megatron job with overlap)."""
    rng = np.random.default_rng(seed)
    t, g = [], []
    for s in range(n_steps):
        for b in range(40):
            t.append(s * 4200.0 + 1400 + b * 70 + rng.normal(0, 1))
            g.append((1400 + 40 if b == 0 else 40) * (1 + 0.05 * rng.standard_normal()))
    return np.array(t) * MS, np.array(g) * MS


def test_buckets_spread_over_the_backward_pass_are_not_steps():
    """The buckets' spacings tile most of the flows evenly, but a third of the time lies in the
    forward passes' spacings, twenty times longer: one step per 4.2 s."""
    period, tb = gap_ladder(*_buckets(20))
    assert abs(period / (4200 * MS) - 1) < 0.02 and abs(len(tb) - 20) <= 1, (period / MS, len(tb))


def _forward_then_buckets(n_steps: int, fwd_ms: float, fwd_spread: float, n_buckets: int, bucket_ms: float,
                          bucket_gap_ms: float, jitter_ms: float, seed: int):
    """Steps of a forward pass with no traffic (fwd_ms, varying by fwd_spread) followed by
    n_buckets gradient buckets bucket_ms apart (as regular as the layers' compute): flow starts and
    the gap before each."""
    rng = np.random.default_rng(seed)
    t, g, now = [], [], 0.0
    for _ in range(n_steps):
        fwd = fwd_ms * (1 + fwd_spread * rng.standard_normal())
        for b in range(n_buckets):
            t.append(now + fwd + b * bucket_ms + rng.normal(0, jitter_ms))
            g.append((fwd if b == 0 else bucket_gap_ms) * (1 + 0.05 * rng.standard_normal()))
        now += fwd + n_buckets * bucket_ms
    return np.array(t) * MS, np.array(g) * MS


def test_buckets_more_regular_than_the_steps_are_not_steps():
    """Steps of about 5.3 s (64-GPU seed 2238: a TP8 x DP5 DDP job over RDMA): a forward pass of
    2 s that varies by 8 %, then 41 buckets 80 ms apart, as regular as the layers' compute. The
    buckets' spacings are more regular than the steps, and by count the forward passes hide under
    the 90th percentile, but each leaves some 25 bucket boundaries missing: that level does not
    tile the time, the steps do. (Judged by spread alone, the buckets were taken: 86 ms steps.)"""
    period, tb = gap_ladder(*_forward_then_buckets(17, 2000.0, 0.08, 41, 80, 40, 1.0, seed=7))
    assert abs(period / (5280 * MS) - 1) < 0.05 and abs(len(tb) - 17) <= 1, (period / MS, len(tb))


def test_a_job_with_five_steps_in_the_span_gets_its_step_not_its_buckets():
    """A job that launched late in the span (64-GPU seed 2247: 5 steps of 1.9 s in its first window):
    fewer boundaries than the ladder's eight spacings, the buckets were taken instead (30 ms). Its
    forward gaps stand apart from the buckets' (the steepest drop in gap size)."""
    period, tb = gap_ladder(*_forward_then_buckets(6, 640.0, 0.03, 41, 30, 15, 0.5, seed=11))
    assert abs(period / (1870 * MS) - 1) < 0.05 and abs(len(tb) - 6) <= 1, (period / MS, len(tb))


def test_the_period_of_a_train_of_chunks_on_a_clock_wide_grid_is_a_positive_lag():
    # chunks every 25 ms over 900 ms of each 1.259 s step: the lag picked on the smoothed
    # autocorrelation is no peak of the raw one, and the parabola through it put the period at -31 s
    from tests.flows.test_jobs_and_types import _cadenced
    starts, _ = _cadenced(int(1.259e9), 50, offset_ns=400_000_000)
    p = autocorr_period(starts, 20_000_000)
    assert p is not None and p > 20_000_000


def _streaming_train(n_steps: int, step_ms: float, units: int, seed: int = 0):
    """An FSDP-like address: per step an all-gather before each unit's forward (fast rhythm), and
    one before each unit's backward, each unit's reduce-scatter beside the next one's all-gather
    (slow rhythm), the last unit's alone, then a short optimizer gap (shorter than a backward
    unit's, a quiet time shorter than a backward unit's); every step 1.5 % longer or shorter at random. Returns (starts, bytes)."""
    rng = np.random.default_rng(seed)
    t, w, now = [], [], 0.0
    for _ in range(n_steps):
        d = step_ms * (1 + 0.015 * rng.standard_normal())
        fwd, bwd = 0.3 * d, 0.6 * d               # and the optimizer 0.1 d
        for u in range(units):
            t.append(now + u * fwd / units)
            w.append(4e6)
        t.append(now + fwd)                        # the first backward unit's all-gather
        w.append(4e6)
        for u in range(units):                     # reduce-scatter u (+ all-gather u + 1)
            t += [now + fwd + (u + 1) * bwd / units] + ([now + fwd + (u + 1) * bwd / units + 0.5] if u < units - 1 else [])
            w += [4e6] + ([4e6] if u < units - 1 else [])
        now += d
    return np.asarray(t) * MS, np.asarray(w)


def test_a_job_streaming_through_its_steps_gets_its_step_period_not_its_units_rhythm():
    """FSDP-like traffic: the units' all-gathers tile the time more evenly than the steps (whose
    boundary is no longer quiet than a backward unit), so the gap ladder settles on the units'
    rhythm; the repetition at the step's own scale gives the step."""
    from fleetscope.flows.period import step_scale_period

    trains = [_streaming_train(120, 600.0, 6, seed=s) for s in (1, 2)]
    t, _ = trains[0]
    g = np.diff(t)
    p_ladder, _ = gap_ladder(t[1:], g)
    assert p_ladder < 300 * MS          # the inner rhythm, the premise
    p = step_scale_period(trains, p_ladder)
    assert p is not None and abs(p / (600 * MS) - 1) < 0.02, p


def test_a_job_whose_ladder_holds_its_steps_keeps_them():
    """DDP-like traffic (a quiet forward pass, then gradient buckets): nothing at a longer scale
    repeats; the ladder's period stands."""
    from fleetscope.flows.period import step_scale_period

    rng = np.random.default_rng(3)
    t, now = [], 0.0
    for _ in range(100):
        d = 800 * (1 + 0.015 * rng.standard_normal())
        t += [now + 0.4 * d + k * 0.05 * d for k in range(10)]
        now += d
    t = np.asarray(t) * MS
    p_ladder, _ = gap_ladder(t[1:], np.diff(t))
    assert abs(p_ladder / (800 * MS) - 1) < 0.02
    assert step_scale_period([(t, np.full(len(t), 4e6))], p_ladder) is None
