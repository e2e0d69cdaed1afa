"""Lumos: execution graphs from profiler traces, replay and what-if analysis.

    read_trace / read_capture  -> trace_events            (fleetscope.ingest.traces)
    trace_collectives / trace_iterations / trace_syncs    (tables.py)
    build_graph                -> graph_tasks, graph_edges (graph.py)
    replay                     -> replays, replay_sm_util, Chrome trace (replay.py)
    predict                    -> whatif                   (whatif.py)
    trace_verdicts             -> anomaly_verdicts         (verdicts.py)
    analyze_capture            -> Analysis: all of the above for one capture (analyze.py)
"""
from fleetscope.traces.graph import Graph, build_graph  # noqa: F401
from fleetscope.ingest.traces import TraceError, TraceFile, read_capture, read_trace  # noqa: F401
from fleetscope.traces.replay import ReplayResult, export_chrome_trace, replay, simulate_graph  # noqa: F401
from fleetscope.traces.tables import trace_collectives, trace_iterations, trace_syncs  # noqa: F401
from fleetscope.traces.whatif import DEFAULT_SCENARIOS, fit_comm_model, predict  # noqa: F401
from fleetscope.traces.verdicts import trace_verdicts  # noqa: F401,E402
from fleetscope.traces.analyze import analyze_capture  # noqa: F401,E402
