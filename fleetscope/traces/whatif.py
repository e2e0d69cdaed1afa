"""What-if analysis (Lumos 3.4): edit an execution graph and re-simulate it.

Edits (each returns a new Graph; `predict` simulates and compares with the unedited graph):
  kernel_speedup   a kernel class (gemm, attention, comm, memcpy, compute, or a name regex) k times faster
  remove_sync      synchronizing calls removed (their waits and their own time)
  dp_degree        data-parallel degree changed: DP collectives get the duration a bandwidth/latency
                   model fitted on the trace's own collectives predicts for the new group size
  pp_repartition   pipeline stages re-partitioned: each rank's compute scales with its stage's
                   new share of layers (cross-rank send/recv collectives keep the pipeline coupled)
  layers           layers added or removed: the layers' kernels and CPU work (where the trace marks
                   its layers, else all compute and CPU work) and the DP gradient volume scale
                   with the number of layers (identical layers)

The prediction is the simulated mean iteration time of the slowest rank (model lags, see graph.py),
for both the edited and the unedited graph, so the ratio isolates the edit."""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import polars as pl

from fleetscope.common import bus_factor
from fleetscope.schemas.base import conform
from fleetscope.traces.graph import Graph
from fleetscope.traces.replay import iteration_times
from fleetscope.traces.schemas import WHATIF

KERNEL_CLASSES = {
    "gemm": r"(?i)gemm|cutlass|cublas|xmma|matmul|ampere_.*(sgemm|hgemm|_nn|_nt|_tn|_tt)|sm\d+_.*(gemm|_nn|_nt|_tn)",
    "attention": r"(?i)flash|fmha|attention|attn|sdpa|softmax",
}

# bytes on the wire per rank relative to the message size, by collective (nccl-tests bus factors)
@dataclass
class CommModel:
    """t = latency_ns + bus_bytes / bandwidth, fitted on the trace's communication kernels."""
    latency_ns: float
    ns_per_byte: float
    n_samples: int

    @property
    def bandwidth_bps(self) -> float:
        return 1e9 / self.ns_per_byte if self.ns_per_byte > 0 else float("inf")

    def predict(self, bus_bytes: np.ndarray) -> np.ndarray:
        return self.latency_ns + self.ns_per_byte * bus_bytes


def fit_comm_model(graph: Graph) -> CommModel:
    """Least squares (non-negative) of the collectives' own durations on their bus bytes."""
    c = graph.tasks.filter((pl.col("role") == "comm") & pl.col("msg_bytes").is_not_null() & (pl.col("sim_dur_ns") > 0))
    if c.height < 2:
        raise ValueError("fit_comm_model: the trace has fewer than 2 collectives with a known message size")
    x = c.select(bus_factor(pl.col("collective"), pl.col("group_size").fill_null(2)) * pl.col("msg_bytes")).to_series().to_numpy()
    y = c["sim_dur_ns"].to_numpy().astype(float)
    a = np.vstack([np.ones_like(x), x]).T
    (lat, slope), *_ = np.linalg.lstsq(a, y, rcond=None)
    if slope <= 0:  # sizes explain nothing: bandwidth from the largest transfers, no latency
        slope, lat = float(np.median(y / np.maximum(x, 1))), 0.0
    if lat < 0:
        lat, slope = 0.0, float((x @ y) / (x @ x))
    return CommModel(float(lat), float(slope), int(c.height))


def _scale(graph: Graph, mask: pl.Expr, factor: float | pl.Expr) -> Graph:
    return graph.with_durations(graph.tasks.with_columns(
        sim_dur_ns=pl.when(mask).then((pl.col("sim_dur_ns") * factor).round(0)).otherwise(pl.col("sim_dur_ns")).cast(pl.Int64)))


def kernel_class_mask(kernel_class: str) -> pl.Expr:
    gpu = pl.col("kind") == "gpu"
    if kernel_class == "comm":
        return gpu & (pl.col("role") == "comm")
    if kernel_class == "memcpy":
        return gpu & pl.col("role").is_in(["memcpy", "memset"])
    if kernel_class == "compute":
        return gpu & (pl.col("role") == "compute")
    rx = KERNEL_CLASSES.get(kernel_class, kernel_class)
    return gpu & (pl.col("role") == "compute") & pl.col("name").str.contains(rx)


