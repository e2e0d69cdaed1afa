"""A missing or rejected topology never empties the analysis silently, and flows that make no job
are a warning with the likely cause (issue 11, item 1)."""
import polars as pl

from fleetscope.flows import analyze_window
from fleetscope.sim.scoring import comm_type_accuracy
from tests.flows.synth import MS, S, Job, fleet

JOBS = [Job(hosts=[0, 1, 2, 3], gpus=list(range(8)), dp=2, pp=2),
        Job(hosts=[4, 5, 6, 7], gpus=[0, 1, 2, 3], dp=4, pp=1, period_ns=int(0.8 * S), phase_ns=300 * MS)]


def _truth_pairs(truths):
    return pl.concat([pl.DataFrame([{"ip_a": a, "ip_b": b, "comm_type": c} for (a, b), c in t["pairs"].items()])
                      for t in truths])


def test_without_topology_flows_still_give_jobs_pairs_and_steps_and_say_what_was_skipped():
    flows, topo, truths = fleet(JOBS, 25)
    with_topo = analyze_window(flows, topo, 3 * S, 23 * S)
    for missing in (None, topo.head(0)):
        out = analyze_window(flows, missing, 3 * S, 23 * S)
        # pairs typed as with a topology; steps reconstructed for the same addresses
        assert comm_type_accuracy(out["comm_pairs"], _truth_pairs(truths))[0] == 1.0
        assert set(out["step_timelines"]["ip"]) == set(with_topo["step_timelines"]["ip"])
        assert out["jobs"].height >= with_topo["jobs"].height and out["jobs"]["n_hosts"].max() == 0
        # no job mixes addresses of the two true jobs (tensor-parallel ranks may stay apart: no hosts)
        true_of = {ip: i for i, t in enumerate(truths) for ip in t["ips"]}
        for _, g in out["job_clusters"].group_by("job_id"):
            assert len({true_of[ip] for ip in g["ip"]}) == 1
        warnings = " ".join(out.warnings)
        assert "no topology" in warnings and "host merge" in warnings
    assert with_topo.warnings == []


def test_topology_of_another_cluster_is_a_warning_with_the_cause():
    flows, topo, _ = fleet(JOBS, 12)
    other = topo.with_columns(ip=pl.format("192.168.{}", pl.int_range(pl.len())))
    out = analyze_window(flows, other, 2 * S, 10 * S)
    assert out["jobs"].height == 0
    warnings = " ".join(out.warnings)
    assert "outside the topology" in warnings and "none between two topology addresses" in warnings


def test_flows_without_any_job_are_a_warning_not_a_quiet_success():
    # only one-off copies between GPU addresses (a checkpoint shard each) and tiny control messages
    _, topo, _ = fleet(JOBS, 2)
    ips = topo["ip"].to_list()
    rows = [(2 * S + i * 700 * MS, 2 * S + i * 700 * MS + 40 * MS, ips[i], ips[-1 - i], (64 + 7 * i) << 20) for i in range(6)]
    rows += [(3 * S + i * MS, 3 * S + i * MS + 1000, ips[0], ips[1], 200) for i in range(20)]
    flows = pl.DataFrame(rows, schema={"start_ns": pl.Int64, "end_ns": pl.Int64, "src_ip": pl.Utf8, "dst_ip": pl.Utf8,
                                       "bytes": pl.Int64}, orient="row")
    out = analyze_window(flows, topo, 2 * S, 10 * S)
    assert out["jobs"].height == 0 and out["step_timelines"].height == 0
    assert any("no training job was found" in w for w in out.warnings)
