"""XPUTimer detectors on the ground-truth simulator's job captures (fleetscope.sim.capture): each
fault scenario must raise a verdict naming the faulty rank / kernel with the team the simulator's
truth names, the healthy one nothing. The history a capture is compared with is a healthy run of
ANOTHER seed (a job's earlier capture is never the same run's twin). The truth rows are read here
only, never by the code under test."""
from __future__ import annotations


import polars as pl
import pytest

from fleetscope.ingest.timings import read_timings
from fleetscope.xputimer import detectors as D
from fleetscope.xputimer.hang import diagnose_all

SCEN = ["healthy", "gc_stall", "sync_in_forward", "slow_dataloader", "slow_gpu", "misaligned_gemm", "hang", "hang_link"]
SEED, HISTORY_SEED = 1, 2


@pytest.fixture(scope="module")
def sims(tmp_path_factory):
    from fleetscope.sim.capture import scenario_capture

    root = tmp_path_factory.mktemp("sim")
    out = {}
    for sc, seed in [(sc, SEED) for sc in SCEN] + [("healthy", HISTORY_SEED)]:
        landing, truth = scenario_capture(root / f"{sc}-{seed}", sc, seed=seed)
        caps = [p for p in (landing / "timings").iterdir() if p.is_dir()] if (landing / "timings").is_dir() else []
        out[sc if seed == SEED else "history"] = (landing, read_timings(caps[0]) if caps else None, truth)
    return out


def _bad(v):
    return v.filter(pl.col("severity").is_in(["warning", "critical"]))


def _analyze(sims, sc):
    return D.analyze(sims[sc][1], history=sims["history"][1])


def test_healthy_capture_raises_nothing(sims):
    # against a healthy capture of another seed as history, and with no history
    assert _bad(D.analyze(sims["healthy"][1])["verdicts"]).height == 0
    assert _bad(_analyze(sims, "healthy")["verdicts"]).height == 0


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
    assert set(bad["team"].to_list()) == {t["team"] for t in truth}  # the simulator says algorithm (fixed in the script)


def test_misaligned_gemm_kernel(sims):
    truth = sims["misaligned_gemm"][2]
    bad = _bad(_analyze(sims, "misaligned_gemm")["verdicts"])
    assert bad.height >= 1 and (bad["scope"] == "kernel").all()
    assert all("8484" in s for s in bad["subject"].to_list())
    assert any("n=8484" in t["expected"] for t in truth)
    assert set(bad["team"].to_list()) == {t["team"] for t in truth}
    # the padding suggested is computed from the shape each verdict names
    for subj, expl in bad.select("subject", "explanation").rows():
        assert D.pad_suggestion(subj[subj.index("[") + 1:-1]) in expl


def test_pad_suggestion_from_the_shape():
    assert D.pad_suggestion("m=4096,n=8484,k=8192,dtype=bf16") == "n 8484 -> 8512"
    assert D.pad_suggestion("m=7,n=1000,k=1001,dtype=fp32") == "n 1000 -> 1024, k 1001 -> 1024"
    assert D.pad_suggestion("m=4096,n=8192,k=8192,dtype=fp16") == ""


def test_hang_culprit_from_stacks(sims):
    landing, _, truth = sims["hang"]
    h = diagnose_all(landing / "stacks")
    hung = [t for t in truth if t["kind"] == "hang"]
    assert h.ranks.filter(pl.col("culprit"))["rank"].to_list() == [h_["rank"] for h_ in hung]
    assert h.verdicts.select("scope", "subject", "team").rows() == [("rank", str(t["rank"]), t["team"]) for t in hung]


def test_hang_over_a_faulty_link(sims):
    """Every rank waits in the same all_reduce; ring.json's slowest connection names the link."""
    from fleetscope.sim.capture.scenarios import scenario_job_and_faults

    landing, _, truth = sims["hang_link"]
    job, _ = scenario_job_and_faults("hang_link", SEED)
    h = diagnose_all(landing / "stacks", rank_ips=dict(enumerate(job.ips)))
    assert h.ranks["in_collective"].all() and not h.ranks["culprit"].any()
    (sub,) = {t["subject"] for t in truth}
    assert h.verdicts.select("scope", "subject", "team").rows() == [("link", sub, truth[0]["team"])]
