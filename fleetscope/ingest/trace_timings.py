"""Profiler traces as timings (docs/CONTRACT.md 1.4), so a capture that has only traces gets the
timing-based analyses (XPUTimer's metrics, PRISM's models, op-level patterns) too.

`timings_from_trace_events`: trace_events (fleetscope.ingest.traces) -> the kernel and api rows the
tracer writes, where the traces carry the same facts:

- GPU kernels: start/end on the device, issue = the launching CUDA runtime call (same correlation
  id), stream; communication kernels become `nccl:<Collective>` with bytes, group (pg_name) and
  group size; GEMM-like kernels become `gemm` (FLOPs are unknown: traces carry no GEMM shapes);
- CPU-only traces: communication events with a message size (record_param_comms operators, gloo's
  annotations) as kernels timed on the CPU, in their process group when the trace names it;
- API events: the DataLoader `__next__` and `Optimizer.step` operators, device synchronizations;
- step: the enclosing `ProfilerStep#N` annotation.

`ops_from_trace_events`: the framework-level `kind=op` rows (Megatron's timer names, per
microbatch) PRISM and op-level PerfTracker need: annotations the script made with those names
(`record_function("forward-compute")`) when there are any, else derived from each step's
structure on the training thread (`derive_ops`, documented there).

`capture_timings`: what a capture's timing analyses read: its landed timings, completed from its
traces where the timings lack kernel/api rows or op rows.
"""
from __future__ import annotations

import polars as pl

from fleetscope.common import by_name

_CAMEL = {"allreduce": "AllReduce", "allgather": "AllGather", "reduce_scatter": "ReduceScatter", "broadcast": "Broadcast",
          "send": "Send", "recv": "Recv", "all_to_all": "AllToAll", "reduce": "Reduce", "barrier": "Barrier"}
_GEMM = r"(?i)gemm|cutlass|xmma|cublas|matmul|s\d+_tensorop|ampere_.*(?:nn|nt|tn|tt)"


