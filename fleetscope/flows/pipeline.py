"""Step boundaries of pipeline-only addresses: where the pipeline is drained.

An address with no DP pair (a pipeline without data parallelism) has only its pipeline hops to
delimit its steps, and their gaps do not: a stage waits about as long for the next stage's forward
and backward of a microbatch as for the optimizer and the first forward of the next step. What
does tell a step from its microbatches is what is in flight (counted in bytes: an activation may
travel as several flows). On a hop, every activation sent
forward comes back as a gradient before the step ends, so the running count of activations minus
gradients returns to its drained level once per step and stays there through the optimizer and the
first forward; inside the step it stays above it (a stage sends its next activation before the
gradient of the previous one returns) or touches it only for the instant between a gradient and the
activation sent with it.

Which direction is forward is not known from the flows alone. Read the wrong way, the drained
level is the one with the most microbatches in flight: a two-stage pipeline waits there after
every microbatch (more long waits than once per step), a longer one passes it only briefly (no
long wait): the reading whose extreme level holds long waits, the fewest of them, is favoured.
Each end of a hop reads it, and a pipeline is a chain: a middle stage is downstream on one hop and
upstream on the other, so one reading per chain is chosen (hop_chains): the one whose drained gaps
repeat more evenly, one per step (the gap ladder's score at the chain's ends; a two-stage pipeline
with two microbatches in flight now and then holds as many long waits at either extreme), else
the one its ends' votes favour in sum. An address with two hops (a middle stage) is drained when both are."""
from __future__ import annotations

import numpy as np
import polars as pl

from fleetscope.flows.period import gap_ladder_fit

WINDOW = 129  # flows of a hop over which its drained level is taken: a step's worth unless a step
#               moves more than 64 flows each way over one hop


def drained_gaps(df: pl.DataFrame) -> np.ndarray:
    """df: an address's pipeline flows, rows sorted by (ix, start_ns), with ix, peer, role
    (send/recv), start_ns, end_ns, bytes and gap (to the latest end of the address's earlier flows, NaN at
    its first). Returns the gap where every hop of the address was drained before the flow, else 0
    (the first flow of an address keeps NaN)."""
    if df.height == 0:
        return np.zeros(0)
    # in flight, in messages: an activation cut into several flows (channels, a transport's records)
    # comes back as a gradient of its size in however many flows, so bytes are counted; each
    # direction in units of its own typical message (the two directions' framing may differ by a
    # few bytes per message, which summed in raw bytes over a window of steps drifts the levels
    # apart by more than a level's tolerance)
    x = df.select("ix", "peer", "start_ns", "end_ns", "gap", "role", b=pl.col("bytes").cast(pl.Float64)).with_row_index("_i")
    hop = ["ix", "peer"]
    x = x.with_columns(d=pl.when(pl.col("role") == "send").then(1.0).otherwise(-1.0)
                       * pl.col("b") / pl.col("b").median().over(*hop, "role"))
    x = x.with_columns(D=pl.col("d").cum_sum().over(hop),
                       idle=(pl.col("start_ns").shift(-1).over(hop) - pl.col("end_ns")).clip(lower_bound=0).fill_null(0),
                       # a level is the same within a tenth of a message
                       eps=pl.lit(0.1))
    # the levels around each flow (a lost or cut flow record shifts the count for good: levels
    # are local, over WINDOW flows of the hop, a step or more of them)
    x = x.with_columns(lo=pl.col("D").rolling_min(WINDOW, min_samples=1, center=True).over(hop) + pl.col("eps"),
                       hi=pl.col("D").rolling_max(WINDOW, min_samples=1, center=True).over(hop) - pl.col("eps"))
    at_lo, at_hi = pl.col("D") <= pl.col("lo"), pl.col("D") >= pl.col("hi")
    # the reading (forward = this address's sends, or its receives): the drained level is left
    # after a long wait once per step; the other extreme (most microbatches in flight) either
    # after every microbatch (a two-stage pipeline: more long waits) or only in passing (none)
    long = pl.col("idle") > pl.col("idle").median().over(hop)
    t = x.with_columns(long=long).group_by(hop).agg(
        n_lo=(pl.col("long") & at_lo).sum(), n_hi=(pl.col("long") & at_hi).sum(),
        t_lo=pl.col("idle").filter(at_lo).sum(), t_hi=pl.col("idle").filter(at_hi).sum())
    use_lo = (pl.when(pl.col("n_lo") == 0).then(False).when(pl.col("n_hi") == 0).then(True)
              .when(pl.col("n_lo") != pl.col("n_hi")).then(pl.col("n_lo") < pl.col("n_hi"))
              .otherwise(pl.col("t_lo") <= pl.col("t_hi")))
    # each end's vote for reading its sends as activations (the drained level low), by the same
    # rule: a level without long waits is no drained level; of two with, the one with fewer
    vote = (pl.when(pl.col("n_lo") == 0).then(-pl.lit(1.0) * (pl.col("n_hi") > 0)).when(pl.col("n_hi") == 0).then(1.0)
            .otherwise((pl.col("n_hi").cast(pl.Float64) - pl.col("n_lo")) / (pl.col("n_hi") + pl.col("n_lo"))))
    t = t.with_columns(vote=vote, use_lo=use_lo)
    if "ip" not in df.columns:
        return _drained(x, t, at_lo, at_hi)
    # a chain's reading: the one whose drained gaps repeat most evenly (one per step), the votes'
    # in sum where neither shows steps better
    chain, fwd, ends = hop_chains(t["ix"].to_numpy(), t["peer"].to_list(), df.select("ix", "ip").unique())
    if not ends:
        return _drained(x, t, at_lo, at_hi)
    on = chain >= 0
    signed = np.where(fwd, 1.0, -1.0) * t["vote"].to_numpy()
    favoured = np.bincount(chain[on], weights=signed[on], minlength=len(ends)) >= 0
    readings = []
    for flip in (False, True):
        u = t["use_lo"].to_numpy().copy()
        u[on] = fwd[on] == (favoured[chain[on]] != flip)
        readings.append(_drained(x, t.with_columns(use_lo=pl.Series(u)), at_lo, at_hi))
    rows = x.sort("_i")
    ix_rows, start = rows["ix"].to_numpy(), rows["start_ns"].to_numpy()
    ix_chain = dict(zip(t["ix"].to_list(), chain.tolist()))
    flip_c = np.array([_evenness(readings[1], ix_rows, start, e) < _evenness(readings[0], ix_rows, start, e) for e in ends])
    row_chain = np.array([ix_chain.get(int(i), -1) for i in ix_rows])
    use = (row_chain >= 0) & flip_c[np.maximum(row_chain, 0)]
    return np.where(use, readings[1], readings[0])


