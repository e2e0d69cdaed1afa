"""Settings of the flow analytics (all configurable; defaults documented in docs/figures/flows.md)."""
from __future__ import annotations

from dataclasses import dataclass, field

from fleetscope.flows.changepoint import SplitParams


@dataclass(frozen=True)
class FlowConfig:
    split: SplitParams = field(default_factory=SplitParams)
    # a pair is job traffic (periodic) with at least this many flows of recurring sizes; fewer is
    # aperiodic background (control, one-off copies) and never creates or merges jobs
    min_pair_flows: int = 4
    # a training message (an activation, a gradient chunk) carries tens of KB to MBs; smaller flows
    # are control, heartbeats, probes: they never make a pair job traffic nor delimit a step
    min_data_bytes: int = 16_384
    # an address talking to far more peers than its peers do (storage, monitoring, a probe server)
    # is a service, not a GPU of a job: its pairs never join or bridge jobs
    hub_factor: float = 4.0
    hub_min_peers: int = 8
    # a job pair carries at least this share of the bytes of each end's biggest pair (pipeline
    # activations are a few tenths of a percent to tens of percent of a ring's gradients; a
    # monitoring scrape or a heartbeat a millionth to a ten-thousandth)
    min_pair_share: float = 0.001
    size_tol: float = 0.01  # flow sizes within 1 % are one size
    min_size_share: float = 0.02  # a size counts when >= 2 % of the pair's flows have it
    # two cross-machine clusters sharing hosts are one job only when they step in lockstep: at least
    # sync_min_share of one's step ends lie within sync_tol_ns of the other's (jobs.lockstep_pairs)
    sync_tol_ns: int = 500_000
    sync_min_share: float = 0.5
    # ... or they repeat with one period (within period_tol) and phase (cross-correlation of their flow
    # starts highest within phase_tol of a period around zero lag: jobs.phase_locked_pairs)
    lockstep_slice_ns: int = 20_000_000_000  # flow starts compared over this much of the window
    period_tol: float = 0.005
    phase_tol: float = 0.05
    # comm types (comm_types module doc): the false-label probability the window's timing tests may
    # spend over all its pairs (each pair's bar is the Bonferroni z of it)
    label_alpha: float = 0.01
    # a step belongs to the window holding its closing boundary + this guard, longer than half of any
    # step period (timelines module doc); the window margin must exceed 2 periods + the guard
    edge_guard_ns: int = 6_000_000_000
    # the shortest step period looked for (autocorrelation lags below it are within-step structure)
    min_period_ns: int = 20_000_000
    # a reconstructed step shorter than this share of the ip's median step is a split inside a DP
    # phase and is merged into the step before it
    min_step_frac: float = 0.5
    # verdicts: robust k-sigma (median + k * 1.4826 MAD) with a relative floor so that tiny jitter
    # on a perfectly regular fleet is not an anomaly
    k_sigma: float = 3.0
    min_rel_excess: float = 0.10
    min_steps_for_verdict: int = 2
    # false-alarm budget per detector: the bars of its tests come from it (Bonferroni over the
    # window's tests, fleetscope.flows.stats), not from a fixed k-sigma
    fa_per_job_hour: float = 0.01
    # cross-step: rolling mean over this many steps (a sustained slowdown, not one long step), a
    # scale floor (share of the step) for perfectly regular jobs, warm-up steps after a launch, and
    # the quiet time before a job's first flow that makes it a launch
    step_run: int = 5
    max_rel_spread: float = 0.25  # a typical step lies within this share of the job's median step
    min_typical: float = 0.6  # fewer typical steps: not reconstructed reliably, not judged
    min_rel_scale: float = 0.01
    warmup_steps: int = 2
    launch_quiet_ns: int = 5_000_000_000
    # switch over-subscription: max concurrent DP flows a switch carries, when the operator states it
    # (no default: a nominal capacity is not something the flows can tell)
    switch_dp_flow_capacity: int | None = None
    # network localization (network module doc): time bins, min flows per (candidate, bin), min peers
    # of a flow for a peer baseline, min rate drop that matters, most causes named per window
    diag_bin_ns: int = 10_000_000_000
    min_flows_per_cell: int = 8
    min_peer_flows: int = 4
    min_bw_drop: float = 0.25
    max_causes: int = 8
    min_slow_share: float = 0.1  # a candidate whose slow flows are >= this share is tested too
    stall_ratio: float = 0.1  # a flow under this share of its peers' rate stalled (a link down)
    # slow GPU from PP timing: receive-to-send lag >= ratio x the fastest DP peer's, and the excess
    # >= this share of the step
    pp_lag_ratio: float = 2.0
    pp_lag_min_share: float = 0.02