def timings_from_trace_events(ev: pl.DataFrame) -> pl.DataFrame:
    if ev.height == 0:
        raise ValueError("no trace events")
    key = ["capture_id", "rank"]
    coll = pl.col("collective")
    camel = coll.replace_strict(_CAMEL, default=None)
    backend = pl.when(pl.col("name").str.to_lowercase().str.starts_with("gloo")).then(pl.lit("gloo:")).otherwise(pl.lit("nccl:"))
    comm_name = pl.concat_str([backend, pl.coalesce(camel, coll)])
    launch = ev.filter((pl.col("cat") == "cuda_runtime") & pl.col("correlation").is_not_null()).select(
        *key, "correlation", pl.col("ts_ns").alias("issue_ns"))
    # the columns used, before the filter (not every column of millions of events)
    gpu = ev.lazy().filter(pl.col("cat") == "kernel").select(
        *key, "correlation", "name", "is_comm", "collective", "ts_ns", "end_ns", "stream", "msg_bytes", "pg_name", "group_size").collect()
    gpu = gpu.join(launch, on=[*key, "correlation"], how="left")
    gpu = gpu.select(
        *key, pl.lit("kernel").alias("kind"),
        pl.when(pl.col("is_comm")).then(comm_name).when(pl.col("name").str.contains(_GEMM)).then(pl.lit("gemm"))
        .otherwise(pl.col("name")).alias("name"),
        pl.coalesce("issue_ns", "ts_ns").alias("issue_ns"), pl.col("ts_ns").alias("start_ns"), "end_ns", "stream",
        pl.when(pl.col("is_comm")).then(pl.col("msg_bytes")).alias("bytes"),
        pl.when(pl.col("is_comm")).then(pl.coalesce(pl.col("pg_name"), pl.lit("pg"))).alias("group"),
        pl.when(pl.col("is_comm")).then(pl.col("group_size")).alias("group_size"))
    has_gpu = gpu.height > 0
    parts = [gpu]
    if not has_gpu:
        # CPU-only trace: the communication events that know their size (record_param_comms
        # operators, or gloo's own annotations, `gloo:all_reduce` on its worker threads with the
        # collective's real duration). Without a process-group name (torch 2.13's gloo annotations
        # carry none) the group stays unknown: collectives of different groups must not be matched
        # into one instance, so they count as communication time but not as collective instances
        cpu = ev.filter(pl.col("cat").is_in(["cpu_op", "user_annotation"]) & pl.col("is_comm") & pl.col("msg_bytes").is_not_null())
        parts.append(cpu.select(*key, pl.lit("kernel").alias("kind"), comm_name.alias("name"), pl.col("ts_ns").alias("issue_ns"),
                                pl.col("ts_ns").alias("start_ns"), "end_ns", pl.lit(None, pl.Int64).alias("stream"),
                                pl.col("msg_bytes").alias("bytes"), pl.col("pg_name").alias("group"), "group_size"))
    n = pl.col("name")
    api_name = (pl.when(n.str.contains(r"DataLoader.*__next__|DataLoaderIter\.__next__")).then(pl.lit("dataloader.next"))
                .when(n.str.contains(r"^Optimizer\.step#")).then(pl.lit("optimizer.step"))
                .when(n.str.contains(r"^cuda(Device|Stream)Synchronize$")).then(pl.lit("cuda.synchronize")))
    api = ev.lazy().filter(pl.col("cat").is_in(["cpu_op", "user_annotation", "cuda_runtime"])).select(*key, "name", "ts_ns", "end_ns").collect()
    api = api.with_columns(_api=by_name(api["name"], lambda _: api_name))  # the regexes once per distinct name
    api = api.filter(pl.col("_api").is_not_null()).select(
        *key, pl.lit("api").alias("kind"), pl.col("_api").alias("name"), pl.col("ts_ns").alias("issue_ns"),
        pl.col("ts_ns").alias("start_ns"), "end_ns", pl.lit(None, pl.Int64).alias("stream"), pl.lit(None, pl.Int64).alias("bytes"),
        pl.lit(None, pl.Utf8).alias("group"), pl.lit(None, pl.Int32).alias("group_size"))
    parts.append(api)
    t = pl.concat([p.with_columns(pl.col("group_size").cast(pl.Int32)) for p in parts], how="vertical_relaxed")
    # step: the ProfilerStep#N annotation that contains the CPU-side time (issue) of each row
    steps = ev.filter((pl.col("cat") == "user_annotation") & pl.col("name").str.starts_with("ProfilerStep#")).select(
        *key, pl.col("ts_ns").alias("_s"), pl.col("end_ns").alias("_e"),
        pl.col("name").str.extract(r"#(\d+)").cast(pl.Int64).alias("step")).sort("_s")
    t = t.sort("issue_ns").join_asof(steps, left_on="issue_ns", right_on="_s", by=key, strategy="backward",
                                     check_sortedness=False)
    t = t.with_columns(pl.when(pl.col("issue_ns") <= pl.col("_e")).then(pl.col("step")).alias("step")).drop("_s", "_e")
    return t.with_columns(pl.lit(None, pl.Float64).alias("flops"), pl.lit(None, pl.Utf8).alias("shape")).sort(*key, "start_ns")


# ---------------------------------------------------------------------------- op rows from traces
OP_NAMES = ("forward-compute", "backward-compute", "forward-send", "forward-recv", "backward-send", "backward-recv",
            "grads-all-reduce", "grads-reduce-scatter", "params-all-gather", "optimizer")
# CPU operators that are the model's own compute (a run of forward operators without one is glue:
# allocating a receive buffer, detaching an output)
_MODEL_OP = (r"(?i)^aten::(linear|addmm|mm|bmm|baddbmm|matmul|einsum|conv|_convolution|cudnn_convolution|embedding|"
             r"scaled_dot_product|_scaled_dot_product|_flash|_efficient|layer_norm|native_layer_norm|rms_norm)|^nn\.Module")
