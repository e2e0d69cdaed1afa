"""Helpers over pandera.polars schemas: conform a frame, make an empty one, validate row by row;
and `Table`, the one declaration of a warehouse table (each module that writes tables declares
them beside their schemas; fleetscope.tables gathers them)."""
from __future__ import annotations

from dataclasses import dataclass

import pandera.polars as pa
import polars as pl

@dataclass(frozen=True)
class Table:
    """A warehouse table, declared once: its name, its schema, what it holds (the UI's and the docs'
    description), the partitions it is written in (a partition set of the wiring, "slices" when
    every writer of another table adds its own slice, "all" when one partition holds it) and the
    tables its writer reads."""
    name: str
    schema: pa.DataFrameSchema
    description: str
    partitions: str
    reads: tuple[str, ...] = ()


def polars_schema(schema: pa.DataFrameSchema) -> dict[str, pl.DataType]:
    """Column name -> polars dtype, in schema order."""
    return {name: col.dtype.type for name, col in schema.columns.items()}


def empty_frame(schema: pa.DataFrameSchema) -> pl.DataFrame:
    return pl.DataFrame(schema=polars_schema(schema))


def conform(df: pl.DataFrame, schema: pa.DataFrameSchema, strict: bool = False) -> pl.DataFrame:
    """Select the schema's columns in order, adding absent nullable columns as nulls and casting
    (non-strict cast: values that do not fit become null, which validation then catches for
    required columns). Extra columns are dropped. With strict=True a missing required column
    raises KeyError naming it."""
    if not df.columns:  # selecting only literals from a column-less frame would make one row
        return empty_frame(schema)
    exprs = []
    for name, col in schema.columns.items():
        dtype = col.dtype.type
        if name in df.columns:
            exprs.append(pl.col(name).cast(dtype, strict=False).alias(name))
        elif col.nullable or not strict:
            exprs.append(pl.lit(None, dtype=dtype).alias(name))
        else:
            raise KeyError(name)
    return df.select(exprs)


@dataclass
class ValidationResult:
    kept: pl.DataFrame
    # one row per rejected input row: row_index (position in the frame given), reason
    rejected: pl.DataFrame

    @property
    def n_in(self) -> int:
        return self.kept.height + self.rejected.height


def validate_rows(df: pl.DataFrame, schema: pa.DataFrameSchema, index_col: str | None = None) -> ValidationResult:
    """Validate with pandera (lazy: every failure collected), then split the frame into rows that
    pass and rows that do not, each rejected row with a readable reason (all its failures joined).

    index_col: a column holding each row's original row number (kept in the reason table);
    defaults to the position in df. Frame-level failures (a missing required column) reject
    every row with that reason: nothing is dropped silently."""
    pos = pl.int_range(0, df.height, dtype=pl.Int64, eager=True)
    try:
        schema.validate(df, lazy=True)
        return ValidationResult(df, pl.DataFrame({"row_index": [], "reason": []}, schema={"row_index": pl.Int64, "reason": pl.Utf8}))
    except pa.errors.SchemaErrors as exc:
        fc = exc.failure_cases
        if not isinstance(fc, pl.DataFrame):
            fc = pl.from_pandas(fc)  # pragma: no cover - pandas backend only
    row_level = fc.filter(pl.col("index").is_not_null())
    frame_level = fc.filter(pl.col("index").is_null())
    reasons = (
        row_level.with_columns(
            reason=pl.concat_str(
                [pl.col("column").fill_null("row"), pl.lit(": "), pl.col("check").cast(pl.Utf8),
                 pl.lit(" (got "), pl.col("failure_case").cast(pl.Utf8).fill_null("null"), pl.lit(")")]
            )
        )
        .group_by("index")
        .agg(pl.col("reason").unique().sort().str.join("; "))
        .rename({"index": "row_index"})
        .with_columns(pl.col("row_index").cast(pl.Int64))
    )
    if frame_level.height:
        msg = "; ".join(
            f"{c}: {k}" for c, k in zip(frame_level["column"].cast(pl.Utf8).fill_null("table").to_list(),
                                         frame_level["check"].cast(pl.Utf8).to_list())
        )
        reasons = pl.DataFrame({"row_index": pos, "reason": [msg] * df.height})
    bad = reasons["row_index"]
    mask = pos.is_in(bad.implode())
    kept = df.filter(~mask)
    rej = reasons
    if index_col is not None and index_col in df.columns:
        rej = rej.join(df.select(pl.int_range(0, df.height, dtype=pl.Int64).alias("row_index"), pl.col(index_col).alias("_orig")), on="row_index").with_columns(row_index=pl.col("_orig").cast(pl.Int64)).drop("_orig")
    return ValidationResult(kept, rej.sort("row_index"))
