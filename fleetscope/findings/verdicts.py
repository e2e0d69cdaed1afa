"""The one verdict table every detector writes (docs/CONTRACT.md section 2, anomaly_verdicts).

Detectors build rows with `make_verdicts`; ids are a stable hash of what identifies the finding,
so the same input always gives the same verdict ids (reruns replace, never duplicate)."""
from __future__ import annotations

import hashlib

import pandera.polars as pa
import polars as pl

from fleetscope.schemas.base import Table, conform

SCOPES = ["job", "step", "stage", "dp_group", "switch", "link", "host", "gpu", "rank", "function", "kernel"]
SEVERITIES = ["info", "warning", "critical"]
TEAMS = ["algorithm", "infrastructure", "operations"]

VERDICTS = pa.DataFrameSchema(
    {
        "verdict_id": pa.Column(pl.Utf8, unique=True),
        "detector": pa.Column(pl.Utf8),
        "scope": pa.Column(pl.Utf8, pa.Check.isin(SCOPES)),
        "subject": pa.Column(pl.Utf8),
        "job_id": pa.Column(pl.Utf8, nullable=True),
        "start_ns": pa.Column(pl.Int64, nullable=True),
        "end_ns": pa.Column(pl.Int64, nullable=True),
        "metric": pa.Column(pl.Utf8),
        "value": pa.Column(pl.Float64, nullable=True),
        "baseline": pa.Column(pl.Float64, nullable=True),
        "severity": pa.Column(pl.Utf8, pa.Check.isin(SEVERITIES)),
        "team": pa.Column(pl.Utf8, pa.Check.isin(TEAMS)),
        "explanation": pa.Column(pl.Utf8),
        # optional context (additions to the contract): where the evidence came from
        "window_id": pa.Column(pl.Utf8, nullable=True),
        "capture_id": pa.Column(pl.Utf8, nullable=True),
        "evidence": pa.Column(pl.Utf8, nullable=True),  # JSON with detector-specific details
    },
    strict=False,
)

_ID_PARTS = ["detector", "scope", "subject", "job_id", "window_id", "capture_id", "metric", "start_ns"]


def make_verdicts(rows: list[dict] | pl.DataFrame) -> pl.DataFrame:
    """Rows (dicts or a frame) with at least detector, scope, subject, metric, severity, team,
    explanation -> a conformed, validated verdict frame with stable verdict ids."""
    df = rows if isinstance(rows, pl.DataFrame) else pl.DataFrame(rows, infer_schema_length=None)
    if df.height == 0:
        return conform(pl.DataFrame(), VERDICTS)
    df = conform(df, VERDICTS)
    keys = df.select([pl.col(c).cast(pl.Utf8).fill_null("") for c in _ID_PARTS]).rows()
    ids = [hashlib.sha1("\x1f".join(k).encode()).hexdigest()[:16] for k in keys]
    df = df.with_columns(verdict_id=pl.Series(ids, dtype=pl.Utf8)).unique("verdict_id", keep="first", maintain_order=True)
    return VERDICTS.validate(df)


DECLARED = (
    Table("anomaly_verdicts", VERDICTS, "Every finding of every detector in one table (docs/CONTRACT.md section 2): the analyses "
          "each write their slice (flows_verdicts, traces_verdicts, ...); this page shows them all, worst first.", "slices"),
)
