"""A model's repeated layers in its profiler trace when no span names them (issue 23): the layer what-ifs
(duplicate / remove layers, re-partition the pipeline) need each layer's forward work.

Where the trace names its layers (`layers.3`, `TransformerLayer_3`, a `transformer_layer.py(...)`
Python frame, an `nn.Module: Block_3` module span) the names are used (graph._mark_layers); spans
named like a layer without a number are numbered in their order inside each forward segment.
Otherwise the layers are found where they show in any trace: a model's layers run the same operators
in the same order, so the forward pass is a tandem repeat of one unit of top-level operators.

Forward segments: the top-level operators of the training thread (the ProfilerStep's thread) inside a
step, cut at everything that is not forward work (autograd nodes, point-to-point transfers, the
optimizer, zero_grad and data loading). Collectives stay inside (tensor-parallel communication is
part of a layer). In each segment the unit is the period p with the most operators covered by
k >= 2 consecutive copies (ties: the shorter unit); it must hold a model operator (a linear / matmul /
convolution / attention / norm). Each copy is one layer: from its first operator's start to the next
copy's start (the last copy: to the next operator's start, or its own end), so untraced work inside a
layer stays in it. A stage's layer count is its segments' most common count; layers are numbered
across stages in stage order (stage s starts after the layers of stages < s), which the pipeline
re-partition needs."""
from __future__ import annotations

import numpy as np
import polars as pl
from numba import njit

from fleetscope.common import by_name
from fleetscope.ingest.trace_timings import clip_work_spans

# operators that are a model's own compute (as fleetscope.ingest.trace_timings._MODEL_OP)
MODEL_OP = (r"(?i)^aten::(linear|addmm|mm|bmm|baddbmm|matmul|einsum|conv|_convolution|cudnn_convolution|embedding|"
            r"scaled_dot_product|_scaled_dot_product|_flash|_efficient|layer_norm|native_layer_norm|rms_norm)|^nn\.Module|Flash")
_NOT_FORWARD = (r"(?i)^autograd::engine::evaluate_function|Backward\d*$|^Optimizer\.|DataLoader|zero_grad|^ProfilerStep#")
SPAN_COLUMNS = {"rank": pl.Int32, "pid": pl.Utf8, "tid": pl.Utf8, "s0": pl.Int64, "s1": pl.Int64, "layer": pl.Int32}


def repeat_unit(tokens: np.ndarray) -> tuple[int, int, int]:
    """(start, period, copies) of the tandem repeat covering the most tokens (k >= 2 copies; ties:
    the shorter period); (0, 0, 0) when nothing repeats."""
    return _repeat_unit(np.ascontiguousarray(tokens, np.int64))


