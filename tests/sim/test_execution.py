"""The execution model's pieces: 1F1B as a max-plus recurrence, rail-aligned DP rings, buckets."""
from __future__ import annotations

import numpy as np
import pytest

from fleetscope.sim.execution import one_f_one_b, one_f_one_b_order
from fleetscope.sim.jobs import _buckets, dp_rings, make_job


@pytest.mark.parametrize("p,m", [(1, 4), (2, 8), (4, 8), (4, 4), (8, 16), (3, 2)])
def test_1f1b_order_is_complete_and_respects_dependencies(p, m):
    order = one_f_one_b_order(p, m)
    assert len(order) == len(set(order)) == 2 * p * m
    pos = {op: k for k, op in enumerate(order)}
    for s in range(p):
        for i in range(m):
            if s > 0:
                assert pos[(s - 1, 0, i)] < pos[(s, 0, i)]
            if s < p - 1:
                assert pos[(s + 1, 1, i)] < pos[(s, 1, i)]
            assert pos[(s, 0, i)] < pos[(s, 1, i)]
    # stage s runs min(p-s-1, m) warm-up forwards before its first backward
    for s in range(p):
        ops = [(b, i) for (st, b, i) in order if st == s]
        w = min(p - s - 1, m)
        assert ops.index((1, 0)) == (w + 1 if m > w else w)


@pytest.mark.parametrize("p,m", [(2, 8), (4, 8), (4, 16), (8, 8)])
def test_1f1b_makespan_is_the_closed_form_only_without_p2p_latency(p, m):
    f, b = 3.0, 6.0
    fd, bd = np.full((p, m, 1), f), np.full((p, m, 1), b)
    zero = np.zeros((1, p - 1))
    *_, be = one_f_one_b(fd, bd, zero, zero)
    assert be[0, m - 1, 0] == pytest.approx((m + p - 1) * (f + b))
    c = 0.5
    *_, be_c = one_f_one_b(fd, bd, zero + c, zero + c)
    # every one of the p-1 hops is paid on the way down and back for the critical microbatch at least
    assert be_c[0, m - 1, 0] >= (m + p - 1) * (f + b) + 2 * (p - 1) * c - 1e-9
    assert be_c[0, m - 1, 0] > be[0, m - 1, 0]


def test_1f1b_a_slow_stage_stretches_the_step():
    p, m = 4, 8
    fd, bd = np.full((p, m, 2), 1.0), np.full((p, m, 2), 2.0)
    fd[2, :, 1] *= 1.5
    bd[2, :, 1] *= 1.5
    c = np.zeros((2, p - 1))
    *_, be = one_f_one_b(fd, bd, c, c)
    assert be[0, m - 1, 1] > be[0, m - 1, 0] * 1.3


def test_dp_rings_are_rail_aligned_and_cover_every_member():
    rng = np.random.default_rng(0)
    w = (0, 60_000_000_000)
    for cfg, gph, off in [((2, 2, 4), 4, 0), ((4, 2, 2), 4, 4), ((4, 1, 4), 8, 0), ((8, 2, 3), 8, 0)]:
        tp, pp, dp = cfg
        n_hosts = pp * dp * tp // gph
        job = make_job("j", "t", np.arange(n_hosts), gph, off, rng, w, cfg=cfg)
        src, dst = dp_rings(job)
        assert src.shape[:2] == (pp, tp)
        assert ((src // 8) != (dst // 8)).all()                 # network hops only
        assert ((src % 8) == (dst % 8)).all()                   # same rail
        for s in range(pp):
            for t in range(tp):
                members = set(job.rank_gpu(t, np.arange(dp), s).tolist())
                assert set(src[s, t]) <= members and set(dst[s, t]) <= members
                # one cycle: every host of the group is entered once and left once
                assert len(set((src[s, t] // 8).tolist())) == len(src[s, t])


def test_buckets_have_different_sizes_and_sum_to_the_gradients():
    ddp = _buckets("ddp", 130 << 20, 8)
    assert ddp[0] == 1 << 20 and ddp[1] == 25 << 20 and ddp.sum() == 130 << 20 and len(set(ddp.tolist())) >= 2
    meg = _buckets("megatron", 1_000_000_000, 64)
    assert meg[0] == int(max(4e7, 64e6)) * 4 and meg.sum() == 1_000_000_000 and len(set(meg.tolist())) == 2
