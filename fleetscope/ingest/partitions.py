"""Ingest one registered partition (a landed file, a capture folder, an incident) into the
warehouse: kept rows to the kind's table, rejected rows and files to rejected_records. Plain
functions: the Dagster assets call them, and so can a person or a test."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import polars as pl

from fleetscope.ingest.flows import read_flows
from fleetscope.ingest.hw import read_hw
from fleetscope.ingest.tabular import IngestError, IngestResult
from fleetscope.ingest.timings import read_capture_layout, read_timings_file
from fleetscope.ingest.topology import read_topology
from fleetscope.ingest.landing import LandedFile, dedupe_folder_files, folder_files
from fleetscope.schemas.base import conform
from fleetscope.schemas.landing import (
    CAPTURES, COLLECTIVE_PROGRESS, FLOWS, HW, INCIDENTS, REJECTED, RING, STACKS, TIMINGS, TOPOLOGY, TRACE_FILES)
from fleetscope.warehouse import Warehouse


@dataclass
class IngestSummary:
    table: str
    key: str
    rows_in: int = 0
    rows_kept: int = 0
    rows_rejected: int = 0
    files_in: int = 0
    files_rejected: int = 0
    notes: list[str] = field(default_factory=list)
    frame: pl.DataFrame | None = None          # what was written (for previews / downstream)
    rejected: pl.DataFrame | None = None
    extra: dict = field(default_factory=dict)
    tables: dict[str, pl.DataFrame] = field(default_factory=dict)  # other tables written beside `table`

    def add(self, res: IngestResult) -> None:
        self.rows_in += res.n_read
        self.rows_kept += res.kept.height
        self.rows_rejected += res.rejected.height
        self.notes += res.notes


def _rejections(kind: str, key: str, rel: str, rows: pl.DataFrame | None = None, file_reason: str | None = None, sha: str | None = None) -> pl.DataFrame:
    now = time.time_ns()
    if file_reason is not None:
        df = pl.DataFrame([dict(source_file=rel, source_kind=kind, row_number=None, reason=file_reason,
                                partition_key=key, content_sha256=sha, detected_ns=now)])
    else:
        df = rows.select(pl.lit(rel).alias("source_file"), pl.lit(kind).alias("source_kind"), pl.col("row_number"),
                         pl.col("reason"), pl.lit(key).alias("partition_key"), pl.lit(sha, dtype=pl.Utf8).alias("content_sha256"),
                         pl.lit(now).alias("detected_ns"))
    return REJECTED.validate(conform(df, REJECTED))


def _write_rejected(wh: Warehouse, kind: str, key: str, frames: list[pl.DataFrame]) -> pl.DataFrame:
    frames = [f for f in frames if f is not None and f.height]
    part = f"{kind}__{key}"
    if not frames:
        wh.delete_partition("rejected_records", part)  # a fixed rerun clears old rejections
        return conform(pl.DataFrame(), REJECTED)
    rej = pl.concat(frames)
    wh.write_partition("rejected_records", part, rej)
    return rej


def landed_path(wh: Warehouse, landing: Path, key: str) -> tuple[Path, str, str]:
    """Where a file partition's content is: (absolute path, relative path, sha256)."""
    df = wh.read("landed_files", where=f"partition_key = '{key}' AND status = 'registered'")
    if df.height == 0:
        raise IngestError(f"partition {key} is not registered in landed_files: run the landing sensor or `fleetscope run` first")
    rel = df["path"][0]
    return Path(landing) / rel, rel, df["content_sha256"][0]


READERS: dict[str, tuple[str, Callable[[Path], IngestResult], object]] = {
    "topology": ("topology", read_topology, TOPOLOGY),
    "flows": ("flows", read_flows, FLOWS),
    "hw": ("hw", read_hw, HW),
}


