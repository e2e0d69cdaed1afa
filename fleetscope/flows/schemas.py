"""Pandera schemas of the flow-analytics tables (docs/CONTRACT.md section 2: jobs, job_clusters, comm_pairs,
step_timelines). Contract columns come first; the rest are additions (evidence, spans)."""
from __future__ import annotations

import pandera.polars as pa
import polars as pl

from fleetscope.schemas.base import Table


COMM_TYPES = ["DP", "PP", "other"]

JOBS = pa.DataFrameSchema(
    {
        "window_id": pa.Column(pl.Utf8),
        "job_id": pa.Column(pl.Utf8),
        "n_gpus": pa.Column(pl.Int64, pa.Check.ge(1)),
        "n_hosts": pa.Column(pl.Int64, pa.Check.ge(0)),  # 0: no topology, hosts unknown
        # additions: when the job's traffic was seen inside the window (jobs starting/stopping)
        "first_ns": pa.Column(pl.Int64, nullable=True),
        "last_ns": pa.Column(pl.Int64, nullable=True),
        "n_flows": pa.Column(pl.Int64, pa.Check.ge(0)),
        "n_clusters": pa.Column(pl.Int64, pa.Check.ge(1)),  # cross-machine clusters merged into it
        "step_period_ns": pa.Column(pl.Int64, nullable=True),   # the median reconstructed step
        # a job whose traffic streams through its steps (FSDP: steps withheld): the period its flows
        # repeat with at the step's scale (flows.period.step_scale_period): its step, or one
        # microbatch of it where the step adds little to that pattern; null otherwise
        "repeat_period_ns": pa.Column(pl.Int64, nullable=True),
    },
    unique=["window_id", "job_id"],
)

JOB_CLUSTERS = pa.DataFrameSchema(
    {
        "window_id": pa.Column(pl.Utf8),
        "job_id": pa.Column(pl.Utf8),
        "ip": pa.Column(pl.Utf8),
        "host": pa.Column(pl.Utf8, nullable=True),  # null: no topology, hosts unknown
        "gpu": pa.Column(pl.Utf8, nullable=True),
        "cluster_id": pa.Column(pl.Int64),  # cross-machine cluster (before host-set merging)
    },
    unique=["window_id", "ip"],
)

COMM_PAIRS = pa.DataFrameSchema(
    {
        "window_id": pa.Column(pl.Utf8),
        "job_id": pa.Column(pl.Utf8),
        "ip_a": pa.Column(pl.Utf8),
        "ip_b": pa.Column(pl.Utf8),
        "comm_type": pa.Column(pl.Utf8, pa.Check.isin(COMM_TYPES)),
        "n_flows": pa.Column(pl.Int64, pa.Check.ge(1)),
        # evidence (LLMPrism Algorithm 2)
        "bytes": pa.Column(pl.Int64),
        "n_steps": pa.Column(pl.Int64),  # segments found by the change-point split
        "mode_distinct_sizes": pa.Column(pl.Int64, nullable=True),
        "raw_type": pa.Column(pl.Utf8, pa.Check.isin(COMM_TYPES)),  # size-count rule alone
        # one_way | both_ways_together | starts_together | both_ways_in_turn | dp_transitivity | size_count | aperiodic | not_job_traffic
        "method": pa.Column(pl.Utf8),
        "refined": pa.Column(pl.Boolean),  # changed by DP transitivity
        "dp_group": pa.Column(pl.Int64, nullable=True),
        # timing evidence: share of flows in the minority direction, and of bytes (the one-way test:
        # a pipeline hop moves as many bytes each way), share overlapping the other one
        "dir_share": pa.Column(pl.Float64, nullable=True),
        "dir_byte_share": pa.Column(pl.Float64, nullable=True),
        "overlap": pa.Column(pl.Float64, nullable=True),
        # the overlap the pair's own flows give by chance (one direction shifted by fractions of its
        # period), and the z of (overlap - chance): > 0 together (DP), < 0 in turn (PP)
        "overlap_chance": pa.Column(pl.Float64, nullable=True),
        "overlap_z": pa.Column(pl.Float64, nullable=True),
        # share of its flows that start with one of the other direction's (within a tenth of their
        # length; both ends of an exchange send at once) and its z against the same shifted chance
        "start_co": pa.Column(pl.Float64, nullable=True),
        "start_z": pa.Column(pl.Float64, nullable=True),
    },
    checks=[pa.Check(lambda d: d.lazyframe.select(pl.col("ip_a") < pl.col("ip_b")), name="ip_a<ip_b")],
    unique=["window_id", "ip_a", "ip_b"],
)

