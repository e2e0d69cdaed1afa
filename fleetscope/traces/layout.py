"""The parallel layout of a capture from its profiler traces alone (issue 23): world size, the
tensor- / pipeline- / data-parallel degrees and each rank's stage, replica and tensor-parallel place.

Evidence, strongest first (capture.json's `parallel` only overrides; `infer_layout(..., override=)`):

1. `distributedInfo.pg_config` of every rank's trace: the process groups the rank belongs to, their
   size, member ranks and description. Descriptions that name a dimension decide it: Megatron's
   `TENSOR_MODEL_PARALLEL_GROUP` / `PIPELINE_MODEL_PARALLEL_GROUP` / `DATA_PARALLEL_GROUP`, torch's
   DeviceMesh `mesh_tp` / `mesh_pp` / `mesh_dp` (`mesh_dp_replicate`, `mesh_dp_shard`), plain `tp`,
   `pp`, `dp`, `fsdp`. Groups joining several dimensions (`TENSOR_AND_DATA_PARALLEL_GROUP`,
   `MODEL_PARALLEL_GROUP`, `mesh_dp_cp`, embedding groups) are not a dimension.
2. The traces' point-to-point transfers (send/recv peers: Kineto's `Dst Rank` / `Src Rank`, NCCL's
   2-rank groups, else gloo's work spans matched across ranks by size and time,
   fleetscope.traces.graph): ranks that exchange activations are neighbouring pipeline stages; each
   chain of such ranks is one pipeline, and its end that sends first in a step is stage 0 (the first
   stage starts a step by sending its first microbatch's activations; every other stage first receives).
3. The groups the traces' collectives run in (NCCL's group ranks, else matched across ranks) and the
   undescriptive pg_config groups (torch names them `undefined`): groups inside one stage are
   tensor- or data-parallel; a family of such groups whose collectives run inside the forward pass
   (before the step's backward starts) is tensor-parallel, the other data-parallel; with one family
   and no such sign, data-parallel.
4. Nothing else: world size from distributedInfo; ranks with no point-to-point traffic are one
   stage; with no group that splits the stage, the stage's ranks are its data-parallel replicas
   (said in the notes: an assumption, not evidence).

Every step says what it used and what it could not tell in `Layout.notes`."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import polars as pl

# a process group's description -> the dimension it is (None: a group that is not one dimension)
_DESC_DIM = [
    (re.compile(r"(?i)(_and_|_with_|^model_parallel_group$|^mesh_default$|embedding|^default_pg$|^mesh_dp_cp|^mesh_dp_shard_cp)"), None),
    (re.compile(r"(?i)(tensor|(^|[^a-z])tp($|[^a-z]))"), "tp"),
    (re.compile(r"(?i)(pipe|(^|[^a-z])pp($|[^a-z]))"), "pp"),
    (re.compile(r"(?i)(data|(^|[^a-z])(dp|fsdp|ddp|hsdp)($|[^a-z])|replicate|shard)"), "dp"),
]
def layout_events() -> pl.Expr:
    """The trace_events rows the layout needs: communication, steps, backward passes."""
    return pl.col("is_comm") | pl.col("name").str.starts_with("ProfilerStep#") | pl.col("name").str.starts_with(
        "autograd::engine::evaluate_function")

COMM_EVENT_COLUMNS = ["rank", "pid", "tid", "cat", "name", "ph", "ts_ns", "end_ns", "is_comm", "collective", "msg_bytes",
                      "group_size", "group_ranks", "pg_name", "stream", "peer"]


def desc_dim(desc: str | None) -> str | None:
    """The parallel dimension a process group's description names (tp, pp, dp), else None."""
    if not desc or desc.lower() in ("undefined", "unknown", ""):
        return None
    for rx, dim in _DESC_DIM:
        if rx.search(desc):
            return dim
    return None


