"""What-if analysis (Lumos 3.4): edit an execution graph and re-simulate it.

Edits (each returns a new Graph; `predict` simulates and compares with the unedited graph):
  kernel_speedup   a kernel class (gemm, attention, comm, memcpy, compute, or a name regex) k times faster
  remove_sync      synchronizing calls removed (their waits and their own time)
  dp_degree        data-parallel degree changed: DP collectives get the duration a bandwidth/latency
                   model fitted on the trace's own collectives predicts for the new group size
                   (per link type: intra-host / inter-host, see CommModel)
  pp_repartition   pipeline stages re-partitioned: the graph is rebuilt with the new stages, their
                   sends and receives and a 1F1B schedule (rebuild.pp_repartition)
  layers           layers added or removed: duplicated with their tasks, kernels and collectives where
                   the trace numbers its layers (rebuild.duplicate_layers), else scaled

The prediction is the simulated mean iteration time of the slowest rank (model lags, see graph.py),
for both the edited and the unedited graph, so the ratio isolates the edit."""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import polars as pl
from scipy.optimize import nnls

from fleetscope.common import bus_factor
from fleetscope.schemas.base import conform
from fleetscope.traces.graph import Graph
from fleetscope.traces.rebuild import duplicate_layers, has_layers, pp_repartition
from fleetscope.traces.replay import iteration_times
from fleetscope.traces.schemas import WHATIF

KERNEL_CLASSES = {
    "gemm": r"(?i)gemm|cutlass|cublas|xmma|matmul|ampere_.*(sgemm|hgemm|_nn|_nt|_tn|_tt)|sm\d+_.*(gemm|_nn|_nt|_tn)",
    "attention": r"(?i)flash|fmha|attention|attn|sdpa|softmax",
}

LINKS = ("intra", "inter", "unknown")  # a collective's members on one host / several hosts / hosts not known


def steps(collective: pl.Expr, n: pl.Expr) -> pl.Expr:
    """Latency-bound steps of a ring algorithm: all-reduce 2(n-1), all-gather / reduce-scatter /
    all-to-all n-1, the rest (send, recv, broadcast, ...) 1."""
    n = n.cast(pl.Float64)
    return (pl.when(collective == "allreduce").then(2 * (n - 1))
            .when(collective.is_in(["allgather", "reduce_scatter", "all_to_all"])).then(n - 1)
            .otherwise(1.0))


@dataclass
class LinkFit:
    """Own time of a collective on one link type: step_ns x steps(collective, n) + ns_per_byte x bus bytes."""
    step_ns: float
    ns_per_byte: float
    n_samples: int
    n_sizes: int = 0  # distinct message sizes behind the fit: with one, latency and bandwidth are not separable


@dataclass
class CommModel:
    """Per link type (intra-host, inter-host, unknown), fitted on the trace's own collectives; `all`
    is fitted on every collective (used where a link type has no samples). latency_ns and
    bandwidth_bps describe the `all` fit at the trace's most common group size."""
    fits: dict[str, LinkFit]
    group_size: int = 2
    collective: str = "allreduce"

    def fit_for(self, link: str) -> LinkFit:
        return self.fits.get(link) or self.fits["all"]

    def expr(self, link: pl.Expr | str, collective: pl.Expr, n: pl.Expr, nbytes: pl.Expr) -> pl.Expr:
        """Predicted own time (ns, float) per row."""
        link = pl.lit(link) if isinstance(link, str) else link
        out = None
        for name in ("intra", "inter", "unknown"):
            f = self.fit_for(name)
            t = f.step_ns * steps(collective, n) + f.ns_per_byte * bus_factor(collective, n) * nbytes.cast(pl.Float64)
            out = pl.when(link == name).then(t) if out is None else out.when(link == name).then(t)
        f = self.fits["all"]
        return out.otherwise(f.step_ns * steps(collective, n) + f.ns_per_byte * bus_factor(collective, n) * nbytes.cast(pl.Float64))

    @property
    def latency_ns(self) -> float:
        n = float(self.group_size)
        k = 2 * (n - 1) if self.collective == "allreduce" else (n - 1 if self.collective in ("allgather", "reduce_scatter") else 1)
        return self.fits["all"].step_ns * k

    @property
    def ns_per_byte(self) -> float:
        return self.fits["all"].ns_per_byte

    @property
    def bandwidth_bps(self) -> float:
        return 1e9 / self.ns_per_byte if self.ns_per_byte > 0 else float("inf")


