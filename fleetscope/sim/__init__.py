"""Ground-truth fleet simulator: model a multi-tenant LLM training fleet's execution (fabric, jobs,
1F1B pipelines, NCCL collectives, job life, faults) under conventions drawn per seed
(fleetscope.sim.conventions), then render it as a CONTRACT landing folder, as real collectors and
exporters write it, plus ground truth. `simulate(out_dir, ...)` is the entry point;
fleetscope.sim.scoring scores analysis tables against the truth (docs/SIMULATOR.md);
fleetscope.sim.capture (a colleague's package) renders profiler traces / timings / hw samples for
sampled jobs when present."""
from fleetscope.sim.simulate import simulate  # noqa: F401

__all__ = ["simulate"]
