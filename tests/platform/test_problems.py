"""Grouping verdicts into problems (library level)."""
import json

import polars as pl

from fleetscope.problems import group_problems
from fleetscope.verdicts import make_verdicts

S = 1_000_000_000


def _v(**kw):
    base = dict(detector="d", metric="m", severity="warning", team="operations", explanation="x", start_ns=0, end_ns=60 * S)
    return {**base, **kw}


def test_same_problem_from_several_sources_is_one_problem():
    v = make_verdicts([
        _v(detector="flows.switch", scope="switch", subject="leaf-3", severity="critical", evidence=json.dumps({"jobs": ["jobA"]})),
        _v(detector="flows.steps", scope="step", subject="17", job_id="jobA", start_ns=20 * S, end_ns=30 * S),
        _v(detector="xputimer.busbw", scope="job", subject="jobA", job_id="jobA", start_ns=40 * S, end_ns=50 * S),
        _v(detector="flows.nic", scope="gpu", subject="10.0.9.9"),                       # unrelated gpu
        _v(detector="flows.steps", scope="step", subject="3", job_id="jobA", start_ns=3600 * S, end_ns=3601 * S),  # an hour later
        _v(detector="perf", scope="function", subject="f", job_id="jobB", severity="info"),  # info: not a problem
    ])
    inc, members = group_problems(v)
    assert inc.height == 3
    top = inc.row(0, named=True)
    assert top["severity"] == "critical" and top["n_verdicts"] == 3
    assert top["detectors"] == "flows.steps,flows.switch,xputimer.busbw"
    assert members.height == 5
    # stable: same input, same ids (order of rows does not matter)
    inc2, _ = group_problems(v.reverse())
    assert sorted(inc["problem_id"].to_list()) == sorted(inc2["problem_id"].to_list())


def test_topology_links_a_gpu_to_its_host_and_job():
    topo = pl.DataFrame({"ip": ["10.0.0.1", "10.0.0.2"], "host": ["h1", "h1"], "leaf": ["leaf-1", "leaf-1"]})
    jc = pl.DataFrame({"ip": ["10.0.0.1"], "job_id": ["jobZ"]})
    v = make_verdicts([
        _v(scope="gpu", subject="10.0.0.1"), _v(scope="host", subject="h1", detector="hw"),
        _v(scope="job", subject="jobZ", job_id="jobZ", detector="prism"),
        _v(scope="gpu", subject="10.0.0.2", detector="x"),  # same host h1: linked too
    ])
    inc, _ = group_problems(v, topo, jc)
    assert inc.height == 1 and inc["n_verdicts"][0] == 4
    assert group_problems(v)[0].height == 4  # without topology and job membership nothing links them
