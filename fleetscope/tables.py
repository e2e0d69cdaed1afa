"""Every warehouse table and its pandera schema, in one explicit list (docs/CONTRACT.md section 2
names the public ones; the rest are additions). The warehouse creates an empty placeholder for each,
so every DuckDB view exists, and SQL over it works, before the first row lands."""
from __future__ import annotations

import pandera.polars as pa

from fleetscope.findings import problems, verdicts
from fleetscope.flows import schemas as flows
from fleetscope.ingest.captures import CAPTURE_RANKS
from fleetscope.perftracker import schemas as perftracker
from fleetscope.prism import schemas as prism
from fleetscope.schemas import landing
from fleetscope.traces import schemas as traces
from fleetscope.xputimer import schemas as xputimer

TABLES: dict[str, pa.DataFrameSchema] = {
    # landing -> ingest
    "topology": landing.TOPOLOGY,
    "flows": landing.FLOWS,
    "timings": landing.TIMINGS,
    "hw": landing.HW,
    "captures": landing.CAPTURES,
    "capture_ranks": CAPTURE_RANKS,
    "stacks": landing.STACKS,
    "ring_progress": landing.RING,
    "collective_progress": landing.COLLECTIVE_PROGRESS,
    "incidents": landing.INCIDENTS,
    "rejected_records": landing.REJECTED,
    "landed_files": landing.LANDED,
    "trace_events": landing.TRACE_EVENTS,
    "trace_files": landing.TRACE_FILES,
    # flows (LLMPrism)
    "jobs": flows.JOBS,
    "job_clusters": flows.JOB_CLUSTERS,
    "comm_pairs": flows.COMM_PAIRS,
    "step_timelines": flows.STEP_TIMELINES,
    "flow_background": flows.FLOW_BACKGROUND,
    "flow_pair_rates": flows.FLOW_PAIR_RATES,
    # traces (Lumos)
    "trace_collectives": traces.TRACE_COLLECTIVES,
    "trace_iterations": traces.TRACE_ITERATIONS,
    "trace_syncs": traces.TRACE_SYNCS,
    "graph_tasks": traces.GRAPH_TASKS,
    "graph_edges": traces.GRAPH_EDGES,
    "replays": traces.REPLAYS,
    "replay_sm_util": traces.REPLAY_SM_UTIL,
    "whatif": traces.WHATIF,
    # perftracker
    "behavior_patterns": perftracker.BEHAVIOR_PATTERNS,
    # xputimer
    "xputimer_step_throughput": xputimer.STEP_THROUGHPUT,
    "xputimer_job_throughput": xputimer.JOB_THROUGHPUT,
    "xputimer_kernel_flops": xputimer.KERNEL_FLOPS,
    "xputimer_comm_instances": xputimer.COMM_INSTANCES,
    "xputimer_comm_bandwidth": xputimer.COMM_BANDWIDTH,
    "xputimer_issue_latency": xputimer.ISSUE_LATENCY,
    "xputimer_issue_latency_summary": xputimer.ISSUE_LATENCY_SUMMARY,
    "xputimer_void": xputimer.VOID,
    "xputimer_stage_metrics": xputimer.STAGE_METRICS,
    "xputimer_iterations": xputimer.ITERATIONS,
    "xputimer_degradations": xputimer.DEGRADATIONS,
    "xputimer_hang_ranks": xputimer.HANG_RANKS,
    "xputimer_hang_collectives": xputimer.HANG_COLLECTIVES,
    # prism
    "variability_models": prism.VARIABILITY_MODELS,
    "variability_hw_correlation": prism.HW_CORRELATION,
    "step_forecasts": prism.STEP_FORECASTS,
    "step_forecast_details": prism.SCENARIO_DETAILS,
    "straggler_summary": prism.STRAGGLER_SUMMARY,
    "straggler_attribution": prism.STRAGGLER_ATTRIBUTION,
    "straggler_slowdown": prism.STRAGGLER_SLOWDOWN,
    "straggler_causes": prism.STRAGGLER_CAUSES,
    # verdicts and what people read
    "anomaly_verdicts": verdicts.VERDICTS,
    "problems": problems.PROBLEMS,
    "problem_members": problems.PROBLEM_MEMBERS,
}
