"""The one way an asset writes a table: conform + validate with the stage's pandera schema,
write the partition atomically, and describe it in the UI (row counts, schema, preview)."""
from __future__ import annotations

import time

import pandera.polars as pa
import polars as pl
from dagster import MetadataValue, TableColumn, TableSchema

from fleetscope.schemas.base import conform
from fleetscope.warehouse import Warehouse


def table_schema_metadata(schema: pa.DataFrameSchema) -> TableSchema:
    return TableSchema(columns=[
        TableColumn(name=n, type=str(c.dtype), description=("nullable" if c.nullable else "required"))
        for n, c in schema.columns.items()
    ])


def preview(df: pl.DataFrame, n: int = 10) -> MetadataValue:
    if df.height == 0:
        return MetadataValue.md("_no rows_")
    head = df.head(n)
    cols = head.columns[:12]
    def cell(v):
        s = str(v)
        return (s[:40] + "…") if len(s) > 41 else s
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in head.select(cols).iter_rows():
        lines.append("| " + " | ".join(cell(v).replace("|", "\\|") for v in row) + " |")
    return MetadataValue.md("\n".join(lines))


def write_table(wh: Warehouse, table: str, key: str, df: pl.DataFrame, schema: pa.DataFrameSchema) -> tuple[pl.DataFrame, dict]:
    """Validate and write one partition of `table`; returns the written frame and UI metadata."""
    t0 = time.perf_counter()
    df = schema.validate(conform(df, schema))
    path = wh.write_partition(table, key, df)
    return df, {
        f"{table}/rows": MetadataValue.int(df.height),
        f"{table}/preview": preview(df),
        f"{table}/schema": MetadataValue.table_schema(table_schema_metadata(schema)),
        f"{table}/path": MetadataValue.path(str(path)),
        f"{table}/write_seconds": MetadataValue.float(round(time.perf_counter() - t0, 3)),
        "dagster/row_count": MetadataValue.int(df.height),
        "dagster/column_schema": MetadataValue.table_schema(table_schema_metadata(schema)),
    }


def write_verdicts(wh: Warehouse, detector: str, key: str, verdicts: pl.DataFrame | None, capture_id: str | None = None) -> dict:
    """One detector's verdicts for one partition: replace them (or clear them when there are none
    now, so a fixed problem disappears) and describe them."""
    from fleetscope.verdicts import VERDICTS

    part = f"{detector}__{key}"
    if verdicts is None or verdicts.height == 0:
        wh.delete_partition("anomaly_verdicts", part)
        return {"dagster/row_count": MetadataValue.int(0), "by_severity": MetadataValue.json({})}
    if capture_id is not None:
        verdicts = verdicts.with_columns(capture_id=pl.lit(capture_id))
    df, md = write_table(wh, "anomaly_verdicts", part, verdicts, VERDICTS)
    md["by_severity"] = MetadataValue.json(dict(df.group_by("severity").len().sort("severity").iter_rows()))
    md["by_team"] = MetadataValue.json(dict(df.group_by("team").len().sort("team").iter_rows()))
    return md
