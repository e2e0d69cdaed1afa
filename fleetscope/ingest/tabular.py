"""Read a landed tabular file (csv, csv.gz, parquet, jsonl, jsonl.gz) into a frame without
losing a single row silently, then cast and validate it against a table schema.

Every row ends up either kept or in the rejected frame with its 1-based row number and a reason
a person can act on; a file that cannot be read at all raises IngestError with the reason."""
from __future__ import annotations

import codecs
import csv
import gzip
import io
import json
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pandera.polars as pda
import polars as pl
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

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
    # gzip by its magic number as well as by name: some exporters compress without renaming
    if path.name.endswith(".gz") or raw[:2] == b"\x1f\x8b":
        try:
            # checks every member's trailer: a missing trailer (EOFError) or a CRC / length that
            # does not match the data (BadGzipFile) means the copy is incomplete or damaged
            return gzip.decompress(raw)
        except EOFError as exc:
            raise IngestError(f"truncated or corrupt gzip: the stream ends before its trailer ({exc}); the file was "
                              "probably cut while being written or copied: re-copy it") from exc
        except (zlib.error, gzip.BadGzipFile, OSError) as exc:
            raise IngestError(f"truncated or corrupt gzip: its CRC or length check failed ({exc}); the copy is "
                              "damaged: re-copy it") from exc
    return raw


def _csv_header(data: bytes) -> list[str]:
    """The header record's field names (RFC 4180: quoted or not; a UTF-8 BOM may lead)."""
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8):]
    # the header ends at the first line break outside quotes (a quoted name may hold one)
    i, inq = 0, False
    while True:
        j = data.find(b"\n", i)
        seg = data[i:] if j < 0 else data[i:j]
        inq ^= seg.count(b'"') % 2 == 1
        if j < 0 or not inq:
            line = data if j < 0 else data[:j]
            break
        i = j + 1
    try:
        fields = next(csv.reader(io.StringIO(line.decode("utf-8"), newline="")), [])
    except (UnicodeDecodeError, csv.Error) as exc:
        raise IngestError(f"unreadable CSV header ({exc}): fix the exporter") from exc
    header = [h.strip() for h in fields]
    if not header or header == [""]:
        raise IngestError("empty CSV: no header line")
    return header


def read_csv_rows(data: bytes) -> tuple[pl.DataFrame, pl.DataFrame]:
    """CSV bytes -> (frame of Utf8 columns named by the header + _row, rejected rows).

    RFC 4180 as exporters write it (quoted header and fields, doubled quotes, line breaks inside
    quotes, CRLF, a UTF-8 BOM) through pyarrow's native multi-threaded reader; every record whose
    field count differs from the header's is rejected with its row number (the 1-based data
    record, header and blank lines not counted) instead of being truncated or padded."""
    header = _csv_header(data)
    n = len(header)
    if len(set(header)) != n:
        raise IngestError(f"duplicate column names in header {header}")
    bad: list[tuple[int | None, int, str]] = []

    def on_invalid(row) -> str:
        bad.append((row.number, row.actual_columns, row.text[:60]))
        return "skip"

    def parse(threads: bool):
        bad.clear()
        return pacsv.read_csv(
            pa.py_buffer(data),
            read_options=pacsv.ReadOptions(column_names=header, skip_rows=1, use_threads=threads),
            # values may hold line breaks only inside quotes: the slower quote-aware block split is
            # needed only when the file has quotes at all
            parse_options=pacsv.ParseOptions(invalid_row_handler=on_invalid, newlines_in_values=b'"' in data),
            convert_options=pacsv.ConvertOptions(column_types={h: pa.string() for h in header},
                                                 strings_can_be_null=True, quoted_strings_can_be_null=True))

    try:
        table = parse(True)
        if bad and any(b[0] is None for b in bad):
            table = parse(False)  # the multi-threaded reader does not know the row numbers
    except (pa.ArrowInvalid, UnicodeDecodeError) as exc:
        raise IngestError(f"unreadable CSV ({exc}): fix or re-export the file") from exc
    # spaces around a separator (", ") are not data: trimmed natively, column by column
    import pyarrow.compute as pac

    table = pa.table({name: pac.utf8_trim_whitespace(col) for name, col in zip(table.column_names, table.columns)})
    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    # pyarrow counts the header as record 1
    bad_rows = sorted((int(num) - 1, cnt, txt) for num, cnt, txt in bad)
    rejected = pl.DataFrame(
        [(r, f"row has {c} fields but the header has {n} ({','.join(header)}): fix the exporter or drop the "
             f"partial line (starts {t!r})") for r, c, t in bad_rows],
        schema=REJECTED_SCHEMA, orient="row")
    if bad_rows:
        # kept rows are the record numbers that were not rejected, in order
        total = frame.height + len(bad_rows)
        mask = np.ones(total + 1, dtype=bool)
        mask[0] = False
        mask[[r for r, _, _ in bad_rows]] = False
        rows = pl.Series(ROW, np.flatnonzero(mask), dtype=pl.Int64)
    else:
        rows = pl.int_range(1, frame.height + 1, dtype=pl.Int64, eager=True).alias(ROW)
    # an empty field is missing (pyarrow already nulls empty ones; these held only spaces)
    blank = [c for c in header if frame.height and frame.get_column(c).str.len_bytes().min() == 0]
    if blank:
        frame = frame.with_columns([pl.when(pl.col(c) == "").then(None).otherwise(pl.col(c)).alias(c) for c in blank])
    return frame.with_columns(rows), rejected


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


def _read_parquet(path: Path) -> pl.DataFrame:
    if path.stat().st_size == 0:
        raise IngestError("empty file (0 bytes): nothing to ingest; re-export it or remove it")
    try:
        df = pl.read_parquet(path)
    except Exception:  # a codec or type polars lacks (e.g. LZO-free but exotic writers): pyarrow reads the rest
        try:
            df = pl.from_arrow(pq.read_table(path))
        except Exception as exc:  # pyarrow raises several types for corrupt files
            raise IngestError(f"not a readable parquet file ({type(exc).__name__}: {exc}); it may still be being "
                              "written or be corrupt") from exc
    # timestamps written as a parquet TIMESTAMP (any unit) mean ns since the epoch in *_ns columns
    return df.with_columns([pl.col(c).dt.epoch("ns") for c, t in df.schema.items()
                            if c.endswith("_ns") and isinstance(t, pl.Datetime)])


def read_table_file(path: Path) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Any supported tabular file -> (raw frame with _row, structurally rejected rows)."""
    name = path.name.lower()
    if name.endswith(".parquet"):
        df = _read_parquet(path)
        return df.with_columns(pl.int_range(1, df.height + 1, dtype=pl.Int64).alias(ROW)), _empty_rejected()
    data = _read_bytes(path)
    if name.endswith((".csv", ".csv.gz")):
        return read_csv_rows(data)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise IngestError(f"not UTF-8 text ({exc}); is it a binary file with a text extension?") from exc
    if name.endswith((".jsonl", ".jsonl.gz", ".ndjson")):
        return read_jsonl_rows(text)
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
        try:  # the common case, every value parses: one native cast, no per-row checks
            casts.append(df.get_column(name).cast(dtype, strict=True))
            continue
        except (pl.exceptions.InvalidOperationError, pl.exceptions.ComputeError):
            pass
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
    schema: pda.DataFrameSchema,
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
