"""Grouping verdicts into problems (library level)."""
import json

import polars as pl

from fleetscope.findings.problems import group_problems
from fleetscope.findings.verdicts import make_verdicts

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


def _fleet():
    """Two hosts of 4 GPUs under one leaf; job A on h1 (ranks 0-3 of capture capA) and h2, job B on h2."""
    topo = pl.DataFrame({"ip": [f"10.0.{h}.{g}" for h in (1, 2) for g in range(4)],
                         "host": [f"h{h}" for h in (1, 2) for _ in range(4)],
                         "gpu": [f"h{h}/gpu{g}" for h in (1, 2) for g in range(4)], "leaf": ["leaf-1"] * 8})
    jc = pl.DataFrame({"job_id": ["jobA"] * 6 + ["jobB"] * 2,
                       "ip": [f"10.0.1.{g}" for g in range(4)] + ["10.0.2.0", "10.0.2.1", "10.0.2.2", "10.0.2.3"],
                       "host": ["h1"] * 4 + ["h2"] * 4})
    ranks = pl.DataFrame({"capture_id": ["capA"] * 4, "rank": [0, 1, 2, 3], "host": ["h1"] * 4, "device": [0, 1, 2, 3]})
    return topo, jc, ranks


def test_a_slow_rank_is_one_problem_on_its_machine_with_the_job_slowdown_and_kernels_as_evidence():
    topo, jc, ranks = _fleet()
    kernel = "void cutlass::Kernel<cutlass::gemm::kernel::GemmUniversal<cute::tuple<int, int, int>, float>>(Params)"
    v = make_verdicts([
        _v(detector="prism.stragglers", scope="rank", subject="3", capture_id="capA", job_id="capA-job", severity="critical",
           explanation="rank 3 computes 27% slower than its same-stage peers", start_ns=12 * 3600 * S, end_ns=12 * 3600 * S + 60 * S),
        _v(detector="perftracker", scope="kernel", subject=kernel, capture_id="capA", job_id="capA-job", team="infrastructure",
           evidence=json.dumps({"ranks": [3]}), start_ns=12 * 3600 * S, end_ns=12 * 3600 * S + 60 * S),
        _v(detector="flows.cross_step", scope="job", subject="jobA", job_id="jobA", team="infrastructure",
           start_ns=12 * 3600 * S + 10 * S, end_ns=12 * 3600 * S + 50 * S),
        _v(detector="flows.switch_bandwidth", scope="switch", subject="leaf-1", evidence=json.dumps({"jobs": ["jobA"]}),
           start_ns=12 * 3600 * S, end_ns=12 * 3600 * S + 60 * S),
    ])
    problems, members = group_problems(v, topo, jc, ranks)
    assert problems.height == 1, problems.select("title", "cause")
    p = problems.row(0, named=True)
    assert (p["cause"], p["host"], p["gpu"], p["ip"], p["team"]) == ("gpu", "h1", "h1/gpu3", "10.0.1.3", "operations")
    assert p["title"].startswith("GPU h1/gpu3 (10.0.1.3)") and "since 12:00:00 UTC" in p["title"]
    assert "stragglers" not in p["title"] and "_" not in p["title"].split(":")[0]  # no metric names in the title
    assert "switch leaf-1 was flagged too, but the other jobs crossing it are not slower" in p["team_reason"]
    roles = dict(members.join(v.select("verdict_id", "scope"), on="verdict_id").select("scope", "role").iter_rows())
    assert roles == {"rank": "cause", "kernel": "evidence", "job": "symptom", "switch": "evidence"}
    ev = json.loads(p["evidence"])
    assert any(kernel in line for line in ev)  # the full kernel name stays in the evidence


