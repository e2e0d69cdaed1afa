"""Vocabulary every analysis shares, defined once: collective names, the bus-bandwidth factor,
robust statistics and stage imbalance. A collective, a robust sigma or an imbalanced stage then
means the same thing in traces, timings, flows and verdicts."""
from __future__ import annotations

import numpy as np
import polars as pl

# -- collectives ------------------------------------------------------------------------------------
# Canonical names. Traces (NCCL kernel names, c10d / gloo operators, record_param_comms), the tracer's
# `nccl:<Collective>` kernel names and stack dumps all map onto these.
COLLECTIVES = ("allreduce", "allgather", "reduce_scatter", "all_to_all", "send_recv", "broadcast", "barrier",
               "send", "recv", "reduce", "gather", "scatter")
P2P = ("send", "recv", "send_recv")
# (pattern in the name lower-cased with everything but letters removed, canonical name); first match wins
_PATTERNS = [
    ("reducescatter", "reduce_scatter"), ("allreduce", "allreduce"), ("allgather", "allgather"),
    ("alltoall", "all_to_all"), ("sendrecv", "send_recv"), ("broadcast", "broadcast"), ("bcast", "broadcast"),
    ("barrier", "barrier"), ("send", "send"), ("recv", "recv"), ("reduce", "reduce"), ("gather", "gather"),
    ("scatter", "scatter"),
]


def collective_expr(name: pl.Expr) -> pl.Expr:
    """Any spelling of a collective (`ncclDevKernel_AllReduce_Sum_bf16_RING_LL`, `nccl:ReduceScatter`,
    `c10d::allgather_`, `gloo:all_reduce`, `_reduce_scatter_base`) -> its canonical name, else null."""
    key = name.str.to_lowercase().str.replace_all(r"[^a-z]", "")
    expr = pl.lit(None, pl.Utf8)
    for pat, norm in reversed(_PATTERNS):
        expr = pl.when(key.str.contains(pat, literal=True)).then(pl.lit(norm)).otherwise(expr)
    return expr


def bus_factor(collective: pl.Expr, n: pl.Expr) -> pl.Expr:
    """Bus bandwidth = algorithm bandwidth x this factor (the nccl-tests convention): all-reduce moves
    2(n-1)/n of the buffer per rank, all-gather / reduce-scatter / all-to-all (n-1)/n, the rest 1."""
    n = n.cast(pl.Float64)
    return (pl.when(collective == "allreduce").then(2 * (n - 1) / n)
            .when(collective.is_in(["allgather", "reduce_scatter", "all_to_all"])).then((n - 1) / n)
            .otherwise(1.0))


# -- robust statistics ------------------------------------------------------------------------------
MAD_TO_SIGMA = 1.4826  # sigma of a normal distribution = 1.4826 x its median absolute deviation


def mad(x: pl.Expr) -> pl.Expr:
    """Median absolute deviation from the median (raw, not scaled to a sigma)."""
    return (x - x.median()).abs().median()


def robust_sigma(x: pl.Expr) -> pl.Expr:
    return MAD_TO_SIGMA * mad(x)


# -- stage imbalance --------------------------------------------------------------------------------
def stage_imbalance(per_rank: pl.DataFrame, value: str = "compute_ns", by: tuple[str, ...] = ()) -> pl.DataFrame:
    """How much longer each pipeline stage computes than the other stages, taken on the stage's least
    loaded data-parallel replica, so that one slow worker (which slows only its own replica) never
    makes its stage look imbalanced, while a stage given too many layers is slow in every replica.

    per_rank: one row per rank with `stage`, `dp_rank` (the replica; null = one replica) and `value`
    (its typical compute per step), plus the `by` columns (e.g. capture_id) grouping independent jobs.
    Returns per (`by`, stage): value (the stage's least loaded replica: min over replicas of the
    replica's median), others (median of the other stages' values), ratio = value / others,
    n_stages, ranks (the stage's ranks)."""
    by = list(by)
    schema = {**{c: per_rank.schema[c] for c in by}, "stage": pl.Int32, "value": pl.Float64, "others": pl.Float64,
              "ratio": pl.Float64, "n_stages": pl.Int64, "ranks": pl.List(pl.Int32)}
    df = per_rank.filter(pl.col("stage").is_not_null() & pl.col(value).is_not_null())
    if df.height == 0:
        return pl.DataFrame(schema=schema)
    if "dp_rank" not in df.columns:
        df = df.with_columns(dp_rank=pl.lit(None, pl.Int32))
    replica = df.group_by(*by, "stage", "dp_rank").agg(pl.col(value).median().alias("_v"), pl.col("rank").cast(pl.Int32))
    st = replica.group_by(*by, "stage").agg(pl.col("_v").min().alias("value"), pl.col("rank").list.explode(keep_nulls=False, empty_as_null=False).sort().alias("ranks"))
    st = st.with_columns(pl.col("stage").cast(pl.Int32), pl.len().over(by or pl.lit(1)).cast(pl.Int64).alias("n_stages"))
    # median of the other stages: join every stage with its siblings
    sib = st.select(*by, pl.col("stage").alias("_o"), pl.col("value").alias("_ov"))
    others = (st.select(*by, "stage").join(sib, on=by, how="inner") if by else st.select("stage").join(sib, how="cross")) \
        .filter(pl.col("stage") != pl.col("_o")).group_by(*by, "stage").agg(pl.col("_ov").median().alias("others"))
    out = st.join(others, on=[*by, "stage"], how="left").with_columns(
        (pl.col("value") / pl.col("others")).alias("ratio"))
    return out.select(list(schema)).cast({k: v for k, v in schema.items() if k not in by}).sort(*by, "stage")


# -- intervals --------------------------------------------------------------------------------------
def union_intervals(s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union of intervals [s, e) -> sorted disjoint (starts, ends); empty intervals dropped."""
    keep = e > s
    s, e = s[keep], e[keep]
    if s.size == 0:
        return s, e
    o = np.argsort(s, kind="stable")
    s, e = s[o], e[o]
    run = np.maximum.accumulate(e)
    # a new block starts where the start lies beyond every earlier end; a block ends at the running end
    new = np.empty(s.size, bool)
    new[0] = True
    new[1:] = s[1:] > run[:-1]
    return s[new], np.append(run[np.flatnonzero(new)[1:] - 1], run[-1])


def sigterm_default() -> None:
    """Give this process SIGTERM's default back where it is ignored, so the processes it starts can be
    stopped. Dagster maps SIGTERM to SIGINT's handler after each in-process run
    (dagster._utils.interrupts); where SIGINT is ignored (a job a non-interactive shell ran in the
    background) SIGTERM ends up ignored, and every process started afterwards inherits that. Only the
    main thread may change a handler; elsewhere this does nothing."""
    import signal
    import threading
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_IGN:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


# -- names --------------------------------------------------------------------------------------------
def by_name(names: pl.Series, fn) -> pl.Expr:
    """fn(name expr) evaluated once per distinct name, as a mapping (string functions on millions of rows
    cost more than on the few hundred names they hold)."""
    u = pl.DataFrame({"name": names.unique()}).with_columns(v=fn(pl.col("name")))
    return pl.col("name").replace_strict(u["name"], u["v"], default=None)