def _layout_cols(layout: dict | None) -> list[pl.Expr]:
    """stage / dp_rank / tp_rank of each rank from the capture's layout: each rank's place when the
    layout has them (`ranks`: {rank: (stage, dp_rank, tp_rank)}, fleetscope.traces.layout), else
    Megatron's rank order (tp fastest, then dp, then pp), when the layout is known."""
    if not layout or not layout.get("pp"):
        return []
    r = pl.col("rank")
    if layout.get("ranks"):
        places = layout["ranks"]
        return [r.replace_strict({k: v[i] for k, v in places.items()}, default=None, return_dtype=pl.Int32).alias(c)
                for i, c in enumerate(("stage", "dp_rank", "tp_rank"))]
    tp, dp = int(layout.get("tp") or 1), int(layout.get("dp") or 1)
    return [(r // (tp * dp)).cast(pl.Int32).alias("stage"), ((r // tp) % dp).cast(pl.Int32).alias("dp_rank"),
            (r % tp).cast(pl.Int32).alias("tp_rank")]


def _steps(ev: pl.DataFrame) -> pl.DataFrame:
    return ev.filter((pl.col("cat") == "user_annotation") & pl.col("name").str.starts_with("ProfilerStep#")).select(
        "capture_id", "rank", pl.col("tid").alias("_tid"), pl.col("ts_ns").alias("_s"), pl.col("end_ns").alias("_e"),
        pl.col("name").str.extract(r"#(\d+)").cast(pl.Int64).alias("step")).sort("_s")


# operators the autograd engine runs (its node wrappers, or the nodes themselves in traces without them)
_AUTOGRAD_OP = r"^autograd::engine::evaluate_function|Backward\d*$"
_OPT_FRAME = r"(?i)optim\w*\.py\(\d+\): step$"


def clip_work_spans(ops: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """A backend's work span annotated on the issuing thread (gloo:send of an asynchronous isend) runs in
    the background while the thread goes on: it is not a container of the operators that follow. Its
    end is clipped to the start of the thread's next operator that is not communication (a blocking
    wait keeps its whole span: nothing runs on the thread meanwhile). ops: rows of one thread per `by`
    group with name, cat, ts_ns, end_ns, dur_ns, is_comm."""
    work = (pl.col("cat") == "user_annotation") & pl.col("is_comm")
    if ops.filter(work).height == 0:
        return ops
    nxt = ops.filter(~pl.col("is_comm")).select(*by, _n=pl.col("ts_ns")).sort("_n")
    o = ops.with_row_index("_r").sort("ts_ns").join_asof(nxt, left_on="ts_ns", right_on="_n", by=by, strategy="forward",
                                                         allow_exact_matches=False, check_sortedness=False)
    o = o.with_columns(end_ns=pl.when(work & pl.col("_n").is_not_null()).then(pl.min_horizontal("end_ns", "_n")).otherwise("end_ns"))
    return o.with_columns(dur_ns=pl.col("end_ns") - pl.col("ts_ns")).sort("_r").drop("_r", "_n")


def derive_ops(ev: pl.DataFrame) -> pl.DataFrame:
    """kind=op rows from the structure of each ProfilerStep on its thread (the training thread) and the
    autograd engine's threads, on CPU and GPU traces alike.

    The step's top-level operators are classed (autograd nodes -> backward, on the training thread
    (CPU tensors) or on the engine's own thread (GPU tensors: every top-level operator of a thread that
    runs autograd nodes); Optimizer.step or an `optimizer` annotation -> optimizer; communication
    operators -> p2p or collective, each spanning its nested annotations, e.g. gloo:recv holding the
    wait; annotations named like a backward pass -> backward; other operators -> forward) and
    consecutive operators of one class make a run. A collective between two runs of the same
    compute class is part of that compute (tensor- or sequence-parallel communication inside a layer).
    Forward and backward runs are numbered in order (microbatch 0, 1, ...; Megatron's schedules run
    both in microbatch order); a compute run starts where the previous run ended (untraced Python
    before the first traced operator is that compute's time) and, followed by communication or the
    optimizer, lasts until it (DDP's backward() waits for its buckets there; a layer's trailing work);
    a forward run with no model operator (a buffer allocation, a detach) is glue and not an op.
    A p2p run after a forward run sends forward (`forward-send`), after a backward run backward; a
    recv in it receives for the next run (`forward-recv` / `backward-recv`); a fused send+recv gets
    both names with the same span, as Megatron's timers record them. Collectives after the step's
    last backward are its data-parallel gradient reduction (`grads-all-reduce` /
    `grads-reduce-scatter`); when the training thread issued none (DDP reduces from its reducer's
    or the autograd engine's threads), the communication on other threads between the first backward
    and the optimizer is. On a rank with GPU kernels an op spans the kernels its operators launched
    (first start to last end on the device; Megatron's timers measure device work the same way)."""
    out_schema = {"capture_id": pl.Utf8, "rank": pl.Int32, "kind": pl.Utf8, "name": pl.Utf8, "issue_ns": pl.Int64,
                  "start_ns": pl.Int64, "end_ns": pl.Int64, "step": pl.Int64, "microbatch": pl.Int32}
    steps = _steps(ev)
    if steps.height == 0:
        return pl.DataFrame(schema=out_schema)
    key = ["capture_id", "rank", "step"]
    cols = ["capture_id", "rank", "tid", "name", "cat", "ts_ns", "end_ns", "dur_ns", "is_comm", "collective"]
    ops = ev.lazy().filter(pl.col("cat").is_in(["cpu_op", "user_annotation"]) & ~pl.col("name").str.starts_with("ProfilerStep#")).select(
        cols).collect()
    # Python frames are containers of everything (with_stack): only the optimizer's step() frame is an op
    frames = ev.lazy().filter(pl.col("cat") == "python_function").select(cols).collect()
    # the threads that matter: the training thread, the autograd engine's (other threads of the rank that
    # run autograd nodes) and those that communicate (DDP's reducer); the rest (data loaders, ...) never sorted
    main_t = steps.select("capture_id", "rank", tid="_tid").unique()
    other = ops.join(main_t, on=["capture_id", "rank", "tid"], how="anti")
    bthreads = other.filter((_name_flags(other["name"]) & _F_AUTOGRAD) > 0).select("capture_id", "rank", "tid").unique().with_columns(
        _bt=pl.lit(True))
    keep = pl.concat([main_t, bthreads.drop("_bt"), other.filter(pl.col("is_comm")).select("capture_id", "rank", "tid").unique()]).unique()
    cand = pl.concat([ops.join(keep, on=["capture_id", "rank", "tid"], how="semi"),
                      frames.filter(pl.col("name").str.contains(_OPT_FRAME))]).sort("ts_ns")
    m = cand.join_asof(steps, left_on="ts_ns", right_on="_s", by=["capture_id", "rank"], strategy="backward", check_sortedness=False)
    m = m.filter(pl.col("step").is_not_null() & (pl.col("ts_ns") < pl.col("_e")))
    m = m.join(bthreads, on=["capture_id", "rank", "tid"], how="left").with_columns(pl.col("_bt").fill_null(False))
    on_main = pl.col("tid") == pl.col("_tid")
    seq_rows = clip_work_spans(m.filter(on_main | (pl.col("_bt") & ~pl.col("is_comm"))), [*key, "tid"])
    main = seq_rows.sort([*key, "tid", "ts_ns", "dur_ns"], descending=[False] * (len(key) + 2) + [True])
    main = main.with_columns(_pme=pl.col("end_ns").cum_max().shift(1).over([*key, "tid"]))
    main = main.with_columns(_top=pl.col("_pme").is_null() | (pl.col("ts_ns") >= pl.col("_pme")))
    main = main.with_columns(_grp=pl.col("_top").cast(pl.Int64).cum_sum().over([*key, "tid"]))
    main = main.with_columns(_f=_name_flags(main["name"]))
    ann = pl.col("cat") == "user_annotation"
    f = pl.col("_f")
    cls = (pl.when(pl.col("_bt") | ((f & _F_AUTOGRAD) > 0)).then(pl.lit("bwd"))
           .when(((f & _F_SKIP) > 0) | (ann & ((f & _F_ZERO_ANN) > 0))).then(pl.lit("skip"))
           .when(((f & _F_OPT) > 0) | (ann & ((f & _F_OPT_ANN) > 0))).then(pl.lit("opt"))
           .when(pl.col("is_comm") & pl.col("collective").is_in(["send", "recv"])).then(pl.lit("p2p"))
           .when(pl.col("is_comm")).then(pl.lit("coll"))
           .when(ann & ((f & _F_BWD_ANN) > 0)).then(pl.lit("bwd"))
           .otherwise(pl.lit("fwd")))
    items = main.group_by([*key, "tid", "_grp"]).agg(
        pl.col("ts_ns").first().alias("s"), pl.col("end_ns").max().alias("e"),
        cls.first().alias("cls"), pl.col("_s").first(), pl.col("_e").first(),
        # an annotation around a whole microbatch's work (a pipeline schedule's `Forward 2`) is one run by itself
        ((pl.col("cat").first() == "user_annotation") & (pl.len() > 1) & ~pl.col("is_comm").first()).alias("_box"),
        ((f & _F_MODEL) > 0).any().alias("model"),
        pl.col("collective").filter(pl.col("is_comm")).unique().alias("colls")).sort([*key, "s"])
    items = items.filter(pl.col("cls") != "skip").drop("tid")
    runs = _runs(items, key)
    # communication between two runs of one compute class belongs to that compute (tensor parallelism)
    inner = (pl.col("cls") == "coll") & pl.col("_prev_cls").is_in(["fwd", "bwd"]) & (pl.col("_prev_cls") == pl.col("_next_cls"))
    if runs.filter(inner).height:
        items = items.with_row_index("_item")
        hit = items.join(runs.filter(inner).select(*key, _rs="s", _re="e", _into=pl.col("_prev_cls")), on=key).filter(
            (pl.col("s") >= pl.col("_rs")) & (pl.col("s") < pl.col("_re"))).select("_item", "_into")
        items = items.join(hit, on="_item", how="left").with_columns(cls=pl.coalesce("_into", "cls")).drop("_item", "_into")
        runs = _runs(items, key)
    runs = runs.filter((pl.col("cls") != "fwd") | pl.col("model"))  # glue runs are not ops
    runs = runs.with_columns(
        _prev_end=pl.col("e").shift(1).over(key), _prev_cls=pl.col("cls").shift(1).over(key),
        _next_cls=pl.col("cls").shift(-1).over(key))
    # a compute run starts where the previous run ended (or where the step began)
    runs = runs.with_columns(
        pl.when(pl.col("cls").is_in(["fwd", "bwd"])).then(pl.coalesce("_prev_end", "_s")).otherwise("s").alias("s"),
        # and a compute run followed by communication or the optimizer lasts until it: the untraced work
        # after its last operator (Python, a layer's own sleep or kernel wait) is still its compute
        pl.when(pl.col("cls").is_in(["fwd", "bwd"]) & pl.col("_next_cls").is_in(["opt", "coll", "p2p"]))
        .then(pl.max_horizontal("e", pl.col("s").shift(-1).over(key))).otherwise("e").alias("e"))
    runs = runs.with_columns(
        mb=pl.when(pl.col("cls").is_in(["fwd", "bwd"])).then(pl.int_range(pl.len()).over([*key, "cls"])).cast(pl.Int32))
    runs = runs.with_columns(
        _prev_mb=pl.col("mb").shift(1).over(key), _next_mb=pl.col("mb").shift(-1).over(key),
        _last_bwd=pl.col("s").filter(pl.col("cls") == "bwd").max().over(key))
    direction = {"fwd": "forward", "bwd": "backward"}
    rows = []
    for r in runs.iter_rows(named=True):
        base = {"capture_id": r["capture_id"], "rank": r["rank"], "step": r["step"], "start_ns": r["s"], "end_ns": r["e"],
                "_cls": r["cls"]}
        c = r["cls"]
        if c in ("fwd", "bwd"):
            rows.append({**base, "name": f"{direction[c]}-compute", "microbatch": r["mb"]})
        elif c == "opt":
            rows.append({**base, "name": "optimizer", "microbatch": None})
        elif c == "p2p":
            if "send" in r["colls"] and r["_prev_cls"] in direction:
                rows.append({**base, "name": f"{direction[r['_prev_cls']]}-send", "microbatch": r["_prev_mb"]})
            if "recv" in r["colls"] and r["_next_cls"] in direction:
                rows.append({**base, "name": f"{direction[r['_next_cls']]}-recv", "microbatch": r["_next_mb"]})
        elif c == "coll":
            after_bwd = r["_last_bwd"] is not None and r["s"] >= r["_last_bwd"]
            colls = set(r["colls"])
            if after_bwd and colls <= {"allreduce"}:
                rows.append({**base, "name": "grads-all-reduce", "microbatch": None})
            elif after_bwd and colls <= {"reduce_scatter"}:
                rows.append({**base, "name": "grads-reduce-scatter", "microbatch": None})
            elif colls <= {"allgather"} and r["_prev_cls"] in (None, "opt"):
                rows.append({**base, "name": "params-all-gather", "microbatch": None})
            else:
                for cc in sorted(colls):
                    rows.append({**base, "name": f"comm:{_CAMEL.get(cc, cc)}", "microbatch": None})
    ops_schema = {**{k: v for k, v in out_schema.items() if k not in ("kind", "issue_ns")}, "_cls": pl.Utf8}
    ops = pl.DataFrame(rows, schema=ops_schema) if rows else pl.DataFrame(schema=ops_schema)
    # DDP: the gradient reduction runs on the reducer's (or the autograd engine's) threads, overlapping backward
    side = m.filter(~on_main & pl.col("is_comm"))
    if side.height:
        win = runs.group_by(key).agg(pl.col("s").filter(pl.col("cls") == "bwd").min().alias("_b0"),
                                     pl.col("s").filter(pl.col("cls") == "opt").min().fill_null(pl.col("_e").first()).alias("_o"))
        have = ops.filter(pl.col("name").is_in(["grads-all-reduce", "grads-reduce-scatter"])).select(key).unique()
        dp = (side.join(win, on=key).filter((pl.col("ts_ns") >= pl.col("_b0")) & (pl.col("ts_ns") < pl.col("_o")))
              .join(have, on=key, how="anti").group_by(key).agg(
                  pl.col("ts_ns").min().alias("start_ns"), pl.col("end_ns").max().alias("end_ns"),
                  pl.col("collective").unique().alias("_c")))
        dp = dp.with_columns(name=pl.when(pl.col("_c").list.eval(pl.element() == "reduce_scatter").list.any())
                             .then(pl.lit("grads-reduce-scatter")).otherwise(pl.lit("grads-all-reduce")),
                             microbatch=pl.lit(None, pl.Int32), _cls=pl.lit("side")).drop("_c")
        ops = pl.concat([ops, dp.select(ops.columns)], how="vertical_relaxed")
    ops = _device_spans(ops, ev, m, key)
    return ops.with_columns(kind=pl.lit("op"), issue_ns=pl.col("start_ns")).select(list(out_schema)).sort(*key, "start_ns")


# what an operator's name says, as bits (derive_ops): the regexes run once per distinct name, not on
# every one of a million operators
_F_AUTOGRAD, _F_SKIP, _F_ZERO_ANN, _F_OPT, _F_OPT_ANN, _F_BWD_ANN, _F_MODEL = (1 << k for k in range(7))


def _name_flags(names: pl.Series) -> pl.Expr:
    return by_name(names, lambda n: pl.sum_horizontal(
        n.str.contains(_AUTOGRAD_OP).cast(pl.Int32) * _F_AUTOGRAD,
        (n.str.starts_with("Optimizer.zero_grad#") | n.str.contains(r"DataLoader")).cast(pl.Int32) * _F_SKIP,
        n.str.contains(r"(?i)zero_grad").cast(pl.Int32) * _F_ZERO_ANN,
        (n.str.starts_with("Optimizer.step#") | n.str.contains(_OPT_FRAME)).cast(pl.Int32) * _F_OPT,
        n.str.contains(r"(?i)optimi[sz]er").cast(pl.Int32) * _F_OPT_ANN,
        n.str.contains(r"(?i)\bbackward\b").cast(pl.Int32) * _F_BWD_ANN,
        n.str.contains(_MODEL_OP).cast(pl.Int32) * _F_MODEL)).fill_null(0).cast(pl.Int32)


def _runs(items: pl.DataFrame, key: list[str]) -> pl.DataFrame:
    """Consecutive items of one class -> runs, with their neighbours' classes."""
    items = items.sort([*key, "s"])
    new_run = (pl.col("cls") != pl.col("cls").shift(1)).fill_null(True)
    if "_box" in items.columns:
        # boxes next to boxes of their class (`Forward 0`, `Forward 1`, ...) are one microbatch each; a lone
        # box (DistributedDataParallel.forward) stays in the run of the operators around it
        same = pl.col("cls") == pl.col("cls").shift(1)
        items = items.with_columns(_seq=pl.col("_box") & ((same & pl.col("_box").shift(1)).fill_null(False)
                                                          | ((pl.col("cls") == pl.col("cls").shift(-1)) & pl.col("_box").shift(-1)).fill_null(False)))
        new_run = new_run | pl.col("_seq")
    items = items.with_columns(_run=new_run.cast(pl.Int32).cum_sum().over(key))
    runs = items.group_by([*key, "_run"]).agg(
        pl.col("cls").first(), pl.col("s").min(), pl.col("e").max(), pl.col("model").any(),
        pl.col("colls").list.explode(keep_nulls=False, empty_as_null=False).unique(),
        pl.col("_s").first(), pl.col("_e").first()).sort([*key, "_run"])
    return runs.with_columns(_prev_cls=pl.col("cls").shift(1).over(key), _next_cls=pl.col("cls").shift(-1).over(key))


def _device_spans(ops: pl.DataFrame, ev: pl.DataFrame, m: pl.DataFrame, key: list[str]) -> pl.DataFrame:
    """On ranks with GPU kernels: each op's span on the device, from the first start to the last end of
    the kernels launched while it ran on the host (compute ops: by the training thread or the autograd
    engine's; communication ops: the communication kernels launched in their span). Ops that launched
    nothing keep their host span."""
    if ops.height == 0 or not ev.filter(pl.col("cat") == "kernel").height:
        return ops.drop("_cls")
    k = ev.filter(pl.col("cat").is_in(["kernel", "gpu_memcpy", "gpu_memset"]) & pl.col("correlation").is_not_null()).select(
        "capture_id", "rank", "correlation", _ks="ts_ns", _ke="end_ns", _kc="is_comm")
    launch = ev.filter((pl.col("cat") == "cuda_runtime") & pl.col("correlation").is_not_null()).select(
        "capture_id", "rank", "correlation", _lt="ts_ns", tid="tid")
    kl = launch.join(k, on=["capture_id", "rank", "correlation"]).sort("_lt")
    if kl.height == 0:
        return ops.drop("_cls")
    threads = m.select("capture_id", "rank", "tid", "_bt", "_tid").unique(["capture_id", "rank", "tid"])
    kl = kl.join(threads, on=["capture_id", "rank", "tid"], how="left").with_columns(
        _main=(pl.col("tid") == pl.col("_tid")).fill_null(False), _bt=pl.col("_bt").fill_null(False))
    o = ops.with_row_index("_i")
    spans = []
    for cls_set, sel in ((["fwd", "opt"], pl.col("_main") & ~pl.col("_kc")), (["bwd"], pl.col("_bt") | (pl.col("_main") & ~pl.col("_kc"))),
                         (["p2p", "coll", "side"], pl.col("_kc"))):
        oo = o.filter(pl.col("_cls").is_in(cls_set)).select("_i", "capture_id", "rank", "start_ns", "end_ns").sort("start_ns")
        if oo.height == 0:
            continue
        j = kl.filter(sel).join_asof(oo, left_on="_lt", right_on="start_ns", by=["capture_id", "rank"], strategy="backward",
                                     check_sortedness=False)
        j = j.filter(pl.col("_i").is_not_null() & (pl.col("_lt") < pl.col("end_ns")))
        spans.append(j.group_by("_i").agg(_ds=pl.col("_ks").min(), _de=pl.col("_ke").max()))
    if not spans:
        return ops.drop("_cls")
    sp = pl.concat(spans).group_by("_i").agg(pl.col("_ds").min(), pl.col("_de").max())
    o = o.join(sp, on="_i", how="left").with_columns(start_ns=pl.coalesce("_ds", "start_ns"), end_ns=pl.coalesce("_de", "end_ns"))
    return o.drop("_i", "_ds", "_de", "_cls")


def ops_from_trace_events(ev: pl.DataFrame, layout: dict | None = None) -> pl.DataFrame:
    """kind=op rows of a capture's traces: the script's own annotations with Megatron's op names
    (record_function("forward-compute"), ...) for ranks that have them, else derive_ops."""
    marked = ev.filter((pl.col("cat") == "user_annotation") & pl.col("name").is_in(list(OP_NAMES)))
    ranks_marked = marked.select("capture_id", "rank").unique()
    parts = []
    if marked.height:
        steps = _steps(ev)
        mk = marked.select("capture_id", "rank", pl.lit("op").alias("kind"), "name", pl.col("ts_ns").alias("issue_ns"),
                           pl.col("ts_ns").alias("start_ns"), "end_ns").sort("start_ns")
        mk = mk.join_asof(steps.select("capture_id", "rank", "_s", "step"), left_on="start_ns", right_on="_s",
                          by=["capture_id", "rank"], strategy="backward", check_sortedness=False).drop("_s")
        mk = mk.with_columns(microbatch=pl.int_range(pl.len()).over("capture_id", "rank", "step", "name").cast(pl.Int32))
        mk = mk.with_columns(pl.when(pl.col("name").str.ends_with("-compute") | pl.col("name").str.contains("send|recv"))
                             .then(pl.col("microbatch")).alias("microbatch"))
        parts.append(mk)
    rest = ev.join(ranks_marked, on=["capture_id", "rank"], how="anti") if marked.height else ev
    if rest.height:
        parts.append(derive_ops(rest))
    if not parts:
        return derive_ops(ev.head(0))
    out = pl.concat(parts, how="diagonal_relaxed")
    return out.with_columns(pl.col("rank").cast(pl.Int32), *_layout_cols(layout))


def trace_gaps(events: pl.DataFrame) -> list[str]:
    """What a capture's traces cannot give, in words (the capture's notes and the run summary): ranks
    without ProfilerStep# annotations (no iterations, step times or op rows), no traced backward pass,
    no input shapes (record_shapes off: the gradient volume of a data-parallel what-if is unknown)."""
    if events is None or events.height == 0:
        return ["no profiler trace events"]
    out = []
    ranks = events["rank"].unique()
    stepped = events.filter((pl.col("cat") == "user_annotation") & pl.col("name").str.starts_with("ProfilerStep#"))["rank"].unique()
    missing = sorted(set(ranks.to_list()) - set(stepped.to_list()))
    if missing:
        out.append(f"rank(s) {missing} have no ProfilerStep# annotation: no iterations, step times or op rows for them (profile "
                   "with a torch.profiler.schedule and call prof.step() every step)")
    if not events.filter(pl.col("name").str.contains(_AUTOGRAD_OP)).height:
        out.append("no backward pass in the traces (no autograd nodes): no backward-compute op rows, no pipeline model")
    if "weight_bytes" in events.columns and events["weight_bytes"].null_count() == events.height:
        out.append("no operator input shapes (record_shapes off): a data-parallel what-if for a job without data parallelism "
                   "cannot size its gradients")
    return out


def capture_timings(timings: pl.DataFrame | None, events: pl.DataFrame | None, layout: dict | None = None,
                    need_ops: bool = False) -> tuple[pl.DataFrame, list[str]]:
    """What a capture's timing analyses read, and notes saying what came from where: the landed
    timings; with none, the kernel/api rows from its traces; and (need_ops) op rows derived from
    its traces when the timings have none."""
    timings = timings if timings is not None else pl.DataFrame()
    has_ev = events is not None and events.height > 0
    notes = []
    t = timings
    if t.height == 0 and has_ev:
        t = _as_timings(timings_from_trace_events(events))
        notes.append("no tracer timings: kernel and API rows converted from the capture's profiler traces")
    if need_ops and has_ev and ("kind" not in t.columns or t.filter(pl.col("kind") == "op").height == 0):
        ops = _as_timings(ops_from_trace_events(events, layout))
        if ops.height:
            t = pl.concat([t, ops], how="diagonal_relaxed") if t.height else ops
            notes.append(f"op rows ({ops.height}) derived from the profiler traces' step structure")
        else:
            notes.append("no op rows could be derived from the traces: " + ("; ".join(trace_gaps(events)) or
                                                                            "no forward or backward pass recognized in any step"))
    return t, notes


def _as_timings(df: pl.DataFrame) -> pl.DataFrame:
    """The ingested timings table's shape (docs/CONTRACT.md 2.1 timings), marked as from the traces."""
    from fleetscope.schemas.base import conform
    from fleetscope.schemas.landing import TIMINGS

    if df.height == 0:
        return conform(df, TIMINGS)
    df = df.with_columns((pl.col("end_ns") - pl.col("start_ns")).clip(lower_bound=0).alias("duration_ns"),
                         pl.lit("profiler traces").alias("source_file"))
    return TIMINGS.validate(conform(df, TIMINGS))