def ingest_file(wh: Warehouse, landing: Path, kind: str, key: str) -> IngestSummary:
    table, reader, schema = READERS[kind]
    path, rel, sha = landed_path(wh, landing, key)
    s = IngestSummary(table, key, files_in=1)
    rejected = []
    try:
        res = reader(path)
        s.add(res)
        rejected.append(_rejections(kind, key, rel, res.rejected, sha=sha))
        kept = res.kept.with_columns(pl.lit(rel).alias("source_file"))
        wh.write_partition(table, key, kept)
        s.frame = kept
    except (IngestError, FileNotFoundError) as exc:
        s.files_rejected = 1
        rejected.append(_rejections(kind, key, rel, file_reason=str(exc), sha=sha))
        wh.delete_partition(table, key)
        s.frame = conform(pl.DataFrame(), schema)
    s.rejected = _write_rejected(wh, kind, key, rejected)
    return s


def _folder(landing: Path, kind: str, key: str) -> tuple[list[LandedFile], list[pl.DataFrame]]:
    files, dups = dedupe_folder_files(folder_files(landing, kind, key))
    rej = [_rejections(kind, key, d.rel, file_reason=f"same content as {orig.rel} in this folder: read once, this copy skipped", sha=d.sha256)
           for d, orig in dups]
    return files, rej


def ingest_timings_capture(wh: Warehouse, landing: Path, key: str) -> IngestSummary:
    files, rejected = _folder(landing, "timings", key)
    s = IngestSummary("timings", key)
    data_files = [f for f in files if f.path.name.endswith((".parquet", ".jsonl", ".jsonl.gz"))]
    s.files_in = len(data_files)
    frames = []
    for f in data_files:
        try:
            res = read_timings_file(f.path, key)
            s.add(res)
            frames.append(res.kept.with_columns(pl.lit(f.rel).alias("source_file")))
            rejected.append(_rejections("timings", key, f.rel, res.rejected, sha=f.sha256))
        except IngestError as exc:
            s.files_rejected += 1
            rejected.append(_rejections("timings", key, f.rel, file_reason=str(exc), sha=f.sha256))
    if frames:
        df = TIMINGS.validate(pl.concat(frames))
        wh.write_partition("timings", key, df)
        s.frame = df
    else:
        wh.delete_partition("timings", key)
        s.frame = conform(pl.DataFrame(), TIMINGS)
    s.rejected = _write_rejected(wh, "timings", key, rejected)
    return s


def capture_span(wh: Warehouse, key: str) -> tuple[int | None, int | None]:
    """(first, last) ns of a capture: its trace events and timings as ingested (parquet statistics)."""
    lo, hi = [], []
    for table, a, b in (("trace_events", "ts_ns", "end_ns"), ("timings", "start_ns", "end_ns")):
        if key in wh.partitions(table):
            r = wh.read(table, partitions=[key], columns=[a, b]).select(pl.col(a).min(), pl.col(b).max()).row(0)
            lo += [r[0]] if r[0] is not None else []
            hi += [r[1]] if r[1] is not None else []
    return (min(lo) if lo else None), (max(hi) if hi else None)


def declared_layout(landing: Path, key: str) -> dict:
    """What the capture's capture.json (or StragglerAnalysis meta) declares: job_id, note, dp, pp, tp, vpp, world_size."""
    layout = {}
    for kind in ("timings", "traces"):
        folder = Path(landing) / kind / key
        if folder.is_dir():
            try:
                layout = {**read_capture_layout(folder), **layout}
            except IngestError:
                pass
    return layout


def capture_record(landing: Path, key: str, n_trace: int, n_timing: int, span: tuple[int | None, int | None] = (None, None),
                   derived: dict | None = None) -> pl.DataFrame:
    """The captures row: the declared layout (capture.json) over the one derived from the traces
    (`derived`: dp, pp, tp, world_size, layout_source, notes; fleetscope.traces.layout)."""
    layout = {**{k: v for k, v in (derived or {}).items() if v is not None}, **declared_layout(landing, key)}
    row = dict(capture_id=key, n_trace_files=n_trace, n_timing_files=n_timing, start_ns=span[0], end_ns=span[1], **layout)
    return CAPTURES.validate(conform(pl.DataFrame([row]), CAPTURES))


