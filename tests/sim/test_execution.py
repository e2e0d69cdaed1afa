"""The execution model's pieces: 1F1B as a max-plus recurrence, NCCL-style DP rings and trees over
channels and NICs, buckets."""
from __future__ import annotations

import numpy as np
import pytest

from fleetscope.sim.execution import one_f_one_b, one_f_one_b_order
from fleetscope.sim.jobs import _buckets, dp_plan, make_job


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


def _job(cfg, gph, off, **kw):
    tp, pp, dp = cfg
    n_hosts = pp * dp * tp // gph
    job = make_job("j", "t", np.arange(n_hosts), gph, off, np.random.default_rng(0), (0, 60_000_000_000), cfg=cfg)
    for k, v in kw.items():
        setattr(job, k, v)
    return job


@pytest.mark.parametrize("cfg,gph,off", [((2, 2, 4), 4, 0), ((4, 2, 2), 4, 4), ((4, 1, 4), 8, 0), ((8, 2, 3), 8, 0),
                                         ((1, 1, 16), 8, 0), ((2, 2, 8), 8, 0)])
@pytest.mark.parametrize("channels,bidir", [(1, False), (4, True)])
def test_rings_join_members_of_one_dp_group_across_hosts_on_one_rail(cfg, gph, off, channels, bidir):
    job = _job(cfg, gph, off, channels=channels, bidir=bidir, cross_rail=False, nic_slots=tuple(range(gph // cfg[0])))
    tp, pp, dp = cfg
    for s in range(pp):
        plan = dp_plan(job, s)
        src, dst = plan["src"], plan["dst"]
        assert src.shape[:2] == (tp, channels)
        assert ((src // 8) != (dst // 8)).all()                 # network hops only
        assert ((src % 8) == (dst % 8)).all()                   # same rail
        for t in range(tp):
            members = set(job.rank_gpu(t, np.arange(dp), s).tolist())
            assert set(src[t].reshape(-1)) <= members and set(dst[t].reshape(-1)) <= members
            for c in range(channels):
                # one ring: every host of the group is left once and entered once
                hs, hd = src[t, c] // 8, dst[t, c] // 8
                assert len(set(hs.tolist())) == len(hs) == len(set(hd.tolist())) == dp // (gph // tp)


def test_cross_rail_rings_leave_on_one_rail_and_enter_on_another():
    job = _job((2, 1, 8), 8, 0, channels=4, cross_rail=True, nic_slots=(0, 1, 2, 3))
    plan = dp_plan(job, 0)
    assert ((plan["src"] % 8) != (plan["dst"] % 8)).all()


def test_restricted_nics_leave_the_other_members_silent():
    job = _job((2, 1, 8), 8, 0, channels=2, nic_slots=(1,))
    used = set(dp_plan(job, 0)["src"].reshape(-1).tolist()) | set(dp_plan(job, 0)["dst"].reshape(-1).tolist())
    assert len(used) == 2 * 2        # one NIC per TP group per host, 2 hosts
    assert len(set(job.gpus.tolist()) - used) == 12


def test_double_binary_tree_edges_go_up_and_down():
    job = _job((8, 1, 7), 8, 0, channels=2, algo="tree")
    plan = dp_plan(job, 0)
    src, dst, phase = plan["src"], plan["dst"], plan["phase"]
    assert src.shape == (8, 2, 12) and (phase[:6] == 0).all() and (phase[6:] == 1).all()
    up = set(zip(src[0, 0, :6].tolist(), dst[0, 0, :6].tolist()))
    down = set(zip(dst[0, 0, 6:].tolist(), src[0, 0, 6:].tolist()))
    assert up == down
    # every host but the root has one parent per tree; the two trees have different roots
    for c in range(2):
        children = (src[0, c, :6] // 8).tolist()
        assert len(set(children)) == 6
    assert set((src[0, 0, :6] // 8).tolist()) != set((src[0, 1, :6] // 8).tolist())


def test_nic_overload_funnels_a_host_through_one_nic():
    job = _job((8, 2, 2), 8, 0, channels=2, nic_overload=True)
    for s in range(2):
        src = dp_plan(job, s)["src"]
        assert set((src % 8).reshape(-1).tolist()) == {0}


def test_buckets_have_different_sizes_and_sum_to_the_gradients():
    ddp = _buckets("ddp", 130 << 20, 8)
    assert ddp[0] == 1 << 20 and ddp[1] == 25 << 20 and ddp.sum() == 130 << 20 and len(set(ddp.tolist())) >= 2
    meg = _buckets("megatron", 1_000_000_000, 64)
    assert meg[0] == int(max(4e7, 64e6)) * 4 and meg.sum() == 1_000_000_000 and len(set(meg.tolist())) == 2


def test_auto_algorithm_runs_small_all_reduces_on_trees_and_big_ones_on_rings():
    from fleetscope.sim.execution import KIND_DP, run_job
    from fleetscope.sim.fabric import build_fabric

    fab = build_fabric(64, seed=0)
    job = _job((8, 1, 8), 8, 0, channels=2, qps=1, algo="auto", dp_style="ddp", overlap=True,
               buckets=np.array([1 << 20, 64 << 20, 64 << 20], dtype=np.int64))
    job.start_ns = 0
    run = run_job(job, 0, fab, [], (0, 20_000_000_000), seed=0)
    f = run.flows
    dp = f["kind"] == KIND_DP
    pairs_small = set(zip(f["src"][dp & (f["bytes"] < 2 << 20)].tolist(), f["dst"][dp & (f["bytes"] < 2 << 20)].tolist()))
    pairs_big = set(zip(f["src"][dp & (f["bytes"] > 2 << 20)].tolist(), f["dst"][dp & (f["bytes"] > 2 << 20)].tolist()))
    ring = dp_plan(job, 0, "ring")
    tree = dp_plan(job, 0, "tree")
    assert pairs_big == set(zip(ring["src"].reshape(-1).tolist(), ring["dst"].reshape(-1).tolist()))
    assert pairs_small == set(zip(tree["src"].reshape(-1).tolist(), tree["dst"].reshape(-1).tolist()))
    assert pairs_small != pairs_big


def _dp_starts(run, job, k):
    """Step k's DP records: source GPU, start, end, bytes."""
    f = run.flows
    m = (f["kind"] == 1) & (f["step"] == run.steps[k])
    return f["src"][m], f["start"][m], f["start"][m] + f["dur"][m], f["bytes"][m]


def test_a_late_replica_sends_late_while_its_peers_send_their_own_chunk_on_time_and_wait():
    """A rank enters a DP collective on its own: its own chunk leaves when it is ready, the rest once
    the last member entered (the real gloo recordings with a straggler show the late rank's sends
    leaving late and its peers' on time). A slow GPU's replica is then the one whose hops start late."""
    from fleetscope.sim.execution import run_job
    from fleetscope.sim.fabric import build_fabric
    from fleetscope.sim.faults import Fault

    fab = build_fabric(64, seed=3)
    job = _job((1, 1, 4), 1, 0, overlap=False, algo="ring", dp_style="ddp", nic_overload=False, launch_ns=None)
    job.start_ns = 0
    slow = int(job.gpus[2])
    mask = np.zeros(fab.n_gpus, bool)
    mask[slow] = True
    fault = Fault("F0", "slow_gpu", "gpu", str(fab.ip[slow]), 0, 60_000_000_000, 1.4, job_idx=0, gpu_mask=mask)
    run = run_job(job, 0, fab, [fault], (0, 60_000_000_000), seed=5)
    healthy = run_job(job, 0, fab, [], (0, 60_000_000_000), seed=5)
    late, early = [], []
    for k in range(2, 6):
        src, st, en, nb = _dp_starts(run, job, k)
        first = {int(s): int(st[src == s].min()) for s in np.unique(src)}
        others = [v for s, v in first.items() if s != slow]
        late.append(first[slow] - np.median(others))
        # the peers' first chunks leave before the late replica entered: small bursts (their own
        # share), the rest of their bytes move from when it did
        before = st < first[slow]
        early.append(int(before.sum()))
        assert nb[before].max() < nb[~before].max()
        # healthy: no member holds the others back by more than the replicas' jitter
        hs, hst, _, _ = _dp_starts(healthy, job, k)
        hf = [int(hst[hs == s].min()) for s in np.unique(hs)]
        assert max(hf) - min(hf) < 0.05 * (run.step_end[k] - run.step_start[k])
    step = float(np.median(run.step_end[2:6] - run.step_start[2:6]))
    assert min(late) > 0.1 * step
    assert min(early) > 0
