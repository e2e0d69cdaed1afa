"""Read a landed tabular file (csv, csv.gz, parquet, jsonl, jsonl.gz) into a frame without
losing a single row silently, then cast and validate it against a table schema.

Every row ends up either kept or in the rejected frame with its 1-based row number and a reason
a person can act on; a file that cannot be read at all raises IngestError with the reason."""
from __future__ import annotations

import gzip
import io
import json
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pandera.polars as pa
import polars as pl

from fleetscope.schemas.base import polars_schema, validate_rows

ROW = "_row"  # 1-based row number in the source file (data rows; the header is not counted)
REJECTED_SCHEMA = {"row_number": pl.Int64, "reason": pl.Utf8}


class IngestError(Exception):
    """The whole file cannot be used; the message says why and what to do."""


@dataclass
class IngestResult:
    kept: pl.DataFrame
    rejected: pl.DataFrame  # row_number, reason
    n_read: int
    notes: list[str] = field(default_factory=list)

    def check_counts(self) -> None:
        assert self.n_read == self.kept.height + self.rejected.height, (self.n_read, self.kept.height, self.rejected.height)


def _empty_rejected() -> pl.DataFrame:
    return pl.DataFrame(schema=REJECTED_SCHEMA)


def _read_bytes(path: Path) -> bytes:
    raw = path.read_bytes()
    if not raw:
        raise IngestError("empty file (0 bytes): nothing to ingest; re-export it or remove it")
    if path.name.endswith(".gz"):
        try:
            return gzip.decompress(raw)
        except (EOFError, zlib.error, gzip.BadGzipFile, OSError) as exc:
            raise IngestError(f"truncated or corrupt gzip ({exc}); the file was probably cut while being written: re-copy it") from exc
    return raw


def _split_csv_lines(text: str) -> tuple[list[str], pl.DataFrame]:
    """Header fields and one row per data line (raw text, 1-based row number)."""
    # polars' reader splits lines at native speed: one column, a separator that never occurs
    lines = pl.read_csv(io.StringIO(text), has_header=False, separator="\x1f", quote_char=None,
                        new_columns=["line"], schema={"line": pl.Utf8}, ignore_errors=False)["line"].fill_null("")
    if lines.len() == 0:
        raise IngestError("empty CSV: no header line")
    header = [h.strip() for h in lines[0].split(",")]
    body = pl.DataFrame({"line": lines[1:]}).with_columns(pl.int_range(1, lines.len(), dtype=pl.Int64).alias(ROW))
    return header, body.filter(pl.col("line").str.strip_chars() != "")


def read_csv_rows(text: str) -> tuple[pl.DataFrame, pl.DataFrame]:
    """CSV text -> (frame of Utf8 columns + _row, rejected rows with a wrong field count).

    Vectorized: count separators per line instead of a Python csv loop; quoted fields (rare in
    machine-written flow/hw exports) fall back to polars' quoted parser row by row count."""
    header, body = _split_csv_lines(text)
    n = len(header)
    if len(set(header)) != n:
        raise IngestError(f"duplicate column names in header {header}")
    if body.height and body["line"].str.contains('"', literal=True).any():
        df = pl.read_csv(io.StringIO(text), infer_schema=False, truncate_ragged_lines=True)
        return df.with_columns(pl.int_range(1, df.height + 1, dtype=pl.Int64).alias(ROW)), _empty_rejected()
    counts = body["line"].str.count_matches(",", literal=True) + 1
    bad = body.filter(counts != n)
    good = body.filter(counts == n)
    rejected = bad.select(
        pl.col(ROW).alias("row_number"),
        pl.format("row has {} fields but the header has {} ({}): fix the exporter or drop the partial line",
                  (pl.col("line").str.count_matches(",", literal=True) + 1), pl.lit(n), pl.lit(",".join(header))).alias("reason"),
    )
    parts = good["line"].str.split_exact(",", n - 1).struct.rename_fields(header).struct.unnest()
    frame = parts.with_columns([pl.col(c).str.strip_chars() for c in header]).with_columns(
        [pl.when(pl.col(c) == "").then(None).otherwise(pl.col(c)).alias(c) for c in header]
    ).with_columns(good[ROW])
    return frame, rejected


def read_jsonl_rows(text: str) -> tuple[pl.DataFrame, pl.DataFrame]:
    rows, bad = [], []
    for i, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            if not isinstance(obj, dict):
                raise ValueError("not a JSON object")
            obj[ROW] = i
            rows.append(obj)
        except ValueError as exc:
            bad.append((i, f"malformed JSON line ({exc}): fix or re-export the line"))
    frame = pl.DataFrame(rows, infer_schema_length=None) if rows else pl.DataFrame({ROW: []}, schema={ROW: pl.Int64})
    return frame, pl.DataFrame(bad, schema=REJECTED_SCHEMA, orient="row")


