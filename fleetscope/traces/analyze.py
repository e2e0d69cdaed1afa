"""One call per capture: trace_events -> the Analysis (fleetscope.analysis) with every table
fleetscope.traces derives, the trace verdicts, and the simulated timeline as a Chrome trace."""
from __future__ import annotations

import polars as pl

from fleetscope.analysis import Analysis, skipped
from fleetscope.traces.graph import build_graph
from fleetscope.traces.replay import chrome_trace_bytes, replay
from fleetscope.traces.tables import trace_collectives, trace_iterations, trace_syncs
from fleetscope.traces.verdicts import trace_verdicts
from fleetscope.traces.whatif import DEFAULT_SCENARIOS, comm_fit_notes, parallel_scenarios, predict


EXPORT_MAX_TASKS = 200_000  # tasks in the exported simulated timeline


def analyze_capture(events: pl.DataFrame, capture_id: str | None = None, scenarios=DEFAULT_SCENARIOS,
                    job_id: str | None = None, export_replay: bool = False, parallel: dict | None = None) -> Analysis:
    """-> tables trace_collectives, trace_iterations, trace_syncs, graph_tasks, graph_edges, replays,
    replay_sm_util, whatif (each validated against its schema) and the trace verdicts; with
    export_replay, the simulated timeline as artifact `replays/<capture>-simulated.json`. With the
    capture's layout (`parallel`: {dp, pp}, capture.json), also the what-ifs that rebuild the graph
    (DP degree, PP re-partition, layers; whatif.parallel_scenarios)."""
    if events.height == 0:
        return skipped("no profiler trace events in this capture")
    try:
        places = (parallel or {}).get("ranks") or {}
        g = build_graph(events, capture_id, stage_of_rank={int(r): int(v[0]) for r, v in places.items() if v[0] is not None} or None,
                        places={int(r): tuple(v) for r, v in places.items()} or None)
    except ValueError as exc:
        return skipped(f"could not build the execution graph: {exc}")
    r = replay(g)
    base = int(r.replays.group_by("rank").agg(pl.col("simulated_ns").mean())["simulated_ns"].max()) if r.replays.height else None
    cannot: list[str] = []  # what-ifs the capture cannot support, and why (said in the run summary)
    scen = list(scenarios or []) + parallel_scenarios(g, parallel, cannot)
    notes: list[str] = []
    parts = []
    for sc in scen:  # one by one: a what-if the capture cannot support does not take the others with it
        try:
            parts.append(predict(g, [sc], baseline_ns=base))
        except ValueError as exc:
            cannot.append(f"what-if {sc[0]} skipped: {exc}")
    w = pl.concat(parts, how="vertical_relaxed") if parts else None
    if w is not None and w.filter(pl.col("scenario").str.starts_with("dp_")).height:
        notes.extend(comm_fit_notes(g))
    tables = {
        "trace_collectives": trace_collectives(events),
        "trace_iterations": trace_iterations(events),
        "trace_syncs": trace_syncs(events),
        "graph_tasks": g.tasks,
        "graph_edges": g.edges,
        "replays": r.replays,
        "replay_sm_util": r.sm_util,
    }
    if w is not None:
        tables["whatif"] = w
    if r.replays.height:
        notes.append(f"replay mean absolute error {float(r.replays['error_pct'].abs().mean()):.2f} % over "
                     f"{r.replays.height} rank-iterations")
    artifacts = {}
    if export_replay:  # the simulated timeline, for Perfetto / chrome://tracing
        cap = capture_id or str(events["capture_id"][0])
        tk = r.tasks
        if tk.height > EXPORT_MAX_TASKS:  # the first iterations that fit: a bounded file, quick to write and open
            its = tk.drop_nulls("iteration").group_by("iteration").len().sort("iteration").with_columns(c=pl.col("len").cum_sum())
            keep = its.filter((pl.col("c") <= EXPORT_MAX_TASKS) | (pl.int_range(pl.len()) == 0))["iteration"]
            tk = tk.filter(pl.col("iteration").is_in(keep.implode()))
            notes.append(f"simulated timeline exported for {keep.len()} of {its.height} iterations ({tk.height} tasks)")
        artifacts[f"replays/{cap}-simulated.json"] = chrome_trace_bytes(tk)
    return Analysis(tables=tables, verdicts=trace_verdicts(r.replays, w, job_id=job_id), notes=notes + cannot, warnings=cannot,
                    artifacts=artifacts)
