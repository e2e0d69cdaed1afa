"""NIC overload (fleetscope.flows.nic_use): a job that sends a host's traffic through one of its NICs is
named for the job's owners; jobs that use their hosts' NICs, and hosts with one NIC, raise nothing.
On the fleet simulator the truth (which job was pinned to one NIC) is never read by the analysis."""
import json

import polars as pl
import pytest

import fleetscope.sim as sim
from benchmarks.flows_common import load_landing, load_truth
from fleetscope.flows import analyze_window
from fleetscope.flows.nic_use import nic_overload_rows
from fleetscope.sim.scoring import match_jobs

W = (0, 60_000_000_000)
S = 1_000_000_000


def _topo(hosts: int, nics: int) -> pl.DataFrame:
    return pl.DataFrame({"ip": [f"10.{n}.0.{h}" for h in range(hosts) for n in range(nics)],
                         "host": [f"h{h}" for h in range(hosts) for _ in range(nics)]})


def _pairs(rows: list[tuple[str, str, str]]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=["job_id", "ip_a", "ip_b"], orient="row").with_columns(
        comm_type=pl.lit("DP"), pid=pl.int_range(pl.len()))


def _flows(pairs: pl.DataFrame, busy: dict[str, float]) -> pl.DataFrame:
    """One flow per pair and second, busy for the job's share of each second."""
    p = pairs.with_columns(b=pl.col("job_id").replace_strict(busy, return_dtype=pl.Float64))
    return p.join(pl.DataFrame({"t": list(range(0, 60 * S, S))}), how="cross").select(
        "pid", src_ip="ip_a", dst_ip="ip_b", start_ns=pl.col("t"), end_ns=pl.col("t") + (pl.col("b") * S).cast(pl.Int64),
        bytes=pl.lit(10**6, dtype=pl.Int64))


def _rows(pairs, topo, busy):
    return nic_overload_rows(_flows(pairs, busy), pairs, topo, W, "w0")


# a ring over three hosts through each host's first NIC (the other NICs carry nothing), and another
# job spreading its traffic over two NICs per host of hosts 3 and 4
FUNNEL = [("job-a", "10.0.0.0", "10.0.0.1"), ("job-a", "10.0.0.1", "10.0.0.2"), ("job-a", "10.0.0.0", "10.0.0.2")]
SPREAD = [("job-b", f"10.{n}.0.3", f"10.{n}.0.4") for n in (0, 1)]


def test_a_job_funnelling_every_host_through_one_busy_nic_is_named_for_its_owners():
    rows = _rows(_pairs(FUNNEL + SPREAD), _topo(5, 4), {"job-a": 0.9, "job-b": 0.2})
    assert [(r["scope"], r["subject"], r["team"], r["severity"]) for r in rows] == [("job", "job-a", "algorithm", "warning")]
    assert json.loads(rows[0]["evidence"])["ips"] == ["10.0.0.0", "10.0.0.1", "10.0.0.2"]
    assert rows[0]["value"] == pytest.approx(0.9, rel=0.02) and rows[0]["baseline"] == pytest.approx(0.2, rel=0.02)


def test_one_nic_per_host_no_busier_than_the_fleets_nics_is_information_only():
    """Small collectives on one NIC (few channels) cost nothing: named, not loud; with no other job to
    compare with, not loud either."""
    rows = _rows(_pairs(FUNNEL + SPREAD), _topo(5, 4), {"job-a": 0.1, "job-b": 0.2})
    assert [(r["subject"], r["severity"]) for r in rows] == [("job-a", "info")]
    rows = _rows(_pairs(FUNNEL), _topo(3, 4), {"job-a": 0.9})
    assert [(r["subject"], r["severity"]) for r in rows] == [("job-a", "info")]


def test_a_job_using_its_hosts_nics_and_hosts_with_one_nic_raise_nothing():
    topo = _topo(2, 4)
    # one ring per NIC (rail): every NIC of both hosts carries the job's traffic
    assert _rows(_pairs([("job-a", f"10.{n}.0.0", f"10.{n}.0.1") for n in range(4)]), topo, {"job-a": 0.9}) == []
    # hosts with one NIC (the real recorder's namespaces): nothing to funnel
    assert _rows(_pairs([("job-b", "10.0.0.0", "10.0.0.1")]), _topo(2, 1), {"job-b": 0.9}) == []
    # one NIC per host, but the host's other NICs busy with another job: a co-tenant, not idle NICs
    two = _pairs([("job-a", "10.0.0.0", "10.0.0.1")] + [("job-b", f"10.{n}.0.0", f"10.{n}.0.1") for n in (1, 2, 3)])
    assert _rows(two, topo, {"job-a": 0.9, "job-b": 0.1}) == []
    # a job on one host only: no inter-host traffic to judge
    assert _rows(_pairs([("job-a", "10.0.0.0", "10.1.0.0")]), topo, {"job-a": 0.9}) == []


