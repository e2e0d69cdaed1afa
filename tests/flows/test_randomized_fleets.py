"""The flow analytics on simulated fleets whose conventions, background traffic, life events and fault
places are drawn per seed (fleetscope.sim), analysed as the wiring does (60 s windows, 30 s margin)
and scored by fleetscope.sim.scoring, which counts misses and false labels; the analysis never sees
the truth. A few small seeds here; benchmarks/flows_accuracy.py runs many more."""
from pathlib import Path

import polars as pl
import pytest

from benchmarks.flows_accuracy import run_folder, simulated

HEALTHY_SEEDS = [40, 41, 42]
# (seed, spec): each fault kind the flows can localize, placed by the seed
FAULTY = [(43, "degraded_nic:1"), (44, "congested_switch:1"), (45, "degraded_nic:1,congested_switch:1")]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fleets")


@pytest.fixture(scope="module")
def healthy(data):
    return {s: run_folder(simulated(data, s, 96, 1.5, "")) for s in HEALTHY_SEEDS}


@pytest.mark.parametrize("seed", HEALTHY_SEEDS)
def test_healthy_fleet_raises_no_warning_or_critical(healthy, seed):
    r = healthy[seed]
    loud = r["_tables"]["anomaly_verdicts"].filter(pl.col("severity").is_in(["warning", "critical"]))
    assert loud.height == 0, loud.select("detector", "scope", "subject", "explanation").rows()


@pytest.mark.parametrize("seed", HEALTHY_SEEDS)
def test_background_pairs_never_get_a_dp_or_pp_label(healthy, seed):
    r = healthy[seed]
    assert r["background_pairs"] > 0  # storage, checkpoint, monitoring, probes, control are there
    assert r["labels_on_background"] == 0


def test_pairs_jobs_and_steps(healthy):
    """Aggregated over the seeds, at bars below the issue's targets (benchmarks/flows_accuracy.py
    prints the figures): they catch a regression, the benchmark says how far from the targets."""
    rs = list(healthy.values())
    tot = {k: sum(r[k] for r in rs) for k in ("pairs_correct", "pairs_union", "jobs_exact", "jobs_true",
                                              "steps_covered", "steps_true", "steps_spurious", "steps_reconstructed")}
    assert tot["pairs_correct"] / tot["pairs_union"] >= 0.9, tot
    assert tot["jobs_exact"] / tot["jobs_true"] >= 0.7, tot
    assert tot["steps_covered"] / tot["steps_true"] >= 0.7, tot
    assert tot["steps_spurious"] / tot["steps_reconstructed"] <= 0.1, tot


def test_injected_network_faults_are_named_without_false_alarms(data):
    runs = [run_folder(simulated(data, seed, 96, 1.5, spec)) for seed, spec in FAULTY]
    per = pl.concat([r["per_fault"] for r in runs])
    # every verdict is about an injected fault (exact or on its job), none is a false alarm
    assert sum(r["verdicts_false"] for r in runs) == 0
    # a degraded NIC in a two-member ring is a coin toss between its ends (both carry the one slow
    # pair); the bar: most faults named exactly (the benchmark prints the rate)
    assert (per["outcome"] == "exact").sum() >= 2, per.rows()
