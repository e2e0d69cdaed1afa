"""Input checks and the per-pair step split every later stage uses."""
from __future__ import annotations

import numpy as np
import polars as pl

from fleetscope.flows.changepoint import SplitParams, sequence_gaps, split_steps, step_index

FLOW_REQUIRED = ["start_ns", "src_ip", "dst_ip", "bytes"]
TOPO_REQUIRED = ["ip", "host"]


def check_flows(flows: pl.DataFrame) -> pl.DataFrame:
    """Normalized flows (docs/CONTRACT.md 1.2) -> start_ns, end_ns, src_ip, dst_ip, bytes, src_port,
    dst_port, src_qp, dst_qp, path, packets. Raises ValueError naming the problem for missing columns or
    rows that break the contract (the ingestion quarantines those; here they mean a caller bug)."""
    missing = [c for c in FLOW_REQUIRED if c not in flows.columns]
    if "end_ns" not in flows.columns and "duration_ns" not in flows.columns:
        missing.append("end_ns or duration_ns")
    if missing:
        raise ValueError(f"flows lack required column(s) {missing}; have {flows.columns}")
    df = flows
    if "end_ns" not in df.columns:
        df = df.with_columns(end_ns=pl.col("start_ns") + pl.col("duration_ns"))
    elif "duration_ns" in df.columns:
        df = df.with_columns(end_ns=pl.coalesce("end_ns", pl.col("start_ns") + pl.col("duration_ns")))
    opt = {"src_port": pl.Int64, "dst_port": pl.Int64, "src_qp": pl.Int64, "dst_qp": pl.Int64,
           "path": pl.List(pl.Utf8), "packets": pl.Int64}
    df = df.with_columns([pl.col(c).cast(t) if c in df.columns else pl.lit(None, dtype=t).alias(c) for c, t in opt.items()])
    df = df.select(
        pl.col("start_ns").cast(pl.Int64), pl.col("end_ns").cast(pl.Int64),
        pl.col("src_ip").cast(pl.Utf8), pl.col("dst_ip").cast(pl.Utf8), pl.col("bytes").cast(pl.Int64),
        *opt.keys(),
    )
    bad = df.select(
        null_key=pl.any_horizontal(pl.col("start_ns", "end_ns", "src_ip", "dst_ip", "bytes").is_null()).sum(),
        bad_bytes=(pl.col("bytes") <= 0).sum(),
        bad_time=(pl.col("end_ns") < pl.col("start_ns")).sum(),
        self_loop=(pl.col("src_ip") == pl.col("dst_ip")).sum(),
    ).row(0, named=True)
    problems = {k: v for k, v in bad.items() if v}
    if problems:
        raise ValueError(f"flows break docs/CONTRACT.md 1.2 (rows per problem): {problems}; ingest them with "
                         "fleetscope.ingest.flows.read_flows, which quarantines such rows")
    return df


def check_topology(topology: pl.DataFrame) -> pl.DataFrame:
    missing = [c for c in TOPO_REQUIRED if c not in topology.columns]
    if missing:
        raise ValueError(f"topology lacks required column(s) {missing}; have {topology.columns}")
    cols = {"gpu": pl.Utf8, "leaf": pl.Utf8, "spine": pl.Utf8, "rail": pl.Int64, "rack": pl.Utf8, "pod": pl.Utf8}
    topo = topology.with_columns(
        [pl.col(c).cast(t) if c in topology.columns else pl.lit(None, dtype=t).alias(c) for c, t in cols.items()]
    ).select(pl.col("ip").cast(pl.Utf8), pl.col("host").cast(pl.Utf8), *cols.keys())
    topo = topo.unique("ip", keep="last", maintain_order=True)  # later snapshot rows win
    if topo["ip"].null_count() or topo["host"].null_count():
        raise ValueError("topology rows with null ip or host")
    return topo


def empty_topology(ips: pl.Series) -> pl.DataFrame:
    """A topology that knows only the addresses (no hosts, switches, rails): the analysis without one."""
    return pl.DataFrame({"ip": ips.cast(pl.Utf8)}).with_columns(
        [pl.lit(None, dtype=t).alias(c) for c, t in {"host": pl.Utf8, "gpu": pl.Utf8, "leaf": pl.Utf8, "spine": pl.Utf8,
                                                     "rail": pl.Int64, "rack": pl.Utf8, "pod": pl.Utf8}.items()]
    )


def add_pairs(flows: pl.DataFrame) -> pl.DataFrame:
    """Unordered pair columns ip_a < ip_b."""
    return flows.with_columns(
        ip_a=pl.min_horizontal("src_ip", "dst_ip"), ip_b=pl.max_horizontal("src_ip", "dst_ip"),
    )


def segment(df: pl.DataFrame, by: list[str], params: SplitParams, col: str = "seg") -> pl.DataFrame:
    """Sort by (by, start) and add `col`: the step index of each flow inside its group, from the
    online change-point split (fleetscope.flows.changepoint)."""
    if df.height == 0:
        return df.with_columns(pl.lit(0, dtype=pl.Int64).alias(col))
    df = df.sort([*by, "start_ns"])
    gid = df.select(
        pl.any_horizontal([pl.col(c).ne_missing(pl.col(c).shift(1)) for c in by]).cum_sum()
    ).to_series().to_numpy().astype(np.int64)
    start = df["start_ns"].to_numpy()
    end = df["end_ns"].to_numpy()
    gaps = sequence_gaps(gid, start, end)
    b = split_steps(gid, gaps, params, durations=(end - start).astype(np.float64))
    return df.with_columns(pl.Series(col, step_index(gid, b), dtype=pl.Int64))
