"""Localization (PerfTracker 4.3): distances, planted anomalies, stage awareness, healthy input,
verdict routing, and the real StragglerAnalysis trace (last stage too long)."""
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from fleetscope.perftracker.localize import (
    PAPER_EXPECTED,
    LocalizeConfig,
    LocalizeError,
    _group_median_mad,
    differential_counts,
    localize,
    stage_differential,
)
from fleetscope.perftracker.verdicts import patterns_verdicts

REAL = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "real"


def fleet(n=400, n_stages=4, seed=3, plant=True, python_beta=0.002):
    """Patterns of n workers x 3 functions with seeded noise; planted: 12 throttled GPUs (gemm mu
    0.45), 3 workers whose AllReduce runs at a fraction of the link (mu 0.1), 5 workers with GC
    stalls in a Python function (beta 0.1). Returns (patterns, planted (rank, function) set)."""
    rng = np.random.default_rng(seed)
    rows = []
    ranks = np.arange(n)
    stage = ranks // (n // n_stages)
    specs = {"gemm": ("compute", 0.30, 0.85, 0.10, "hw_nearest"), "AllReduce": ("collective", 0.10, 0.70, 0.15, "hw_alg1"),
             "grad_mode.py: __init__": ("python", python_beta, None, None, "none")}
    planted = set()
    thr = rng.choice(n, 12, replace=False) if plant else []
    link = rng.choice(np.setdiff1d(ranks, thr), 3, replace=False) if plant else []
    gc = rng.choice(n, 5, replace=False) if plant else []
    for f, (cat, b, m, s, src) in specs.items():
        beta = np.clip(b * (1 + 0.05 * rng.standard_normal(n)), 0, 1)
        mu = None if m is None else np.clip(m + 0.02 * rng.standard_normal(n), 0, 1)
        sig = None if s is None else np.clip(s + 0.01 * rng.standard_normal(n), 0, 1)
        if f == "gemm":
            mu[thr] = 0.45
            beta[thr] *= 1.4
            planted |= {(int(r), f) for r in thr}
        if f == "AllReduce":
            mu[link] = 0.10
            planted |= {(int(r), f) for r in link}
        if f.startswith("grad_mode"):
            beta[gc] = 0.10
            planted |= {(int(r), f) for r in gc}
        for r in ranks:
            rows.append({"capture_id": "c", "rank": int(r), "function": f, "function_name": f, "category": cat, "beta": float(beta[r]),
                         "mu": None if mu is None else float(mu[r]), "sigma": None if sig is None else float(sig[r]),
                         "stage": int(stage[r]), "mu_source": src, "resource": "sm"})
    return pl.DataFrame(rows, schema_overrides={"rank": pl.Int32, "stage": pl.Int32}), planted


def flagged(loc):
    return {(r, f) for r, f in loc.filter("abnormal").select("rank", "function").iter_rows()}


def test_planted_anomalies_found_exactly():
    pats, planted = fleet()
    loc = localize(pats)
    got = flagged(loc)
    assert got == planted
    ab = loc.filter("abnormal")
    assert set(ab.filter(pl.col("function") == "gemm")["diff_dim"]) == {"mu"}
    assert set(ab.filter(pl.col("function") == "AllReduce")["diff_dim"]) == {"mu"}
    v = patterns_verdicts(loc).filter(pl.col("severity") != "info")
    teams = dict(zip(v["subject"], v["team"]))
    assert teams == {"gemm": "operations", "AllReduce": "operations", "grad_mode.py: __init__": "algorithm"}
    import json
    for subj, want in (("gemm", {r for r, f in planted if f == "gemm"}), ("AllReduce", {r for r, f in planted if f == "AllReduce"})):
        ev = json.loads(v.filter(pl.col("subject") == subj)["evidence"][0])
        assert set(ev["ranks"]) == want
        assert "mu" in v.filter(pl.col("subject") == subj)["explanation"][0]


def test_healthy_fleet_raises_nothing():
    pats, planted = fleet(plant=False)
    assert planted == set()
    loc = localize(pats)
    assert loc.filter("abnormal").height == 0
    v = patterns_verdicts(loc, stage_differential(loc))
    assert v.filter(pl.col("severity").is_in(["warning", "critical"])).height == 0


def test_the_same_share_on_every_worker_is_the_jobs_shape_not_an_anomaly():
    """A Python function taking 20 % of every worker's window: no fixed box says it is wrong by
    default (PerfTracker's production box raised dozens of false alarms on a healthy real fleet)."""
    pats, _ = fleet(plant=False, python_beta=0.2)
    loc = localize(pats)
    assert loc.filter("abnormal").height == 0 and (loc["d_exp"] == 0).all()
    assert patterns_verdicts(loc).filter(pl.col("severity") != "info").height == 0


