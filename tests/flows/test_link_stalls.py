"""The flapping-link detector (fleetscope.flows.network.stall_causes) on hand-built flow residuals: a
link that goes down stalls what it carries at that moment, against both of a flow's baselines, far
beyond what its job's other flows stall; single slow flows and flows slow only against one baseline
are not a link."""
import numpy as np
import polars as pl

from fleetscope.flows import FlowConfig
from fleetscope.flows.network import held_witnesses, stall_causes

S = 1_000_000_000
WINDOW = (0, 60 * S)
LEAF = {"a": "leaf1", "b": "leaf1", "c": "leaf2", "d": "leaf2", "e": "leaf2"}


def flows(pairs: dict[tuple[str, str], float], seed: int = 0) -> pl.DataFrame:
    """Residuals of one job's flows: per directed pair (a collective of its own), one 50 ms flow every
    `every` seconds over the window, healthy (both residuals around 0)."""
    rng = np.random.default_rng(seed)
    rows = []
    for (src, dst), every in pairs.items():
        for t in np.arange(0, 60, every):
            path = [LEAF[src]] if LEAF[src] == LEAF[dst] else [LEAF[src], "spine", LEAF[dst]]
            rows.append((src, dst, int(t * S), int(t * S) + 50_000_000, path))
    f = pl.DataFrame(rows, schema=["src_ip", "dst_ip", "start_ns", "end_ns", "path"], orient="row")
    return f.with_row_index("fid").with_columns(
        fid=pl.col("fid").cast(pl.Int64), job_id=pl.lit("job-1"), bin=pl.col("start_ns") // (10 * S),
        unit=pl.lit("PP:") + pl.col("src_ip") + pl.col("dst_ip"), size=pl.lit(20, dtype=pl.Int32),
        e_peer=pl.Series(rng.normal(0, 0.05, f.height)), e_hist=pl.Series(rng.normal(0, 0.05, f.height)))


def stall(f: pl.DataFrame, where: pl.Expr, e_peer: float | None = -4.0, e_hist: float | None = -4.0) -> pl.DataFrame:
    return f.with_columns(e_peer=pl.when(where).then(pl.lit(e_peer, dtype=pl.Float64)).otherwise("e_peer"),
                          e_hist=pl.when(where).then(pl.lit(e_hist, dtype=pl.Float64)).otherwise("e_hist"))


def medians(f: pl.DataFrame) -> pl.DataFrame:
    """The detector reads the residuals against median levels (flow_residuals' e_peer_s, e_hist_s)."""
    return f.with_columns(e_peer_s="e_peer", e_hist_s="e_hist")


def named(f: pl.DataFrame) -> list[tuple[str, str]]:
    return stall_causes(medians(f), 1, WINDOW, FlowConfig()).select("kind", "cand").rows()


def through(ip: str) -> pl.Expr:
    return (pl.col("src_ip") == ip) | (pl.col("dst_ip") == ip)


def down(*spans: tuple[float, float]) -> pl.Expr:
    return pl.any_horizontal([(pl.col("start_ns") >= a * S) & (pl.col("start_ns") < b * S) for a, b in spans])


def flap(f: pl.DataFrame, ip: str, *spans: tuple[float, float], **e) -> pl.DataFrame:
    """ip's link down over each span: every flow through it that starts then stalls and is held until the
    link is back (its record ends with the span)."""
    for a, b in spans:
        at = through(ip) & down((a, b))
        f = stall(f, at, **e).with_columns(end_ns=pl.when(at).then(pl.lit(int(b * S))).otherwise("end_ns"))
    return f


RING = {("a", "b"): 0.1, ("b", "c"): 0.1, ("c", "d"): 0.1, ("d", "a"): 0.1}
FLAPS = ((10, 10.5), (25, 25.5), (40, 40.5))


def test_a_flapping_nic_is_named_and_nothing_else():
    f = flap(flows(RING), "b", *FLAPS)
    assert named(f) == [("nic", "b")]
    assert named(flows(RING)) == []


