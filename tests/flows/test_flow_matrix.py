"""The flow analytics on the recorder matrix (tests/data/flow_matrix: real gloo jobs in DP2, DP4,
PP2, PP4, PP2 x DP3, shared-host, 3 s-step and PP2 x DP2 layouts; truth from the scripts' logs),
analysed as the wiring does and scored by fleetscope.sim.scoring. The bars are the ones that held
on the held-out recordings when they were first scored (benchmarks/flows_accuracy.py prints every
figure, the ones that fall short included: a congested uplink's DDP steps are withheld)."""
from pathlib import Path

import pytest

from tests.flows.recordings import recorded_runs

ROOT = Path(__file__).resolve().parents[1] / "data" / "flow_matrix"


@pytest.fixture(scope="module")
def runs():
    return recorded_runs(ROOT, 19)


def test_every_pair_labelled_right_and_no_label_on_background(runs):
    bad = {k: (r["pair_accuracy"], r["labels_on_background"]) for k, r in runs.items()
           if r["pair_accuracy"] < 1.0 or r["labels_on_background"]}
    assert not bad, bad


def test_healthy_steps_one_per_true_step_within_one_percent(runs):
    # on the wire's clock (the scripts log a step's end when their thread next runs)
    healthy = {k: r for k, r in runs.items() if r["faults"] == 0}
    assert len(healthy) >= 15
    low = {k: round(r["step_coverage"], 3) for k, r in healthy.items() if r["step_coverage"] < 0.98}
    spurious = {k: round(r["spurious_share"], 3) for k, r in healthy.items() if r["spurious_share"] > 0.03}
    assert not low and not spurious, (low, spurious)


@pytest.mark.parametrize("layout", ["pp2-", "pp4-"])
def test_pipeline_only_jobs_get_their_steps(runs, layout):
    # no DP pair: the steps come from where the pipeline drains (gaps alone never separate them)
    got = {k: r["step_coverage"] for k, r in runs.items() if k.split("/")[1].startswith(layout)}
    assert len(got) >= 2 and min(got.values()) >= 0.98, got