def ingest_traces_capture(wh: Warehouse, landing: Path, key: str) -> IngestSummary:
    """Profiler traces of one capture -> trace_events (parsing by fleetscope.ingest.traces, the files
    spread over the cores)."""
    from fleetscope.ingest.traces import TraceError, read_traces

    files, rejected = _folder(landing, "traces", key)
    files = [f for f in files if f.path.name.endswith((".json", ".json.gz")) and f.path.name != "capture.json"]
    s = IngestSummary("trace_events", key, files_in=len(files))
    frames, ranks_seen, metas = [], {}, []
    for f, tf in zip(files, read_traces([f.path for f in files], key)):
        try:
            if isinstance(tf, Exception):
                raise tf
            ev = tf.events.with_columns(pl.lit(f.rel).alias("source_file"))
            rank = int(tf.meta["rank"])
            if rank in ranks_seen:
                raise TraceError(f"rank {rank} already read from {ranks_seen[rank]}: two different traces claim the same rank; rename one or put it in its own capture folder")
            ranks_seen[rank] = f.rel
            frames.append(ev)
            metas.append(_trace_file_row(key, f.rel, tf.meta, ev.height))
            s.rows_in += ev.height
            s.rows_kept += ev.height
        except (TraceError, OSError, ValueError) as exc:
            s.files_rejected += 1
            rejected.append(_rejections("traces", key, f.rel, file_reason=str(exc), sha=f.sha256))
    tf_rows = TRACE_FILES.validate(conform(pl.DataFrame(metas, infer_schema_length=None), TRACE_FILES))
    s.tables["trace_files"] = tf_rows
    if frames:
        df = pl.concat(frames, how="diagonal_relaxed", rechunk=False)  # no second copy of a big capture
        wh.write_partition("trace_events", key, df)
        wh.write_partition("trace_files", key, tf_rows)
        s.frame = df
    else:
        wh.delete_partition("trace_events", key)
        wh.delete_partition("trace_files", key)
        s.frame = None
    s.rejected = _write_rejected(wh, "traces", key, rejected)
    return s


def _trace_file_row(key: str, rel: str, meta: dict, n_events: int) -> dict:
    """trace_files row of one read trace: its rank and what its distributedInfo says about the job."""
    dist = meta.get("distributedInfo") or {}
    other = meta.get("other_keys") or {}
    ws = dist.get("world_size")
    pgc = dist.get("pg_config")
    host = other.get("host_name")
    return {"capture_id": key, "rank": meta["rank"], "source_file": rel, "rank_source": meta.get("rank_source") or "",
            "world_size": ws if isinstance(ws, int) else None, "backend": dist.get("backend") if isinstance(dist.get("backend"), str) else None,
            "pg_config": json.dumps(pgc) if isinstance(pgc, list) and pgc else None,
            "host_name": host if isinstance(host, str) else None, "is_gpu": bool(meta.get("is_gpu")), "n_events": n_events}


