"""PerfTracker 4.2 critical path per worker.

A function execution (or a part of it) is on the critical path when no higher-priority function
runs at that time. Priorities: GPU compute kernels (0) > memory operations (1) > collective
communication (2) > Python/CPU functions (3). A CPU function additionally needs to be on a
training thread and to have no child running (only its self time can be critical).

Functions are identified as PerfTracker does: kernels, memory ops and collectives by name, CPU
functions by their whole call stack, derived from the nesting of python_function / cpu_op /
cuda_runtime events on the thread.

What a function is on real traces:
- Containers group other events: profiler annotations (ProfilerStep#, record_function ranges and
  the framework's own, e.g. `DistributedDataParallel.forward`, `Optimizer.step#SGD.step`), module
  wrappers (`nn.Module: X`, `_call_impl`) and autograd wrappers (`autograd::engine::evaluate_function:
  X`, `CompiledFunction[Backward]`). Like every CPU function only their exclusive time (the time no
  traced child runs: Python the profiler does not see, data loading, sleeps) can hold the critical
  path; `container` marks them so a verdict says what that time is.
- Communication on the CPU (gloo's `gloo:send` / `gloo:recv` / `gloo:all_reduce` annotations, c10d
  operators) is a collective whatever its event category.
- A rank whose trace has no GPU activity (a CPU-only run: gloo, no kernels) computes on the CPU: its
  operators (cpu_op that are not containers) are its compute, at compute priority; containers'
  exclusive time and Python functions stay CPU functions.

Everything is interval arithmetic in numpy: unions of higher-priority intervals (sort + running
max), subtraction of a union from every interval (searchsorted into the union's gaps + explode).
Python loops only over small things: ranks (or rank x step), priority levels, stack depths.
"""
from __future__ import annotations

import numpy as np
import polars as pl

from fleetscope.common import union_intervals

PRIORITY = {"compute": 0, "memory": 1, "collective": 2, "python": 3}
CATEGORIES = list(PRIORITY)

# trace_events cat values that make up a CPU thread's call stack
_CPU_STACK_CATS = ["python_function", "cpu_op", "user_annotation", "cuda_runtime", "cuda_driver"]
# runtime calls that are memory operations (PerfTracker: malloc, memcpy, memset)
_MEM_RUNTIME = r"(?i)^cuda(Malloc|Free|Memcpy|Memset|HostAlloc|HostFree)|^hip(Malloc|Free|Memcpy|Memset)"
STACK_SEP = " > "
# containers (see the module docstring): annotations are recognised by category, these by name
_CONTAINER_NAME = (r"^(ProfilerStep#|nn\.Module: |autograd::engine::evaluate_function: |CompiledFunction(Backward)?$|"
                   r"Optimizer\.(step|zero_grad)#|## )|(_call_impl|_wrapped_call_impl)$|^DistributedDataParallel\.")
_GPU_CATS = ["kernel", "gpu_memcpy", "gpu_memset"]


def container_expr(cat: pl.Expr, name: pl.Expr) -> pl.Expr:
    """True for events that only group others (annotations, module and autograd wrappers)."""
    return (cat == "user_annotation") | (cat.is_in(["cpu_op", "python_function"]) & name.str.contains(_CONTAINER_NAME))

REQUIRED_EVENT_COLUMNS = ["rank", "cat", "name", "pid", "tid", "ts_ns", "dur_ns"]
# every trace_events column PerfTracker reads (a reader may load only these: a big capture's other
# columns would cost memory for nothing)
EVENT_COLUMNS = ["capture_id", "rank", "event_id", "cat", "name", "pid", "tid", "ts_ns", "dur_ns", "end_ns", "device", "is_comm",
                 "collective", "msg_bytes", "group_size", "group_ranks"]


class CriticalPathError(ValueError):
    pass


def _check_columns(df: pl.DataFrame, required: list[str], what: str) -> None:
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise CriticalPathError(f"{what} lacks column(s) {missing}; got {df.columns}")


# ---------------------------------------------------------------------------------------------
# interval arithmetic (numpy, one worker at a time; the union is fleetscope.common.union_intervals)