def test_a_switch_is_the_cause_when_the_jobs_crossing_it_slow_together():
    topo, jc, ranks = _fleet()
    v = make_verdicts([
        _v(detector="flows.switch_bandwidth", scope="switch", subject="leaf-1", severity="critical",
           evidence=json.dumps({"jobs": ["jobA", "jobB"]})),
        _v(detector="flows.cross_step", scope="job", subject="jobA", job_id="jobA", team="infrastructure"),
        _v(detector="flows.cross_step", scope="job", subject="jobB", job_id="jobB", team="infrastructure"),
        _v(detector="flows.nic_bandwidth", scope="link", subject="10.0.2.0", start_ns=30 * S, end_ns=40 * S),
    ])
    problems, members = group_problems(v, topo, jc, ranks)
    sw = problems.filter(pl.col("cause") == "switch")
    assert sw.height == 1 and sw["switch"][0] == "leaf-1" and sw["team"][0] == "operations"
    assert sw["severity"][0] == "critical" and problems["cause"][0] == "switch"  # the most severe first
    assert set(sw["job_ids"][0].split(",")) == {"jobA", "jobB"}


def test_a_slow_job_nothing_explains_is_its_own_problem():
    v = make_verdicts([_v(detector="flows.cross_step", scope="job", subject="jobQ", job_id="jobQ", team="infrastructure",
                          explanation="12 steps of jobQ took 2.1 s, +40% vs its usual 1.5 s")])
    problems, _ = group_problems(v)
    assert problems.height == 1 and problems["cause"][0] == "job"
    assert problems["title"][0].startswith("job jobQ is slow and no machine, link or stage explains it: 12 steps of jobQ took 2.1 s")


def test_kernel_names_are_short_in_titles():
    from fleetscope.findings.problems import short_name
    assert short_name("void cutlass::Kernel<cutlass::gemm::kernel::GemmUniversal<cute::tuple<int>>>(Params)") == "cutlass::Kernel"
    assert short_name("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)") == \
        "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"
    assert short_name("aten::mm") == "aten::mm"


def test_a_problem_keeps_its_id_while_its_cause_stays():
    """The live rebuilds add evidence and symptoms as analyses land: the problem's id follows its
    cause (the GPU and when it was first seen), not its members; another episode is another id."""
    topo, jc, _ = _fleet()
    first = make_verdicts([_v(detector="flows.slow_gpu", scope="gpu", subject="10.0.1.2", start_ns=10 * S, end_ns=20 * S)])
    more = make_verdicts([_v(detector="flows.slow_gpu", scope="gpu", subject="10.0.1.2", start_ns=70 * S, end_ns=80 * S),
                          _v(detector="flows.steps", scope="step", subject="4", job_id="jobA", start_ns=70 * S, end_ns=80 * S,
                             severity="critical")])
    later = make_verdicts([_v(detector="flows.slow_gpu", scope="gpu", subject="10.0.1.2", start_ns=7200 * S, end_ns=7210 * S)])
    p1, _ = group_problems(first, topo, jc)
    p2, m2 = group_problems(pl.concat([first, more]), topo, jc)
    assert p1.height == 1 and p2.height == 1 and p2["n_verdicts"][0] == 3 and p2["severity"][0] == "critical"
    assert p2["problem_id"][0] == p1["problem_id"][0]
    assert set(m2["problem_id"]) == {p1["problem_id"][0]}
    p3, _ = group_problems(pl.concat([first, more, later]), topo, jc)
    assert p3.height == 2 and p1["problem_id"][0] in p3["problem_id"].to_list()


def test_a_switch_that_slowed_another_jobs_flows_is_its_own_problem_beside_a_slow_rank():
    """A congested switch that slows flows without slowing steps (communication overlapped with
    compute) is still a fault of its own when it slowed a job that no other cause touches."""
    topo, jc, ranks = _fleet()
    v = make_verdicts([
        _v(detector="prism.stragglers", scope="rank", subject="3", capture_id="capA", job_id="capA-job", severity="critical"),
        _v(detector="flows.switch_bandwidth", scope="switch", subject="leaf-1", severity="critical",
           evidence=json.dumps({"jobs": ["jobA", "jobB"]})),
    ])
    problems, _ = group_problems(v, topo, jc, ranks)
    assert sorted(problems["cause"].to_list()) == ["gpu", "switch"], problems.select("cause", "title")
    assert problems.filter(pl.col("cause") == "switch")["switch"][0] == "leaf-1"


