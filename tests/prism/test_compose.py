"""Composition rules checked against brute force and closed forms."""
import numpy as np
from scipy import stats

from fleetscope.prism.compose import (cdf_on_grid, max_of_iid_quantile, parallel_max, pipeline_end_times, schedule,
                                      serial_sum)


def test_product_of_cdfs_is_the_max_of_heterogeneous_ranks():
    rng = np.random.default_rng(1)
    mus, sds, counts = [10.0, 10.5, 9.0], [1.0, 0.3, 2.0], [5, 1, 20]
    grid = np.linspace(0, 25, 5001)
    cdf = parallel_max([stats.norm.cdf(grid, m, s) for m, s in zip(mus, sds)], counts)
    brute = np.max(np.concatenate([rng.normal(m, s, (k, 200_000)) for m, s, k in zip(mus, sds, counts)]), axis=0)
    assert np.abs(cdf - cdf_on_grid(brute, grid)).max() < 0.01


def test_serial_sum_is_the_convolution():
    dx = 0.01
    grid = np.arange(0, 20, dx)
    a = stats.gamma.pdf(grid, 3.0, scale=1.0) * dx
    b = stats.norm.pdf(grid, 5.0, 0.5) * dx
    s = serial_sum([a, b])
    x = np.arange(len(s)) * dx
    mean = (s * x).sum()
    var = (s * x * x).sum() - mean ** 2
    assert abs(mean - 8.0) < 0.02 and abs(var - (3.0 + 0.25)) < 0.05


def test_max_of_iid_quantile_matches_brute_force():
    rng = np.random.default_rng(2)
    x = np.sort(rng.lognormal(0, 0.2, 200_000))
    fast = max_of_iid_quantile(x, rng.random(50_000), 8)
    brute = rng.lognormal(0, 0.2, (8, 50_000)).max(axis=0)
    assert stats.ks_2samp(fast, brute).statistic < 0.02


def _deterministic(kind, p, m, f, b, c, v=1):
    sched = schedule(kind, p, m, v)
    durs = [[np.full(1, (b if bw else f) / v) for bw, _, _ in sched[s]] for s in range(p)]
    return pipeline_end_times(sched, durs, c, p, v).max()


def test_pipeline_schedules_match_their_closed_forms():
    p, m, f, b = 4, 8, 1.0, 2.0
    # without transfer time both GPipe and 1F1B take (m + p - 1)(f + b)
    assert np.isclose(_deterministic("gpipe", p, m, f, b, 0.0), (m + p - 1) * (f + b))
    assert np.isclose(_deterministic("1f1b", p, m, f, b, 0.0), (m + p - 1) * (f + b))
    # interleaving v chunks shrinks the bubble by v: m(f+b) + (p-1)(f+b)/v
    assert np.isclose(_deterministic("interleaved_1f1b", p, m, f, b, 0.0, v=2), m * (f + b) + (p - 1) * (f + b) / 2)
    # GPipe with a transfer time c: the fill and the drain each cross p-1 links
    assert np.isclose(_deterministic("gpipe", p, m, f, b, 0.25), (m + p - 1) * (f + b) + 2 * (p - 1) * 0.25)
    # 1F1B with c > 0 is longer than the c = 0 closed form (the closed form no longer holds)
    assert _deterministic("1f1b", p, m, f, b, 0.25) > (m + p - 1) * (f + b) + 2 * (p - 1) * 0.25 - 1e-9


def test_1f1b_order_per_stage():
    s = schedule("1f1b", 4, 6)
    assert [n[:2] for n in s[0][:5]] == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0)]  # 3 warm-up forwards
    assert [n[:2] for n in s[3][:4]] == [(0, 0), (1, 0), (0, 1), (1, 1)]          # last stage alternates
    assert all(sorted(n[1] for n in st if n[0] == k) == list(range(6)) for st in s for k in (0, 1))
