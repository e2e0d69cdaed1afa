"""Fault localization on real recordings (tests/data/flow_faults: real gloo jobs, truth from the
scripts' logs and the recorder's fault log, which the analysis never sees): healthy fleets raise no
warning or critical verdict, and a slowed host link is named on its own address."""
from pathlib import Path

import polars as pl
import pytest

from benchmarks.flows_accuracy import run_folder

ROOT = Path(__file__).resolve().parents[1] / "data" / "flow_faults" / "seed5"


def _loud(name: str) -> tuple[pl.DataFrame, dict]:
    r = run_folder(ROOT / name, tail_ns=0)
    return r["_tables"]["anomaly_verdicts"].filter(pl.col("severity").is_in(["warning", "critical"])), r


@pytest.mark.parametrize("name", ["dp4-healthy-s5", "pp2dp2+dp2-healthy-s5", "pp2dp3-healthy-s5"])
def test_a_healthy_real_fleet_raises_nothing(name):
    loud, _ = _loud(name)
    assert loud.height == 0, loud.select("detector", "subject").rows()


@pytest.mark.parametrize("name", ["dp4-slow_link-s5", "pp2dp2+dp2-slow_link-s5"])
def test_a_slowed_host_link_is_named_on_its_address(name):
    loud, r = _loud(name)
    subject = pl.read_csv(ROOT / name / "ground_truth" / "faults.csv")["subject"][0]
    assert subject in set(loud.filter(pl.col("scope") == "link")["subject"].to_list())


def test_a_cross_spine_hops_steady_offset_from_its_rings_leaf_hops_is_no_slow_spine():
    """dp4-healthy-s9 (real DP4 ring over two leaves): its two hops through the spine move at ~60 % of
    its two hops inside a leaf in every bin, healthy; the spine was named at 71 % (the offset of the
    route class, through any spine, is its own level)."""
    loud, _ = _loud("../seed9/dp4-healthy-s9")
    assert loud.height == 0, loud.select("detector", "subject").rows()


def test_a_host_link_slowed_one_way_is_named_on_its_own_address():
    """dp4-slow_link-s9: only the shaped host's hop to its ring neighbour slows (13.5 MB/s against 323);
    its receiver was named (critical) beside a spine. The sender is named; its neighbour only as the
    tie the flows cannot break."""
    loud, _ = _loud("../seed9/dp4-slow_link-s9")
    subject = pl.read_csv(ROOT.parent / "seed9" / "dp4-slow_link-s9" / "ground_truth" / "faults.csv")["subject"][0]
    links = loud.filter(pl.col("scope") == "link")["subject"].to_list()
    assert links[:1] == [subject] and loud.filter(pl.col("scope") == "switch").height == 0, loud.select("subject").rows()