def test_a_host_the_flows_single_out_joins_the_slow_gpu_on_a_host_they_cannot_tell_it_from():
    """A slow GPU holds back its rings; the flows name its host (or one they cannot tell from it): the
    problem is the GPU's, with the host finding as evidence, not a second problem on the host."""
    topo, jc, ranks = _fleet()
    v = make_verdicts([
        _v(detector="prism.stragglers", scope="rank", subject="3", capture_id="capA", job_id="capA-job", severity="critical"),
        _v(detector="flows.late_rank", scope="host", subject="h2", evidence=json.dumps({"jobs": ["jobA"], "or_equally": ["h1"]})),
    ])
    problems, members = group_problems(v, topo, jc, ranks)
    assert problems.height == 1 and problems["cause"][0] == "gpu" and problems["host"][0] == "h1", problems.select("cause", "title")
    assert members.height == 2
    # a host finding with no GPU cause on it or on its alternatives stays a problem of its own
    v2 = make_verdicts([_v(detector="flows.late_rank", scope="host", subject="h2", evidence=json.dumps({"jobs": ["jobB"]}))])
    assert group_problems(v2, topo, jc, ranks)[0]["cause"].to_list() == ["host"]


def test_a_gpu_the_flows_find_late_is_the_same_problem_as_that_gpu_slow_in_the_traces():
    """The traces name rank 3 (h1/gpu3, 10.0.1.3) slow; the flows find 10.0.1.3 starting its traffic late
    (demo seed 743): one problem on the GPU, the flows' finding its evidence. A late GPU the traces do
    not name stays a problem of its own."""
    topo, jc, ranks = _fleet()
    # the capture's finding has no time (rank-level what-ifs), the flows' has the window's
    gpu = _v(detector="prism.stragglers", scope="rank", subject="3", capture_id="capA", job_id="capA-job", severity="critical",
             start_ns=None, end_ns=None)
    t0 = 1_795_262_460 * S
    late = _v(detector="flows.late_rank", scope="gpu", subject="10.0.1.3", evidence=json.dumps({"jobs": ["jobA"]}),
              start_ns=t0, end_ns=t0 + 50 * S)
    problems, members = group_problems(make_verdicts([gpu, late]), topo, jc, ranks)
    assert problems.height == 1 and problems["ip"][0] == "10.0.1.3", problems.select("cause", "title")
    assert members.height == 2
    other = _v(detector="flows.late_rank", scope="gpu", subject="10.0.1.2", evidence=json.dumps({"jobs": ["jobA"]}),
               start_ns=t0, end_ns=t0 + 50 * S)
    assert group_problems(make_verdicts([gpu, other]), topo, jc, ranks)[0].height == 2


def test_a_slowdown_of_a_piece_of_a_job_on_the_hosts_of_a_slowed_job_is_that_causes_symptom():
    """The flows see one job in pieces (demo seed 734: ranks whose only traffic is a pipeline hop inside
    a leaf): jobA crosses a slow switch, jobA2 on the same hosts slows at the same time with nothing of
    its own: a symptom of the switch, not a problem 'no machine, link or stage explains'. A slowdown
    of a job on other hosts stays its own problem."""
    jc = pl.DataFrame({"job_id": ["jobA", "jobA", "jobA2", "jobA2", "jobC"], "ip": ["a1", "a2", "a3", "a4", "c1"],
                       "host": ["h1", "h2", "h1", "h2", "h9"]})
    sw = _v(detector="flows.switch_bandwidth", scope="switch", subject="spine-0", severity="critical",
            evidence=json.dumps({"jobs": ["jobA"]}))
    piece = _v(detector="flows.cross_step", scope="job", subject="jobA2", job_id="jobA2", start_ns=10 * S, end_ns=20 * S)
    other = _v(detector="flows.cross_step", scope="job", subject="jobC", job_id="jobC", start_ns=10 * S, end_ns=20 * S)
    problems, members = group_problems(make_verdicts([sw, piece, other]), pl.DataFrame(), jc)
    assert sorted(problems["cause"].to_list()) == ["job", "switch"], problems.select("cause", "title")
    assert problems.filter(pl.col("cause") == "job")["job_ids"][0] == "jobC"
    assert members.filter(pl.col("role") == "symptom").height == 1