def _drained(x: pl.DataFrame, t: pl.DataFrame, at_lo: pl.Expr, at_hi: pl.Expr) -> np.ndarray:
    """The drained gaps for the hop readings in t (use_lo per (ix, peer))."""
    hop = ["ix", "peer"]
    x = x.join(t.select(*hop, "use_lo"), on=hop, how="left").with_columns(
        drained=pl.when(pl.col("use_lo")).then(at_lo).otherwise(at_hi))
    # hops not drained after each flow, over the address's flows in time order
    nd = (~pl.col("drained")).cast(pl.Int64)
    x = x.with_columns(change=nd - nd.shift(1).over(hop).fill_null(0)).sort("_i")
    x = x.with_columns(busy_before=(pl.col("change").cum_sum().over("ix") - pl.col("change")))
    return x.select(pl.when(pl.col("busy_before") == 0).then(pl.col("gap")).otherwise(
        pl.when(pl.col("gap").is_nan()).then(pl.col("gap")).otherwise(0.0)))["gap"].to_numpy()


def _evenness(g: np.ndarray, ix: np.ndarray, start: np.ndarray, members: list) -> float:
    """How evenly the drained gaps of a chain's end addresses repeat: the median over them of the
    gap ladder's score (inf where no step shows)."""
    sc = []
    for i in members:
        m = (ix == i) & (np.nan_to_num(g, nan=0.0) > 0)
        fit = gap_ladder_fit(start[m], g[m])
        sc.append(np.inf if fit is None else fit[0])
    return float(np.median(sc)) if sc else np.inf


def hop_chains(ix: np.ndarray, peer: list, ips: pl.DataFrame) -> tuple[np.ndarray, np.ndarray, list]:
    """Per (address, peer) hop row: its chain (a pipeline: addresses linked by hops in a line; -1
    for a component that is no chain: a cycle, a rank with three or more hops) and whether the
    address comes before the peer along the chain (from one end); and per chain its two end
    addresses."""
    ix_of = dict(zip(ips["ip"].to_list(), ips["ix"].to_list()))
    nodes = [int(i) for i in ix]
    peers = [ix_of.get(p) for p in peer]
    adj: dict[int, set] = {}
    for a, b in zip(nodes, peers):
        if b is not None:
            adj.setdefault(a, set()).add(b)
            adj.setdefault(b, set()).add(a)
    place: dict[int, tuple[int, int]] = {}   # address -> (chain, position)
    ends_of: list = []
    seen: set = set()
    for first in list(adj):
        if first in seen:
            continue
        comp, stack = [], [first]
        seen.add(first)
        while stack:
            v = stack.pop()
            comp.append(v)
            for w in adj[v]:
                if w not in seen:
                    seen.add(w)
                    stack.append(w)
        ends = [v for v in comp if len(adj[v]) == 1]
        if len(ends) != 2 or any(len(adj[v]) > 2 for v in comp):
            continue
        c, prev, v, k = len(ends_of), None, ends[0], 0
        while v is not None:
            place[v] = (c, k)
            nxt = [w for w in adj[v] if w != prev]
            prev, v, k = v, (nxt[0] if nxt else None), k + 1
        ends_of.append(ends)
    chain = np.full(len(nodes), -1, dtype=np.int64)
    fwd = np.zeros(len(nodes), dtype=bool)
    for k, (a, b) in enumerate(zip(nodes, peers)):
        if a in place and b in place:
            chain[k] = place[a][0]
            fwd[k] = place[a][1] < place[b][1]
    return chain, fwd, ends_of
