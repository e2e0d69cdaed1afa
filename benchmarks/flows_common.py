"""Shared helpers of the flow benchmarks: load a landing folder the way the platform ingests it
(content-hashed: a file landing twice under two names counts once), run the window analysis the
way the wiring does (60 s windows with a 30 s margin), and score against ground truth with the
simulator's scorer (fleetscope.sim.scoring), which the analysis never sees."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import polars as pl

WINDOW_S = 60
MARGIN_S = 30
HISTORY_S = 3600  # as AnalysisSettings.pair_history_seconds


def load_landing(landing: Path) -> tuple[pl.DataFrame, pl.DataFrame | None, dict]:
    """(flows, topology or None, stats) through the platform ingestion (fleetscope.ingest)."""
    from fleetscope.ingest.flows import read_flows
    from fleetscope.ingest.tabular import IngestError
    from fleetscope.ingest.topology import read_topology

    landing = Path(landing)
    seen: set[str] = set()
    parts, rejected, dup, refused = [], 0, 0, []
    files = sorted(p for p in (landing / "flows").rglob("*") if p.is_file())
    for p in files:
        h = hashlib.sha256(p.read_bytes()).hexdigest()
        if h in seen:  # the platform registers files by content hash: a resent copy is ingested once
            dup += 1
            continue
        seen.add(h)
        try:
            r = read_flows(p)
        except IngestError as exc:
            refused.append(f"{p.name}: {exc}")
            continue
        parts.append(r.kept)
        rejected += r.rejected.height
    flows = pl.concat(parts, how="diagonal_relaxed") if parts else pl.DataFrame()
    topo_parts = []
    tdir = landing / "topology"
    for p in sorted(tdir.rglob("*")) if tdir.exists() else []:
        if p.is_file():
            try:
                topo_parts.append(read_topology(p).kept)
            except IngestError as exc:
                refused.append(f"{p.name}: {exc}")
    topo = pl.concat(topo_parts, how="diagonal_relaxed") if topo_parts else None
    if topo is not None:
        from fleetscope.ingest.topology import latest_topology

        topo = latest_topology(topo)
    return flows, topo, {"files": len(files), "duplicates": dup, "rejected_rows": rejected, "refused": refused,
                         "flows": flows.height}


def analyze_span(flows: pl.DataFrame, topo: pl.DataFrame | None, span: tuple[int, int], window_s: int = WINDOW_S,
                 margin_s: int = MARGIN_S, config=None, timings: dict | None = None) -> dict[str, pl.DataFrame]:
    """The wiring's way over a span: one analyze_window per window in time order (its flows plus a
    margin before it, the pair rates of the earlier windows as history), tables concatenated; window
    ids as fleetscope.ingest.windows names them."""
    from fleetscope.flows import analyze_window
    from fleetscope.ingest.windows import NS, window_id

    w = window_s * NS
    first = span[0] // w * w
    out: dict[str, list] = {}
    notes: list[str] = []
    for ws in range(first, span[1], w):
        we = ws + w
        f = flows.filter((pl.col("start_ns") >= ws - margin_s * NS) & (pl.col("start_ns") < we))
        if f.filter(pl.col("start_ns") >= ws).height == 0:
            continue
        tm: dict = {}
        hist = [h for h in out.get("flow_pair_rates", []) if h.height and h["window_start_ns"][0] >= ws - HISTORY_S * NS]
        t = analyze_window(f, topo, ws, we, config=config, window_id=window_id(ws, window_s), timings=tm,
                           history=pl.concat(hist) if hist else None)
        if timings is not None:
            for k, v in tm.items():
                timings[k] = timings.get(k, 0.0) + v
        for k, v in [*t.tables.items(), ("anomaly_verdicts", t.verdicts)]:
            out.setdefault(k, []).append(v)
        notes += [f"WARNING: {w}" for w in t.warnings] + [f"NOTE: {n}" for n in t.notes]
    tables = {k: pl.concat(v, how="diagonal_relaxed") for k, v in out.items()}
    tables["notes"] = notes
    return tables


def load_truth(gt: Path) -> dict:
    from fleetscope.sim.scoring import load_truth as _lt

    return _lt(gt)


def score(tables: dict, truth: dict, step_span: tuple[int, int] | None = None) -> dict:
    """fleetscope.sim.scoring over the tables; steps scored on the true steps ending inside
    step_span (default: the whole truth) against reconstructed steps inside it."""
    from fleetscope.sim import scoring as sc

    tr = dict(truth)
    out = sc.score_tables({k: v for k, v in tables.items() if isinstance(v, pl.DataFrame)}, tr)
    if step_span is not None:
        st = tables.get("step_timelines", pl.DataFrame())
        ts = tr["steps"].filter((pl.col("end_ns") >= step_span[0]) & (pl.col("end_ns") < step_span[1]))
        st_ = st if st.height else pl.DataFrame(schema={"ip": pl.Utf8, "start_ns": pl.Int64, "end_ns": pl.Int64})
        out.update(sc.score_steps(st_, ts, 0.01, step_span, tr["jobs"]))
    return out


def truth_window(gt: Path) -> tuple[int, int]:
    return tuple(json.loads((Path(gt) / "summary.json").read_text())["window"])