def test_a_nic_the_flows_cannot_place_in_a_ring_joins_the_slow_gpu_of_that_ring():
    """A slow GPU slows its rings as a whole, and the flows cannot tell which member of a slowed ring
    holds it back: a NIC finding whose ring alternatives hold the slow GPU is evidence of the GPU's
    problem; a NIC finding whose rings do not hold it stays a problem of its own."""
    topo, jc, ranks = _fleet()
    gpu = _v(detector="prism.stragglers", scope="rank", subject="3", capture_id="capA", job_id="capA-job", severity="critical")
    ring = json.dumps({"jobs": ["jobA"], "or_in_its_rings": ["10.0.1.3", "10.0.2.1"]})
    problems, members = group_problems(make_verdicts([
        gpu, _v(detector="flows.nic_bandwidth", scope="link", subject="10.0.2.0", evidence=ring)]), topo, jc, ranks)
    assert problems["cause"].to_list() == ["gpu"] and problems["ip"][0] == "10.0.1.3", problems.select("cause", "title")
    assert members.height == 2
    other = json.dumps({"jobs": ["jobA"], "or_in_its_rings": ["10.0.2.1"]})
    problems, _ = group_problems(make_verdicts([
        gpu, _v(detector="flows.nic_bandwidth", scope="link", subject="10.0.2.0", evidence=other)]), topo, jc, ranks)
    assert sorted(problems["cause"].to_list()) == ["gpu", "nic"], problems.select("cause", "title")


def test_a_capture_job_seen_in_flows_as_several_jobs_keeps_its_parts_and_leaves_other_jobs_alone():
    """Demo seed 385's shape: hosts h1, h2 of 8 GPUs each; job X on gpu0-3 (one flow job), job Y on
    gpu4-7 with pipeline and tensor-parallel traffic inside its hosts, so flows see one job per DP
    ring (Y1: gpu4-5 of both hosts, Y2: gpu6, Y3: gpu7). Y's capture names rank 7 (h2/gpu7); the
    slowdowns of Y's flow parts are its symptoms, and a switch slowing X is not Y's GPU's evidence."""
    topo = pl.DataFrame({"ip": [f"10.0.{h}.{g}" for h in (1, 2) for g in range(8)],
                         "host": [f"h{h}" for h in (1, 2) for _ in range(8)],
                         "gpu": [f"h{h}/gpu{g}" for h in (1, 2) for g in range(8)], "leaf": ["leaf-1"] * 16})
    part = {0: "X", 1: "X", 2: "X", 3: "X", 4: "Y1", 5: "Y1", 6: "Y2", 7: "Y3"}
    jc = pl.DataFrame({"job_id": [part[g] for h in (1, 2) for g in range(8)], "ip": [f"10.0.{h}.{g}" for h in (1, 2) for g in range(8)],
                       "host": [f"h{h}" for h in (1, 2) for _ in range(8)]})
    ranks = pl.DataFrame({"capture_id": ["capY"] * 8, "rank": list(range(8)), "host": ["h1"] * 4 + ["h2"] * 4,
                          "device": [4, 5, 6, 7] * 2})
    v = make_verdicts([
        _v(detector="prism.stragglers", scope="rank", subject="7", capture_id="capY", job_id="job-Y", severity="critical"),
        _v(detector="flows.cross_step", scope="job", subject="Y1", job_id="Y1", team="infrastructure"),
        _v(detector="flows.cross_step", scope="job", subject="Y2", job_id="Y2", team="infrastructure"),
        _v(detector="flows.switch_bandwidth", scope="switch", subject="spine-1", severity="critical",
           evidence=json.dumps({"jobs": ["X"]})),
    ])
    problems, members = group_problems(v, topo, jc, ranks)
    assert sorted(problems["cause"].to_list()) == ["gpu", "switch"], problems.select("cause", "title")
    gpu = problems.filter(pl.col("cause") == "gpu").row(0, named=True)
    assert gpu["ip"] == "10.0.2.7" and "rank 7 of job Y3" in gpu["title"]   # the flow job holding the rank's GPU
    assert {"Y1", "Y2", "Y3"} <= set(gpu["job_ids"].split(","))
    sym = members.filter((pl.col("problem_id") == gpu["problem_id"]) & (pl.col("role") == "symptom")).height
    assert sym == 2
    sw = problems.filter(pl.col("cause") == "switch").row(0, named=True)
    assert sw["switch"] == "spine-1" and sw["job_ids"] == "X"