def test_single_slow_flows_scattered_over_the_window_are_not_a_link():
    # one flow of b's at a time, in eight places: every other flow through b moved meanwhile
    f = flows(RING)
    one = f.filter(through("b")).sort("start_ns").gather_every(60)["fid"]
    assert named(stall(f, pl.col("fid").is_in(one.implode()))) == []


def test_flows_slow_against_one_baseline_only_are_not_stalled():
    # as slow as the rest of their collective at that moment (its history says otherwise), or as slow
    # as this pair always is (its peers say otherwise): neither is a link going down
    assert named(flap(flows(RING), "b", *FLAPS, e_peer=0.0)) == []
    assert named(flap(flows(RING), "b", *FLAPS, e_hist=0.0)) == []
    # a flow with one baseline only (no history yet) is judged by that one
    assert named(flap(flows(RING), "b", *FLAPS, e_hist=None)) == [("nic", "b")]


def test_the_bar_comes_from_the_flows_that_do_not_cross_the_candidate():
    # b is in nearly all of its job's traffic and is down half the time: measured against the job's
    # stall rate with b's own stalls in it, b would look ordinary
    pairs = {("b", "c"): 0.1, ("c", "b"): 0.1, ("b", "d"): 0.1, ("d", "b"): 0.1, ("c", "d"): 2.0}
    f = flap(flows(pairs), "b", (0, 6), (12, 18), (24, 30), (36, 42), (48, 54))
    assert named(f) == [("nic", "b")]


def test_a_cause_named_by_the_rate_localization_explains_its_stalls_for_its_switches():
    # b was named already (its flows move at a fraction of their peers' rate): its stalled flows are
    # its own, not evidence against the leaf or spine they cross
    f = flap(flows(RING), "b", *FLAPS)
    assert named(f) != [] and stall_causes(medians(f), 1, WINDOW, FlowConfig(), exclude={"b"}).height == 0


def test_one_transfer_stalling_on_all_its_queue_pairs_is_not_a_link():
    # the same b -> c transfer on four queue pairs stalls together, three times; b's other traffic
    # (c -> b's reverse direction is a -> b here) moves meanwhile
    f = flows(RING)
    qp = f.filter((pl.col("src_ip") == "b") & (pl.col("dst_ip") == "c") & down((10, 10.1), (25, 25.1), (40, 40.1)))
    copies = pl.concat([qp.with_columns(fid=pl.col("fid") + 100_000 * i) for i in range(1, 4)])
    f = stall(pl.concat([f, copies]), (pl.col("src_ip") == "b") & (pl.col("dst_ip") == "c") & down((10, 10.1), (25, 25.1), (40, 40.1)))
    assert named(f) == []


def test_two_flaps_close_together_are_two_episodes_and_the_end_holding_a_pipeline_hop_is_named():
    """b and c are a two-member DP group: every flow of it crosses both NICs. b's link goes down twice,
    0.4 s apart; it holds the group's flows and b's pipeline hop from a, each until the link is back
    (overlapping spans: one episode per flap). A second's gap between stalls made both flaps one
    episode, and nothing was named; c carries the same group flows, but not the held hop."""
    pairs = {("b", "c"): 0.1, ("c", "b"): 0.1, ("a", "b"): 0.25, ("c", "d"): 0.25}
    assert named(flap(flows(pairs), "b", (10.0, 10.5), (10.9, 11.4))) == [("nic", "b")]


def test_a_kind_of_message_slow_all_window_beside_fast_ones_is_no_flapping_link():
    """A two-member group's small messages move at a tenth of their baselines from 20 s on, each a
    fraction of a millisecond, while b's other flows keep moving (64-GPU seed 2193's healthy job): every
    such message is an episode of its own by time, but none lasts as long as b usually waits between
    flows, and the link held nothing else meanwhile."""
    f = flows({("b", "c"): 0.1, ("c", "b"): 0.1, ("a", "b"): 0.05, ("b", "d"): 0.05})
    small = pl.concat([f.filter(pl.col("src_ip") == s).with_columns(
        fid=pl.col("fid") + 100_000 * (i + 1), start_ns=pl.col("start_ns") + 3_000_000,
        end_ns=pl.col("start_ns") + 3_200_000) for i, s in enumerate(("b", "c"))])
    late = (pl.col("fid") >= 100_000) & (pl.col("start_ns") >= 20 * S)
    assert named(stall(pl.concat([f, small]), late)) == []


