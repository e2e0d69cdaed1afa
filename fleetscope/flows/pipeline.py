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
long wait): the reading whose extreme level holds long waits, the fewest of them, is taken. An
address with two hops (a middle stage) is drained when both are."""
from __future__ import annotations

import numpy as np
import polars as pl

WINDOW = 129  # flows of a hop over which its drained level is taken: a step's worth unless a step
#               moves more than 64 flows each way over one hop


def drained_gaps(df: pl.DataFrame) -> np.ndarray:
    """df: an address's pipeline flows, rows sorted by (ix, start_ns), with ix, peer, role
    (send/recv), start_ns, end_ns, bytes and gap (to the latest end of the address's earlier flows, NaN at
    its first). Returns the gap where every hop of the address was drained before the flow, else 0
    (the first flow of an address keeps NaN)."""
    if df.height == 0:
        return np.zeros(0)
    # in flight, in bytes: an activation cut into several flows (channels, a transport's records)
    # comes back as a gradient of its size in however many flows
    x = df.select("ix", "peer", "start_ns", "end_ns", "gap",
                  d=pl.when(pl.col("role") == "send").then(pl.col("bytes")).otherwise(-pl.col("bytes")).cast(pl.Float64)).with_row_index("_i")
    hop = ["ix", "peer"]
    x = x.with_columns(D=pl.col("d").cum_sum().over(hop),
                       idle=(pl.col("start_ns").shift(-1).over(hop) - pl.col("end_ns")).clip(lower_bound=0).fill_null(0),
                       # a level is the same within a tenth of the hop's typical flow (headers make
                       # an activation and its gradient differ by a few bytes)
                       eps=0.1 * pl.col("d").abs().median().over(hop))
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
    x = x.join(t.with_columns(use_lo=use_lo), on=hop, how="left").with_columns(
        drained=pl.when(pl.col("use_lo")).then(at_lo).otherwise(at_hi))
    # hops not drained after each flow, over the address's flows in time order
    nd = (~pl.col("drained")).cast(pl.Int64)
    x = x.with_columns(change=nd - nd.shift(1).over(hop).fill_null(0)).sort("_i")
    x = x.with_columns(busy_before=(pl.col("change").cum_sum().over("ix") - pl.col("change")))
    return x.select(pl.when(pl.col("busy_before") == 0).then(pl.col("gap")).otherwise(
        pl.when(pl.col("gap").is_nan()).then(pl.col("gap")).otherwise(0.0)))["gap"].to_numpy()
