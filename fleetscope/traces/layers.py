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


def forward_segments(events: pl.DataFrame) -> pl.DataFrame:
    """Top-level operators of each rank's training thread per step, with the forward segment they
    belong to: rank, pid, tid, step, seg, ts_ns, end_ns, name, next_ts (the next top-level operator's
    start on the thread), forward (False for the operators that cut segments)."""
    steps = events.filter((pl.col("cat") == "user_annotation") & pl.col("name").str.starts_with("ProfilerStep#")).select(
        "rank", _tid=pl.col("tid"), _s=pl.col("ts_ns"), _e=pl.col("end_ns"), step=pl.col("name")).sort("_s")
    if steps.height == 0:
        return pl.DataFrame()
    ops = events.filter(pl.col("cat").is_in(["cpu_op", "user_annotation"]) & (pl.col("ph") == "X")
                        & ~pl.col("name").str.starts_with("ProfilerStep#")).select(
        "rank", "pid", "tid", "name", "ts_ns", "end_ns", "dur_ns", "is_comm", "collective").sort("ts_ns")
    ops = ops.join_asof(steps, left_on="ts_ns", right_on="_s", by="rank", strategy="backward", check_sortedness=False)
    ops = ops.filter((pl.col("tid") == pl.col("_tid")) & (pl.col("ts_ns") < pl.col("_e")))
    ops = ops.sort(["rank", "step", "ts_ns", "dur_ns"], descending=[False, False, False, True])
    ops = ops.with_columns(_pme=pl.col("end_ns").cum_max().shift(1).over(["rank", "step"]))
    top = ops.filter(pl.col("_pme").is_null() | (pl.col("ts_ns") >= pl.col("_pme")))
    cut = pl.col("name").str.contains(_NOT_FORWARD) | (pl.col("is_comm") & pl.col("collective").is_in(["send", "recv"]))
    top = top.with_columns(forward=~cut, next_ts=pl.coalesce(pl.col("ts_ns").shift(-1).over(["rank", "step"]), pl.col("end_ns")))
    return top.with_columns(seg=(~pl.col("forward")).cast(pl.Int32).cum_sum().over(["rank", "step"])).select(
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


def named_spans_numbered(named: pl.DataFrame, events: pl.DataFrame, stage_of_rank: dict[int, int] | None) -> pl.DataFrame:
    """Layer spans named without a number (rank, pid, tid, s0, s1): numbered in their order inside each
    forward segment of their thread."""
    seg = forward_segments(events)
    if seg.height == 0 or named.height == 0:
        return pl.DataFrame(schema=SPAN_COLUMNS)
    marks = seg.select("rank", "tid", "step", "seg", _t="ts_ns").sort("_t")
    # outermost named spans only (a layer's own nested spans are not layers)
    named = named.sort(["rank", "tid", "s0", "s1"], descending=[False, False, False, True]).with_columns(
        _pme=pl.col("s1").cum_max().shift(1).over(["rank", "tid"])).filter(pl.col("_pme").is_null() | (pl.col("s0") >= pl.col("_pme")))
    j = named.sort("s0").join_asof(marks, left_on="s0", right_on="_t", by=["rank", "tid"], strategy="backward", check_sortedness=False)
    j = j.filter(pl.col("seg").is_not_null()).sort("s0").with_columns(layer=pl.int_range(pl.len()).over(["rank", "step", "seg"]).cast(pl.Int32))
    return _number(j.select("rank", "pid", "tid", "step", "seg", "s0", "s1", "layer"), stage_of_rank).select(list(SPAN_COLUMNS))


def infer_layer_spans(events: pl.DataFrame, stage_of_rank: dict[int, int] | None = None) -> pl.DataFrame:
    """Forward layer spans (rank, pid, tid, s0, s1, layer) of a trace whose layers no span names, found as
    the tandem repeat of each forward segment's top-level operators; empty when nothing repeats."""
    seg = forward_segments(events)
    if seg.height == 0:
        return pl.DataFrame(schema=SPAN_COLUMNS)
    seg = seg.filter("forward")
    vocab = {n: i for i, n in enumerate(seg["name"].unique().sort().to_list())}
    model_tok = {i for n, i in vocab.items() if re.search(MODEL_OP, n)}
    rows = []
    cache: dict[tuple, tuple[int, int, int]] = {}
    for (r, step, sg), g in seg.group_by(["rank", "step", "seg"], maintain_order=True):
        names = g["name"].to_list()
        if len(names) < 2:
            continue
        tok = np.fromiter((vocab[x] for x in names), np.int64, len(names))
        key = tuple(tok.tolist())
        if key not in cache:
            i, p, k = repeat_unit(tok)
            cache[key] = (i, p, k) if p and model_tok & set(tok[i:i + p].tolist()) else (0, 0, 0)
        i, p, k = cache[key]
        if not k:
            continue
        ts, nxt = g["ts_ns"].to_numpy(), g["next_ts"].to_numpy()
        pid, tid = g["pid"][0], g["tid"][0]
        for j in range(k):
            a, b = i + j * p, i + (j + 1) * p
            rows.append((int(r), pid, tid, step, sg, int(ts[a]), int(ts[b] if b < len(ts) else nxt[b - 1]), j))
    if not rows:
        return pl.DataFrame(schema=SPAN_COLUMNS)
    spans = pl.DataFrame(rows, orient="row", schema={"rank": pl.Int32, "pid": pl.Utf8, "tid": pl.Utf8, "step": pl.Utf8, "seg": pl.Int32,
                                                      "s0": pl.Int64, "s1": pl.Int64, "layer": pl.Int32})
    return _number(spans, stage_of_rank).select(list(SPAN_COLUMNS))