def test_a_pair_whose_messages_of_one_size_stall_is_no_link():
    """Only one pair's flows of one size stall (both ways, in three episodes) while its other transfers
    move: that kind of message is slow, not the link (64-GPU seed 2193's healthy job: one pair's small
    messages moving at a tenth of their peers' for half a minute). The same pair's stalls in two sizes
    are a link slowing whatever crosses it (the real recordings' shaped host links: one ring hop, every
    bucket size)."""
    pairs = {("a", "b"): 0.1, ("b", "c"): 0.1, ("c", "b"): 0.1, ("c", "d"): 0.1, ("d", "a"): 0.1}
    f = flows(pairs)
    at = through("b") & through("c") & down(*FLAPS)
    assert named(stall(f, at)) == []
    two_sizes = stall(f, at).with_columns(size=pl.when(at & (pl.col("src_ip") == "c")).then(22).otherwise(pl.col("size")))
    assert named(two_sizes) in ([("nic", "b")], [("nic", "c")])


def test_a_ring_paced_by_a_down_link_is_no_evidence_against_it():
    """A three-member ring a -> b -> c -> a: b's link goes down twice and holds its two hops through each
    outage; the hop c -> a, waiting on the ring, moves in short stalled pieces meanwhile. Those pieces
    are the ring's pacing, not how often the job stalls anyway (counted so, they set a bar b's two held
    hops could not pass, and the leaf carrying the whole ring was named: 64-GPU seed 2206). The job's
    other collective (d <-> e) moves all along."""
    ring = {("a", "b"): 0.1, ("b", "c"): 0.1, ("c", "a"): 0.1}
    other = {("d", "e"): 0.05, ("e", "d"): 0.05}
    f = pl.concat([flows(ring).with_columns(unit=pl.lit("dp:job-1/0")),
                   flows(other, seed=1).with_columns(fid=pl.col("fid") + 100_000, unit=pl.lit("dp:job-1/1"))])
    paced = (pl.col("src_ip") == "c") & (pl.col("dst_ip") == "a") & down((10, 11), (30, 31))
    f = stall(flap(f, "b", (10, 11), (30, 31)), paced)
    assert named(f) == [("nic", "b")]


def test_a_two_member_groups_link_that_goes_down_is_named_with_the_other_end():
    """b and c are a two-member group and b carries nothing else: b's link goes down three times and
    holds the pair's flows through each outage (64-GPU seeds 2192, 2212). Held outages count on their
    own, but every stalled flow is between b and c, which the flows cannot tell apart: one is named,
    the other is its equal alternative."""
    f = flap(flows({("b", "c"): 0.1, ("c", "b"): 0.1, ("c", "d"): 0.1, ("d", "c"): 0.1}), "b", *FLAPS)
    got = stall_causes(medians(f), 1, WINDOW, FlowConfig())
    assert got.height == 1 and got["kind"][0] == "nic" and got["cand"][0] == "b", got
    assert got["alts"][0] == "c"


def probes(ips: list[str], held: dict[str, tuple[tuple[float, float], ...]]) -> pl.DataFrame:
    """Raw records of a prober p: a 4 KB probe to and from each NIC every second, 20 us each; a probe
    to a NIC whose link is down over a span is held until the link is back."""
    rows = []
    for ip in ips:
        for t in np.arange(0.3, 60, 1.0):
            end = t + 20e-6
            for a, b in held.get(ip, ()):
                if a <= t < b:
                    end = b
            rows += [("p", ip, int(t * S), int(end * S), 4096, None), (ip, "p", int(t * S), int(end * S), 4096, None)]
    return pl.DataFrame(rows, schema={"src_ip": pl.Utf8, "dst_ip": pl.Utf8, "start_ns": pl.Int64, "end_ns": pl.Int64,
                                      "bytes": pl.Int64, "path": pl.List(pl.Utf8)}, orient="row")