def subtract_union(s: np.ndarray, e: np.ndarray, us: np.ndarray, ue: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pieces of each interval [s_i, e_i) outside the disjoint sorted union (us, ue).

    Returns (idx, ps, pe): the interval each piece belongs to and the piece bounds."""
    n = s.size
    if us.size == 0:
        keep = e > s
        return np.nonzero(keep)[0], s[keep], e[keep]
    big = np.iinfo(np.int64).max
    # gaps of the union: gap j = [ue[j-1], us[j]) with ue[-1] = -inf and us[len] = +inf
    gap_s = np.concatenate([[-big], ue])
    gap_e = np.concatenate([us, [big]])
    j_lo = np.searchsorted(gap_e, s, side="right")   # first gap ending after s
    j_hi = np.searchsorted(gap_s, e, side="left") - 1  # last gap starting before e
    cnt = np.maximum(j_hi - j_lo + 1, 0)
    idx = np.repeat(np.arange(n), cnt)
    off = np.arange(idx.size) - np.repeat(np.cumsum(cnt) - cnt, cnt)
    j = j_lo[idx] + off
    ps = np.maximum(s[idx], gap_s[j])
    pe = np.minimum(e[idx], gap_e[j])
    keep = pe > ps
    return idx[keep], ps[keep], pe[keep]


# ---------------------------------------------------------------------------------------------
# classification


def _normalize_name(expr: pl.Expr) -> pl.Expr:
    # ProfilerStep#12 and friends: the step number would make every iteration a new function
    return expr.str.replace_all(r"#\d+", "#")


def training_threads(events: pl.DataFrame) -> pl.DataFrame:
    """(rank, pid, tid) of each rank's training thread: the main Python thread, i.e. the thread
    with the most python_function events, ties (or traces without Python stacks) broken by the
    time its CPU events cover (the main thread wraps each iteration in ProfilerStep#N). The
    autograd engine's thread, data-loader workers and other helpers are left out: PerfTracker
    counts Python functions on the training thread only (not threads started by _bootstrap);
    the backward pass shows there as the blocking backward() call."""
    cpu = events.filter(pl.col("cat").is_in(_CPU_STACK_CATS) & (pl.col("dur_ns") > 0))
    if cpu.height == 0:
        return pl.DataFrame(schema={"rank": pl.Int32, "pid": pl.Utf8, "tid": pl.Utf8})
    cpu = cpu.with_columns(pl.col("rank").cast(pl.Int32), end_=pl.col("ts_ns") + pl.col("dur_ns"))
    rows = []
    for (rank, pid, tid), g in cpu.group_by("rank", "pid", "tid"):  # threads: few
        us, ue = union_intervals(g["ts_ns"].to_numpy(), g["end_"].to_numpy())
        rows.append((rank, pid, tid, int((g["cat"] == "python_function").sum()), int((ue - us).sum())))
    per = pl.DataFrame(rows, schema={"rank": pl.Int32, "pid": pl.Utf8, "tid": pl.Utf8, "n_py": pl.Int64, "covered": pl.Int64}, orient="row")
    return per.sort(["rank", "n_py", "covered", "tid"], descending=[False, True, True, False]).unique("rank", keep="first", maintain_order=True).select("rank", "pid", "tid")


def classify_events(events: pl.DataFrame, threads: pl.DataFrame | None = None) -> pl.DataFrame:
    """trace_events -> the events that can hold the critical path, with category, priority,
    function (kernel name / memory op name / collective name / CPU call stack), function_name
    (the leaf), and for CPU functions their stack depth and thread.

    GPU kernels with is_comm are collectives, other kernels compute; gpu_memcpy / gpu_memset and
    the runtime's malloc/memcpy/memset calls are memory ops; CPU events with is_comm (gloo, c10d,
    whatever their category) are collectives; remaining CPU events on training threads form the
    call stacks: on a rank without GPU activity its operators are compute (priority 0), else they
    and everything else on the stack are CPU functions. `container` marks annotations and wrappers."""
    _check_columns(events, REQUIRED_EVENT_COLUMNS, "trace_events")
    ev = events
    if "end_ns" not in ev.columns:
        ev = ev.with_columns(end_ns=pl.col("ts_ns") + pl.col("dur_ns"))
    if "is_comm" not in ev.columns:
        ev = ev.with_columns(is_comm=pl.lit(False))
    if "event_id" not in ev.columns:
        ev = ev.with_columns(event_id=pl.int_range(pl.len(), dtype=pl.Int64).over("rank"))
    for c in ("step",):
        if c not in ev.columns:
            ev = ev.with_columns(pl.lit(None, dtype=pl.Int64).alias(c))
    # only the columns used below (trace_events has ~30: every copy of the others is wasted)
    keep = ["rank", "step", "event_id", "pid", "tid", "cat", "name", "ts_ns", "end_ns", "dur_ns", "is_comm",
            "collective", "msg_bytes", "group_size", "group_ranks"]
    ev = ev.select([c for c in keep if c in ev.columns])
    ev = ev.filter(pl.col("dur_ns") > 0).with_columns(
        pl.col("rank").cast(pl.Int32), name_n=_normalize_name(pl.col("name")), is_comm=pl.col("is_comm").fill_null(False)
    )
    gpu_ranks = ev.filter(pl.col("cat").is_in(_GPU_CATS)).select(pl.col("rank").unique())["rank"]
    cat = pl.col("cat")
    container = container_expr(cat, pl.col("name"))
    category = (
        pl.when((cat == "kernel") & pl.col("is_comm")).then(pl.lit("collective"))
        .when(cat == "kernel").then(pl.lit("compute"))
        .when(cat.is_in(["gpu_memcpy", "gpu_memset"])).then(pl.lit("memory"))
        .when(cat.is_in(["cuda_runtime", "cuda_driver"]) & pl.col("name").str.contains(_MEM_RUNTIME)).then(pl.lit("memory"))
        .when(cat.is_in(["cpu_op", "python_function", "user_annotation"]) & pl.col("is_comm")).then(pl.lit("collective"))
        # a CPU-only rank: its operators are its compute
        .when((cat == "cpu_op") & ~container & ~pl.col("rank").is_in(gpu_ranks.implode())).then(pl.lit("compute"))
        .when(cat.is_in(_CPU_STACK_CATS)).then(pl.lit("python"))
        .otherwise(None)
    )
    ev = ev.with_columns(category=category, container=container & ~pl.col("is_comm")).filter(pl.col("category").is_not_null())
    on_stack = cat.is_in(_CPU_STACK_CATS) & ~pl.col("is_comm")  # CPU compute of a CPU-only rank nests like any CPU event
    gpu_like = ev.filter(~on_stack).with_columns(
        function=pl.col("name_n"), function_name=pl.col("name_n"), depth=pl.lit(None, dtype=pl.Int32)
    )
    if threads is None:
        threads = training_threads(ev)
    cpu = ev.filter(on_stack).join(threads, on=["rank", "pid", "tid"], how="semi")
    cpu = _call_stacks(cpu)
    cols = ["rank", "step", "event_id", "pid", "tid", "ts_ns", "end_ns", "dur_ns", "category", "function", "function_name", "depth",
            "container", "is_comm", "collective", "msg_bytes", "group_size", "group_ranks", "_thread"]
    out = []
    for f in (gpu_like, cpu):
        for c in cols:
            if c not in f.columns:
                f = f.with_columns(pl.lit(None).alias(c))
        out.append(f.select(cols))
    res = pl.concat(out, how="vertical_relaxed")
    return res.with_columns(priority=pl.col("category").replace_strict(PRIORITY, return_dtype=pl.Int8))


def _call_stacks(cpu: pl.DataFrame) -> pl.DataFrame:
    """Depth, parent and full call-stack string of each CPU event from the nesting of intervals
    on its thread (sorted by start, longer first: a parent precedes its children)."""
    if cpu.height == 0:
        return cpu.with_columns(function=pl.lit(None, pl.Utf8), function_name=pl.lit(None, pl.Utf8), depth=pl.lit(None, pl.Int32))
    # equal intervals (common at microsecond resolution: an operator and the runtime call it makes)
    # nest by kind (annotations outermost, runtime and driver calls innermost), then by file order, so
    # the same trace gives the same call stacks on every rank
    nest = pl.col("cat").replace_strict({"user_annotation": 0, "python_function": 1, "cpu_op": 2, "cuda_runtime": 3, "cuda_driver": 4},
                                        default=2, return_dtype=pl.Int8)
    cpu = cpu.with_columns(_nest=nest).sort(["rank", "pid", "tid", "ts_ns", "end_ns", "_nest", "event_id"],
                                            descending=[False, False, False, False, True, False, False], maintain_order=True).drop("_nest")
    thread = cpu.select(pl.struct("rank", "pid", "tid").rank("dense") - 1).to_series().to_numpy().astype(np.int64)
    s = cpu["ts_ns"].to_numpy()
    e = cpu["end_ns"].to_numpy()
    n = s.size
    pos = np.arange(n)
    # per thread: depth_i = (events before i on the thread) - (events on the thread ending at or
    # before s_i); with positive durations every such event precedes i in the sort order
    depth = np.empty(n, np.int64)
    for t in np.unique(thread):  # few threads per capture
        lo, hi = np.searchsorted(thread, [t, t + 1])
        ends = np.sort(e[lo:hi])
        depth[lo:hi] = (pos[lo:hi] - lo) - np.searchsorted(ends, s[lo:hi], side="right")
    depth = np.maximum(depth, 0)
    # parent: the last event before i on the same thread with depth_i - 1
    names = cpu["name_n"]
    code = cpu.select(pl.col("name_n").rank("dense")).to_series().to_numpy().astype(np.uint64)  # 1..k (no Python strings)
    parent = np.full(n, -1, np.int64)
    key = thread * (n + 1) + pos  # sortable (thread, position)
    for d in range(1, int(depth.max()) + 1 if n else 1):
        cand = np.nonzero(depth == d - 1)[0]
        kids = np.nonzero(depth == d)[0]
        if kids.size == 0 or cand.size == 0:
            continue
        k = np.searchsorted(key[cand], key[kids], side="left") - 1
        ok = k >= 0
        p = np.where(ok, cand[np.clip(k, 0, None)], -1)
        ok &= thread[np.clip(p, 0, None)] == thread[kids]
        parent[kids] = np.where(ok, p, -1)
    # stack ids level by level (hash of parent's stack id and the name), strings per unique stack
    sid = np.zeros(n, np.uint64)
    mult = np.uint64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):
        for d in range(0, int(depth.max()) + 1):
            m = depth == d
            ps = np.where(parent[m] >= 0, sid[np.clip(parent[m], 0, None)], np.uint64(0))
            sid[m] = (ps ^ (code[m] + np.uint64(0x632BE59BD9B4E019))) * mult + np.uint64(d)
    first = np.unique(sid, return_index=True)[1]
    first = first[np.argsort(depth[first], kind="stable")]
    text: dict[int, str] = {}
    first_names = names.gather(first).to_list()
    for i, nm in zip(first.tolist(), first_names):  # one per distinct call stack: small
        pi = parent[i]
        base = text.get(int(sid[pi])) if pi >= 0 else None
        text[int(sid[i])] = (base + STACK_SEP if base else "") + nm
    keys = np.fromiter(text.keys(), np.uint64, len(text))
    vals = np.array(list(text.values()), dtype=object)
    o = np.argsort(keys)
    stacks = vals[o][np.searchsorted(keys[o], sid)]
    return cpu.with_columns(
        function=pl.Series(stacks, dtype=pl.Utf8), function_name=pl.col("name_n"),
        depth=pl.Series(depth, dtype=pl.Int32), _thread=pl.Series(thread),
    )


# ---------------------------------------------------------------------------------------------
# critical pieces


def critical_pieces(classified: pl.DataFrame, by_step: bool = False) -> pl.DataFrame:
    """The critical parts of every classified event: one row per piece with rank, (step),
    event_id, category, function, start_ns, end_ns. An event contributes the parts of its
    interval where no higher-priority event runs on the same worker; an event of a CPU call stack
    (depth not null) also loses the time its children run (children = events one level deeper on
    its thread), so only exclusive time is ever critical.

    by_step: compute per (rank, step) (for op-level timings whose times restart every step)."""
    _check_columns(classified, ["rank", "ts_ns", "end_ns", "priority", "category", "function", "event_id"], "classified events")
    keys = ["rank", "step"] if by_step else ["rank"]
    df = classified.with_columns(_row=pl.int_range(pl.len(), dtype=pl.Int64))
    if "depth" not in df.columns:
        df = df.with_columns(depth=pl.lit(None, dtype=pl.Int32))
    if "_thread" not in df.columns:
        df = df.with_columns(_thread=pl.lit(0, dtype=pl.Int64))
    df = df.sort(keys + ["ts_ns"])
    grp = df.select(pl.struct(keys).rank("dense") - 1).to_series().to_numpy()
    s_all = df["ts_ns"].to_numpy()
    e_all = df["end_ns"].to_numpy()
    pr_all = df["priority"].to_numpy()
    dep_all = df["depth"].fill_null(-1).to_numpy()
    th_all = df["_thread"].fill_null(0).to_numpy()
    bounds = np.searchsorted(grp, np.arange(grp.max() + 2 if grp.size else 1))
    out_idx, out_s, out_e = [], [], []
    for g in range(len(bounds) - 1):
        lo, hi = bounds[g], bounds[g + 1]
        s, e, pr, dep, th = s_all[lo:hi], e_all[lo:hi], pr_all[lo:hi], dep_all[lo:hi], th_all[lo:hi]
        on_stack = dep >= 0
        for p in range(4):
            mine = np.nonzero(pr == p)[0]
            if mine.size == 0:
                continue
            higher = pr < p
            us, ue = union_intervals(s[higher], e[higher])
            flat = mine[~on_stack[mine]]
            if flat.size:  # GPU work and collectives: the parts no higher priority covers
                idx, ps, pe = subtract_union(s[flat], e[flat], us, ue)
                out_idx.append(lo + flat[idx]); out_s.append(ps); out_e.append(pe)
            # events of a CPU call stack: also subtract their children (the next depth on the same
            # thread, whatever their priority): only a function's exclusive time can be critical
            stack = mine[on_stack[mine]]
            for t in np.unique(th[stack]):
                for d in np.unique(dep[stack][th[stack] == t]):
                    sel = stack[(th[stack] == t) & (dep[stack] == d)]
                    kid = on_stack & (th == t) & (dep == d + 1) & ~higher
                    ks, ke = union_intervals(np.concatenate([s[higher], s[kid]]), np.concatenate([e[higher], e[kid]]))
                    idx, ps, pe = subtract_union(s[sel], e[sel], ks, ke)
                    out_idx.append(lo + sel[idx]); out_s.append(ps); out_e.append(pe)
    if out_idx:
        idx = np.concatenate(out_idx); ps = np.concatenate(out_s); pe = np.concatenate(out_e)
    else:
        idx = np.zeros(0, np.int64); ps = np.zeros(0, np.int64); pe = np.zeros(0, np.int64)
    keep_cols = [c for c in ["rank", "step", "event_id", "category", "priority", "function", "function_name", "container", "ts_ns",
                             "end_ns", "dur_ns", "collective", "msg_bytes", "group_size", "group_ranks"] if c in df.columns]
    base = df.select(keep_cols)[idx]
    return base.with_columns(
        start_ns=pl.Series(ps, dtype=pl.Int64), stop_ns=pl.Series(pe, dtype=pl.Int64)
    ).with_columns(crit_ns=pl.col("stop_ns") - pl.col("start_ns"))


def worker_windows(events: pl.DataFrame, by_step: bool = False, window: tuple[int, int] | None = None) -> pl.DataFrame:
    """Profiling window per worker: (rank, window_ns), the span of its events (summed over steps
    when by_step), or the given [start, end) window."""
    ev = events.with_columns(pl.col("rank").cast(pl.Int32))
    end = pl.col("end_ns") if "end_ns" in ev.columns else pl.col("ts_ns") + pl.col("dur_ns")
    if window is not None:
        return ev.select("rank").unique().with_columns(window_ns=pl.lit(int(window[1] - window[0]), dtype=pl.Int64))
    keys = ["rank", "step"] if by_step else ["rank"]
    span = ev.group_by(keys).agg(window_ns=end.max() - pl.col("ts_ns").min())
    return span.group_by("rank").agg(pl.col("window_ns").sum().cast(pl.Int64))


def critical_path(events: pl.DataFrame, window: tuple[int, int] | None = None) -> pl.DataFrame:
    """trace_events -> critical pieces (see critical_pieces), clipped to the window if given."""
    pieces = critical_pieces(classify_events(events))
    if window is not None:
        pieces = pieces.with_columns(
            start_ns=pl.col("start_ns").clip(window[0], window[1]), stop_ns=pl.col("stop_ns").clip(window[0], window[1])
        ).with_columns(crit_ns=pl.col("stop_ns") - pl.col("start_ns")).filter(pl.col("crit_ns") > 0)
    return pieces


def op_category(name: pl.Expr, kind: pl.Expr) -> pl.Expr:
    """Category of a timings row (docs/CONTRACT.md 1.4): kernels by name (nccl:* collectives, memcpy /
    memset memory, else compute); api calls are CPU functions; framework ops by Megatron-style
    names (*-compute and optimizer are compute; send/recv/all-reduce/all-gather/reduce-scatter
    are communication; clip-main-grad is dominated by the grad-norm all-reduce across the
    model-parallel group, so it counts as communication too; anything else, e.g. gc, is CPU)."""
    lname = name.str.to_lowercase()
    comm = lname.str.contains(r"nccl|rccl|gloo|send|recv|all-?reduce|all-?gather|reduce-?scatter|all-?to-?all|broadcast|clip-main-grad|allreduce|allgather")
    mem = lname.str.contains(r"memcpy|memset|malloc")
    return (
        pl.when(kind == "kernel").then(pl.when(comm).then(pl.lit("collective")).when(mem).then(pl.lit("memory")).otherwise(pl.lit("compute")))
        .when(kind == "api").then(pl.when(mem).then(pl.lit("memory")).otherwise(pl.lit("python")))
        .when(comm).then(pl.lit("collective"))
        .when(lname.str.contains(r"compute|optimizer$|^optimizer|gemm|attn|forward|backward")).then(pl.lit("compute"))
        .otherwise(pl.lit("python"))
    )


def classify_timings(timings: pl.DataFrame) -> pl.DataFrame:
    """Normalized timings (docs/CONTRACT.md 1.4, e.g. StragglerAnalysis op traces) -> classified events
    for critical_pieces: ops (and kernels / api calls) are the functions, by name."""
    _check_columns(timings, ["rank", "kind", "name", "start_ns", "end_ns"], "timings")
    t = timings.filter(pl.col("end_ns") > pl.col("start_ns"))
    out = t.select(
        pl.col("rank").cast(pl.Int32),
        (pl.col("step").cast(pl.Int64) if "step" in t.columns else pl.lit(None, dtype=pl.Int64)).alias("step"),
        pl.int_range(pl.len(), dtype=pl.Int64).alias("event_id"),
        pl.col("start_ns").alias("ts_ns"), pl.col("end_ns"),
        (pl.col("end_ns") - pl.col("start_ns")).alias("dur_ns"),
        op_category(pl.col("name"), pl.col("kind")).alias("category"),
        pl.col("name").alias("function"), pl.col("name").alias("function_name"),
        (pl.col("bytes").cast(pl.Int64) if "bytes" in t.columns else pl.lit(None, dtype=pl.Int64)).alias("msg_bytes"),
        (pl.col("group_size").cast(pl.Int32) if "group_size" in t.columns else pl.lit(None, dtype=pl.Int32)).alias("group_size"),
    )
    # every op is a leaf on its own thread (timings carry no call nesting)
    return out.with_columns(
        priority=pl.col("category").replace_strict(PRIORITY, return_dtype=pl.Int8), depth=pl.lit(0, dtype=pl.Int32),
        _thread=pl.lit(0, dtype=pl.Int64),
    )

