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

import re

import numpy as np
import polars as pl
from numba import njit

from fleetscope.ingest.trace_timings import clip_work_spans

# operators that are a model's own compute (as fleetscope.ingest.trace_timings._MODEL_OP)
MODEL_OP = (r"(?i)^aten::(linear|addmm|mm|bmm|baddbmm|matmul|einsum|conv|_convolution|cudnn_convolution|embedding|"
            r"scaled_dot_product|_scaled_dot_product|_flash|_efficient|layer_norm|native_layer_norm|rms_norm)|^nn\.Module|Flash")
_NOT_FORWARD = (r"(?i)^autograd::engine::evaluate_function|Backward\d*$|^Optimizer\.|DataLoader|zero_grad|^ProfilerStep#")
SPAN_COLUMNS = {"rank": pl.Int32, "pid": pl.Utf8, "tid": pl.Utf8, "s0": pl.Int64, "s1": pl.Int64, "layer": pl.Int32}


def repeat_unit(tokens: np.ndarray) -> tuple[int, int, int]:
    """(start, period, copies) of the tandem repeat covering the most tokens (k >= 2 copies; ties:
    the shorter period); (0, 0, 0) when nothing repeats."""
    n = tokens.size
    best = (0, 0, 0, 0)  # coverage, -period, start, copies
    for p in range(1, n // 2 + 1):
        eq = tokens[:-p] == tokens[p:]
        if not eq.any():
            continue
        # longest run of equalities: k = run // p + 1 copies of the unit starting at the run's start
        d = np.diff(np.concatenate(([0], eq.view(np.int8), [0])))
        starts, ends = np.flatnonzero(d == 1), np.flatnonzero(d == -1)
        lens = ends - starts
        i = int(np.argmax(lens))
        k = int(lens[i]) // p + 1
        if k < 2:
            continue
        cov = k * p
        if (cov, -p) > best[:2]:
            best = (cov, -p, int(starts[i]), k)
    return (best[2], -best[1], best[3]) if best[0] else (0, 0, 0)


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
    ops = events.filter(pl.col("cat").is_in(["cpu_op", "user_annotation"]) & (pl.col("ph") == "X")
                        & ~pl.col("name").str.starts_with("ProfilerStep#")).select(
        "rank", "pid", "tid", "name", "cat", "ts_ns", "end_ns", "dur_ns", "is_comm", "collective").sort("ts_ns")
    ops = ops.join_asof(steps, left_on="ts_ns", right_on="_s", by="rank", strategy="backward", check_sortedness=False)
    ops = clip_work_spans(ops.filter((pl.col("tid") == pl.col("_tid")) & (pl.col("ts_ns") < pl.col("_e"))), ["rank", "step"])
    ops = ops.sort(["rank", "step", "ts_ns", "dur_ns"], descending=[False, False, False, True]).with_columns(
        _g=pl.struct("rank", "step").rank("dense"))
    depth, parent = _nest(ops["_g"].to_numpy(), ops["ts_ns"].to_numpy(), ops["end_ns"].to_numpy())
    cut = (pl.col("name").str.contains(_NOT_FORWARD) | pl.col("name").str.contains(r"^Backward \d+$")
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
    vocab = {n: i for i, n in enumerate(ops["name"].unique().sort().to_list())}
    model_tok = {i for n, i in vocab.items() if re.search(MODEL_OP, n)}
    tok = np.fromiter((vocab[x] for x in ops["name"].to_list()), np.int64, ops.height)
    ts, end, cut = ops["ts_ns"].to_numpy(), ops["end_ns"].to_numpy(), ops["cut"].to_numpy()
    rank, step = ops["rank"].to_numpy(), ops["step"].to_list()
    pid, tid = ops["pid"].to_list(), ops["tid"].to_list()
    # children of a row: a contiguous range once the rows are ordered by parent (found only where searched)
    parent = ops["parent"].to_numpy()
    by_parent = np.argsort(parent, kind="stable")
    sorted_parent = parent[by_parent]

    def children(r: int) -> np.ndarray:
        lo, hi = np.searchsorted(sorted_parent, [r, r + 1])
        return by_parent[lo:hi]
    top = {(r, st): np.asarray(rows, np.int64) for r, st, rows in
           ops.filter(pl.col("depth") == 0).group_by("rank", "step", maintain_order=True).agg(pl.col("row")).iter_rows()}
    cache: dict[tuple, tuple[int, int, int]] = {}
    out: list[tuple] = []
    scope = [0]

    def search(rows: np.ndarray, stop: int, level: int) -> None:
        # forward runs: the rows between cutting operators
        bounds = np.flatnonzero(cut[rows])
        starts = np.concatenate(([0], bounds + 1))
        ends = np.concatenate((bounds, [rows.size]))
        for a, b in zip(starts, ends):
            run = rows[a:b]
            if run.size == 0:
                continue
            i, p, k = (0, 0, 0)
            if run.size >= 2:
                key = tuple(tok[run].tolist())
                if key not in cache:
                    i0, p0, k0 = repeat_unit(tok[run])
                    cache[key] = (i0, p0, k0) if p0 and model_tok & set(tok[run][i0:i0 + p0].tolist()) else (0, 0, 0)
                i, p, k = cache[key]
            if k:
                nxt = ts[rows[b]] if b < rows.size else stop
                scope[0] += 1
                for j in range(k):
                    x, y = i + j * p, i + (j + 1) * p
                    s1 = ts[run[y]] if y < run.size else nxt
                    out.append((int(rank[run[x]]), pid[run[x]], tid[run[x]], step[run[x]], scope[0], int(ts[run[x]]), int(s1), j))
            elif level < 4:  # nothing repeats here: look inside its operators
                for r in run:
                    ch = children(int(r))
                    if ch.size:
                        search(ch, int(end[r]), level + 1)

    for rows in top.values():
        search(rows, int(end[rows[-1]]), 0)
    if not out:
        return pl.DataFrame(schema=SPAN_COLUMNS)
    spans = pl.DataFrame(out, orient="row", schema={"rank": pl.Int32, "pid": pl.Utf8, "tid": pl.Utf8, "step": pl.Utf8, "seg": pl.Int32,
                                                     "s0": pl.Int64, "s1": pl.Int64, "layer": pl.Int32})
    return _number(spans, stage_of_rank).select(list(SPAN_COLUMNS))
