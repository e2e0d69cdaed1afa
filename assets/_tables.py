"""The one way an asset writes: conform + validate each table with its pandera schema, write the
partition atomically, describe it in the UI (row counts, schema, preview), and for an analysis
(fleetscope.analysis.Analysis) also its verdicts, notes and artifacts. Every analysis asset is a
multi-asset with one AssetSpec per table it writes, so asset keys and table names are the same."""
from __future__ import annotations

import base64
import time
from collections.abc import Iterator, Sequence

import pandera.polars as pa
import polars as pl
from dagster import AssetSpec, AutomationCondition, MaterializeResult, MetadataValue, TableColumn, TableSchema

from fleetscope.analysis import Analysis
from fleetscope.assets.partitions import BY_NAME
from fleetscope.schemas.base import Table, conform, empty_frame
from fleetscope.tables import DECLARED, TABLES
from fleetscope.findings.verdicts import VERDICTS
from fleetscope.warehouse import Warehouse


def table_of(result: Analysis, name: str) -> pl.DataFrame:
    """The analysis' table by name, or an empty frame of its schema when it did not produce it."""
    return result.tables[name] if name in result.tables else empty_frame(TABLES[name])


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


def write_table(wh: Warehouse, table: str, key: str, df: pl.DataFrame, schema: pa.DataFrameSchema | None = None) -> tuple[pl.DataFrame, dict]:
    """Validate and write one partition of `table`; returns the written frame and UI metadata."""
    schema = schema if schema is not None else TABLES[table]
    t0 = time.perf_counter()
    df = schema.validate(conform(df, schema))
    path = wh.write_partition(table, key, df)
    return df, {
        f"{table}/rows": MetadataValue.int(df.height),
        f"{table}/preview": preview(df),
        f"{table}/path": MetadataValue.path(str(path)),
        f"{table}/write_seconds": MetadataValue.float(round(time.perf_counter() - t0, 3)),
        "dagster/row_count": MetadataValue.int(df.height),
        "dagster/column_schema": MetadataValue.table_schema(table_schema_metadata(schema)),
    }


def write_verdicts(wh: Warehouse, detector: str, key: str, verdicts: pl.DataFrame | None, capture_id: str | None = None) -> dict:
    """One detector's verdicts for one partition: replace them (or clear them when there are none
    now, so a fixed problem disappears) and describe them. The partition file changes only when its
    verdicts do (cleared = an empty file, not a missing one): its modification time is what tells the
    planner (fleetscope.jobs.planner) that the answers built on the verdicts are out of date."""
    part = f"{detector}__{key}"
    before = wh.read("anomaly_verdicts", partitions=[part])
    if verdicts is None or verdicts.height == 0:
        if before.height:
            write_table(wh, "anomaly_verdicts", part, verdicts if verdicts is not None else before.clear(), VERDICTS)
        return {"dagster/row_count": MetadataValue.int(0), "by_severity": MetadataValue.json({})}
    if capture_id is not None:
        verdicts = verdicts.with_columns(capture_id=pl.lit(capture_id))
    new = VERDICTS.validate(conform(verdicts, VERDICTS))
    if before.height == new.height and set(before.columns) == set(new.columns) and \
            before.select(new.columns).sort("verdict_id").equals(new.sort("verdict_id")):
        df, md = new, {"dagster/row_count": MetadataValue.int(new.height), "unchanged": MetadataValue.bool(True)}
    else:
        df, md = write_table(wh, "anomaly_verdicts", part, new, VERDICTS)
    md["by_severity"] = MetadataValue.json(dict(df.group_by("severity").len().sort("severity").iter_rows()))
    md["by_team"] = MetadataValue.json(dict(df.group_by("team").len().sort("team").iter_rows()))
    return md


def table_spec(name: str, *, group: str, deps=(), automation_condition=None) -> AssetSpec:
    """The asset of a declared table: its partitions and description from the declaration."""
    t = DECLARED[name]
    return AssetSpec(name, partitions_def=BY_NAME.get(t.partitions), group_name=group, deps=list(deps), kinds={"duckdb", "parquet"},
                     automation_condition=automation_condition, description=t.description)


def analysis_specs(tables: Sequence[Table], verdicts_asset: str, verdicts_description: str, *, group: str,
                   deps=None, eager: bool = True) -> list[AssetSpec]:
    """One AssetSpec per declared table of the analysis, plus its verdicts asset (its slice of
    anomaly_verdicts), all in the tables' one partition set, depending on what the declarations say
    the analysis reads (`deps` only where a dependency needs more, e.g. a partition mapping)."""
    (partitions,) = {t.partitions for t in tables}
    (reads,) = {t.reads for t in tables}
    deps = list(reads) if deps is None else deps
    cond = AutomationCondition.eager() if eager else None
    return [table_spec(t.name, group=group, deps=deps, automation_condition=cond) for t in tables] + [
        AssetSpec(verdicts_asset, partitions_def=BY_NAME[partitions], group_name=group, deps=deps, kinds={"duckdb", "parquet"},
                  automation_condition=cond, description=verdicts_description)]


def materialize_analysis(wh: Warehouse, key: str, result: Analysis, tables: Sequence[Table], verdicts_asset: str, detector: str,
                         capture_id: str | None = None, extra: dict | None = None,
                         artifacts_on: str | None = None) -> Iterator[MaterializeResult]:
    """Write every table of the analysis (an empty frame of its schema when it produced none), its
    verdicts and artifacts (files under <warehouse>.exports/, PNGs also shown in the UI on the asset
    `artifacts_on`, default the first table), and yield one MaterializeResult per asset with its
    metadata and the analysis' notes."""
    notes = MetadataValue.text("; ".join(result.notes)) if result.notes else None
    warnings = MetadataValue.text("; ".join(result.warnings)) if result.warnings else None
    files = {}
    for rel, data in result.artifacts.items():
        path = wh.exports_dir() / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
        files[rel] = path
    shown = {f"artifact/{rel}": MetadataValue.path(str(p)) for rel, p in files.items()}
    shown.update({f"plot/{rel.rsplit('/', 1)[-1][:-4]}": MetadataValue.md(
        f"![{rel}](data:image/png;base64,{base64.b64encode(result.artifacts[rel]).decode()})")
        for rel in files if rel.endswith(".png")})
    artifacts_on = artifacts_on or tables[0].name
    for name in (t.name for t in tables):
        _, md = write_table(wh, name, key, table_of(result, name))
        if notes is not None:
            md["notes"] = notes
        if warnings is not None:
            md["warnings"] = warnings
        md.update((extra or {}).get(name, {}))
        if name == artifacts_on:
            md.update(shown)
        yield MaterializeResult(asset_key=name, metadata=md)
    md = write_verdicts(wh, detector, key, result.verdicts, capture_id=capture_id)
    if notes is not None:
        md["notes"] = notes
    if warnings is not None:
        md["warnings"] = warnings
    yield MaterializeResult(asset_key=verdicts_asset, metadata=md)
