"""What every per-capture analysis reads: the capture's rows of a table, its layout, its job id,
and the hw samples covering its time span.

A capture's trace_events (millions of rows) and the timings derived from them are read / derived once
per process and shared by the analyses of the capture run (Dagster's in-process executor runs them one
after another in one process): each is keyed by the partition file's path, size and modification time,
so a re-ingested capture is read again; one capture is held at a time, so memory stays bounded."""
import copy
import os

import polars as pl

from fleetscope.ingest.trace_timings import capture_timings
from fleetscope.warehouse import Warehouse, partition_filename

_EVENTS: dict = {}   # (file identity) -> trace_events frame, at most one capture
_DERIVED: dict = {}  # (file identity, layout, need_ops) -> (timings, notes), at most two


def _identity(wh: Warehouse, table: str, key: str):
    p = wh.table_dir(table) / f"{partition_filename(key)}.parquet"
    try:
        st = os.stat(p)
    except OSError:
        return None
    return (str(p), st.st_size, st.st_mtime_ns)


def capture_events(wh: Warehouse, key: str, columns: list[str] | None = None) -> pl.DataFrame:
    """The capture's trace_events (or some of its columns), read once per process."""
    ident = _identity(wh, "trace_events", key)
    if ident is None:
        return wh.read("trace_events", partitions=[key], columns=columns)
    if ident not in _EVENTS:
        _EVENTS.clear()
        _DERIVED.clear()
        _EVENTS[ident] = wh.read("trace_events", partitions=[key])
    ev = _EVENTS[ident]
    return ev.select(columns) if columns else ev


def remember_events(wh: Warehouse, key: str, events: pl.DataFrame | None) -> None:
    """Hand the frame just written as the capture's trace_events partition to later readers in this process."""
    ident = _identity(wh, "trace_events", key)
    _EVENTS.clear()
    _DERIVED.clear()
    if ident is not None and events is not None and events.height:
        _EVENTS[ident] = events


_INFO: dict = {}  # (the captures and capture_ranks partition files' identities) -> capture_info, one capture


def capture_info(wh: Warehouse, key: str) -> dict:
    """The capture's job id, layout, start and trace files; read once per process for the capture's analyses
    (each read opens a DuckDB connection: tens of ms), again when either partition changed."""
    ident = (_identity(wh, "captures", key), _identity(wh, "capture_ranks", key), key)
    if ident[0] is None or ident not in _INFO:
        info = _capture_info(wh, key)
        if ident[0] is None:
            return info
        _INFO.clear()
        _INFO[ident] = info
    return copy.deepcopy(_INFO[ident])


def _capture_info(wh: Warehouse, key: str) -> dict:
    cap = wh.read("captures", partitions=[key])
    info = cap.to_dicts()[0] if cap.height else {"capture_id": key}
    layout = {k: info[k] for k in ("dp", "pp", "tp", "vpp", "world_size") if info.get(k) is not None}
    if layout and key in wh.partitions("capture_ranks"):  # each rank's place (the traces' layout, fleetscope.traces.layout)
        places = wh.read("capture_ranks", partitions=[key], columns=["rank", "stage", "dp_rank", "tp_rank"]).drop_nulls("stage")
        if places.height:
            layout["ranks"] = {int(r): (s, d, t) for r, s, d, t in places.iter_rows()}
    return {"job_id": info.get("job_id") or key, "layout": layout or None, "start_ns": info.get("start_ns"),
            "n_trace_files": info.get("n_trace_files") or 0, "notes": info.get("notes")}


def job_history(wh: Warehouse, key: str, job_id: str, start_ns: int | None, table: str, limit: int = 8) -> pl.DataFrame | None:
    """The table's rows of the job's earlier captures (the newest `limit` that started before this
    one): the job's history an analysis learns its expectations from. None when there is none."""
    if start_ns is None or not wh.partitions(table):
        return None
    caps = wh.read("captures", columns=["capture_id", "job_id", "start_ns"])
    if "start_ns" not in caps.columns:
        return None
    earlier = caps.filter((pl.col("job_id") == job_id) & (pl.col("capture_id") != key) & (pl.col("start_ns") < start_ns))
    keys = earlier.sort("start_ns", descending=True).head(limit)["capture_id"].to_list()
    keys = [k for k in keys if k in set(wh.partitions(table))]
    return wh.read(table, partitions=keys) if keys else None


def capture_frames(wh: Warehouse, key: str, info: dict, ops: str | None = None,
                   traces: bool = False) -> tuple[pl.DataFrame, pl.DataFrame | None, list[str]]:
    """(timings the analyses read, the capture's trace_events when read, notes): the landed timings,
    completed from the capture's traces (fleetscope.ingest.trace_timings): all rows for a trace-only
    capture; op rows derived from the traces when ops="missing" and the timings have none, or
    ops="trace_only" and there are no timings at all (the traces cover a few steps: they must not
    stand for a whole window the tracer timed). `traces`: return the trace_events too."""
    t = wh.read("timings", partitions=[key])
    lacks_ops = "kind" not in t.columns or t.filter(pl.col("kind") == "op").height == 0
    need_ops = (ops == "missing" and lacks_ops) or (ops == "trace_only" and t.height == 0)
    ev = None
    if info.get("n_trace_files") and (t.height == 0 or need_ops or traces):
        ev = capture_events(wh, key)
    if t.height == 0 and ev is not None:  # a trace-only capture: derived once for every analysis
        dk = (_identity(wh, "trace_events", key), repr(info.get("layout")), need_ops)
        if dk not in _DERIVED:
            if len(_DERIVED) > 1:
                _DERIVED.clear()
            _DERIVED[dk] = capture_timings(t, ev, info.get("layout"), need_ops=need_ops)
        t, notes = _DERIVED[dk]
        return t, ev, list(notes)
    t, notes = capture_timings(t, ev, info.get("layout"), need_ops=need_ops)
    return t, ev, notes


def capture_hw(wh: Warehouse, frame: pl.DataFrame, start_col: str, end_col: str) -> pl.DataFrame | None:
    """hw samples within the capture's time span (+/- 1 s); None when there are none."""
    if frame.height == 0 or not wh.partitions("hw"):
        return None
    lo, hi = frame[start_col].min(), frame[end_col].max()
    hw = wh.read("hw", where=f"ts_ns BETWEEN {lo - 1_000_000_000} AND {hi + 1_000_000_000}")
    return hw if hw.height else None
