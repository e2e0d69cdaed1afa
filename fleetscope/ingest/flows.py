"""Flow records (docs/CONTRACT.md 1.2): end_ns or duration_ns, path as list or 'a>b>c' string."""
from __future__ import annotations

from pathlib import Path

import polars as pl

from fleetscope.ingest.tabular import IngestResult, ingest_table
from fleetscope.schemas.landing import FLOWS


def _normalize(df: pl.DataFrame) -> pl.DataFrame:
    for c in ("end_ns", "duration_ns"):
        if c in df.columns and df.schema[c] == pl.Utf8:
            df = df.with_columns(pl.col(c).cast(pl.Float64, strict=False).cast(pl.Int64, strict=False))
    has_end, has_dur = "end_ns" in df.columns, "duration_ns" in df.columns
    if has_dur and has_end:
        df = df.with_columns(duration_ns=pl.coalesce("duration_ns", pl.col("end_ns") - pl.col("start_ns")))
        df = df.with_columns(end_ns=pl.coalesce("end_ns", pl.col("start_ns") + pl.col("duration_ns")))
    elif has_dur:
        df = df.with_columns(end_ns=pl.col("start_ns") + pl.col("duration_ns"))
    else:
        df = df.with_columns(duration_ns=pl.col("end_ns") - pl.col("start_ns"))
    if "path" in df.columns:
        dt = df.schema["path"]
        if dt == pl.Utf8:
            df = df.with_columns(path=pl.when(pl.col("path").str.strip_chars() == "").then(None)
                                 .otherwise(pl.col("path").str.split(">").list.eval(pl.element().str.strip_chars())))
        elif isinstance(dt, pl.List):
            df = df.with_columns(path=pl.col("path").cast(pl.List(pl.Utf8)))
        else:
            df = df.with_columns(path=pl.lit(None, dtype=pl.List(pl.Utf8)))
    return df


def read_flows(path: Path | str) -> IngestResult:
    path = Path(path)
    res = ingest_table(path, FLOWS, required=["start_ns", "src_ip", "dst_ip", "bytes"], normalize=_normalize,
                       constants={"source_file": path.name}, raw=_raw_with_time_check(path))
    return res


def _raw_with_time_check(path: Path):
    from fleetscope.ingest.tabular import IngestError, read_table_file

    frame, rej = read_table_file(path)
    if frame.height and "end_ns" not in frame.columns and "duration_ns" not in frame.columns:
        raise IngestError(f"flows need end_ns or duration_ns; found {sorted(set(frame.columns) - {'_row'})}")
    return frame, rej
