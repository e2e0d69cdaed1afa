"""Which machine each rank of a capture ran on, so a finding about "rank 14" can name its host and
GPU. From the timings' host column (docs/CONTRACT.md 1.4) and, for profiler traces, the device the
rank's kernels ran on plus the host in Kineto's default file name (`<host>_<pid>.<ts>.pt.trace.json`);
fleetscope.findings.problems maps host + device to the topology's GPU and address."""
from __future__ import annotations

import pandera.polars as pa
import polars as pl

from fleetscope.schemas.base import Table, conform

CAPTURE_RANKS = pa.DataFrameSchema({
    "capture_id": pa.Column(pl.Utf8),
    "rank": pa.Column(pl.Int32),
    "host": pa.Column(pl.Utf8, nullable=True),
    "device": pa.Column(pl.Int32, nullable=True),    # the CUDA device its kernels ran on
    # "trace": the device of its kernels; "local rank": its position among the host's ranks (torchrun's
    # LOCAL_RANK, which launchers use as the device), shifted like the host's traced ranks, when no trace says
    "device_source": pa.Column(pl.Utf8, nullable=True),
    "stage": pa.Column(pl.Int32, nullable=True),
    "dp_rank": pa.Column(pl.Int32, nullable=True),
    "source": pa.Column(pl.Utf8),                    # where the host came from
    "tp_rank": pa.Column(pl.Int32, nullable=True),   # addition (issue 23): place in its tensor-parallel group
}, unique=["capture_id", "rank"])

# Kineto's default trace file name: <hostname>_<pid>.<timestamp ms>.pt.trace.json[.gz]
_KINETO_NAME = r"^(?:.*/)?(?P<host>.+)_\d+\.\d+\.pt\.trace\.json(?:\.gz)?$"


def capture_ranks(capture_id: str, timings: pl.DataFrame | None, trace_events: pl.DataFrame | None,
                  places: pl.DataFrame | None = None) -> pl.DataFrame:
    """places: rank, stage, dp_rank, tp_rank from the capture's layout (fleetscope.traces.layout);
    the timings' own stage / dp_rank win where they have them."""
    parts = []
    if timings is not None and timings.height:
        t = timings.group_by("rank").agg(
            *[pl.col(c).drop_nulls().mode().first().alias(c) for c in ("host", "stage", "dp_rank") if c in timings.columns])
        parts.append(t.with_columns(source=pl.lit("timings")))
    if trace_events is not None and trace_events.height:
        per = trace_events.group_by("rank").agg(
            pl.col("device").filter(pl.col("cat") == "kernel").drop_nulls().mode().first().alias("device"),
            pl.col("source_file").first().str.extract(_KINETO_NAME, 1).alias("trace_host"))
        parts.append(per)
    if not parts:
        return conform(pl.DataFrame(), CAPTURE_RANKS)
    df = parts[0]
    for p in parts[1:]:
        df = df.join(p, on="rank", how="full", coalesce=True)
    if places is not None and places.height:
        pl_ = places.select(pl.col("rank").cast(pl.Int32), _st=pl.col("stage"), _dp=pl.col("dp_rank"), tp_rank=pl.col("tp_rank"))
        df = df.with_columns(pl.col("rank").cast(pl.Int32)).join(pl_, on="rank", how="left")
        for c, src in (("stage", "_st"), ("dp_rank", "_dp")):
            df = df.with_columns((pl.coalesce(c, src) if c in df.columns else pl.col(src)).cast(pl.Int32).alias(c))
        df = df.drop("_st", "_dp")
    for c, dt in (("host", pl.Utf8), ("trace_host", pl.Utf8), ("source", pl.Utf8)):
        if c not in df.columns:
            df = df.with_columns(pl.lit(None, dt).alias(c))
    df = df.with_columns(
        source=pl.when(pl.col("host").is_not_null()).then(pl.col("source"))
        .when(pl.col("trace_host").is_not_null()).then(pl.lit("trace file name")).otherwise(pl.lit("none")),
        host=pl.coalesce("host", "trace_host"), capture_id=pl.lit(capture_id))
    if "device" not in df.columns:
        df = df.with_columns(device=pl.lit(None, pl.Int32))
    df = df.with_columns(_pos=pl.col("rank").rank("ordinal").over("host").cast(pl.Int32) - 1)
    # a job on GPUs 4-7 of a host: its traced rank on device 4 at position 0 shifts the others by 4
    # (a host with no traced rank takes the capture's usual shift: schedulers give a job the same GPU slots
    # on every host)
    df = df.with_columns(_off=(pl.col("device") - pl.col("_pos")).median().over("host")
                         .fill_null((pl.col("device") - pl.col("_pos")).median()).fill_null(0).round().cast(pl.Int32))
    df = df.with_columns(
        device_source=pl.when(pl.col("device").is_not_null()).then(pl.lit("trace"))
        .when(pl.col("host").is_not_null()).then(pl.lit("local rank")),
        device=pl.coalesce(pl.col("device"), pl.when(pl.col("host").is_not_null()).then(pl.col("_pos") + pl.col("_off"))))
    return CAPTURE_RANKS.validate(conform(df.sort("rank"), CAPTURE_RANKS))


DECLARED = (
    Table("capture_ranks", CAPTURE_RANKS, "Which host and GPU device each rank of the capture ran on (timings' host, the trace's "
          "device and file name), so findings about a rank name its machine.", "captures", ("timings", "trace_events", "trace_files")),
)
