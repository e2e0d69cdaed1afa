"""An independent reader of CONTRACT 1.1 / 1.2 files for the simulator's tests: Python's csv module
(RFC 4180) and pyarrow, not fleetscope's ingestion, so that what the simulator writes is checked
against the contract itself, not against what the platform happens to accept."""
from __future__ import annotations

import csv
import gzip
import io
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq

BOM = b"\xef\xbb\xbf"
FLOW_TYPES = {"start_ns": pl.Int64, "duration_ns": pl.Int64, "end_ns": pl.Int64, "src_ip": pl.Utf8, "dst_ip": pl.Utf8,
              "bytes": pl.Int64, "packets": pl.Int64, "src_port": pl.Int64, "dst_port": pl.Int64, "src_qp": pl.Int64,
              "dst_qp": pl.Int64}


def raw_text(path: Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if path.name.endswith(".gz") else data   # raises on a truncated stream


def read_rfc4180(data: bytes) -> tuple[list[str], list[list[str]]]:
    if data.startswith(BOM):
        data = data[len(BOM):]
    rows = list(csv.reader(io.StringIO(data.decode("utf-8"), newline="")))
    return rows[0], rows[1:]


def read_table(path: Path) -> pl.DataFrame:
    """Any landed table, columns typed per CONTRACT where known, everything else as text. The header
    is parsed by the csv module (RFC 4180), the body by polars with every field as text."""
    if path.name.endswith(".parquet"):
        return pl.from_arrow(pq.read_table(path))
    data = raw_text(path)
    if data.startswith(BOM):
        data = data[len(BOM):]
    head = next(csv.reader(io.StringIO(data[:65536].decode("utf-8", "ignore"), newline="")))
    assert len(set(head)) == len(head), f"{path.name}: duplicate column names {head}"
    df = pl.read_csv(io.BytesIO(data), infer_schema=False)
    assert df.columns == head, (path.name, df.columns, head)
    ints = [c for c in df.columns if FLOW_TYPES.get(c) == pl.Int64 or c == "rail"]
    # an empty field (quoted or not: QUOTE_ALL writers write null as "") is a missing value
    return df.with_columns(pl.when(pl.col(c) == "").then(None).otherwise(pl.col(c)).cast(pl.Int64).alias(c) for c in ints)


def flows_per_contract(path: Path) -> pl.DataFrame:
    """Read a flow file, check CONTRACT 1.2, return it normalized (start_ns, end_ns, duration_ns,
    src_ip, dst_ip, bytes, path as a list, optional columns kept)."""
    df = read_table(path)
    for c in ("start_ns", "src_ip", "dst_ip", "bytes"):
        assert c in df.columns, f"{path.name}: required column {c} missing ({df.columns})"
    assert "duration_ns" in df.columns or "end_ns" in df.columns, f"{path.name}: neither duration_ns nor end_ns"
    for c, t in FLOW_TYPES.items():
        if c in df.columns:
            assert df.schema[c] == t or (t == pl.Int64 and df.schema[c].is_integer()), (path.name, c, df.schema[c])
    if "end_ns" not in df.columns:
        df = df.with_columns(end_ns=pl.col("start_ns") + pl.col("duration_ns"))
    if "duration_ns" not in df.columns:
        df = df.with_columns(duration_ns=pl.col("end_ns") - pl.col("start_ns"))
    assert (df["duration_ns"] == df["end_ns"] - df["start_ns"]).all(), f"{path.name}: duration and end disagree"
    assert (df["duration_ns"] >= 0).all() and (df["bytes"] > 0).all(), path.name
    assert df["src_ip"].null_count() == 0 and df["dst_ip"].null_count() == 0
    if "path" in df.columns and df.schema["path"] == pl.Utf8:
        df = df.with_columns(path=pl.col("path").str.split(">"))
    return df.with_columns(pl.col(c).cast(pl.Int64) for c in FLOW_TYPES if c in df.columns and FLOW_TYPES[c] == pl.Int64)
