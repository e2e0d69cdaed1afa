"""Ingestion assets: one partition per landed file, capture or incident (dynamic partitions).
Thin: each calls fleetscope.ingest.partitions and reports rows in / kept / rejected. (Rejected
rows and files go to the rejected_records table, a slice per partition.)"""

import json

import polars as pl

from dagster import AssetExecutionContext, MaterializeResult, MetadataValue, asset, multi_asset

from fleetscope.assets._capture import capture_events, remember_events
from fleetscope.assets._tables import preview, table_schema_metadata, table_spec, write_table
from fleetscope.assets.partitions import captures, flow_files, hw_files, topology_files
from fleetscope.ingest import partitions as ing
from fleetscope.ingest.captures import capture_ranks
from fleetscope.ingest.trace_timings import trace_gaps
from fleetscope.schemas.landing import CAPTURES, FLOWS, HW, TIMINGS, TOPOLOGY
from fleetscope.schemas.landing import TRACE_EVENTS, TRACE_FILES
from fleetscope.traces.layout import COMM_EVENT_COLUMNS, capture_layout, layout_events
from fleetscope.ingest.windows import windows_touched
from fleetscope.resources import AnalysisSettings, LandingResource, WarehouseResource
from fleetscope.tables import DECLARED, TABLES


def _metadata(s: ing.IngestSummary, schema=None) -> dict:
    md = {
        "rows_in": MetadataValue.int(s.rows_in),
        "rows_kept": MetadataValue.int(s.rows_kept),
        "rows_rejected": MetadataValue.int(s.rows_rejected),
        "files_in": MetadataValue.int(s.files_in),
        "files_rejected": MetadataValue.int(s.files_rejected),
        "dagster/row_count": MetadataValue.int(s.rows_kept),
    }
    if s.frame is not None:
        md["preview"] = preview(s.frame)
    if schema is not None:
        md["dagster/column_schema"] = MetadataValue.table_schema(table_schema_metadata(schema))
    if s.rejected is not None and s.rejected.height:
        md["rejected_preview"] = preview(s.rejected.select("source_file", "row_number", "reason"))
    if s.notes:
        md["notes"] = MetadataValue.text("; ".join(sorted(set(s.notes))))
    for k, v in s.extra.items():
        md[k] = MetadataValue.int(v) if isinstance(v, int) else MetadataValue.text(str(v))
    return md


def _log(context: AssetExecutionContext, s: ing.IngestSummary) -> None:
    context.log.info(f"{s.table}[{s.key}]: {s.rows_in} rows in, {s.rows_kept} kept, {s.rows_rejected} rejected; "
                     f"{s.files_in} files, {s.files_rejected} rejected")


@asset(partitions_def=topology_files, group_name="ingest", kinds={"duckdb", "parquet"},
       description=DECLARED["topology"].description)
def topology(context: AssetExecutionContext, warehouse: WarehouseResource, landing: LandingResource) -> MaterializeResult:
    s = ing.ingest_file(warehouse.get(), landing.root, "topology", context.partition_key)
    _log(context, s)
    return MaterializeResult(metadata=_metadata(s, TOPOLOGY))


@asset(partitions_def=flow_files, group_name="ingest", kinds={"duckdb", "parquet"},
       description=DECLARED["flows"].description)
def flows(context: AssetExecutionContext, warehouse: WarehouseResource, landing: LandingResource,
          settings: AnalysisSettings) -> MaterializeResult:
    s = ing.ingest_file(warehouse.get(), landing.root, "flows", context.partition_key)
    _log(context, s)
    windows = []
    if s.frame is not None and s.frame.height:
        windows = windows_touched(s.frame["start_ns"].to_numpy(), s.frame["end_ns"].to_numpy(), settings.window_seconds)
    md = _metadata(s, FLOWS)
    md["windows"] = MetadataValue.json(windows)
    return MaterializeResult(metadata=md)


@asset(partitions_def=hw_files, group_name="ingest", kinds={"duckdb", "parquet"},
       description=DECLARED["hw"].description)
def hw(context: AssetExecutionContext, warehouse: WarehouseResource, landing: LandingResource) -> MaterializeResult:
    s = ing.ingest_file(warehouse.get(), landing.root, "hw", context.partition_key)
    _log(context, s)
    return MaterializeResult(metadata=_metadata(s, HW))


@asset(partitions_def=captures, group_name="ingest", kinds={"duckdb", "parquet"},
       description=DECLARED["timings"].description)
def timings(context: AssetExecutionContext, warehouse: WarehouseResource, landing: LandingResource) -> MaterializeResult:
    wh = warehouse.get()
    s = ing.ingest_timings_capture(wh, landing.root, context.partition_key)
    _log(context, s)
    return MaterializeResult(metadata=_metadata(s, TIMINGS))


@multi_asset(specs=[table_spec("trace_events", group="ingest"), table_spec("trace_files", group="ingest")],
             can_subset=True)  # a selection of trace_events alone (as before trace_files existed) still runs; both are written
