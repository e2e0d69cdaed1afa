"""Rate localization (fleetscope.flows.network.localize) on hand-built rings: a ring moves at its slowest
hop's pace, so every NIC of a slowed ring explains it through that pacing; the element that carries
every slow hop itself is the one named."""
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