def test_a_switch_of_another_rail_is_its_own_problem_beside_the_slow_gpu_of_its_job():
    """Demo seed 701's shape: a slow GPU on rail 0 and a congested rail-3 leaf slowing the same (only)
    job. A slow GPU paces the rings of its own rail, so a rail-0 switch flagged with it may be its
    evidence; a rail-3 switch cannot be, and is a problem of its own."""
    topo, jc, ranks = _fleet()
    topo = topo.with_columns(rail=pl.Series([g for _ in (1, 2) for g in range(4)], dtype=pl.Int32),
                             leaf=pl.Series([f"leaf-r{g}" for _ in (1, 2) for g in range(4)]))
    gpu = _v(detector="prism.stragglers", scope="rank", subject="0", capture_id="capA", job_id="capA-job", severity="critical")

    def switch(name):
        return _v(detector="flows.switch_bandwidth", scope="switch", subject=name, severity="critical",
                  evidence=json.dumps({"jobs": ["jobA"]}))
    problems, _ = group_problems(make_verdicts([gpu, switch("leaf-r3")]), topo, jc, ranks)
    assert sorted(problems["cause"].to_list()) == ["gpu", "switch"], problems.select("cause", "title")
    assert problems.filter(pl.col("cause") == "switch")["switch"][0] == "leaf-r3"
    # the GPU's own rail: the switch may be its rings' pacing, evidence of the GPU's problem
    problems, members = group_problems(make_verdicts([gpu, switch("leaf-r0")]), topo, jc, ranks)
    assert problems["cause"].to_list() == ["gpu"] and members.height == 2, problems.select("cause", "title")


def test_a_job_pinned_to_one_nic_is_its_own_problem_for_its_owners_beside_a_slow_gpu_of_the_job():
    """A job's launch that funnels each host through one NIC is a cause the job's owners fix, not a
    symptom of another cause on the job: its own problem, with what to change in the launch."""
    topo, jc, ranks = _fleet()
    gpu = _v(detector="prism.stragglers", scope="rank", subject="0", capture_id="capA", job_id="capA-job", severity="critical")
    slow = _v(detector="flows.cross_step", scope="job", subject="jobA", job_id="jobA", explanation="jobA slowed 20 %")
    pinned = _v(detector="flows.nic_overload", scope="job", subject="jobA", job_id="jobA", team="algorithm", value=1.0,
                explanation="job jobA sends all of its traffic on each of its 2 hosts through one NIC (10.0.1.0, 10.0.2.0)")
    problems, members = group_problems(make_verdicts([gpu, slow, pinned]), topo, jc, ranks)
    assert sorted(problems["cause"].to_list()) == ["gpu", "job"], problems.select("cause", "title")
    own = problems.filter(pl.col("cause") == "job")
    assert own["team"][0] == "algorithm" and own["title"][0].startswith("job jobA sends each host's traffic through one NIC")
    assert "NCCL_IB_HCA" in own["action"][0]
    # the job's slowdown stays the slow GPU's symptom
    gid = problems.filter(pl.col("cause") == "gpu")["problem_id"][0]
    assert members.filter((pl.col("problem_id") == gid) & (pl.col("role") == "symptom")).height == 1