def test_a_ring_stalling_as_a_whole_names_the_member_whose_other_traffic_was_held_and_no_neighbour():
    """A four-member ring a -> b -> c -> d -> a moves at its slowest hop's pace: while b's link is down,
    every hop of the ring stalls with it (the simulator lumps the outage into the ring's collective; 64-GPU
    seeds 2651, 2654 named b's two neighbours, each a verdict of its own). The probes crossing b were held
    through its outages; those crossing a, c and d moved. Without any such witness the ring's elements
    are equal: one is named with its equals as alternatives, and no second verdict is raised for the
    same stalls."""
    ring = flows(RING).with_columns(unit=pl.lit("dp:job-1/0"))
    spans = ((10, 11), (25, 26), (40, 41))
    f = stall(ring, down(*spans))
    f = f.with_columns(end_ns=pl.when(down(*spans)).then(pl.col("start_ns") + S).otherwise("end_ns"))
    wit = held_witnesses(probes(["a", "b", "c", "d"], {"b": spans}), pl.DataFrame(), FlowConfig())
    assert set(wit["cand"].to_list()) == {"b", "p"}
    got = stall_causes(medians(f), 1, WINDOW, FlowConfig(), witnesses=wit)
    assert got.select("kind", "cand").rows() == [("nic", "b")] and got["alts"][0] == "", got
    blind = stall_causes(medians(f), 1, WINDOW, FlowConfig())
    assert blind.height == 1 and len(blind["alts"][0].split(",")) >= 2, blind
    # a probe through a that took ten times its usual 20 us during an outage moved (0.2 ms of a 1 s
    # stall): a was up, and it tips nothing (64-GPU seed 2659: such a probe named a spine)
    jitter = pl.DataFrame({"kind": ["nic"], "cand": ["a"], "fid": [10**6], "start_ns": [int(25.5 * S)],
                           "end_ns": [int(25.5 * S) + 200_000]}, schema=wit.schema)
    tipped = stall_causes(medians(f), 1, WINDOW, FlowConfig(), witnesses=jitter)
    assert tipped.select("cand", "alts").rows() == blind.select("cand", "alts").rows()


def test_a_kind_of_message_that_stalls_in_every_group_of_the_job_is_no_link():
    """Healthy 64-GPU seed 2636's shape: a fifth of the job's 1 MB transfers wait on their collective's
    slowest member and read as stalled, in every DP group alike, while its many larger transfers move.
    Ring c -> d -> e -> c crosses leaf2; the job's other group (a <-> b on leaf1) moves far more large
    transfers. Against the job's stall rate over all sizes the leaf "flapped" (20 stalls against ~2);
    against the same class's rate in the job it stalls as often as the rest. The same class stalling
    only on the ring is a link again."""
    ring = {("c", "d"): 0.3, ("d", "e"): 0.3, ("e", "c"): 0.3}
    other = {("a", "b"): 0.3, ("b", "a"): 0.3}
    small = pl.concat([flows(ring).with_columns(unit=pl.lit("dp:job-1/0")),
                       flows(other, seed=1).with_columns(fid=pl.col("fid") + 100_000, unit=pl.lit("dp:job-1/1"))])
    big = pl.concat([flows({("c", "d"): 1.0}, seed=2).with_columns(fid=pl.col("fid") + 200_000, unit=pl.lit("dp:job-1/0")),
                     flows({("a", "b"): 0.02, ("b", "a"): 0.02}, seed=3).with_columns(fid=pl.col("fid") + 300_000,
                                                                                    unit=pl.lit("dp:job-1/1"))])
    f = pl.concat([small, big.with_columns(size=pl.lit(24, dtype=pl.Int32))])
    every_fifth = (pl.col("size") == 20) & (pl.col("fid") % 5 == 0)
    assert named(stall(f, every_fifth)) == []
    assert named(stall(f, every_fifth & (pl.col("fid") < 100_000))) != []