@njit(cache=True)
def _repeat_unit(t):
    # for each period p, the longest run of t[j] == t[j + p] (its first occurrence) is k = run // p + 1
    # copies of the unit starting where the run starts
    n = t.size
    best_cov, best_p, best_i, best_k = 0, 0, 0, 0
    for p in range(1, n // 2 + 1):
        run, top, top_start = 0, 0, 0
        for j in range(n - p):
            if t[j] == t[j + p]:
                run += 1
                if run > top:
                    top, top_start = run, j - run + 1
            else:
                run = 0
        k = top // p + 1
        if k >= 2 and k * p > best_cov:  # p grows: an equal coverage never replaces a shorter unit
            best_cov, best_p, best_i, best_k = k * p, p, top_start, k
    return best_i, best_p, best_k


def forward_segments(events: pl.DataFrame, ops: pl.DataFrame | None = None) -> pl.DataFrame:
    """Top-level operators of each rank's training thread per step, with the forward segment they
    belong to: rank, pid, tid, step, seg, ts_ns, end_ns, name, next_ts (the next top-level operator's
    start on the thread), forward (False for the operators that cut segments). ops: training_ops(events)
    when already computed."""
    ops = training_ops(events) if ops is None else ops
    if ops.height == 0:
        return pl.DataFrame()
    top = ops.filter(pl.col("depth") == 0).with_columns(
        forward=~pl.col("cut"), next_ts=pl.coalesce(pl.col("ts_ns").shift(-1).over(["rank", "step"]), pl.col("end_ns")))
    return top.with_columns(seg=pl.col("cut").cast(pl.Int32).cum_sum().over(["rank", "step"])).select(
        "rank", "pid", "tid", "step", "seg", "ts_ns", "end_ns", "name", "next_ts", "forward")


def _number(spans: pl.DataFrame, stage_of_rank: dict[int, int] | None) -> pl.DataFrame:
    """Local layer numbers (per segment) -> numbers across stages: stage s starts after the layers of the
    stages before it (each stage's count: the most common count of its segments)."""
    st = pl.col("rank").replace_strict(stage_of_rank or {}, default=0, return_dtype=pl.Int32) if stage_of_rank else pl.lit(0, pl.Int32)
    spans = spans.with_columns(_stage=st)
    counts = spans.group_by("rank", "step", "seg", "_stage").agg(k=pl.col("layer").max() + 1).group_by("_stage").agg(
        k=pl.col("k").mode().first()).sort("_stage")
    offs = dict(zip(counts["_stage"].to_list(), (np.cumsum([0] + counts["k"].to_list()[:-1])).tolist()))
    spans = spans.join(counts, on="_stage").filter(pl.col("layer") < pl.col("k"))
    return spans.with_columns(layer=(pl.col("layer") + pl.col("_stage").replace_strict(offs, return_dtype=pl.Int32)).cast(pl.Int32)).drop(
        "_stage", "k")


def named_spans_numbered(named: pl.DataFrame, events: pl.DataFrame, stage_of_rank: dict[int, int] | None,
                         ops: pl.DataFrame | None = None) -> pl.DataFrame:
    """Layer spans named without a number (rank, pid, tid, s0, s1): numbered in their order inside each
    forward segment of their thread."""
    seg = forward_segments(events, ops)
    if seg.height == 0 or named.height == 0:
        return pl.DataFrame(schema=SPAN_COLUMNS)
    marks = seg.select("rank", "tid", "step", "seg", _t="ts_ns").sort("_t")
    # outermost named spans only (a layer's own nested spans are not layers)
    named = named.sort(["rank", "tid", "s0", "s1"], descending=[False, False, False, True]).with_columns(
        _pme=pl.col("s1").cum_max().shift(1).over(["rank", "tid"])).filter(pl.col("_pme").is_null() | (pl.col("s0") >= pl.col("_pme")))
    j = named.sort("s0").join_asof(marks, left_on="s0", right_on="_t", by=["rank", "tid"], strategy="backward", check_sortedness=False)
    j = j.filter(pl.col("seg").is_not_null()).sort("s0").with_columns(layer=pl.int_range(pl.len()).over(["rank", "step", "seg"]).cast(pl.Int32))
    return _number(j.select("rank", "pid", "tid", "step", "seg", "s0", "s1", "layer"), stage_of_rank).select(list(SPAN_COLUMNS))


@njit(cache=True)
def _nest(group, ts, end):
    """Nesting of intervals sorted by (group, start, longest first): depth and parent row (-1: top level)."""
    n = len(ts)
    depth = np.zeros(n, np.int64)
    parent = np.full(n, -1, np.int64)
    stack = np.empty(n, np.int64)
    sp = 0
    for i in range(n):
        if i > 0 and group[i] != group[i - 1]:
            sp = 0
        while sp > 0 and end[stack[sp - 1]] <= ts[i]:
            sp -= 1
        if sp > 0:
            parent[i] = stack[sp - 1]
        depth[i] = sp
        stack[sp] = i
        sp += 1
    return depth, parent


def training_ops(events: pl.DataFrame) -> pl.DataFrame:
    """Every operator and annotation of each rank's training thread per step, in order, with its nesting
    (depth, parent row) and whether it cuts a forward segment (cut)."""
    steps = events.filter((pl.col("cat") == "user_annotation") & pl.col("name").str.starts_with("ProfilerStep#")).select(
        "rank", _tid=pl.col("tid"), _s=pl.col("ts_ns"), _e=pl.col("end_ns"), step=pl.col("name")).sort("_s")
    if steps.height == 0:
        return pl.DataFrame()
    ops = events.lazy().filter(pl.col("cat").is_in(["cpu_op", "user_annotation"]) & (pl.col("ph") == "X")
                               & ~pl.col("name").str.starts_with("ProfilerStep#")).select(
        "rank", "pid", "tid", "name", "cat", "ts_ns", "end_ns", "dur_ns", "is_comm", "collective").collect().sort("ts_ns")
    ops = ops.join_asof(steps, left_on="ts_ns", right_on="_s", by="rank", strategy="backward", check_sortedness=False)
    ops = clip_work_spans(ops.filter((pl.col("tid") == pl.col("_tid")) & (pl.col("ts_ns") < pl.col("_e"))), ["rank", "step"])
    ops = ops.sort(["rank", "step", "ts_ns", "dur_ns"], descending=[False, False, False, True]).with_columns(
        _g=pl.struct("rank", "step").rank("dense"))
    depth, parent = _nest(ops["_g"].to_numpy(), ops["ts_ns"].to_numpy(), ops["end_ns"].to_numpy())
    cut = (by_name(ops["name"], lambda n: n.str.contains(_NOT_FORWARD) | n.str.contains(r"^Backward \d+$"))
           | (pl.col("is_comm") & pl.col("collective").is_in(["send", "recv"])))
    return ops.with_row_index("row").with_columns(depth=pl.Series(depth), parent=pl.Series(parent), cut=cut).drop("_g", "_tid", "_s", "_e")


def infer_layer_spans(events: pl.DataFrame, stage_of_rank: dict[int, int] | None = None, ops: pl.DataFrame | None = None) -> pl.DataFrame:
    """Forward layer spans (rank, pid, tid, s0, s1, layer) of a trace whose layers no span names: the
    tandem repeat of the forward operators, searched in each forward segment of the training thread's
    top-level operators, and where those hold none (a DistributedDataParallel.forward, a pipeline
    schedule's `Forward 0` annotation around the whole microbatch), among the children of each of its
    operators, down to a few levels; empty when nothing repeats."""
    ops = training_ops(events) if ops is None else ops
    if ops.height == 0:
        return pl.DataFrame(schema=SPAN_COLUMNS)
    coded = ops.select(tok=pl.col("name").rank("dense").cast(pl.Int64), model=by_name(ops["name"], lambda n: n.str.contains(MODEL_OP)),
                       top=pl.struct("rank", "step").rank("dense").cast(pl.Int64))
    tok = coded["tok"].to_numpy()
    model_tok = set(coded.filter("model")["tok"].unique().to_list())
    model = coded["model"].fill_null(False).to_numpy()
    ts, end, cut = ops["ts_ns"].to_numpy(), ops["end_ns"].to_numpy(), ops["cut"].fill_null(False).to_numpy()
    depth, parent = ops["depth"].to_numpy(), ops["parent"].to_numpy()
    # siblings share a group: their parent row, or at the top level their (rank, step) (numbered below 0);
    # a top-level group ends with its last operator
    group = np.where(depth == 0, -1 - coded["top"].to_numpy(), parent)
    top_rows = np.flatnonzero(depth == 0)
    group_end = dict(zip(group[top_rows].tolist(), end[top_rows].tolist()))
    cache: dict[bytes, tuple[int, int, int]] = {}
    out: list[tuple[int, int, int, int]] = []  # first row of a layer, its run (seg), its end (s1), its number
    searched = np.zeros(ops.height, bool)  # operators whose children the next level searches
    # level by level, every group of a level at once (rows are in time order within a group); a run is
    # the rows of a group between cutting operators
    for level in range(5):
        level_rows = top_rows if level == 0 else np.flatnonzero((depth == level) & searched[np.maximum(parent, 0)])
        if level_rows.size == 0:
            break
        g, c = group[level_rows], cut[level_rows]
        new = np.ones(level_rows.size, bool)
        new[1:] = (g[1:] != g[:-1]) | c[:-1]
        pos = np.flatnonzero(~c)  # each run row's place among the level's rows: the row after a run is its next place
        run_id = np.cumsum(new)[pos]
        starts = np.flatnonzero(np.r_[True, run_id[1:] != run_id[:-1]])
        for a, b in zip(starts.tolist(), np.r_[starts[1:], pos.size].tolist()):
            run = level_rows[pos[a:b]]
            i = p = k = 0
            if run.size >= 2 and model[run].any():  # a unit must hold a model operator
                t = tok[run]
                key = t.tobytes()
                if key not in cache:
                    i0, p0, k0 = repeat_unit(t)
                    cache[key] = (i0, p0, k0) if p0 and model_tok & set(t[i0:i0 + p0].tolist()) else (0, 0, 0)
                i, p, k = cache[key]
            if k:
                q, gg = pos[b - 1] + 1, int(g[pos[a]])  # the layer after the last copy: up to the next sibling, else the group's end
                nxt = ts[level_rows[q]] if q < level_rows.size and g[q] == gg else (end[gg] if gg >= 0 else group_end[gg])
                out += [(int(run[i + j * p]), len(out), int(ts[run[i + (j + 1) * p]]) if i + (j + 1) * p < run.size else int(nxt), j)
                        for j in range(k)]
            elif level < 4:  # nothing repeats here: look inside its operators
                searched[run] = True
    if not out:
        return pl.DataFrame(schema=SPAN_COLUMNS)
    first, seg, s1, layer = (np.asarray(v, np.int64) for v in zip(*out))
    spans = ops[first].select(pl.col("rank").cast(pl.Int32), "pid", "tid", "step", s0=pl.col("ts_ns").cast(pl.Int64)).with_columns(
        seg=pl.Series(seg, dtype=pl.Int32), s1=pl.Series(s1), layer=pl.Series(layer, dtype=pl.Int32), _r=pl.Series(first))
    return _number(spans.sort("_r").drop("_r"), stage_of_rank).select(list(SPAN_COLUMNS))