def ingest_incident(wh: Warehouse, landing: Path, key: str) -> IngestSummary:
    """incidents/<key>.json (a request) and stacks/<key>/ (dumps of a hang), whichever exist."""
    s = IngestSummary("incidents", key)
    rejected: list[pl.DataFrame] = []
    req = None
    for p in sorted((Path(landing) / "incidents").glob("*.json")) if (Path(landing) / "incidents").is_dir() else []:
        from fleetscope.ingest.landing import file_key, sha256_file
        sha = sha256_file(p)
        if file_key(p, sha) == key or p.stem == key:
            req = (p, sha)
            break
    if req is not None:
        p, sha = req
        rel = str(p.relative_to(landing))
        s.files_in += 1
        try:
            obj = json.loads(p.read_text())
            if not isinstance(obj, dict):
                raise ValueError("top level is not a JSON object")
            if obj.get("kind") not in ("slow", "hang"):
                raise ValueError(f"'kind' must be 'slow' or 'hang', got {obj.get('kind')!r}")
            row = {k: obj.get(k) for k in ("kind", "job_id", "ips", "hosts", "capture", "from_ns", "to_ns", "note")}
            row.update(incident_id=key, source_file=rel)
            df = INCIDENTS.validate(conform(pl.DataFrame([row], infer_schema_length=None), INCIDENTS))
            wh.write_partition("incidents", key, df)
            s.frame = df
            s.rows_in = s.rows_kept = 1
        except (ValueError, TypeError) as exc:
            s.files_rejected += 1
            s.rows_in, s.rows_rejected = 1, 1
            rejected.append(_rejections("incidents", key, rel, file_reason=f"incident request not usable: {exc}; see docs/CONTRACT.md 1.7", sha=sha))
    files, dup_rej = _folder(landing, "stacks", key)
    rejected += dup_rej
    stack_rows, ring_rows, progress = [], [], []
    import re

    from fleetscope.ingest.flight_recorder import FlightRecorderError, entries_frame, is_dump_name, read_dump
    for f in files:
        s.files_in += 1
        if is_dump_name(f.path.name):  # collective progress: a Flight Recorder dump or the tracer's
            try:
                ev, _ = entries_frame([read_dump(f.path)])
                progress.append(ev.with_columns(incident_id=pl.lit(key), source_file=pl.lit(f.rel)))
            except (FlightRecorderError, OSError, ValueError, TypeError, KeyError) as exc:
                s.files_rejected += 1
                rejected.append(_rejections("stacks", key, f.rel, file_reason=f"collective progress dump unusable ({exc}); expected "
                                            "a PyTorch Flight Recorder dump (JSON or pickle) or fr_rank<R>.json", sha=f.sha256))
            continue
        if f.path.name == "ring.json":
            try:
                ring = json.loads(f.path.read_text())
                for r in ring:
                    ring_rows.append(dict(incident_id=key, rank=r["rank"], peer=r["peer"], channel=r.get("channel"), step=r["step"], source_file=f.rel))
            except (ValueError, KeyError, TypeError) as exc:
                s.files_rejected += 1
                rejected.append(_rejections("stacks", key, f.rel, file_reason=f"ring.json unusable ({exc}); expected [{{rank, peer, channel, step}}]", sha=f.sha256))
            continue
        m = re.search(r"rank[-_]?(\d+)", f.path.name)
        if not m:
            s.files_rejected += 1
            rejected.append(_rejections("stacks", key, f.rel, file_reason="stack dump file name must contain the rank (rank<R>.txt)", sha=f.sha256))
            continue
        text = f.path.read_text(errors="replace")
        if not text.strip():
            s.files_rejected += 1
            rejected.append(_rejections("stacks", key, f.rel, file_reason="empty stack dump", sha=f.sha256))
            continue
        n_frames = sum(1 for line in text.splitlines() if line.strip().startswith(("File ", "Thread ")) or " (" in line)
        stack_rows.append(dict(incident_id=key, rank=int(m.group(1)), text=text, n_frames=n_frames, source_file=f.rel))
    if stack_rows:
        wh.write_partition("stacks", key, STACKS.validate(conform(pl.DataFrame(stack_rows), STACKS)))
    if ring_rows:
        wh.write_partition("ring_progress", key, RING.validate(conform(pl.DataFrame(ring_rows), RING)))
    if progress:
        cp = pl.concat(progress, how="vertical_relaxed")
        wh.write_partition("collective_progress", key, COLLECTIVE_PROGRESS.validate(conform(cp, COLLECTIVE_PROGRESS)))
    s.extra = {"stack_dumps": len(stack_rows), "ring_connections": len(ring_rows),
               "progress_entries": sum(p.height for p in progress)}
    s.rejected = _write_rejected(wh, "incidents", key, rejected)
    return s
