"""Rate localization (fleetscope.flows.network.localize) on hand-built rings: a ring moves at its slowest
hop's pace, so every NIC of a slowed ring explains it through that pacing; the element that carries
every slow hop itself is the one named."""
import json

import numpy as np
import polars as pl

from fleetscope.flows import FlowConfig
from fleetscope.flows.network import localize

S = 1_000_000_000
LEAF = {"x": "leaf1", "y": "leaf2", "z": "leaf2", "p": "leaf3", "q": "leaf4", "r": "leaf4", "s": "leaf3"}


def ring_flows(rings: dict[str, list[str]], slow: dict[str, float], seed: int = 0) -> pl.DataFrame:
    """Per ring (a DP group of one job), its hops every 0.2 s over a minute; each flow's rate residual
    is log of the slowest factor on its ring's path (the ring's pace) plus noise."""
    rng = np.random.default_rng(seed)
    rows = []
    for g, members in rings.items():
        hops = list(zip(members, members[1:] + members[:1]))
        paths = {h: [LEAF[h[0]]] if LEAF[h[0]] == LEAF[h[1]] else [LEAF[h[0]], "spine", LEAF[h[1]]] for h in hops}
        # the ring's pace: its slowest hop's (every element on any of its hops)
        pace = min([slow.get(e, 1.0) for h in hops for e in (*paths[h], *h)])
        for t in np.arange(0, 60, 0.2):
            for src, dst in hops:
                rows.append((src, dst, g, int(t * S), int(t * S) + 20_000_000, paths[(src, dst)], float(np.log(pace))))
    f = pl.DataFrame(rows, schema=["src_ip", "dst_ip", "g", "start_ns", "end_ns", "path", "e0"], orient="row")
    noise = rng.normal(0, 0.03, (2, f.height))
    return f.with_row_index("fid").with_columns(
        fid=pl.col("fid").cast(pl.Int64), job_id=pl.lit("job-1"), unit="dp:job-1/" + pl.col("g"),
        bin=pl.col("start_ns") // (10 * S), e_peer=pl.col("e0") + noise[0], e_hist=pl.col("e0") + noise[1]).drop("g", "e0")


RINGS = {"0": ["x", "y", "z"], "1": ["p", "q", "r", "s"]}


def named(f: pl.DataFrame) -> list[tuple[str, str]]:
    causes, _ = localize(f, 1, (0, 60 * S), FlowConfig())
    return causes.select("kind", "cand").rows()


def test_a_congested_leaf_carrying_every_hop_of_a_ring_is_named_not_a_nic_of_it():
    assert named(ring_flows(RINGS, {"leaf2": 0.57})) == [("switch", "leaf2")]


def test_the_ring_members_that_explain_it_through_its_pacing_are_listed_with_it():
    causes, _ = localize(ring_flows(RINGS, {"leaf2": 0.57}), 1, (0, 60 * S), FlowConfig())
    assert set(causes["paced"][0].split(",")) >= {"x", "y", "z"}


def test_a_healthy_pair_of_rings_names_nothing():
    assert named(ring_flows(RINGS, {})) == []


def bimodal_ring(fast_share: list[float], fault: tuple[str, float, float] | None = None,
                 leaves: tuple[str, ...] = ("leaf0", "leaf0", "leaf1", "leaf1"), seed: int = 1,
                 ring: int = 0) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Raw flows of one 4-rank ring (rank i under leaves[i]; a spine between leaves) moving 8 MB chunks
    every 0.1 s for a minute, each chunk at one of two rates 2.2x apart (two channels of a ring);
    fast_share[k]: the share of fast chunks in the k-th 10 s bin; fault: (element, rate factor, from
    second): the ring moves at its slowest hop's pace from then on; ring: its number (addresses, pairs)."""
    rng = np.random.default_rng(seed)
    members = [f"10.{ring}.0.{i + 1}" for i in range(4)]
    leaf = dict(zip(members, leaves))
    hops = list(zip(members, members[1:] + members[:1]))
    path = {h: [leaf[h[0]]] if leaf[h[0]] == leaf[h[1]] else [leaf[h[0]], "spine", leaf[h[1]]] for h in hops}
    hit = fault is not None and any(fault[0] in (*path[h], *h) for h in hops)
    rows = []
    for t in np.arange(0, 60, 0.1):
        fast = rng.random() < fast_share[int(t // 10)]
        pace = fault[1] if hit and t >= fault[2] else 1.0
        for i, (s, d) in enumerate(hops):
            rate = (22.0 if fast else 10.0) * pace * np.exp(rng.normal(0, 0.02))    # bytes per ns
            start = int(t * S) + i * 1000
            rows.append((s, d, start, start + int(8_000_000 / rate), 8_000_000, path[(s, d)], 4 * ring + i))
    f = pl.DataFrame(rows, schema=["src_ip", "dst_ip", "start_ns", "end_ns", "bytes", "path", "pid"], orient="row")
    pairs = pl.DataFrame({"pid": [4 * ring + i for i in range(4)], "comm_type": ["DP"] * 4, "job_id": ["job-1"] * 4,
                          "dp_group": [ring] * 4})
    return f.with_columns(pl.col("pid").cast(pl.Int64)), pairs.with_columns(pl.col("pid").cast(pl.Int64))


SHARES = [0.5, 0.45, 0.55, 0.42, 0.58, 0.5]


def loud(v: list[dict]) -> list[tuple[str, str]]:
    return [(r["scope"], r["subject"]) for r in v if r["severity"] != "info"]


def test_a_healthy_ring_whose_chunks_move_at_two_rates_in_shifting_shares_names_nothing():
    # a median level of two equal modes flips from one mode to the other as their shares move a little:
    # every flow of the ring then looks a mode's gap slower than its pair's usual rate
    from fleetscope.flows.network import network_verdicts
    f, pairs = bimodal_ring(SHARES)
    assert loud(network_verdicts(f, pairs, 1, (0, 60 * S), "w", FlowConfig())) == []


def test_a_congested_spine_is_named_and_not_the_nic_that_carries_the_rings_other_hops():
    # ring 0: ranks 0, 1, 2 under leaf0, rank 3 under leaf1: two hops cross the spine, and rank 1 sends
    # or receives on both hops that do not; ring 1 crosses it too. The spine slows from 25 s (inside a
    # bin), each ring follows its slowest hop. Rings 2 and 3 (other groups of the job) stay under leaf0
    # and under leaf1, at their usual rate: neither leaf is the cause, and the spine is what the slow
    # rings share
    from fleetscope.flows.network import network_verdicts
    rings = [bimodal_ring(SHARES, fault=("spine", 0.45, 25.0), leaves=("leaf0", "leaf0", "leaf0", "leaf1")),
             bimodal_ring(SHARES, fault=("spine", 0.45, 25.0), seed=2, ring=1),
             bimodal_ring(SHARES, leaves=("leaf0",) * 4, seed=3, ring=2),
             bimodal_ring(SHARES, leaves=("leaf1",) * 4, seed=4, ring=3)]
    f, pairs = pl.concat([r[0] for r in rings]), pl.concat([r[1] for r in rings])
    assert loud(network_verdicts(f, pairs, 1, (0, 60 * S), "w", FlowConfig())) == [("switch", "spine")]


def test_of_two_leaves_one_paced_ring_cannot_tell_apart_the_one_named_before_is_named_again():
    # ring 1 crosses leaf3 and leaf4 on three hops each: slowed as a whole, its flows cannot tell
    # which leaf holds it back; an earlier window that could (a job crossing only one of them) decides
    f = ring_flows(RINGS, {"leaf4": 0.5})
    first = localize(f, 1, (0, 60 * S), FlowConfig(), prior={"leaf4"})[0].select("kind", "cand").rows()
    assert first == [("switch", "leaf4")]
    other = localize(f, 1, (0, 60 * S), FlowConfig(), prior={"leaf3"})[0].select("kind", "cand").rows()
    assert other == [("switch", "leaf3")]


def test_a_cause_named_before_is_not_named_again_where_its_flows_are_fine_now():
    f = ring_flows(RINGS, {"leaf4": 0.5})
    assert localize(f, 1, (0, 60 * S), FlowConfig(), prior={"leaf1"})[0]["cand"].to_list() in (["leaf3"], ["leaf4"])
    assert named(ring_flows(RINGS, {})) == [] and localize(ring_flows(RINGS, {}), 1, (0, 60 * S), FlowConfig(),
                                                           prior={"leaf1", "leaf4"})[0].height == 0


def test_the_flows_window_reads_the_causes_earlier_windows_of_its_warehouse_named(tmp_path):
    from assets.flows import read_prior_suspects
    from fleetscope.findings.verdicts import make_verdicts
    from fleetscope.warehouse import Warehouse

    def row(det, subj, sev, t):
        return dict(detector=det, scope="switch" if det.endswith("switch_bandwidth") else "link", subject=subj,
                    metric="flow_rate_vs_peers", severity=sev, team="operations", explanation="x", start_ns=t, end_ns=t,
                    window_id=f"w{t}")
    wh = Warehouse(tmp_path / "w.duckdb")
    wh.write_partition("anomaly_verdicts", "flows-w1", make_verdicts([
        row("flows.switch_bandwidth", "leaf4", "critical", 100 * S), row("flows.nic_bandwidth", "10.0.0.9", "warning", 150 * S),
        row("flows.nic_bandwidth", "10.0.0.7", "info", 150 * S), row("flows.link_stalls", "10.0.0.8", "warning", 150 * S),
        row("flows.switch_bandwidth", "leaf9", "warning", 10 * S), row("flows.switch_bandwidth", "leaf5", "warning", 200 * S)]))
    # the 120 s before the window that starts at 200 s: named causes only, not info, not later
    assert read_prior_suspects(wh, 200 * S, 120) == {"leaf4", "10.0.0.9"}
    assert read_prior_suspects(Warehouse(tmp_path / "empty.duckdb"), 200 * S, 120) == set()


def test_degenerate_records_fake_no_rate_step():
    """network.pair_levels: a pair moving at one rate all along, with a few records an exporter cut to
    1 ns (its bytes at a petabyte per second) on one side of the span, has no faster level to return
    to (demo seed 374 named a healthy NIC on such a pipeline pair); a real halving of the rate still
    gives the faster side as the pair's healthy level."""
    from fleetscope.flows.network import pair_levels

    n = 600
    t = np.arange(n) * 100_000_000
    x = np.full(n, 3.6)
    x[[40, 90, 130]] = 14.0                      # three degenerate pieces, all in the first third
    lv = pair_levels(pl.DataFrame({"hid": [1] * n, "start_ns": t, "x": x}))
    assert abs(lv["base_step"][0] - 3.6) < 0.05 and abs(lv["base_med"][0] - 3.6) < 0.05
    y = np.where(np.arange(n) < 200, 3.6, 3.6 + np.log(0.5)) + np.random.default_rng(0).normal(0, 0.02, n)
    lv = pair_levels(pl.DataFrame({"hid": [1] * n, "start_ns": t, "y": y}).rename({"y": "x"}))
    assert abs(lv["base_step"][0] - 3.6) < 0.05


def test_a_pair_that_lost_its_label_does_not_outweigh_the_element_the_jobs_slow_flows_share():
    """Demo seed 700's shape: a congested spine paces two rings; in this window one ring's hop inside
    leaf4 lost its DP label (a background unit: no peers, no job) and carries more flows than any
    labeled hop, all at the ring's pace. It avoids the spine, yet as direct evidence it made leaf4
    (and leaf2) the causes; background flows confirm or exonerate, the jobs' flows weigh the causes."""
    f = ring_flows(RINGS, {"spine": 0.5})
    hop = (pl.col("src_ip") == "q") & (pl.col("dst_ip") == "r")
    lost = pl.concat([f.filter(hop).with_columns(pl.col("start_ns") + k * 30_000_000, pl.col("end_ns") + k * 30_000_000)
                      for k in range(4)]).with_columns(unit=pl.lit("bg:q-r"), job_id=pl.lit(None, pl.Utf8),
                                                       e_peer=pl.lit(None, pl.Float64))
    g = pl.concat([f.filter(~hop), lost]).drop("fid").with_row_index("fid").with_columns(pl.col("fid").cast(pl.Int64))
    assert named(g) == [("switch", "spine")]


def hop_ring(hops: dict[tuple[str, str], tuple[int, list[str]]], fault: tuple[str, float, float] | None = None,
             seed: int = 5) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Raw flows of one ring whose network hops are pairs of their own (hops: (src, dst) -> (pair id, path));
    its other hops stay inside hosts, unseen. 8 MB chunks every 0.1 s for a minute, every hop at the ring's
    pace (lockstep): a fault (element, rate factor, from second) on any hop's path slows them all."""
    rng = np.random.default_rng(seed)
    hit = fault is not None and any(fault[0] in (*path, *h) for h, (_, path) in hops.items())
    rows = []
    for t in np.arange(0, 60, 0.1):
        pace = fault[1] if hit and t >= fault[2] else 1.0
        rate = 20.0 * pace * np.exp(rng.normal(0, 0.02))
        for i, ((s, d), (pid, path)) in enumerate(hops.items()):
            start = int(t * S) + i * 1000
            rows.append((s, d, start, start + int(8_000_000 / rate), 8_000_000, path, pid))
    return pl.DataFrame(rows, schema=["src_ip", "dst_ip", "start_ns", "end_ns", "bytes", "path", "pid"], orient="row") \
        .with_columns(pl.col("pid").cast(pl.Int64))


def test_a_ring_whose_hops_are_pairs_of_their_own_is_paced_as_one_by_the_spine_on_one_hop():
    # FSDP over three hosts with tensor parallelism inside them (demo seed 725): each of a ring's
    # network hops is its own pair and DP group in the flows. The ring a1 -> b0 -> (host) -> b1 -> c0 ->
    # (host) -> c1 -> a0 crosses spine0 on its first hop only; spine0 congests at 25 s, and the other
    # hops, on spine1 and spine2, move in lockstep at its pace. The reverse ring and another rail's ring
    # cross spine1, spine2 and spine3 at their usual rate. Only spine0 is a cause: not spine1, spine2
    # or a NIC of the paced hops
    from fleetscope.flows.network import network_verdicts

    def path(s, d, spine):
        return [f"leaf-{s[0]}", spine, f"leaf-{d[0]}"]
    paced = {("a1", "b0"): (0, path("a1", "b0", "spine0")), ("b1", "c0"): (1, path("b1", "c0", "spine1")),
             ("c1", "a0"): (2, path("c1", "a0", "spine2"))}
    reverse = {("b0", "a1"): (0, path("b0", "a1", "spine1")), ("c0", "b1"): (1, path("c0", "b1", "spine2")),
               ("a0", "c1"): (2, path("a0", "c1", "spine3"))}
    rail = {("a3", "b2"): (3, path("a3", "b2", "spine1")), ("b3", "c2"): (4, path("b3", "c2", "spine2")),
            ("c3", "a2"): (5, path("c3", "a2", "spine3"))}
    f = pl.concat([hop_ring(paced, fault=("spine0", 0.4, 25.0)), hop_ring(reverse, seed=6), hop_ring(rail, seed=7)])
    pairs = pl.DataFrame({"pid": list(range(6)), "comm_type": ["DP"] * 6, "job_id": ["job-1"] * 6,
                          "dp_group": list(range(6))}).with_columns(pl.col("pid").cast(pl.Int64))
    assert loud(network_verdicts(f, pairs, 1, (0, 60 * S), "w", FlowConfig())) == [("switch", "spine0")]


def paced_ring_rows(rng, hops: list[tuple[str, str]], path, size: int, rate: float, slow: float = 1.0,
                    pid0: int = 0) -> list[tuple]:
    """Raw flow rows (src, dst, start, end, bytes, path, pid) of a ring moving `size`-byte transfers on
    every hop every 0.1 s for a minute at `rate` bytes/ns (2 % jitter), paced to `slow` of it from 25 s;
    path(src, dst) -> its switches; hop i is pair pid0 + i."""
    rows = []
    for t in np.arange(0, 60, 0.1):
        r = rate * (slow if t >= 25 else 1.0) * np.exp(rng.normal(0, 0.02))
        for i, (s, d) in enumerate(hops):
            start = int(t * S) + i * 1000
            rows.append((s, d, start, start + int(size / r), size, path(s, d), pid0 + i))
    return rows


def test_of_two_leaves_one_paced_ring_cannot_tell_apart_the_one_whose_storage_reads_slowed_is_named():
    # one ring over leafA (3 ranks) and leafB (4 ranks), paced as a whole from 25 s: leafB carries more
    # of its hops (5 of 7) than leafA (4), and the ring's flows cannot tell them apart. A storage server
    # reads to every host every 2 s; from 25 s the reads to hosts under leafA move at its congested rate
    # (demo seed 728): leafA is named, not leafB
    from fleetscope.flows.network import network_verdicts
    rng = np.random.default_rng(8)
    members = [f"10.0.0.{i + 1}" for i in range(7)]
    leaf = {m: "leafA" if i < 3 else "leafB" for i, m in enumerate(members)}
    others = [f"10.0.1.{i + 1}" for i in range(4)]
    leaf.update({m: "leafC" for m in others})
    hops = list(zip(members, members[1:] + members[:1]))
    path = {h: [leaf[h[0]]] if leaf[h[0]] == leaf[h[1]] else [leaf[h[0]], "spine", leaf[h[1]]] for h in hops}
    rows = paced_ring_rows(rng, hops, lambda s, d: path[(s, d)], 8_000_000, 20.0, slow=0.4)
    for t in np.arange(0.5, 60, 2.0):
        for j, c in enumerate(members + others):
            slow = 0.4 if t >= 25 and leaf[c] == "leafA" else 1.0
            start = int(t * S) + j * 10_000_000
            rate = 1.0 * slow * np.exp(rng.normal(0, 0.2))
            rows.append(("10.9.0.1", c, start, start + int(500_000_000 / rate), 500_000_000,
                         ["leafS", "spine", leaf[c]], 100 + j))
    f = pl.DataFrame(rows, schema=["src_ip", "dst_ip", "start_ns", "end_ns", "bytes", "path", "pid"], orient="row") \
        .with_columns(pl.col("pid").cast(pl.Int64))
    pairs = pl.DataFrame({"pid": list(range(7)), "comm_type": ["DP"] * 7, "job_id": ["job-1"] * 7,
                          "dp_group": [0] * 7}).with_columns(pl.col("pid").cast(pl.Int64))
    assert loud(network_verdicts(f, pairs, 1, (0, 60 * S), "w", FlowConfig())) == [("switch", "leafA")]


def test_a_channel_slowed_by_a_spine_is_told_from_the_channel_beside_it_on_the_same_pairs():
    # demo seed 747, second minute (tests/data/flow_windows): spine T2-S00 congested; a job's rings move in
    # two channels started together, one across the spine: its transfers on every hop (inside the leaves
    # too) slow to the spine's pace, half of each pair's. The channel beside it ends sooner and is no
    # part of that collective: the spine is named and none of the seven NICs its paced hops cross
    from pathlib import Path

    from fleetscope.flows.network import network_verdicts
    d = Path(__file__).resolve().parents[1] / "data" / "flow_windows" / "demo747-w2"
    f, pairs, hist = (pl.read_parquet(d / f"{n}.parquet") for n in ("flows", "pairs", "history"))
    v = network_verdicts(f, pairs, 1, (1795262460000000000, 1795262520000000000), "w", FlowConfig(), history=hist)
    assert loud(v) == [("switch", "T2-S00")]


def test_flows_that_need_less_than_a_congested_leaf_leaves_them_do_not_clear_it():
    # demo seed 733: a ring over two leaves whose only network hops cross both (leafA and leafB), paced
    # to half its rate from 25 s by a congested leafB; another job's transfers under leafB alone move at
    # a seventh of the ring's rate the whole time (spread over its backward pass: they never needed
    # more than leafB leaves), so they keep their pace. They said leafB was healthy, and leafA, whose
    # only data flows are the ring's, was named alone. Neither leaf can be told from the other by the
    # ring's flows: both are named, in one answer
    from fleetscope.flows.network import network_verdicts
    rng = np.random.default_rng(9)
    a, b = ["10.0.0.1", "10.0.0.2"], ["10.0.1.1", "10.0.1.2"]
    hops = [(a[0], b[0]), (b[0], a[1]), (a[1], b[1]), (b[1], a[0])]
    rows = paced_ring_rows(rng, hops, lambda s, d: ["leafA", "spine", "leafB"] if s in a else ["leafB", "spine", "leafA"],
                           32_000_000, 40.0, slow=0.5)
    fsdp = ["10.0.1.3", "10.0.1.4", "10.0.1.5"]
    rows += paced_ring_rows(rng, list(zip(fsdp, fsdp[1:] + fsdp[:1])), lambda s, d: ["leafB"], 8_000_000, 6.0, pid0=10)
    f = pl.DataFrame(rows, schema=["src_ip", "dst_ip", "start_ns", "end_ns", "bytes", "path", "pid"], orient="row") \
        .with_columns(pl.col("pid").cast(pl.Int64))
    pairs = pl.DataFrame({"pid": [0, 1, 2, 3, 10, 11, 12], "comm_type": ["DP"] * 7, "job_id": ["job-1"] * 4 + ["job-2"] * 3,
                          "dp_group": [0] * 7}).with_columns(pl.col("pid").cast(pl.Int64))
    v = [x for x in network_verdicts(f, pairs, 2, (0, 60 * S), "w", FlowConfig()) if x["severity"] in ("warning", "critical")]
    assert len(v) == 1 and v[0]["scope"] == "switch"
    assert {v[0]["subject"], *json.loads(v[0]["evidence"])["or_equally"]} >= {"leafA", "leafB"}



def test_an_element_named_first_that_a_later_cause_explains_through_its_rings_is_dropped():
    """Demo seed 820's shape: job-1 runs two DP groups in lockstep (one cohort per collective instance): group
    0's ring of six ranks inside leaf A, group 4's ring over leaf B. Leaf B is congested: group 4 slows and
    group 0 waits with it, and so does job-2's ring inside leaf B. The greedy search names leaf A first (it
    carries the most slow flows, and a group paces its own hops only), then leaf B for job-2; leaf B
    explains leaf A's flows through the lockstep, so leaf A is no cause of its own."""
    leaf = {"a1": "leafA", "a2": "leafA", "a3": "leafA", "a4": "leafA", "a5": "leafA", "a6": "leafA",
            "b1": "leafB", "b2": "leafB", "c1": "leafB", "c2": "leafB", "c3": "leafB"}
    groups = {("job-1", "0"): ["a1", "a2", "a3", "a4", "a5", "a6"], ("job-1", "4"): ["b1", "b2"],
              ("job-2", "0"): ["c1", "c2", "c3"]}
    rng = np.random.default_rng(3)
    rows = []
    for (job, g), members in groups.items():
        hops = list(zip(members, members[1:] + members[:1]))
        for k, t in enumerate(np.arange(0, 60, 0.2)):
            for src, dst in hops:
                path = [leaf[src]] if leaf[src] == leaf[dst] else [leaf[src], "spine", leaf[dst]]
                rows.append((src, dst, job, f"dp:{job}/{g}", f"{job}/{k}", int(t * S), int(t * S) + 20_000_000, path,
                             float(np.log(0.5))))
    f = pl.DataFrame(rows, schema=["src_ip", "dst_ip", "job_id", "unit", "cohort", "start_ns", "end_ns", "path", "e0"],
                     orient="row")
    noise = rng.normal(0, 0.03, (2, f.height))
    f = f.with_row_index("fid").with_columns(
        fid=pl.col("fid").cast(pl.Int64), bin=pl.col("start_ns") // (10 * S),
        e_peer=pl.col("e0") + noise[0], e_hist=pl.col("e0") + noise[1]).drop("e0")
    causes, _ = localize(f, 2, (0, 60 * S), FlowConfig())
    assert causes.select("kind", "cand").rows() == [("switch", "leafB")]


def test_a_leaf_is_compared_with_a_nic_of_its_ring_over_the_same_bins():
    """A congested leaf under which a three-member ring's every hop slows from mid-bin; in that onset bin
    the leaf also carries a storage server's healthy reads, so its cell misses the flag while the NIC of
    the ring's middle member (two of the hops, the third through the ring's pace) passes it (demo seed
    814). The NIC gained that bin alone and outscored the leaf; compared over the same bins, the leaf that
    carries every slow hop is named."""
    rng = np.random.default_rng(3)
    leaf = {"x": "leaf1", "y": "leaf2", "z": "leaf2", "st": "leaf2"}
    hops = [("x", "y"), ("y", "z"), ("z", "x")]
    rows = []
    for t in np.arange(0, 60, 0.2):
        for s, d in hops:
            path = [leaf[s]] if leaf[s] == leaf[d] else [leaf[s], "spine", leaf[d]]
            rows.append((s, d, "dp:job-1/0", "job-1", int(t * S), path, float(np.log(0.5)) if t >= 25 else 0.0))
    for t in np.arange(20, 30, 0.05):     # the storage server's reads through the leaf, at their usual rate
        rows.append(("st", "z", "bg:9", None, int(t * S), ["leaf2"], 0.0))
    f = pl.DataFrame(rows, schema={"src_ip": pl.Utf8, "dst_ip": pl.Utf8, "unit": pl.Utf8, "job_id": pl.Utf8,
                                   "start_ns": pl.Int64, "path": pl.List(pl.Utf8), "e0": pl.Float64}, orient="row")
    noise = rng.normal(0, 0.03, (2, f.height))
    f = f.with_row_index("fid").with_columns(
        fid=pl.col("fid").cast(pl.Int64), end_ns=pl.col("start_ns") + 20_000_000, bin=pl.col("start_ns") // (10 * S),
        e_peer=pl.when(pl.col("job_id").is_not_null()).then(pl.col("e0") + noise[0]), e_hist=pl.col("e0") + noise[1]).drop("e0")
    assert named(f) == [("switch", "leaf2")]


def test_a_named_switch_lists_a_job_whose_ring_moves_half_of_its_chunks_at_the_congested_rate():
    """Demo seed 621's shape: the jobs a named switch slowed are judged by the trimmed mean its value and
    cells are (a ring's chunks at two rates): a second job under the congested leaf with 45 % of its
    chunks at a fifth of their rate (median: not slowed) is one of its jobs, so that job's slowdown can
    be pinned on the switch."""
    f = ring_flows(RINGS, {"leaf2": 0.4})
    rng = np.random.default_rng(3)
    rows = []
    for k, t in enumerate(np.arange(0, 60, 0.2)):
        for src, dst in (("u", "v"), ("v", "u")):
            e = np.log(0.2) if (k * 2 + (src == "u")) % 20 < 9 else 0.0
            rows.append((src, dst, int(t * S), int(t * S) + 20_000_000, ["leaf2"], e + rng.normal(0, 0.03), e + rng.normal(0, 0.03)))
    g = pl.DataFrame(rows, schema=["src_ip", "dst_ip", "start_ns", "end_ns", "path", "e_peer", "e_hist"], orient="row")
    assert g.select(pl.col("e_peer").median()).item() > np.log(1 - FlowConfig().min_bw_drop)
    g = g.with_row_index("fid").with_columns(fid=pl.col("fid").cast(pl.Int64) + f.height, job_id=pl.lit("job-2"),
                                             unit=pl.lit("dp:job-2/0"), bin=pl.col("start_ns") // (10 * S))
    causes, _ = localize(pl.concat([f, g.select(f.columns)]), 2, (0, 60 * S), FlowConfig())
    assert causes.select("kind", "cand").rows()[0] == ("switch", "leaf2")
    assert causes["jobs"][0].split(",") == ["job-1", "job-2"]
