"""The flow analytics on the committed real recordings (tests/data/recordings: real PyTorch gloo jobs
in network namespaces, tcpdump at the bridges, truth from the training scripts' own logs), loaded
and analysed as the wiring does and scored by fleetscope.sim.scoring. These recordings were held out
while the analytics were tuned; the properties asserted here are the ones that held when they were
first run (benchmarks/flows_accuracy.py prints every figure, including the ones that fall short)."""
from pathlib import Path

import pytest

from benchmarks.flows_accuracy import run_folder

ROOT = Path(__file__).resolve().parents[1] / "data" / "recordings"
NAMES = ["healthy", "straggler", "slow_link", "congested_uplink"]


@pytest.fixture(scope="module")
def runs():
    if not ROOT.is_dir():
        pytest.fail(f"the committed recordings are missing under {ROOT}")
    return {n: run_folder(ROOT / n, tail_ns=0) for n in NAMES}


@pytest.mark.parametrize("name", NAMES)
def test_jobs_are_exact_and_background_never_labelled(runs, name):
    r = runs[name]
    assert r["jobs_exact"] == r["jobs_true"] == r["jobs_found"], (r["jobs_exact"], r["jobs_true"], r["jobs_found"])
    assert r["background_pairs"] > 0 and r["labels_on_background"] == 0


def test_healthy_recording_raises_nothing(runs):
    assert runs["healthy"]["verdicts_loud"] == 0


def test_rate_limited_and_delayed_link_is_named(runs):
    r = runs["slow_link"]
    assert r["faults_exact"] == r["faults"] == 1 and r["verdicts_false"] == 0


@pytest.mark.parametrize("name", NAMES)
def test_no_false_alarm(runs, name):
    assert runs[name]["verdicts_false"] == 0
