"""Ground-truth fleet simulator: model a multi-tenant LLM training fleet's execution (fabric, jobs,
1F1B pipelines, DP collectives, faults), then render it as a docs/CONTRACT.mdlanding folder plus ground
truth. `simulate(out_dir, ...)` is the entry point; fleetscope.sim.capture (a colleague's package)
renders profiler traces / timings / hw samples for sampled jobs when present."""
from fleetscope.sim.simulate import simulate  # noqa: F401

__all__ = ["simulate"]