def trace_events(context: AssetExecutionContext, warehouse: WarehouseResource, landing: LandingResource):
    wh = warehouse.get()
    s = ing.ingest_traces_capture(wh, landing.root, context.partition_key)
    remember_events(wh, context.partition_key, s.frame)  # the capture's analyses in this process read it from memory
    _log(context, s)
    md = _metadata(s, TRACE_EVENTS)
    if s.frame is not None and s.frame.height:
        md["ranks"] = MetadataValue.json(sorted(int(r) for r in s.frame["rank"].unique().to_list()))
        md["events_by_category"] = MetadataValue.json(dict(s.frame.group_by("cat").len().sort("cat").iter_rows()))
    selected = {k.to_user_string() for k in context.selected_asset_keys}
    if "trace_events" in selected:
        yield MaterializeResult(asset_key="trace_events", metadata=md)
    files = s.tables.get("trace_files")
    if "trace_files" in selected:
        yield MaterializeResult(asset_key="trace_files", metadata={
            "dagster/row_count": MetadataValue.int(files.height if files is not None else 0),
            "preview": preview(files.drop("pg_config") if files is not None else pl.DataFrame()),
            "dagster/column_schema": MetadataValue.table_schema(table_schema_metadata(TRACE_FILES))})


@multi_asset(specs=[table_spec("captures", group="ingest", deps=[timings, trace_events]),
                    table_spec("capture_ranks", group="ingest", deps=[timings, trace_events])],
             can_subset=False)
def captures_asset(context: AssetExecutionContext, warehouse: WarehouseResource, landing: LandingResource):
    wh = warehouse.get()
    key = context.partition_key
    n_tr = len([p for p in (landing.root / "traces" / key).glob("*.json*") if p.name != "capture.json"]) if (landing.root / "traces" / key).is_dir() else 0
    n_ti = len(list((landing.root / "timings" / key).glob("*.*"))) if (landing.root / "timings" / key).is_dir() else 0
    # the parallel layout from the traces themselves; capture.json only overrides it
    lay = None
    if key in wh.partitions("trace_events"):
        ev = capture_events(wh, key, COMM_EVENT_COLUMNS)
        lay = capture_layout(wh.read("trace_files", partitions=[key]), ev.filter(layout_events()), ing.declared_layout(landing.root, key))
    gaps = trace_gaps(capture_events(wh, key)) if lay is not None else []
    derived = None if lay is None else {"dp": lay.dp, "pp": lay.pp, "tp": lay.tp, "world_size": lay.world_size,
                                        "layout_source": lay.source, "notes": "; ".join(lay.notes + gaps) or None}
    df = ing.capture_record(landing.root, key, n_tr, n_ti, span=ing.capture_span(wh, key), derived=derived)
    wh.write_partition("captures", key, df)
    md = {"capture": MetadataValue.json(df.to_dicts()[0]), "dagster/row_count": MetadataValue.int(1),
          "dagster/column_schema": MetadataValue.table_schema(table_schema_metadata(CAPTURES))}
    if lay is not None and (lay.notes or gaps):
        md["warnings"] = MetadataValue.text("; ".join(lay.notes + gaps))  # said in the run summary
    yield MaterializeResult(asset_key="captures", metadata=md)
    ranks = capture_ranks(key, wh.read("timings", partitions=[key]),
                          capture_events(wh, key, ["rank", "cat", "device", "source_file"]),
                          places=lay.ranks if lay is not None else None)
    _, md = write_table(wh, "capture_ranks", key, ranks)
    yield MaterializeResult(asset_key="capture_ranks", metadata=md)


_INCIDENT_TABLES = ("incidents", "stacks", "ring_progress", "collective_progress")


@multi_asset(specs=[table_spec(name, group="ingest") for name in _INCIDENT_TABLES], can_subset=False)
def incident_inputs(context: AssetExecutionContext, warehouse: WarehouseResource, landing: LandingResource):
    """incidents/<key>.json (a request) and stacks/<key>/ (dumps of a hang), whichever exist."""
    wh = warehouse.get()
    s = ing.ingest_incident(wh, landing.root, context.partition_key)
    _log(context, s)
    for name in _INCIDENT_TABLES:
        schema = TABLES[name]
        if name == "incidents":
            md = _metadata(s, schema)
            if s.frame is not None and s.frame.height:
                md["request"] = MetadataValue.json(json.loads(s.frame.drop("source_file").write_json())[0])
        else:
            df = wh.read(name, partitions=[context.partition_key])
            md = {"dagster/row_count": MetadataValue.int(df.height), "preview": preview(df.drop("text") if "text" in df.columns else df),
                  "dagster/column_schema": MetadataValue.table_schema(table_schema_metadata(schema))}
        yield MaterializeResult(asset_key=name, metadata=md)


ASSETS = [topology, flows, hw, timings, trace_events, captures_asset, incident_inputs]
