"""Lightweight tracer timings (docs/CONTRACT.md 1.4), and ByteDance StragglerAnalysis per-op traces
(trace-*.parquet + meta-*.yaml, times in seconds) normalized into the same table."""
from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import yaml

from fleetscope.ingest.tabular import IngestError, IngestResult, ingest_table, read_table_file, ROW
from fleetscope.schemas.landing import TIMINGS

TIMING_SUFFIXES = (".parquet", ".jsonl", ".jsonl.gz")
STRAGGLER_COLUMNS = {"dp_rank", "stage", "rank", "step", "optype", "start_ts", "duration"}
_NS = 1_000_000_000


def is_straggler_frame(columns) -> bool:
    return STRAGGLER_COLUMNS <= set(columns)


def _straggler_to_contract(df: pl.DataFrame) -> pl.DataFrame:
    def opt(c):
        return pl.when(pl.col(c).cast(pl.Int64) < 0).then(None).otherwise(pl.col(c)) if c in df.columns else pl.lit(None)
    start = (pl.col("start_ts").cast(pl.Float64) * _NS).round().cast(pl.Int64)
    dur = (pl.col("duration").cast(pl.Float64) * _NS).round().cast(pl.Int64)
    return df.select(
        pl.col("rank"), pl.lit("op").alias("kind"), pl.col("optype").cast(pl.Utf8).alias("name"),
        start.alias("issue_ns"), start.alias("start_ns"), (start + dur).alias("end_ns"),
        pl.col("step"), pl.col("stage"), pl.col("dp_rank"),
        opt("mb_id").alias("microbatch"), opt("mc").alias("model_chunk"),
        pl.col(ROW),
    )


def _normalize(df: pl.DataFrame) -> pl.DataFrame:
    if "duration_ns" not in df.columns:
        df = df.with_columns(duration_ns=pl.col("end_ns") - pl.col("start_ns"))
    if "issue_ns" in df.columns:
        df = df.with_columns(issue_ns=pl.coalesce("issue_ns", "start_ns"))
    return df


def read_timings_file(path: Path | str, capture_id: str) -> IngestResult:
    path = Path(path)
    frame, rej = read_table_file(path)
    if is_straggler_frame(frame.columns):
        frame = _straggler_to_contract(frame)
    elif frame.height and "end_ns" not in frame.columns:
        raise IngestError(f"timings need start_ns and end_ns (or the StragglerAnalysis columns {sorted(STRAGGLER_COLUMNS)}); found {sorted(set(frame.columns) - {ROW})}")
    return ingest_table(path, TIMINGS, required=["rank", "kind", "name", "start_ns", "end_ns"], normalize=_normalize,
                        constants={"capture_id": capture_id, "source_file": path.name}, raw=(frame, rej))


def read_capture_layout(folder: Path | str) -> dict:
    """Parallel layout from capture.json {"job_id", "note", "parallel": {...}} or a StragglerAnalysis
    meta-*.yaml; keys job_id, note, dp, pp, tp, vpp, world_size (missing ones absent)."""
    folder = Path(folder)
    out: dict = {}
    cj = folder / "capture.json"
    if cj.exists():
        try:
            meta = json.loads(cj.read_text())
        except ValueError as exc:
            raise IngestError(f"capture.json is not valid JSON ({exc})") from exc
        out.update({k: meta[k] for k in ("job_id", "note") if k in meta})
        par = meta.get("parallel") or {}
        out.update({k: int(par[k]) for k in ("dp", "pp", "tp", "vpp", "world_size") if k in par})
    for m in sorted(folder.glob("meta-*.yaml")):
        meta = yaml.safe_load(m.read_text()) or {}
        for src, dst in (("dp_size", "dp"), ("pp_size", "pp"), ("tp_size", "tp"), ("vpp_size", "vpp"), ("world_size", "world_size")):
            if src in meta and dst not in out:
                out[dst] = int(meta[src])
    return out


def timing_files(folder: Path) -> list[Path]:
    return sorted(p for p in Path(folder).iterdir() if p.is_file() and p.name.endswith(TIMING_SUFFIXES))


def read_timings(path: Path | str, capture_id: str | None = None) -> pl.DataFrame:
    """Convenience for analyses and tests: a file or a capture folder -> the validated timings
    frame (rejected rows are dropped here; the platform's ingestion asset quarantines them)."""
    path = Path(path)
    files = timing_files(path) if path.is_dir() else [path]
    cap = capture_id or (path.name if path.is_dir() else path.parent.name)
    frames = [read_timings_file(f, cap).kept for f in files]
    if not frames:
        raise IngestError(f"no timing files ({', '.join(TIMING_SUFFIXES)}) in {path}")
    return pl.concat(frames)