def kernel_speedup(graph: Graph, kernel_class: str, factor: float) -> Graph:
    if factor <= 0:
        raise ValueError("kernel_speedup: factor must be > 0")
    return _scale(graph, kernel_class_mask(kernel_class), 1.0 / factor)


def remove_sync(graph: Graph, name: str | None = None) -> Graph:
    """Remove synchronizing calls (all, or those whose name matches `name`): no wait, no time."""
    g = graph.copy()
    sync = pl.col("role").is_in(["stream_sync", "context_sync", "event_sync"]) | pl.col("wait_ref").is_not_null()
    if name:
        sync = sync & pl.col("name").str.contains(name)
    ids = g.tasks.filter(sync)["task_id"].implode()
    g.tasks = g.tasks.with_columns(
        sim_dur_ns=pl.when(pl.col("task_id").is_in(ids)).then(0).otherwise(pl.col("sim_dur_ns")),
        wait_ref=pl.when(pl.col("task_id").is_in(ids)).then(None).otherwise(pl.col("wait_ref")))
    g.edges = g.edges.filter(~((pl.col("edge_type") == "gpu_cpu") & pl.col("dst").is_in(ids))).with_columns(
        from_start=pl.when(pl.col("src").is_in(ids)).then(False).otherwise(pl.col("from_start")))
    return g


def _dp_mask(dp_old: int | None) -> pl.Expr:
    m = (pl.col("role") == "comm") & pl.col("collective").is_in(["allreduce", "allgather", "reduce_scatter"])
    if dp_old is not None:
        m = m & (pl.col("group_size").is_null() | (pl.col("group_size") == dp_old))
    return m


def dp_degree(graph: Graph, dp_new: int, dp_old: int | None = None, model: CommModel | None = None) -> Graph:
    """DP collectives (all-reduce / all-gather / reduce-scatter of group size dp_old) take the time the
    fitted model predicts at dp_new; each kernel keeps its own residual (observed / model at dp_old)."""
    if dp_new < 1:
        raise ValueError("dp_degree: dp_new must be >= 1")
    model = model or fit_comm_model(graph)
    m = _dp_mask(dp_old)
    n_old = pl.col("group_size").fill_null(dp_old or 2)
    bytes_ = pl.col("msg_bytes").fill_null(0).cast(pl.Float64)
    old = model.latency_ns + model.ns_per_byte * bytes_ * bus_factor(pl.col("collective"), n_old)
    new = pl.when(pl.lit(dp_new) == 1).then(0.0).otherwise(
        model.latency_ns + model.ns_per_byte * bytes_ * bus_factor(pl.col("collective"), pl.lit(dp_new)))
    return _scale(graph, m & pl.col("msg_bytes").is_not_null(), new / old)


