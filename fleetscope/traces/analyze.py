"""One call for the Dagster asset: trace_events of a capture -> every table fleetscope.traces derives."""
from __future__ import annotations

import polars as pl

from fleetscope.traces.findings import trace_verdicts
from fleetscope.traces.graph import build_graph
from fleetscope.traces.replay import replay
from fleetscope.traces.tables import trace_collectives, trace_iterations, trace_syncs
from fleetscope.traces.whatif import DEFAULT_SCENARIOS, predict


def analyze_capture(events: pl.DataFrame, capture_id: str | None = None, scenarios=DEFAULT_SCENARIOS,
                    job_id: str | None = None, chrome_trace_path=None) -> dict[str, pl.DataFrame]:
    """-> {trace_collectives, trace_iterations, trace_syncs, graph_tasks, graph_edges, replays,
    replay_sm_util, whatif, anomaly_verdicts}, each validated against its registered schema."""
    if events.height == 0:
        raise ValueError("analyze_capture: no trace events")
    g = build_graph(events, capture_id)
    r = replay(g)
    if chrome_trace_path is not None:  # the simulated timeline, for Perfetto / chrome://tracing
        r.chrome_trace(chrome_trace_path)
    w = predict(g, list(scenarios)) if scenarios else None
    out = {
        "trace_collectives": trace_collectives(events),
        "trace_iterations": trace_iterations(events),
        "trace_syncs": trace_syncs(events),
        "graph_tasks": g.tasks,
        "graph_edges": g.edges,
        "replays": r.replays,
        "replay_sm_util": r.sm_util,
        "anomaly_verdicts": trace_verdicts(r.replays, w, job_id=job_id),
    }
    if w is not None:
        out["whatif"] = w
    return out