def read_table_file(path: Path) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Any supported tabular file -> (raw frame with _row, structurally rejected rows)."""
    name = path.name.lower()
    if name.endswith(".parquet"):
        if path.stat().st_size == 0:
            raise IngestError("empty file (0 bytes): nothing to ingest; re-export it or remove it")
        try:
            df = pl.read_parquet(path)
        except Exception as exc:  # pyarrow raises several types for corrupt files
            raise IngestError(f"not a readable parquet file ({type(exc).__name__}: {exc}); it may still be being written or be corrupt") from exc
        return df.with_columns(pl.int_range(1, df.height + 1, dtype=pl.Int64).alias(ROW)), _empty_rejected()
    data = _read_bytes(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise IngestError(f"not UTF-8 text ({exc}); is it a binary file with a text extension?") from exc
    if name.endswith((".jsonl", ".jsonl.gz", ".ndjson")):
        return read_jsonl_rows(text)
    if name.endswith((".csv", ".csv.gz")):
        return read_csv_rows(text)
    raise IngestError(f"unsupported file type {path.name!r}: expected .parquet, .csv, .csv.gz, .jsonl or .jsonl.gz")


def _cast_failures(df: pl.DataFrame, target: dict[str, pl.DataType]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Cast columns to the target dtypes; a value present before and null after did not parse."""
    casts, fails = [], []
    for name, dtype in target.items():
        if name not in df.columns:
            continue
        src = pl.col(name)
        if df.schema[name] == dtype or isinstance(dtype, pl.List):
            casts.append(src)
            continue
        if dtype.is_integer() and df.schema[name] == pl.Utf8:
            # "1.7e18" or "12.0" are valid integers written by some exporters; "12.5" is not
            as_f = src.str.strip_chars().cast(pl.Float64, strict=False)
            as_i = src.str.strip_chars().cast(pl.Int64, strict=False)
            val = pl.coalesce(as_i, pl.when(as_f == as_f.floor()).then(as_f.cast(pl.Int64, strict=False))).cast(dtype, strict=False)
        else:
            val = src.cast(dtype, strict=False)
        casts.append(val.alias(name))
        fails.append(
            pl.when(src.is_not_null() & val.is_null())
            .then(pl.format("column '{}': {} is not a valid {}", pl.lit(name), src.cast(pl.Utf8).str.slice(0, 40), pl.lit(str(dtype))))
            .alias(f"_fail_{name}")
        )
    out = df.with_columns(casts + fails)
    fail_cols = [c for c in out.columns if c.startswith("_fail_")]
    if not fail_cols:
        return out, _empty_rejected()
    out = out.with_columns(pl.concat_str(fail_cols, separator="; ", ignore_nulls=True).alias("_fail"))
    out = out.with_columns(pl.when(pl.col("_fail") == "").then(None).otherwise(pl.col("_fail")).alias("_fail"))
    rejected = out.filter(pl.col("_fail").is_not_null()).select(pl.col(ROW).alias("row_number"), pl.col("_fail").alias("reason"))
    return out.filter(pl.col("_fail").is_null()).drop(fail_cols + ["_fail"]), rejected


def ingest_table(
    path: Path,
    schema: pa.DataFrameSchema,
    required: list[str],
    normalize: Callable[[pl.DataFrame], pl.DataFrame] | None = None,
    constants: dict | None = None,
    raw: tuple[pl.DataFrame, pl.DataFrame] | None = None,
) -> IngestResult:
    """The shared pipeline: read -> check required columns -> cast -> normalize -> validate."""
    frame, rejected = raw if raw is not None else read_table_file(path)
    n_read = frame.height + rejected.height
    notes: list[str] = []
    if frame.height == 0 and rejected.height == 0:
        raise IngestError("file has a header but no rows: nothing to ingest")
    cols = set(frame.columns) - {ROW}
    missing = [c for c in required if c not in cols]
    if missing:
        raise IngestError(f"missing required column(s) {missing}; found {sorted(cols)}. Rename or add them (see docs/CONTRACT.md section 1)")
    known = set(schema.columns) | {"end_ns", "duration_ns"}
    extra = sorted(cols - known)
    if extra:
        notes.append(f"ignored unknown columns {extra}")
    target = {k: v for k, v in polars_schema(schema).items()}
    frame, cast_rej = _cast_failures(frame, target)
    if normalize is not None:
        frame = normalize(frame)
    for k, v in (constants or {}).items():
        frame = frame.with_columns(pl.lit(v).alias(k))
    for name, dtype in target.items():
        if name not in frame.columns:
            frame = frame.with_columns(pl.lit(None, dtype=dtype).alias(name))
    frame = frame.select(list(target) + [ROW]).with_columns([pl.col(n).cast(d, strict=False) for n, d in target.items()])
    res = validate_rows(frame, schema, index_col=ROW)
    val_rej = res.rejected.rename({"row_index": "row_number"})
    result = IngestResult(
        kept=res.kept.drop(ROW),
        rejected=pl.concat([rejected, cast_rej, val_rej]).sort("row_number"),
        n_read=n_read,
        notes=notes,
    )
    result.check_counts()
    return result