@pytest.mark.parametrize("seed", [3, 11])
def test_the_simulators_nic_overload_is_named_on_its_job_and_nothing_on_the_others(tmp_path, seed):
    sim.simulate(tmp_path, gpus=64, minutes=1.0, faults="nic_overload:1", seed=seed, captures=False)
    flows, topo, _ = load_landing(tmp_path / "landing")
    truth = load_truth(tmp_path / "ground_truth")
    w = json.loads((tmp_path / "ground_truth" / "summary.json").read_text())["window"]
    out = analyze_window(flows, topo, w[0], w[1])
    v = out["anomaly_verdicts"].filter((pl.col("detector") == "flows.nic_overload") & (pl.col("severity") != "info"))
    m = match_jobs(out["job_clusters"], truth["jobs"], (w[0], w[1]))
    named = set(m.filter(pl.col("job_id").is_in(v["subject"].implode()))["truth_job_id"].to_list())
    assert named == {truth["faults"]["job_id"][0]}, v.select("subject", "explanation").rows()


def test_a_job_the_flows_split_by_rail_is_no_funnel():
    """A job recognized in parts, one per rail: each part uses one NIC per host, but the hosts' other
    NICs carry the other parts' traffic between the same hosts (unlabelled here): not idle."""
    pairs = _pairs([("job-a", "10.0.0.0", "10.0.0.1"), ("job-x", "10.9.9.9", "10.9.9.8")])
    flows = pl.concat([_flows(pairs, {"job-a": 0.9, "job-x": 0.1}),
                       pl.DataFrame({"pid": [99] * 3, "src_ip": [f"10.{n}.0.0" for n in (1, 2, 3)],
                                     "dst_ip": [f"10.{n}.0.1" for n in (1, 2, 3)],
                                     "start_ns": [0] * 3, "end_ns": [S] * 3, "bytes": [10**9] * 3})])
    assert nic_overload_rows(flows, pairs, _topo(2, 4), W, "w0") == []
    # ... but a few control messages between them are no traffic of the job's kind
    control = flows.with_columns(bytes=pl.when(pl.col("pid") == 99).then(pl.lit(1500, dtype=pl.Int64)).otherwise("bytes"))
    assert [r["subject"] for r in nic_overload_rows(control, pairs, _topo(2, 4), W, "w0")] == ["job-a"]
    # the same job with those NICs talking to storage only is a funnel
    storage = flows.with_columns(dst_ip=pl.when(pl.col("pid") == 99).then(pl.lit("10.200.0.1")).otherwise("dst_ip"))
    topo = pl.concat([_topo(2, 4), pl.DataFrame({"ip": ["10.200.0.1"], "host": ["stor0"]})])
    assert [r["subject"] for r in nic_overload_rows(storage, pairs, topo, W, "w0")] == ["job-a"]


def test_a_rail_split_from_its_job_and_slowed_by_a_switch_is_busy_but_no_funnel():
    """A job recognized in two parts in one window (its rail behind a congested switch stepping out of
    lockstep: demo seed 728): the part on one NIC per host is busier than the other part's NICs, for
    the same bytes: slowed, not funnelled; information only. Beside other jobs on its hosts a funnel
    moves more per second than their NICs (all of its host's traffic is on it); with none there, its
    busy NICs alone make it loud."""
    ring = [("job-a", "10.0.0.0", "10.0.0.1"), ("job-a", "10.0.0.1", "10.0.0.2"), ("job-a", "10.0.0.0", "10.0.0.2")]
    rest = [("job-c", f"10.{n}.0.{a}", f"10.{n}.0.{b}") for n in (1, 2, 3) for a, b in ((0, 1), (1, 2), (0, 2))]
    rows = _rows(_pairs(ring + rest), _topo(3, 5), {"job-a": 0.9, "job-c": 0.3})
    assert [(r["subject"], r["severity"]) for r in rows] == [("job-a", "info")]
    rows = _rows(_pairs(FUNNEL + SPREAD), _topo(5, 4), {"job-a": 0.9, "job-b": 0.2})
    assert [(r["subject"], r["severity"]) for r in rows] == [("job-a", "warning")]


def test_a_funnel_stays_loud_beside_a_localized_cause_on_its_job():
    """A job-level finding a NIC or GPU of the job explains becomes that cause's symptom; the funnel is
    the job's own launch, a cause of its own, and stays loud."""
    from fleetscope.flows.diagnosis import explain_symptoms

    rows = _rows(_pairs(FUNNEL + SPREAD), _topo(5, 4), {"job-a": 0.9, "job-b": 0.2})
    gpu = dict(detector="flows.late_rank", scope="gpu", subject="10.0.0.1", job_id="job-a", start_ns=0, end_ns=W[1],
               severity="warning", explanation="late", evidence=json.dumps({"jobs": ["job-a"], "ips": ["10.0.0.1"]}))
    slow = dict(detector="flows.cross_step", scope="job", subject="job-a", job_id="job-a", start_ns=0, end_ns=W[1],
                severity="warning", explanation="slow")
    out = explain_symptoms(rows + [gpu, slow])
    assert [r["severity"] for r in out] == ["warning", "warning", "info"]