def test_a_nic_of_the_slow_gpus_own_host_and_job_joins_the_gpus_problem():
    """Demo seed 706's shape: a slow GPU holds back its tensor-parallel group, every rank of its host, so
    the flows of the host's other NICs are slow too: evidence of the GPU's problem, not NIC problems.
    A NIC of that host that carries another job's flows stays a problem of its own."""
    topo, jc, ranks = _fleet()
    gpu = _v(detector="prism.stragglers", scope="rank", subject="0", capture_id="capA", job_id="capA-job", severity="critical")

    def nic(ip, job):
        return _v(detector="flows.nic_bandwidth", scope="link", subject=ip, job_id=job,
                  evidence=json.dumps({"jobs": [job], "or_equally": [], "or_in_its_rings": []}))
    problems, members = group_problems(make_verdicts([gpu, nic("10.0.1.2", "jobA"), nic("10.0.1.3", "jobA")]), topo, jc, ranks)
    assert problems["cause"].to_list() == ["gpu"] and problems["ip"][0] == "10.0.1.0", problems.select("cause", "title")
    assert members.height == 3
    # the same NIC on another job (a co-tenant of the host): its own problem
    jc_b = jc.with_columns(job_id=pl.when(pl.col("ip") == "10.0.1.2").then(pl.lit("jobB")).otherwise("job_id"))
    problems, _ = group_problems(make_verdicts([gpu, nic("10.0.1.2", "jobB")]), topo, jc_b, ranks)
    assert sorted(problems["cause"].to_list()) == ["gpu", "nic"], problems.select("cause", "title")


def test_a_switch_slow_while_its_jobs_steps_were_not_is_its_own_problem_beside_the_slow_gpu_of_its_job():
    """Demo seed 404's shape: a congested rail-1 leaf and, later, a slow GPU on rail 1 in the same
    (only) job. The leaf's flows were slow in the first window while the job's steps were at their
    usual pace (the flows saw the job slow down only in the second): a slow GPU paces flows only by
    holding back the steps, so the leaf is a problem of its own. Slow flows that only ever come with
    slow steps stay the GPU's evidence."""
    topo, jc, ranks = _fleet()
    topo = topo.with_columns(rail=pl.Series([g for _ in (1, 2) for g in range(4)], dtype=pl.Int32),
                             leaf=pl.Series([f"leaf-r{g}" for _ in (1, 2) for g in range(4)]))
    gpu = _v(detector="prism.stragglers", scope="rank", subject="0", capture_id="capA", job_id="capA-job", severity="critical",
             start_ns=None, end_ns=None)
    slower = _v(detector="flows.cross_step", scope="job", subject="jobA", job_id="jobA", team="infrastructure", severity="info",
                start_ns=61 * S, end_ns=100 * S)

    def switch(a, b):
        return _v(detector="flows.switch_bandwidth", scope="switch", subject="leaf-r0", severity="critical",
                  evidence=json.dumps({"jobs": ["jobA"]}), start_ns=a * S, end_ns=b * S)
    problems, _ = group_problems(make_verdicts([gpu, slower, switch(50, 59), switch(61, 100)]), topo, jc, ranks)
    assert sorted(problems["cause"].to_list()) == ["gpu", "switch"], problems.select("cause", "title")
    assert problems.filter(pl.col("cause") == "switch")["switch"][0] == "leaf-r0"
    # slow only while the steps were slow: the GPU's rings' pacing, one problem
    problems, _ = group_problems(make_verdicts([gpu, slower, switch(61, 100)]), topo, jc, ranks)
    assert problems["cause"].to_list() == ["gpu"], problems.select("cause", "title")


def test_a_switch_whose_slow_flows_are_another_rings_is_its_own_problem_beside_the_slow_gpu_of_its_job():
    """Demo seed 803's shape: a congested spine under every rail's rings of a job, and a slow GPU of
    that job on another rail. A slow GPU paces its own rings: a switch whose slow flows are mostly
    another collective's (the flows' localization names the collective holding most of them and its
    addresses), or spread over many, is slow itself. Where the GPU's own ring holds most of them, the
    switch may be its pacing: one problem."""
    topo, jc, ranks = _fleet()
    gpu = _v(detector="prism.stragglers", scope="rank", subject="0", capture_id="capA", job_id="capA-job", severity="critical")

    def spine(top, ips):
        return _v(detector="flows.switch_bandwidth", scope="switch", subject="spine-0", severity="critical",
                  evidence=json.dumps({"jobs": ["jobA"], "top_ring_share": top, "top_ring_ips": ips}))
    for top, ips in ((0.85, ["10.0.1.2", "10.0.2.2"]), (0.2, ["10.0.1.0", "10.0.2.0"])):
        problems, _ = group_problems(make_verdicts([gpu, spine(top, ips)]), topo, jc, ranks)
        assert sorted(problems["cause"].to_list()) == ["gpu", "switch"], (top, ips, problems.select("cause", "title"))
    problems, _ = group_problems(make_verdicts([gpu, spine(0.85, ["10.0.1.0", "10.0.2.0"])]), topo, jc, ranks)
    assert problems["cause"].to_list() == ["gpu"], problems.select("cause", "title")