STEP_TIMELINES = pa.DataFrameSchema(
    {
        "window_id": pa.Column(pl.Utf8),
        "job_id": pa.Column(pl.Utf8),
        "ip": pa.Column(pl.Utf8),
        "step": pa.Column(pl.Int64),
        "start_ns": pa.Column(pl.Int64),
        "end_ns": pa.Column(pl.Int64),
        "dp_start_ns": pa.Column(pl.Int64, nullable=True),
        "dp_end_ns": pa.Column(pl.Int64, nullable=True),
        # additions
        "job_step": pa.Column(pl.Int64),  # step index aligned across the job's ips
        "start_observed": pa.Column(pl.Boolean),  # false: first step seen, start is the first flow
        "dp_send_start_ns": pa.Column(pl.Int64, nullable=True),  # first DP flow the ip sends
        "dp_bytes": pa.Column(pl.Int64),
        "n_dp_flows": pa.Column(pl.Int64),
        "n_pp_flows": pa.Column(pl.Int64),
        "boundary_source": pa.Column(pl.Utf8, pa.Check.isin(["DP", "PP", "other"])),
    },
    checks=[pa.Check(lambda d: d.lazyframe.select(pl.col("end_ns") >= pl.col("start_ns")), name="end>=start")],
    unique=["window_id", "ip", "end_ns"],
)

# traffic that is not a job's: addresses outside the topology, aperiodic pairs (evidence, not dropped)
# per directed GPU pair, route and window: its healthy level (ln bytes/ns; the median of its data flows, or
# the faster side of a step in its rate inside a slowed job), the history
# later windows compare the pair with (a fault that lasts a whole window leaves no healthy level in it)
FLOW_PAIR_RATES = pa.DataFrameSchema({
    "window_id": pa.Column(pl.Utf8),
    "window_start_ns": pa.Column(pl.Int64),
    "src_ip": pa.Column(pl.Utf8),
    "dst_ip": pa.Column(pl.Utf8),
    "route": pa.Column(pl.Utf8),   # the switches crossed, '>'-joined ('' when the records name none)
    "size_class": pa.Column(pl.Int32),   # log2 of its transfers' bytes, rounded
    "n_flows": pa.Column(pl.Int64, pa.Check.ge(1)),
    "log_rate": pa.Column(pl.Float64),
})

FLOW_BACKGROUND = pa.DataFrameSchema({
    "window_id": pa.Column(pl.Utf8),
    "src_ip": pa.Column(pl.Utf8),
    "dst_ip": pa.Column(pl.Utf8),
    "reason": pa.Column(pl.Utf8, pa.Check.isin(["outside_topology", "aperiodic"])),
    "n_flows": pa.Column(pl.Int64),
    "bytes": pa.Column(pl.Int64),
})


_READS = ("flows", "topology", "flow_pair_rates")
DECLARED = (
    Table("jobs", JOBS, "Training jobs recognized from flows alone (union-find over communicating NICs, same-host-set merge).",
          "flow_windows", _READS),
    Table("job_clusters", JOB_CLUSTERS, "Which GPU address (ip) and host belongs to which job, per window.", "flow_windows", _READS),
    Table("comm_pairs", COMM_PAIRS, "DP / PP / other label of every communicating GPU pair, with the evidence (LLMPrism Algorithm 2).",
          "flow_windows", _READS),
    Table("step_timelines", STEP_TIMELINES, "Reconstructed step boundaries per GPU address (step ends where its DP traffic ends).",
          "flow_windows", _READS),
    Table("flow_background", FLOW_BACKGROUND, "Traffic that is not a job's (outside the topology or aperiodic): evidence, not dropped.",
          "flow_windows", _READS),
    Table("flow_pair_rates", FLOW_PAIR_RATES, "Per directed GPU pair and window: its data flows' median log rate, the history later "
          "windows compare the pair with.", "flow_windows", _READS),
)
