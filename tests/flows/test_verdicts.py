"""Flow verdicts on hand-built fleets: healthy -> nothing; degraded NIC, slow switch,
over-subscription -> the right subject, scope and team."""
import polars as pl

from fleetscope.flows import FlowConfig, analyze_window
from fleetscope.flows.diagnosis import robust_high
from tests.flows.synth import MS, S, Job, fleet

JOBS = [Job(hosts=[0, 1, 2, 3], gpus=list(range(8)), dp=2, pp=2),
        Job(hosts=[4, 5, 6, 7], gpus=[0, 1, 2, 3], dp=4, pp=1, period_ns=int(0.8 * S), phase_ns=300 * MS)]


def _verdicts(slow_links=None, cfg=None):
    flows, topo, _ = fleet(JOBS, 30, slow_links=slow_links)
    return analyze_window(flows, topo, 5 * S, 25 * S, config=cfg)["anomaly_verdicts"]


def test_healthy_fleet_raises_nothing():
    v = _verdicts()
    assert v.filter(pl.col("severity").is_in(["warning", "critical"])).height == 0


def test_degraded_nic_is_named_not_its_switch_or_ring_neighbours():
    v = _verdicts({"10.0.5.2": 3.0})
    loud = v.filter((pl.col("severity") != "info") & pl.col("scope").is_in(["link", "gpu", "switch", "host"]))
    assert loud.select("scope", "subject", "team").rows() == [("link", "10.0.5.2", "operations")]
    # the symptom one level up: the DP group holding that NIC is slower than the job's others
    assert v.filter(pl.col("scope") == "dp_group").height >= 1
    r = loud.row(0, named=True)
    assert 0.25 < r["value"] < 0.45 and r["baseline"] == 1.0 and r["start_ns"] < r["end_ns"]


def test_slow_switch_is_named_once():
    v = _verdicts({"leaf-g0-r1": 2.5})
    sw = v.filter(pl.col("scope") == "switch")
    assert sw["subject"].to_list() == ["leaf-g0-r1"]
    assert v.filter(pl.col("scope") == "link").height == 0  # NICs under it are explained away


def test_oversubscription_against_configured_capacity():
    v = _verdicts(cfg=FlowConfig(switch_dp_flow_capacity=3))
    o = v.filter(pl.col("detector") == "flows.switch_oversubscription")
    assert o.height > 0 and (o["value"] > 3).all() and (o["baseline"] == 3).all()
    assert _verdicts().filter(pl.col("detector") == "flows.switch_oversubscription").height == 0


def test_robust_k_sigma_is_not_fooled_by_the_straggler():
    # plain mean + 3 std misses the straggler because it inflates std; median/MAD does not
    x = [100.0] * 6 + [101.0, 99.0, 100.5, 400.0]
    df = pl.DataFrame({"x": x})
    plain = df.select(pl.col("x") > pl.col("x").mean() + 3 * pl.col("x").std())["x"].to_list()
    robust = df.select(robust_high(pl.col("x"), 3.0, 0.1))["x"].to_list()
    assert not plain[-1] and robust[-1] and sum(robust) == 1