def test_a_nic_the_flows_cannot_tell_from_its_own_leaf_is_named_with_it():
    """A NIC whose leaf carries no other flows is one segment with that leaf for the flows (NIC, cable,
    port and switch slow the same flows): the problem names both. An alternative elsewhere (a spine)
    stays in the explanation; the subject is the NIC alone."""
    topo = pl.DataFrame({"ip": ["10.0.5.3", "10.0.6.3"], "host": ["h5", "h6"], "gpu": ["h5/gpu3", "h6/gpu3"],
                         "leaf": ["leaf-2", "leaf-3"]})
    v = make_verdicts([
        _v(detector="flows.nic_bandwidth", scope="link", subject="10.0.5.3", value=0.5,
           evidence=json.dumps({"jobs": ["jobA"], "or_equally": ["leaf-2"]})),
        _v(detector="flows.nic_bandwidth", scope="link", subject="10.0.6.3", value=0.5, start_ns=7200 * S, end_ns=7260 * S,
           evidence=json.dumps({"jobs": ["jobB"], "or_equally": ["spine-0"]})),
    ])
    problems, _ = group_problems(v, topo)
    subj = dict(zip(problems["ip"].to_list(), problems["subject"].to_list()))
    assert subj["10.0.5.3"] == "NIC of h5/gpu3 (10.0.5.3) or its switch leaf-2"
    assert subj["10.0.6.3"] == "NIC of h6/gpu3 (10.0.6.3)"


def test_a_nic_named_in_the_window_before_a_switch_that_lists_it_in_its_rings_is_the_switchs_onset():
    """Demo seeds 671 and 679: a spine congested from 12:00:52; the window 12:00-12:01 saw only its first
    seconds and pinned them on one NIC of a ring crossing it; the next window named the spine with that NIC
    among the elements its rings cannot tell it from. One problem, the switch's, with the NIC as evidence.
    The same NIC named again in the switch's own window, or a NIC outside its rings, stays a problem."""
    topo, jc, _ = _fleet()
    w1, w2 = "w60s-20261121T120000Z", "w60s-20261121T120100Z"
    t1 = 1_795_262_400 * S
    nic = _v(detector="flows.nic_bandwidth", scope="link", subject="10.0.2.0", window_id=w1, start_ns=t1 + 51 * S,
             end_ns=t1 + 60 * S, evidence=json.dumps({"jobs": ["jobA"], "or_equally": [], "or_in_its_rings": []}))
    sw = _v(detector="flows.switch_bandwidth", scope="switch", subject="spine-1", window_id=w2, start_ns=t1 + 60 * S,
            end_ns=t1 + 120 * S, severity="critical",
            evidence=json.dumps({"jobs": ["jobA"], "or_equally": [], "or_in_its_rings": ["10.0.2.0", "10.0.1.1"]}))
    problems, members = group_problems(make_verdicts([nic, sw]), topo, jc)
    assert problems["cause"].to_list() == ["switch"], problems.select("cause", "title")
    assert members.height == 2
    again = dict(nic, window_id=w2, start_ns=t1 + 60 * S, end_ns=t1 + 120 * S)
    assert sorted(group_problems(make_verdicts([nic, again, sw]), topo, jc)[0]["cause"].to_list()) == ["nic", "switch"]
    outside = dict(nic, subject="10.0.2.3")
    assert sorted(group_problems(make_verdicts([outside, sw]), topo, jc)[0]["cause"].to_list()) == ["nic", "switch"]