def test_expectation_from_a_configured_box():
    pats, _ = fleet(plant=False, python_beta=0.2)
    loc = localize(pats, LocalizeConfig(expected=PAPER_EXPECTED))
    py = loc.filter(pl.col("category") == "python")
    assert py["abnormal"].all() and (py["d_exp"] > 0.15).all() and set(py["reason"]) == {"expectation"}
    assert set(py["expected_source"]) == {"config"} and py["impact"].min() > 0.15
    v = patterns_verdicts(loc, config=LocalizeConfig(expected=PAPER_EXPECTED))
    row = v.filter(pl.col("metric") == "expectation_beta")
    assert row.height == 1 and row["team"][0] == "algorithm" and row["severity"][0] == "critical"
    assert "400 of 400 workers" in row["explanation"][0] and "configured" in row["explanation"][0]
    # an immaterial excess over a configured box (beta 0.013 vs 0.01) is not a finding
    small, _ = fleet(plant=False, python_beta=0.013)
    assert localize(small, LocalizeConfig(expected=PAPER_EXPECTED)).filter("abnormal").height == 0


def test_expectation_from_the_jobs_history():
    """Earlier captures of the job had the Python function at 0.2 %; now it takes 12 % everywhere."""
    history = pl.concat([fleet(plant=False, seed=s)[0].with_columns(capture_id=pl.lit(f"old{s}")) for s in (10, 11, 12)])
    pats, _ = fleet(plant=False, python_beta=0.12)
    loc = localize(pats, history=history)
    py = loc.filter(pl.col("category") == "python")
    assert py["abnormal"].all() and set(py["expected_source"]) == {"history"} and set(py["reason"]) == {"expectation"}
    assert py["expected_beta_hi"].max() < 0.06 and loc.filter(pl.col("category") != "python", "abnormal").height == 0
    v = patterns_verdicts(loc).filter(pl.col("severity") != "info")
    assert v["subject"].to_list() == ["grad_mode.py: __init__"] and v["severity"][0] == "critical"
    assert "earlier captures" in v["explanation"][0]
    # the same job as usual: nothing
    same, _ = fleet(plant=False, seed=13)
    assert localize(same, history=history).filter("abnormal").height == 0


def test_stage_aware_peers():
    """Stage 1's workers legitimately send more (beta 2x) on their collective: compared with
    their own stage nothing is wrong; compared with everyone they would all be flagged."""
    pats, _ = fleet(plant=False)
    pats = pats.with_columns(beta=pl.when((pl.col("function") == "AllReduce") & (pl.col("stage") == 1)).then(pl.col("beta") * 2)
                             .otherwise(pl.col("beta")))
    assert localize(pats).filter("abnormal").height == 0
    blind = localize(pats, LocalizeConfig(stage_aware=False)).filter("abnormal")
    assert set(blind["stage"].unique()) == {1} and blind.height == 100


def test_differential_counts_match_brute_force():
    rng = np.random.default_rng(0)
    xn = rng.random((600, 3)).astype(np.float32)
    bounds = np.array([0, 7, 50, 600])  # two small groups (S = whole group), one large (sampled)
    d, m = differential_counts(xn, bounds, 0.4, 100, seed=5, chunk=64)
    sampler = np.random.default_rng(5)
    for g in range(3):
        lo, hi = bounds[g], bounds[g + 1]
        peers = np.arange(lo, hi) if hi - lo <= 100 else lo + sampler.choice(hi - lo, 100, replace=False)
        dist = np.abs(xn[lo:hi, None, :] - xn[None, peers, :]).sum(2)
        assert (d[lo:hi] == (dist > np.float32(0.4)).sum(1)).all()
        assert (m[lo:hi] == len(peers)).all()


def test_group_median_and_mad():
    rng = np.random.default_rng(1)
    gid = np.repeat([0, 1, 2], [5, 8, 1])
    v = rng.integers(0, 20, gid.size)
    med, mad = _group_median_mad(v, gid, 3, 20)
    for g in range(3):
        x = v[gid == g]
        assert med[g] == np.median(x) and mad[g] == np.median(np.abs(x - np.median(x)))


def test_bad_patterns_are_rejected_with_a_reason():
    pats, _ = fleet(n=40)
    with pytest.raises(LocalizeError, match="beta outside"):
        localize(pats.with_columns(beta=pl.lit(1.5)))
    with pytest.raises(LocalizeError, match="unknown function categories"):
        localize(pats.with_columns(category=pl.lit("gpu")))
    with pytest.raises(LocalizeError, match="lack column"):
        localize(pats.drop("mu"))


def test_real_straggler_trace_points_at_last_stage():
    from fleetscope.perftracker.analyze import diagnose_op_capture
    from fleetscope.ingest.timings import read_timings

    loc, v = diagnose_op_capture(read_timings(REAL / "straggler_analysis", "st"), "st")
    loud = v.filter(pl.col("severity").is_in(["warning", "critical"]))
    assert loud.height >= 1
    assert set(loud["scope"]) == {"stage"} and set(loud["subject"]) == {"3"} and set(loud["team"]) == {"algorithm"}
    assert "forward-compute" in " ".join(loud["metric"])
    # the stage's workers are explained by the stage, not reported one by one
    assert loc.filter(pl.col("stage") == 3, pl.col("abnormal")).height == 0
