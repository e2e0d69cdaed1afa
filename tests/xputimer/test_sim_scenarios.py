"""XPUTimer detectors on the ground-truth simulator's job captures (fleetscope.sim.capture): each
fault scenario must raise a verdict naming the faulty rank / kernel with the right team, the
healthy one nothing. The truth rows are read here only, never by the code under test."""
from __future__ import annotations


import polars as pl
import pytest

from fleetscope.ingest.timings import read_timings
from fleetscope.xputimer import detectors as D
from fleetscope.xputimer.hang import diagnose_all

SCEN = ["healthy", "gc_stall", "sync_in_forward", "slow_dataloader", "slow_gpu", "misaligned_gemm", "hang"]


@pytest.fixture(scope="module")
def sims(tmp_path_factory):
    from fleetscope.sim.capture import scenario_capture

    root = tmp_path_factory.mktemp("sim")
    out = {}
    for sc in SCEN:
        landing, truth = scenario_capture(root / sc, sc, seed=1)
        (cap,) = [p for p in (landing / "timings").iterdir() if p.is_dir()]
        out[sc] = (landing, read_timings(cap), truth)
    return out


def _bad(v):
    return v.filter(pl.col("severity").is_in(["warning", "critical"]))


def _analyze(sims, sc):
    return D.analyze(sims[sc][1], history=sims["healthy"][1])


def test_healthy_capture_raises_nothing(sims):
    # against another healthy capture as history, and with no history
    assert _bad(D.analyze(sims["healthy"][1])["verdicts"]).height == 0
    assert _bad(D.analyze(sims["healthy"][1], history=sims["hang"][1])["verdicts"]).height == 0


@pytest.mark.parametrize("sc", ["sync_in_forward", "slow_dataloader", "slow_gpu"])
def test_fault_found_with_the_truth_team(sims, sc):
    truth = sims[sc][2]
    bad = _bad(_analyze(sims, sc)["verdicts"])
    assert bad.height >= 1
    assert set(bad["team"].to_list()) == {t["team"] for t in truth}
    if sc == "slow_gpu":
        assert bad.filter(pl.col("scope") == "rank")["subject"].to_list() == [str(t["rank"]) for t in truth]


def test_gc_stall_ranks(sims):
    truth = sims["gc_stall"][2]
    bad = _bad(_analyze(sims, "gc_stall")["verdicts"])
    assert sorted(bad.filter(pl.col("scope") == "rank")["subject"].to_list()) == sorted(str(t["rank"]) for t in truth)
    # XPUTimer Table 1 puts memory management (GC) with the infrastructure team; the simulator's
    # truth says algorithm (see docs/figures/xputimer.md): we route per Table 1
    assert set(bad["team"].to_list()) == {D.TEAM_FOR_CAUSE["python_gc"]}


def test_misaligned_gemm_kernel(sims):
    truth = sims["misaligned_gemm"][2]
    bad = _bad(_analyze(sims, "misaligned_gemm")["verdicts"])
    assert bad.height >= 1 and (bad["scope"] == "kernel").all()
    assert all("8484" in s for s in bad["subject"].to_list())
    assert any("n=8484" in t["expected"] for t in truth)
    assert set(bad["team"].to_list()) == {D.TEAM_FOR_CAUSE["misaligned_kernel"]}  # un-optimized kernel (Table 1)


def test_hang_culprit_from_stacks(sims):
    landing, _, truth = sims["hang"]
    ranks, v = diagnose_all(landing / "stacks")
    hung = [t for t in truth if t["kind"] == "hang"]
    assert ranks.filter(pl.col("culprit"))["rank"].to_list() == [h["rank"] for h in hung]
    assert v.select("scope", "subject", "team").rows() == [("rank", str(h["rank"]), h["team"]) for h in hung]