def collective_links(tasks: pl.DataFrame) -> pl.DataFrame:
    """coll_group -> link (intra when every member's host is the same, inter when they differ,
    unknown when a host is not known) and members (ranks taking part)."""
    host = pl.col("host") if "host" in tasks.columns else pl.lit(None, pl.Utf8)
    g = tasks.filter(pl.col("coll_group").is_not_null()).with_columns(_h=host).group_by("coll_group").agg(
        members=pl.col("rank").n_unique(), _nh=pl.col("_h").n_unique(), _null=pl.col("_h").null_count())
    return g.select("coll_group", "members", link=pl.when(pl.col("_null") > 0).then(pl.lit("unknown"))
                    .when(pl.col("_nh") == 1).then(pl.lit("intra")).otherwise(pl.lit("inter")))


def _nnls(x1: np.ndarray, x2: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[float, float]:
    a = np.vstack([x1, x2]).T * w[:, None]
    (c1, c2), _ = nnls(a, y * w)
    return float(c1), float(c2)


def _concurrency(c: pl.DataFrame) -> np.ndarray:
    """Per inter-host collective: how many inter-host collectives (itself included) ran at the same time
    through one of its hosts (their last-arrival-to-end spans overlap); 1 for the others."""
    inter = (c["link"] == "inter").to_numpy()
    out = np.ones(c.height)
    idx = np.flatnonzero(inter)
    if idx.size == 0 or idx.size > 5000:
        return out
    s0, s1 = c["s0"].to_numpy()[idx], c["s1"].to_numpy()[idx]
    hosts = [set(h) for h in c["hosts"].to_list()]
    over = (s0[:, None] < s1[None, :]) & (s0[None, :] < s1[:, None])
    for i, a in enumerate(idx):
        share = [j for j in np.flatnonzero(over[i]) if hosts[a] & hosts[idx[j]]]
        # transfers leaving the same host in the same direction share its egress: count per host, take the most
        out[a] = max(1, max(sum(1 for j in share if h in hosts[idx[j]]) for h in hosts[a]) if hosts[a] else 1)
    return out


def fit_comm_model(graph: Graph) -> CommModel:
    """Non-negative least squares of each collective's own time (after its last member arrived: the
    longest member's sim_dur_ns) on steps and bus bytes, per link type, over the median of each
    (link, collective, group size, size) so a few slow instances do not pull the fit."""
    t = graph.tasks.filter((pl.col("role") == "comm") & pl.col("msg_bytes").is_not_null())
    if t.filter(pl.col("coll_group").is_not_null()).height:
        links = collective_links(t)
        host = pl.col("host") if "host" in t.columns else pl.lit(None, pl.Utf8)
        c = t.filter(pl.col("coll_group").is_not_null()).with_columns(_h=host).group_by("coll_group").agg(
            y=pl.col("sim_dur_ns").max(), collective=pl.col("collective").first(), nbytes=pl.col("msg_bytes").max(),
            n=pl.col("group_size").max(), s0=pl.col("ts_ns").max(), s1=pl.col("end_ns").max(), hosts=pl.col("_h").drop_nulls().unique()
        ).join(links, on="coll_group").with_columns(n=pl.coalesce("n", "members"))
        c = c.with_columns(share=_concurrency(c))
    else:  # one rank: each communication kernel on its own
        c = t.select(y="sim_dur_ns", collective="collective", nbytes="msg_bytes", n=pl.col("group_size").fill_null(2),
                     link=pl.lit("unknown"), share=pl.lit(1.0))
    c = c.filter(pl.col("y") > 0)
    if c.height < 2:
        raise ValueError("fit_comm_model: the trace has fewer than 2 collectives with a known message size")
    # a host link carrying `share` transfers at once gives each 1/share of its bandwidth: fit the link's own
    b = c.group_by(["link", "collective", "n", "nbytes"]).agg(y=pl.col("y").median(), k=pl.len(), share=pl.col("share").median()).with_columns(
        x1=steps(pl.col("collective"), pl.col("n")),
        x2=bus_factor(pl.col("collective"), pl.col("n")) * pl.col("nbytes") * pl.col("share"))
    fits = {}
    for link, sub in [("all", b), *[(k, b.filter(pl.col("link") == k)) for k in LINKS]]:
        if sub.height == 0 or sub["k"].sum() < 2:
            continue
        x1, x2, y, w = (sub[k].to_numpy().astype(float) for k in ("x1", "x2", "y", "k"))
        c1, c2 = _nnls(x1, x2, y, np.sqrt(w))
        fits[link] = LinkFit(c1, c2, int(sub["k"].sum()), int(sub["x2"].n_unique()))
    common = c.group_by(["collective", "n"]).len().sort("len", descending=True).row(0, named=True)
    return CommModel(fits, int(common["n"] or 2), str(common["collective"]))


def _scale(graph: Graph, mask: pl.Expr, factor: float | pl.Expr) -> Graph:
    return graph.with_durations(graph.tasks.with_columns(
        sim_dur_ns=pl.when(mask).then((pl.col("sim_dur_ns") * factor).round(0)).otherwise(pl.col("sim_dur_ns")).cast(pl.Int64)))


def kernel_class_mask(kernel_class: str, tasks: pl.DataFrame | None = None) -> pl.Expr:
    """The tasks of a kernel class; with `tasks`, a name class is matched on their distinct kernel names
    (a regex on every one of millions of tasks costs more than the rest of the edit)."""
    gpu = pl.col("kind") == "gpu"
    if kernel_class == "comm":
        return gpu & (pl.col("role") == "comm")
    if kernel_class == "memcpy":
        return gpu & pl.col("role").is_in(["memcpy", "memset"])
    if kernel_class == "compute":
        return gpu & (pl.col("role") == "compute")
    rx = KERNEL_CLASSES.get(kernel_class, kernel_class)
    if tasks is None:
        return gpu & (pl.col("role") == "compute") & pl.col("name").str.contains(rx)
    names = tasks.lazy().filter(gpu & (pl.col("role") == "compute")).select("name").collect()["name"].unique()
    return gpu & (pl.col("role") == "compute") & pl.col("name").is_in(names.filter(names.str.contains(rx)).implode())


def kernel_speedup(graph: Graph, kernel_class: str, factor: float) -> Graph:
    if factor <= 0:
        raise ValueError("kernel_speedup: factor must be > 0")
    return _scale(graph, kernel_class_mask(kernel_class, graph.tasks), 1.0 / factor)


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


DP_COLLECTIVES = ["allreduce", "allgather", "reduce_scatter"]


def _dp_mask(dp_old: int | None) -> pl.Expr:
    m = (pl.col("role") == "comm") & pl.col("collective").is_in(DP_COLLECTIVES)
    if dp_old is not None:
        m = m & (pl.col("group_size").is_null() | (pl.col("group_size") == dp_old))
    return m


def ranks_per_host(tasks: pl.DataFrame) -> int | None:
    """The most ranks the capture has on one host (None when hosts are not known)."""
    if "host" not in tasks.columns or tasks["host"].null_count() == tasks.height:
        return None
    return int(tasks.filter(pl.col("host").is_not_null()).group_by("host").agg(pl.col("rank").n_unique())["rank"].max())


def dp_degree(graph: Graph, dp_new: int, dp_old: int | None = None, model: CommModel | None = None,
              link: str | None = None) -> Graph:
    """Data-parallel degree dp_old -> dp_new (weak scaling: each rank's compute stays). Each DP
    collective (all-reduce / all-gather / reduce-scatter of group size dp_old) takes the time the
    link model fitted on the trace predicts for dp_new on the new group's link type, times its own
    residual (observed / predicted at dp_old on its old link). The new group's link: `link` when
    given; else inter-host when the trace's group was inside a host and dp_new ranks no longer fit
    on one host (more than the capture has per host), else the old group's link. dp_new = 1: no
    DP communication."""
    if dp_new < 1:
        raise ValueError("dp_degree: dp_new must be >= 1")
    if link is not None and link not in LINKS:
        raise ValueError(f"dp_degree: link must be one of {LINKS}")
    model = model or fit_comm_model(graph)
    if (dp_old or 1) == 1 and dp_new > 1:
        return _add_data_parallel(graph, dp_new, model, link)
    t = graph.tasks
    m = _dp_mask(dp_old) & pl.col("msg_bytes").is_not_null()
    links = collective_links(t)
    t = t.join(links.select("coll_group", _old_link="link", _members="members"), on="coll_group", how="left", maintain_order="left")
    old_link = pl.col("_old_link").fill_null("unknown")
    rph = ranks_per_host(graph.tasks)
    if link is not None:
        new_link = pl.lit(link)
    elif rph is not None:
        new_link = pl.when((old_link == "intra") & (dp_new > rph)).then(pl.lit("inter")).otherwise(old_link)
    else:
        new_link = old_link
    n_old = pl.coalesce(pl.col("group_size"), pl.col("_members"), pl.lit(dp_old or 2)).cast(pl.Float64)
    nbytes = pl.col("msg_bytes").cast(pl.Float64)
    old = model.expr(old_link, pl.col("collective"), n_old, nbytes)
    new = model.expr(new_link, pl.col("collective"), pl.lit(float(dp_new)), nbytes)
    ratio = pl.when(pl.lit(dp_new) == 1).then(0.0).when(old > 0).then(new / old).otherwise(1.0)
    t = t.with_columns(sim_dur_ns=pl.when(m).then((pl.col("sim_dur_ns") * ratio).round(0)).otherwise(pl.col("sim_dur_ns")).cast(pl.Int64))
    return graph.with_durations(t.drop("_old_link", "_members"))


def _add_data_parallel(graph: Graph, dp_new: int, model: CommModel, link: str | None = None) -> Graph:
    """A job without data parallelism given dp_new replicas: before each iteration's optimizer, every
    rank all-reduces its gradients (the bytes of the parameters its forward operators read, per
    microbatch: graph.meta["grad_bytes"]) with its replicas, taking what the link model fitted on the
    trace's own transfers predicts. The group's link: `link`, else within a host when dp_new ranks fit
    on one (as many ranks per host as the capture has; replicas numbered next to each other, as
    Megatron and DeviceMesh number them), else across hosts."""
    grad = graph.meta.get("grad_bytes") or {}
    opt = graph.meta.get("optimizer_tasks") or {}
    if not grad or not opt:
        raise ValueError("the trace shows no parameter sizes (record_shapes) or no optimizer step: the gradient volume a new "
                         "data-parallel group would reduce is unknown")
    rph = ranks_per_host(graph.tasks)
    lk = link or ("unknown" if rph is None else "intra" if dp_new <= rph else "inter")
    f = model.fit_for(lk)
    n = float(dp_new)
    add = {}
    for r, b in grad.items():
        ar = f.step_ns * 2 * (n - 1) + f.ns_per_byte * 2 * (n - 1) / n * float(b)
        for tid in opt.get(r, []):
            add[int(tid)] = int(round(ar))
    t = graph.tasks.with_columns(sim_dur_ns=pl.col("sim_dur_ns") + pl.col("task_id").replace_strict(
        add, default=0, return_dtype=pl.Int64))
    return graph.with_durations(t)


def _scaled_layers(graph: Graph, layers_old: int, layers_new: int, model: CommModel | None = None) -> Graph:
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


def layers(graph: Graph, layers_old: int, layers_new: int, model: CommModel | None = None,
           stage_of_rank: dict[int, int] | None = None) -> Graph:
    """Layers added or removed. Where the trace numbers its layers (spans like `layers.3`), the graph is
    rebuilt: layers duplicated with their tasks, kernels and collectives (rebuild.duplicate_layers).
    Otherwise the work of the marked layers (or, with no marks, all compute and CPU work) and the
    DP gradient volume scale by layers_new / layers_old (identical layers)."""
    if has_layers(graph):
        return duplicate_layers(graph, layers_old, layers_new, stage_of_rank)
    return _scaled_layers(graph, layers_old, layers_new, model)


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


def comm_fit_notes(graph: Graph) -> list[str]:
    """What limits the DP what-ifs' communication model: a link type whose collectives all carry one
    message size cannot split per-message latency from bandwidth, so predictions for other sizes there
    extrapolate."""
    try:
        m = fit_comm_model(graph)
    except ValueError:
        return []
    return [f"{'intra-host' if k == 'intra' else 'inter-host' if k == 'inter' else 'host-unknown'} transfers of the trace have one "
            f"message size only: the link model cannot tell latency from bandwidth there ({1e9 / f.ns_per_byte * 8 / 1e6:.0f} Mbit/s "
            "if it is all bandwidth); DP what-ifs moving other sizes over that link extrapolate"
            for k, f in m.fits.items() if k != "all" and f.n_sizes == 1 and f.ns_per_byte > 0]


def parallel_scenarios(graph: Graph, parallel: dict | None, notes: list[str] | None = None) -> list[tuple[str, str, dict]]:
    """The graph-rebuilding what-ifs a capture supports, from its layout ({dp, pp[, ranks]}: the traces'
    own layout, fleetscope.traces.layout, or capture.json's `parallel`; each rank's stage from `ranks`
    {rank: (stage, dp_rank, tp_rank)}, else r // dp, Megatron's order): DP x2 and /2 where the trace
    has DP collectives; PP x2 (and /2) where the trace's layers are known and split evenly; layers x2
    where the layers are known. What it cannot offer, and why, is appended to `notes`."""
    notes = notes if notes is not None else []
    if not parallel:
        notes.append("no parallel layout (neither the traces nor capture.json give one): no DP / PP / layer what-ifs")
        return []
    dp, pp = int(parallel.get("dp") or 1), int(parallel.get("pp") or 1)
    t = graph.tasks
    out: list[tuple[str, str, dict]] = []
    if dp > 1 and t.filter(_dp_mask(dp) & pl.col("msg_bytes").is_not_null()).height:
        out += [("dp_x2", "dp_degree", {"dp_new": 2 * dp, "dp_old": dp}), ("dp_half", "dp_degree", {"dp_new": max(1, dp // 2), "dp_old": dp})]
    elif dp > 1:
        notes.append(f"no data-parallel collective of group size {dp} with a known size in the traces: no DP what-if")
    elif graph.meta.get("grad_bytes") and graph.meta.get("optimizer_tasks"):
        out.append(("dp_x2", "dp_degree", {"dp_new": 2, "dp_old": 1}))
    else:
        notes.append("dp = 1 and the traces show no parameter sizes (profile with record_shapes=True) or no optimizer step: "
                     "no DP what-if")
    if not has_layers(graph):
        notes.append("the traces show no repeated layers (no layer-named spans, modules or repeated forward operators): "
                     "no PP or layer what-if")
        return out
    ranks = sorted(t["rank"].unique().to_list())
    places = parallel.get("ranks") or {}
    sor = {int(r): int(places[r][0]) if r in places and places[r][0] is not None else int(r) // dp for r in ranks}
    per_stage = [t.filter(pl.col("rank").is_in([r for r, st in sor.items() if st == s]))["layer"].drop_nulls().n_unique()
                 for s in range(pp)]
    total = sum(per_stage)
    if not (all(per_stage) and len(set(sor.values())) == pp):
        notes.append(f"layers found on {sum(1 for x in per_stage if x)} of {pp} stages: no PP or layer what-if")
        return out
    for name, p2 in (("pp_x2", 2 * pp), ("pp_half", pp // 2)):
        if p2 >= 1 and p2 != pp and total % p2 == 0 and total // p2 >= 1:
            out.append((name, "pp_repartition", {"stage_of_rank": sor, "layers_old": per_stage, "layers_new": [total // p2] * p2}))
        elif p2 >= 1 and p2 != pp:
            notes.append(f"{total} layers do not split evenly into {p2} stages: no {name} what-if")
    out.append(("layers_x2", "layers", {"layers_old": total, "layers_new": 2 * total, "stage_of_rank": sor}))
    return out