@dataclass
class Layout:
    world_size: int | None = None
    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    ranks: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=RANK_SCHEMA))  # rank, stage, dp_rank, tp_rank
    source: str = ""
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        """{world_size, tp, pp, dp, ranks: {rank: (stage, dp_rank, tp_rank)}} without unknowns (what the
        analyses take as `layout`)."""
        d = {k: v for k, v in (("world_size", self.world_size), ("tp", self.tp), ("pp", self.pp), ("dp", self.dp)) if v is not None}
        if self.ranks.height:
            d["ranks"] = {int(r): (s, d_, t) for r, s, d_, t in self.ranks.select("rank", "stage", "dp_rank", "tp_rank").iter_rows()}
        return d


RANK_SCHEMA = {"rank": pl.Int32, "stage": pl.Int32, "dp_rank": pl.Int32, "tp_rank": pl.Int32}


# ------------------------------------------------------------------------------------- evidence
def pg_groups(files: pl.DataFrame | None) -> pl.DataFrame:
    """The process groups every rank's trace lists (distributedInfo.pg_config), once each:
    desc, ranks (sorted), size, dim (what the description names, or null)."""
    rows = {}
    for text in ([] if files is None or "pg_config" not in files.columns else files["pg_config"].drop_nulls().to_list()):
        try:
            cfg = json.loads(text)
        except ValueError:
            continue
        for g in cfg if isinstance(cfg, list) else []:
            if not isinstance(g, dict) or not isinstance(g.get("ranks"), list):
                continue
            ranks = tuple(sorted(int(r) for r in g["ranks"] if isinstance(r, int)))
            desc = str(g.get("pg_desc") or "")
            rows[(desc, ranks)] = {"desc": desc, "ranks": list(ranks), "size": len(ranks), "pg_name": str(g.get("pg_name") or "")}
    df = pl.DataFrame(list(rows.values()), schema={"desc": pl.Utf8, "ranks": pl.List(pl.Int32), "size": pl.Int32, "pg_name": pl.Utf8})
    return df.with_columns(dim=pl.col("desc").map_elements(desc_dim, return_dtype=pl.Utf8))


def named_pairs(ev: pl.DataFrame, groups: pl.DataFrame | None = None) -> pl.DataFrame | None:
    """Point-to-point pairs (src, dst, n) from the peers the traces name (`trace_events.peer`): a send
    on rank a to b and the matching recv on b from a. Kineto's peers are global ranks; c10d's
    arguments are the peer's rank in the group the op ran in, which the trace does not name: read as
    global ranks when every send has its recv on the peer that way, else in the first family of
    pg_config groups (groups of one size) that makes them agree. None when no peer is named or no
    reading agrees."""
    ops = ev.filter(pl.col("is_comm") & pl.col("peer").is_not_null() & pl.col("collective").is_in(["send", "recv"])
                    & (pl.col("cat") != "user_annotation"))
    if ops.height == 0:
        return None
    ops = ops.select(pl.col("rank").cast(pl.Int32), pl.col("peer").cast(pl.Int32), "collective").group_by("rank", "peer", "collective").len()

    def pairs(to_global) -> pl.DataFrame | None:
        o = ops.with_columns(peer=pl.struct("rank", "peer").map_elements(lambda x: to_global(x["rank"], x["peer"]), return_dtype=pl.Int32))
        if o["peer"].null_count():
            return None
        s = o.filter(pl.col("collective") == "send").select(src="rank", dst="peer", n="len")
        r = o.filter(pl.col("collective") == "recv").select(src="peer", dst="rank", m="len")
        j = s.join(r, on=["src", "dst"], how="full", coalesce=True)
        if j.filter(pl.col("n").is_null() | pl.col("m").is_null() | (pl.col("src") == pl.col("dst"))).height:
            return None
        return j.select("src", "dst", n=pl.col("n").cast(pl.UInt32)).sort("src", "dst")

    out = pairs(lambda r, p: p)
    fams = [] if groups is None or groups.height == 0 else [g["ranks"].to_list() for _, g in groups.group_by("size")]
    for fam in fams:
        if out is not None:
            break
        of = {int(r): [int(x) for x in g] for g in fam for r in g}
        out = pairs(lambda r, p, of=of: of[r][p] if r in of and p < len(of[r]) else None)
    return out