def layers(graph: Graph, layers_old: int, layers_new: int, model: CommModel | None = None) -> Graph:
    """Layers added or removed (identical layers): the work of the layers scales by
    layers_new / layers_old, and so does the DP gradient volume. When the trace marks its layers
    (graph_tasks.in_layer: Python/operator spans named like a layer and their backward operators) only
    that work scales (kernels, CPU tasks and the CPU gaps inside layers); otherwise every compute kernel
    and the CPU work of the iterations do."""
    if layers_old < 1 or layers_new < 0:
        raise ValueError("layers: layers_old must be >= 1 and layers_new >= 0")
    r = layers_new / layers_old
    marked = "in_layer" in graph.tasks.columns and bool(graph.tasks["in_layer"].fill_null(False).any())
    if marked:
        inl = pl.col("in_layer").fill_null(False)
        g = _scale(graph, inl & ((pl.col("kind") == "cpu") & pl.col("wait_ref").is_null() | (pl.col("role") == "compute")), r)
        scaled = g.tasks.filter(pl.col("in_layer").fill_null(False) & (pl.col("kind") == "cpu"))["task_id"].implode()
    else:
        g = _scale(graph, (pl.col("kind") == "gpu") & (pl.col("role") == "compute"), r)
        # the CPU side of the layers: operator and launch time, and the CPU work between them
        g = _scale(g, (pl.col("kind") == "cpu") & pl.col("wait_ref").is_null() & pl.col("iteration").is_not_null(), r)
        scaled = g.tasks.filter(pl.col("iteration").is_not_null() & (pl.col("kind") == "cpu"))["task_id"].implode()
    g = Graph(g.tasks, g.edges, dict(g.meta))  # lags change below: not the prepared arrays of the original
    g.edges = g.edges.with_columns(
        lag_ns=pl.when((pl.col("subtype") == "thread_order") & pl.col("dst").is_in(scaled) & (pl.col("lag_ns") > 0))
        .then((pl.col("lag_ns") * r).round(0).cast(pl.Int64)).otherwise(pl.col("lag_ns")))
    try:
        model = model or fit_comm_model(graph)
        bytes_ = pl.col("msg_bytes").fill_null(0).cast(pl.Float64) * bus_factor(pl.col("collective"), pl.col("group_size").fill_null(2))
        ratio = (model.latency_ns + model.ns_per_byte * bytes_ * r) / (model.latency_ns + model.ns_per_byte * bytes_)
        g = _scale(g, _dp_mask(None) & pl.col("msg_bytes").is_not_null(), ratio)
    except ValueError:
        pass  # no sized collectives: only compute scales
    return g


def pp_repartition(graph: Graph, stage_of_rank: dict[int, int], layers_old: list[int], layers_new: list[int]) -> Graph:
    """Stage s held layers_old[s] layers and gets layers_new[s]: its ranks' compute scales by the ratio."""
    if len(layers_old) != len(layers_new) or sum(layers_old) != sum(layers_new):
        raise ValueError("pp_repartition: layers_old and layers_new must list the same stages and total")
    ratio = {int(r): layers_new[s] / layers_old[s] for r, s in stage_of_rank.items()}
    factor = pl.col("rank").replace_strict(ratio, default=1.0, return_dtype=pl.Float64)
    return _scale(graph, (pl.col("kind") == "gpu") & (pl.col("role") == "compute"), factor)


EDITS = {"kernel_speedup": kernel_speedup, "remove_sync": remove_sync, "dp_degree": dp_degree,
         "layers": layers, "pp_repartition": pp_repartition}


def iteration_time(graph: Graph) -> int:
    """Simulated mean iteration time of the slowest rank (model lags)."""
    return _slowest_rank_mean(iteration_times(graph))


def _slowest_rank_mean(it: pl.DataFrame) -> int:
    if it.height == 0:
        raise ValueError("iteration_time: the graph has no iterations")
    return int(it.group_by("rank").agg(pl.col("simulated_ns").mean())["simulated_ns"].max())


def predict(graph: Graph, scenarios: list[tuple[str, str, dict]], baseline_ns: int | None = None) -> pl.DataFrame:
    """scenarios: (scenario name, edit name from EDITS, parameters) -> whatif table."""
    base = baseline_ns if baseline_ns is not None else iteration_time(graph)
    rows = []
    for name, edit, params in scenarios:
        if edit not in EDITS:
            raise ValueError(f"predict: unknown edit {edit!r}; one of {sorted(EDITS)}")
        pred = iteration_time(EDITS[edit](graph, **params))
        rows.append({"scenario": name, "parameters": json.dumps({"edit": edit, **params}, sort_keys=True, default=str),
                     "predicted_ns": pred, "baseline_ns": base, "speedup": base / pred if pred > 0 else float("inf")})
    df = pl.DataFrame(rows, infer_schema_length=None).with_columns(capture_id=pl.lit(graph.meta.get("capture_id", "")))
    return WHATIF.validate(conform(df, WHATIF))


DEFAULT_SCENARIOS = [
    ("gemm_2x", "kernel_speedup", {"kernel_class": "gemm", "factor": 2.0}),
    ("attention_1.5x", "kernel_speedup", {"kernel_class": "attention", "factor": 1.5}),
    ("no_sync", "remove_sync", {}),
]
