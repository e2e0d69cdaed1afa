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
                 margin_s: int = MARGIN_S, config=None, timings: dict | None = None, flush: bool = False) -> dict[str, pl.DataFrame]:
    """The wiring's way over a span: one analyze_window per window in time order (its flows plus a
    margin before it, the pair rates and localized causes of the earlier windows as history), tables
    concatenated; window
    ids as fleetscope.ingest.windows names them. With `flush`, the window after the data runs too
    (on its margin alone): a step is claimed by the window after its closing boundary plus a guard
    (fleetscope.flows.timelines), so a recording's last steps belong to the window that comes after
    it, as the next scheduled window would claim them while the fleet goes on."""
    from fleetscope.flows import analyze_window
    from fleetscope.flows.network import prior_suspects
    from fleetscope.ingest.windows import NS, window_id

    w = window_s * NS
    first = span[0] // w * w
    out: dict[str, list] = {}
    notes: list[str] = []
    last = (span[1] - 1) // w * w
    for ws in range(first, last + (2 * w if flush else w), w):
        we = ws + w
        f = flows.filter((pl.col("start_ns") >= ws - margin_s * NS) & (pl.col("start_ns") < we))
        if f.filter(pl.col("start_ns") >= ws).height == 0 and not (flush and ws > last and f.height):
            continue
        tm: dict = {}
        hist = [h for h in out.get("flow_pair_rates", []) if h.height and h["window_start_ns"][0] >= ws - HISTORY_S * NS]
        prev = [v for v in out.get("anomaly_verdicts", []) if v.height and v["start_ns"].max() >= ws - HISTORY_S * NS]
        t = analyze_window(f, topo, ws, we, config=config, window_id=window_id(ws, window_s), timings=tm,
                           history=pl.concat(hist) if hist else None,
                           suspects=prior_suspects(pl.concat(prev, how="diagonal_relaxed") if prev else None))
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


def score(tables: dict, truth: dict, step_span: tuple[int, int] | None = None, flows: pl.DataFrame | None = None) -> dict:
    """fleetscope.sim.scoring over the tables; steps scored on the true steps ending inside
    step_span (default: the whole truth) against reconstructed steps inside it. With `flows`,
    steps are scored on the wire's clock (scoring.wire_steps: a recording's script logs its steps
    after the last byte arrived) and the script's clock is kept as `*_script`."""
    from fleetscope.sim import scoring as sc

    tr = dict(truth)
    script = tr["steps"]
    if flows is not None and tr["steps"].height:
        tr["steps"] = sc.wire_steps(tr["steps"], tr["pairs"], flows)
    out = sc.score_tables({k: v for k, v in tables.items() if isinstance(v, pl.DataFrame)}, tr)
    st = tables.get("step_timelines", pl.DataFrame())
    st_ = st if st.height else pl.DataFrame(schema={"ip": pl.Utf8, "start_ns": pl.Int64, "end_ns": pl.Int64})
    if step_span is not None:
        ts = tr["steps"].filter((pl.col("end_ns") >= step_span[0]) & (pl.col("end_ns") < step_span[1]))
        out.update(sc.score_steps(st_, ts, 0.01, step_span, tr["jobs"]))
    if flows is not None:
        span = step_span or tr.get("window")
        ts = script if span is None else script.filter((pl.col("end_ns") >= span[0]) & (pl.col("end_ns") < span[1]))
        out.update({f"{k}_script": v for k, v in sc.score_steps(st_, ts, 0.01, span, tr["jobs"]).items()})
    return out


def truth_window(gt: Path) -> tuple[int, int]:
    return tuple(json.loads((Path(gt) / "summary.json").read_text())["window"])