def traced_comm(events: pl.DataFrame, groups: pl.DataFrame | None = None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """What the traces' communication says about who talks to whom: (collectives: one row per
    cross-rank collective instance with its member ranks, its kind and when it started on each
    member; p2p: src, dst, n transfers). GPU ranks: NCCL kernels, grouped by their process group
    and sequence (fleetscope.traces.graph); CPU ranks (gloo): the work spans matched across ranks by
    size and time."""
    from fleetscope.traces.graph import _collective_groups, _cpu_collective_groups, _cpu_comm

    empty_c = pl.DataFrame(schema={"coll_group": pl.Utf8, "collective": pl.Utf8, "members": pl.List(pl.Int32),
                                   "rank": pl.Int32, "ts_ns": pl.Int64})
    empty_p = pl.DataFrame(schema={"src": pl.Int32, "dst": pl.Int32, "n": pl.UInt32})
    if events is None or events.height == 0:
        return empty_c, empty_p
    ev = events.with_columns(pl.col("rank").cast(pl.Int32))
    if "peer" not in ev.columns:
        ev = ev.with_columns(peer=pl.lit(None, pl.Int32))
    cpu = ev.filter(_cpu_comm(ev)).select(
        "rank", "collective", "msg_bytes", "ts_ns", "end_ns", kind=pl.lit("cpu"), role=pl.lit("comm"),
        coll_group=pl.lit(None, pl.Utf8), group_size=pl.col("group_size"))
    gpu = ev.filter((pl.col("cat") == "kernel") & pl.col("is_comm")).select(
        "rank", "collective", "msg_bytes", "ts_ns", "end_ns", "group_ranks", "pg_name", "stream", kind=pl.lit("gpu"),
        role=pl.lit("comm"), group_size=pl.col("group_size"))
    t = pl.concat([cpu, gpu], how="diagonal_relaxed").with_row_index("task_id").with_columns(pl.col("task_id").cast(pl.Int64))
    for c, dt in (("group_ranks", pl.Utf8), ("pg_name", pl.Utf8), ("stream", pl.Int64), ("coll_group", pl.Utf8)):
        if c not in t.columns:
            t = t.with_columns(pl.lit(None, dt).alias(c))
    t = _cpu_collective_groups(_collective_groups(t.drop("coll_group")))
    g = t.filter(pl.col("coll_group").is_not_null())
    is_p2p = pl.col("coll_group").str.contains(r"p2p:")
    members = g.filter(~is_p2p).group_by("coll_group").agg(members=pl.col("rank").unique().sort())
    coll = g.filter(~is_p2p).join(members, on="coll_group").select("coll_group", "collective", "members", "rank", "ts_ns")
    pair = g.filter(is_p2p).select(pl.col("coll_group").str.extract(r"p2p:(\d+)->(\d+)", 1).cast(pl.Int32).alias("src"),
                                   pl.col("coll_group").str.extract(r"p2p:(\d+)->(\d+)", 2).cast(pl.Int32).alias("dst"),
                                   "coll_group").unique("coll_group")
    p2p = named_pairs(ev, groups)
    if p2p is None:  # no peers written: the pairs matched by size and time
        p2p = pair.filter(pl.col("src") != pl.col("dst")).group_by("src", "dst").agg(n=pl.len()).sort("src", "dst")
    return (coll if coll.height else empty_c), (p2p if p2p.height else empty_p)


def _first_sends(events: pl.DataFrame) -> dict[int, float]:
    """Per rank: the share of its steps whose first point-to-point operation is a send (the first
    pipeline stage starts a step by sending; every other stage first receives)."""
    ev = events.filter(pl.col("is_comm") & pl.col("collective").is_in(["send", "recv"]))
    if ev.height == 0:
        return {}
    steps = events.filter((pl.col("cat") == "user_annotation") & pl.col("name").str.starts_with("ProfilerStep#")).select(
        pl.col("rank").cast(pl.Int32), _s=pl.col("ts_ns"), step=pl.col("name")).sort("_s")
    ev = ev.select(pl.col("rank").cast(pl.Int32), "ts_ns", "collective").sort("ts_ns")
    if steps.height:
        ev = ev.join_asof(steps, left_on="ts_ns", right_on="_s", by="rank", strategy="backward", check_sortedness=False)
    else:
        ev = ev.with_columns(step=pl.lit("all"))
    first = ev.sort("ts_ns").group_by("rank", "step").agg(pl.col("collective").first())
    return {int(r): float(s) for r, s in first.group_by("rank").agg((pl.col("collective") == "send").mean()).iter_rows()}


def _forward_share(events: pl.DataFrame, coll: pl.DataFrame) -> pl.DataFrame:
    """Per collective group key (members): the share of its all-reduce / all-gather / reduce-scatter
    instances that started before the step's backward pass began on that rank (the first autograd node
    evaluation of the step)."""
    bwd = events.filter(pl.col("name").str.starts_with("autograd::engine::evaluate_function")).select(
        pl.col("rank").cast(pl.Int32), _b=pl.col("ts_ns"))
    steps = events.filter((pl.col("cat") == "user_annotation") & pl.col("name").str.starts_with("ProfilerStep#")).select(
        pl.col("rank").cast(pl.Int32), _s=pl.col("ts_ns"), _e=pl.col("end_ns"))
    # tensor parallelism all-reduces / all-gathers / reduce-scatters activations; an all-to-all in the forward
    # pass is expert or embedding parallelism, not a sign of it
    coll = coll.filter(pl.col("collective").is_in(["allreduce", "allgather", "reduce_scatter"]))
    if coll.height == 0 or bwd.height == 0 or steps.height == 0:
        return pl.DataFrame(schema={"members": pl.List(pl.Int32), "fwd_share": pl.Float64})
    first_b = bwd.sort("_b").join_asof(steps.sort("_s"), left_on="_b", right_on="_s", by="rank", strategy="backward",
                                       check_sortedness=False).group_by("rank", "_s").agg(_b=pl.col("_b").min())
    c = coll.sort("ts_ns").join_asof(steps.sort("_s"), left_on="ts_ns", right_on="_s", by="rank", strategy="backward",
                                     check_sortedness=False).join(first_b, on=["rank", "_s"], how="left")
    c = c.filter(pl.col("_b").is_not_null())
    return c.group_by("members").agg(fwd_share=(pl.col("ts_ns") < pl.col("_b")).mean())


# ------------------------------------------------------------------------------------- inference
def _chains(pairs: list[tuple[int, int]]) -> list[list[int]] | None:
    """Connected components of the undirected point-to-point graph, each a path (a pipeline), as
    rank lists from one end to the other; None when a component is not a path."""
    adj: dict[int, set[int]] = {}
    for a, b in pairs:
        adj.setdefault(a, set()).add(b)
        adj.setdefault(b, set()).add(a)
    seen, out = set(), []
    for start in sorted(adj):
        if start in seen:
            continue
        comp, todo = set(), [start]
        while todo:
            x = todo.pop()
            if x not in comp:
                comp.add(x)
                todo += list(adj[x] - comp)
        seen |= comp
        if any(len(adj[x]) > 2 for x in comp):
            return None
        ends = sorted(x for x in comp if len(adj[x]) == 1)
        if len(ends) != 2:
            return None  # a ring: no first stage
        path, prev, x = [ends[0]], None, ends[0]
        while len(path) < len(comp):
            nxt = next(y for y in adj[x] if y != prev)
            path.append(nxt)
            prev, x = x, nxt
        out.append(path)
    return out


def _place(groups: list[list[int]]) -> dict[int, int]:
    """rank -> its position in its (sorted) group."""
    return {r: i for g in groups for i, r in enumerate(sorted(g))}


def _partition(groups: pl.DataFrame, ranks: set[int]) -> list[list[int]] | None:
    """Disjoint groups of one size that together hold every rank given (a dimension's groups), else None."""
    gs = [list(x) for x in groups["ranks"].to_list()]
    covered = [r for g in gs for r in g]
    if len(set(covered)) != len(covered) or set(covered) != ranks or len({len(g) for g in gs}) != 1:
        return None
    return gs


def infer_layout(files: pl.DataFrame | None, events: pl.DataFrame | None, override: dict | None = None) -> Layout:
    """files: the capture's trace_files rows (rank, world_size, pg_config); events: its trace_events
    (COMM_EVENT_COLUMNS suffice: communication, ProfilerStep# and autograd rows); override: capture.json's
    `parallel` ({dp, pp, tp, ...}), which wins over the traces (a disagreement is noted)."""
    notes: list[str] = []
    used: list[str] = []
    traced = sorted(int(r) for r in files["rank"].to_list()) if files is not None and files.height else (
        sorted(int(r) for r in events["rank"].unique().to_list()) if events is not None and events.height else [])
    ws = files["world_size"].drop_nulls().max() if files is not None and files.height and "world_size" in files.columns else None
    world = int(ws) if ws is not None else None
    if world is None and traced:
        notes.append(f"no trace names the world size (distributedInfo.world_size): taken as the {len(traced)} traced rank(s)")
        world = max(traced) + 1 if traced == list(range(len(traced))) else len(traced)
    else:
        used.append("distributedInfo")
    if not traced:
        return Layout(notes=["no trace files: no layout"], source="none")
    all_ranks = set(range(world)) if world and world >= len(traced) and max(traced) < world else set(traced)
    partial = len(traced) < len(all_ranks)
    pgs = pg_groups(files)
    pgs = pgs.filter((pl.col("size") > 1) & (pl.col("size") < len(all_ranks)))
    coll, p2p = traced_comm(events, pg_groups(files)) if events is not None else traced_comm(None)
    # ---- pipeline stages
    stage: dict[int, int] = {}
    pipelines: list[list[int]] | None = None
    desc_pp = pgs.filter(pl.col("dim") == "pp")
    if desc_pp.height:
        pipelines = _partition(desc_pp, all_ranks) if not partial else [list(x) for x in desc_pp["ranks"].to_list()]
        if pipelines:
            used.append("pipeline groups named in pg_config")
    if pipelines is None and p2p.height:
        chains = _chains([(int(a), int(b)) for a, b, _ in p2p.iter_rows()])
        if chains is None:
            notes.append("the send/recv peers do not form pipeline chains (a rank with more than two peers, or a ring): "
                         "stages not derived")
        else:
            pipelines = chains
            used.append("send/recv peers")
    if pipelines:
        first = _first_sends(events) if events is not None else {}
        ordered = []
        for chain in pipelines:
            if chain == sorted(chain) or len(chain) == 1:
                c = list(chain)
            else:
                c = list(chain)
            a, b = c[0], c[-1]
            fa, fb = first.get(a), first.get(b)
            if fa is not None and fb is not None and fa != fb:
                c = c if fa > fb else c[::-1]
            elif a > b:  # no sign of direction: the lower rank first (launchers number stages upwards)
                c = c[::-1]
                notes.append("pipeline direction not visible in the traces (no step starts with a send): stage 0 taken as "
                             "the lower rank of each chain")
            ordered.append(c)
        if len({len(c) for c in ordered}) > 1:
            notes.append(f"pipelines of different lengths {sorted({len(c) for c in ordered})}: stages as each chain orders them")
        stage = {r: i for c in ordered for i, r in enumerate(c)}
        pipelines = ordered
    pp = max((len(c) for c in pipelines), default=1) if pipelines else 1
    for r in all_ranks:
        stage.setdefault(r, 0)
    if not pipelines:
        used.append("no send/recv between ranks: one stage") if traced else None
    # ---- groups inside a stage: tensor- and data-parallel
    cand = []
    for d, rs, dim in pgs.select("desc", "ranks", "dim").iter_rows():
        rs = [int(x) for x in rs]
        if dim in ("tp", "dp") or (dim is None and len({stage.get(r, 0) for r in rs}) == 1):
            cand.append({"ranks": rs, "dim": dim, "src": "pg_config"})
    if not any(c["src"] == "pg_config" for c in cand) and coll.height:
        for ms in coll.select("members").unique()["members"].to_list():
            ms = [int(x) for x in ms]
            if 1 < len(ms) and len({stage.get(r, 0) for r in ms}) == 1:
                cand.append({"ranks": ms, "dim": None, "src": "collectives"})
    fwd = _forward_share(events, coll) if events is not None and coll.height else pl.DataFrame(
        schema={"members": pl.List(pl.Int32), "fwd_share": pl.Float64})
    fwd_of = {tuple(int(x) for x in m): s for m, s in fwd.iter_rows()}
    cdf = pl.DataFrame(cand, schema={"ranks": pl.List(pl.Int32), "dim": pl.Utf8, "src": pl.Utf8}).unique("ranks", maintain_order=True)
    cdf = cdf.with_columns(size=pl.col("ranks").list.len())
    dims: dict[str, list[list[int]]] = {}
    for dim in ("tp", "dp"):
        sub = cdf.filter(pl.col("dim") == dim)
        if sub.height:
            gs = _partition(sub, all_ranks) if not partial else [list(x) for x in sub["ranks"].to_list()]
            if gs:
                dims[dim] = gs
                used.append(f"{'tensor' if dim == 'tp' else 'data'}-parallel groups named in pg_config")
    undesc = cdf.filter(pl.col("dim").is_null())
    if undesc.height and len(dims) < 2:
        families = []
        for (size,), sub in undesc.partition_by("size", as_dict=True).items():
            # groups of one size may be several dimensions (TP {0,1},{2,3} and DP {0,2},{1,3}): split them
            # into families of disjoint groups first
            fams: list[list[list[int]]] = []
            for g in sub["ranks"].to_list():
                g = sorted(int(x) for x in g)
                home = next((f for f in fams if not any(set(g) & set(h) for h in f)), None)
                fams.append([g]) if home is None else home.append(g)
            for fam in fams:
                fdf = pl.DataFrame({"ranks": fam}, schema={"ranks": pl.List(pl.Int32)})
                gs = _partition(fdf, all_ranks) if not partial else fam
                if gs and not any(sorted(map(sorted, gs)) == sorted(map(sorted, v)) for v in dims.values()):
                    share = [fwd_of.get(tuple(sorted(g))) for g in gs]
                    share = [x for x in share if x is not None]
                    families.append((gs, (sum(share) / len(share)) if share else None, sub["src"][0]))
        free = [d for d in ("tp", "dp") if d not in dims]
        if len(families) == 1 and len(free) >= 1:
            gs, share, src = families[0]
            dim = "tp" if ("dp" in dims or (share is not None and share >= 0.5)) and "tp" in free else "dp"
            dims[dim] = gs
            used.append(f"{'tensor' if dim == 'tp' else 'data'}-parallel groups from {'pg_config' if src == 'pg_config' else 'the collectives'}"
                        + (f" ({share:.0%} of their collectives in the forward pass)" if share is not None else ""))
        elif len(families) >= 2 and free == ["tp", "dp"]:
            # the family whose collectives run in the forward pass is tensor-parallel; else the one of
            # nearer ranks (every launcher puts tensor-parallel ranks next to each other)
            def key(f):
                gs, share, _ = f
                stride = min(max(g) - min(g) for g in gs) / max(1, len(gs[0]) - 1)
                return (-(share or 0.0), stride)
            fam = sorted(families, key=key)[:2]
            dims["tp"], dims["dp"] = fam[0][0], fam[1][0]
            used.append("tensor- and data-parallel groups from the collectives' groups (tensor-parallel: "
                        + ("collectives in the forward pass" if (fam[0][1] or 0) > (fam[1][1] or 0) else "nearer ranks") + ")")
            if len(families) > 2:
                notes.append(f"{len(families)} families of process groups inside a stage: two taken as tensor / data parallel, "
                             "the others (context / expert parallel?) not modelled")
    tp = len(dims["tp"][0]) if "tp" in dims else 1
    per_stage = len(all_ranks) // pp if pp else len(all_ranks)
    if "dp" in dims:
        dp = len(dims["dp"][0])
    else:
        dp = max(1, per_stage // tp)
        if per_stage > tp:
            notes.append(f"no group inside a stage names its data-parallel replicas: the stage's {per_stage // tp} "
                         f"{'pipelines' if pipelines else 'ranks'} taken as data-parallel replicas (dp={dp})")
    tp_rank = _place(dims["tp"]) if "tp" in dims else {}
    dp_rank = _place(dims["dp"]) if "dp" in dims else {}
    if not dp_rank:  # replicas: position among the stage's ranks of the same tensor-parallel place
        by: dict[tuple, list[int]] = {}
        for r in sorted(all_ranks):
            by.setdefault((stage.get(r, 0), tp_rank.get(r, 0)), []).append(r)
        dp_rank = {r: i for rs in by.values() for i, r in enumerate(rs)}
    if world and tp * pp * dp != world:
        notes.append(f"tp {tp} x pp {pp} x dp {dp} = {tp * pp * dp} is not the world size {world}: other dimensions "
                     "(context / expert parallel) or ranks outside these groups are not modelled")
    if partial:
        notes.append(f"{len(traced)} of {world} ranks traced: degrees from the traced ranks' groups only")
    ranks = pl.DataFrame({"rank": traced, "stage": [stage.get(r, 0) for r in traced], "dp_rank": [dp_rank.get(r) for r in traced],
                          "tp_rank": [tp_rank.get(r, 0) for r in traced]}, schema=RANK_SCHEMA)
    lay = Layout(world, tp, pp, dp, ranks, "traces: " + ", ".join(dict.fromkeys(u for u in used if u)), notes)
    return _override(lay, override) if override else lay


def _override(lay: Layout, over: dict) -> Layout:
    """capture.json's `parallel` wins; ranks are placed in Megatron's order (tp fastest, then dp,
    then pp) unless the traces' placement has the same degrees."""
    o = {k: int(over[k]) for k in ("tp", "pp", "dp", "world_size") if over.get(k) is not None}
    traced = {k: getattr(lay, k) for k in ("tp", "pp", "dp")}
    new = Layout(o.get("world_size", lay.world_size), o.get("tp", lay.tp or 1), o.get("pp", lay.pp or 1), o.get("dp", lay.dp),
                 lay.ranks, "capture.json", list(lay.notes))
    diff = {k: (traced[k], o[k]) for k in ("tp", "pp", "dp") if k in o and traced[k] is not None and traced[k] != o[k]}
    if diff:
        new.notes.append("capture.json overrides the traces' layout: " + ", ".join(f"{k} {a} -> {b}" for k, (a, b) in diff.items()))
        tp, dp = new.tp or 1, new.dp or 1
        r = pl.col("rank")
        new.ranks = lay.ranks.select("rank", stage=(r // (tp * dp)).cast(pl.Int32), dp_rank=((r // tp) % dp).cast(pl.Int32),
                                     tp_rank=(r % tp).cast(pl.Int32))
    if new.dp is None and new.world_size:
        new.dp = max(1, new.world_size // ((new.tp or 1) * (new.pp or 1)))
    return new


def capture_layout(files: pl.DataFrame | None, events: pl.DataFrame | None, declared: dict | None = None) -> Layout:
    """The layout of a capture as the platform records it: inferred from its traces, capture.json's
    `parallel` (declared: dp, pp, tp, world_size) over it."""
    over = {k: declared[k] for k in ("dp", "pp", "tp", "world_size") if declared and declared.get(k) is not None}
    lay = infer_layout(files, events, override=over or None)
    lay.notes = list(dict.fromkeys(lay.notes))
    return lay
