import json

import polars as pl
import pytest

from fleetscope.tables import TABLES
from fleetscope.traces.graph import build_graph
from fleetscope.ingest.traces import read_trace
from fleetscope.traces.whatif import dp_degree, fit_comm_model, iteration_time, predict
from tests.traces import synth


def _steps(gemm_us, comm_us, n=5, attn_us=0, same_stream=True, nbytes=None):
    out = []
    for _ in range(n):
        ks = [{"name": "ampere_sgemm_128x64_nn", "stream": 7, "dur": gemm_us}]
        if attn_us:
            ks.append({"name": "flash_fwd_kernel", "stream": 7, "dur": attn_us})
        nel = (nbytes or 4 << 20) // 4
        ks.append({"name": "ncclKernel_AllReduce_RING_LL_Sum_float", "stream": 7 if same_stream else 20, "dur": comm_us,
                   "coll": "allreduce", "nelems": nel, "group": 2})
        out.append(ks)
    return out


def _graph(doc, tmp_path, name="rank0.json.gz"):
    return build_graph(read_trace(synth.write(doc, tmp_path / name), "syn").events)


def _mean_step(doc):
    t = synth.step_times_us(doc)
    return sum(t) / len(t) * 1000


def test_gemm_speedup_matches_a_rerun_and_cannot_beat_comm_bound(tmp_path):
    # communication-bound: 100 us GEMM + 900 us all-reduce serialized on one stream
    base = synth.make_trace(_steps(100, 900))
    fast = synth.make_trace(_steps(50, 900))  # ground truth: the same loop with GEMMs 2x faster
    g = _graph(base, tmp_path)
    w = predict(g, [("gemm_2x", "kernel_speedup", {"kernel_class": "gemm", "factor": 2.0})])
    TABLES["whatif"].validate(w)
    row = w.row(0, named=True)
    assert row["baseline_ns"] == pytest.approx(_mean_step(base), rel=0.02)
    assert row["predicted_ns"] == pytest.approx(_mean_step(fast), rel=0.02)
    assert 1.0 < row["speedup"] < 1.1  # nowhere near 2x
    assert json.loads(row["parameters"])["factor"] == 2.0
    # compute-bound: 900 us GEMM + 100 us all-reduce: close to the ideal 1000/550
    base = synth.make_trace(_steps(900, 100))
    fast = synth.make_trace(_steps(450, 100))
    w = predict(_graph(base, tmp_path, "cb.json.gz"), [("gemm_2x", "kernel_speedup", {"kernel_class": "gemm", "factor": 2.0})])
    assert w["predicted_ns"][0] == pytest.approx(_mean_step(fast), rel=0.02)
    assert 1.6 < w["speedup"][0] < 1000 / 550 + 0.05


def test_attention_speedup_only_touches_attention(tmp_path):
    base = synth.make_trace(_steps(200, 100, attn_us=600))
    fast = synth.make_trace(_steps(200, 100, attn_us=400))
    g = _graph(base, tmp_path)
    w = predict(g, [("attn", "kernel_speedup", {"kernel_class": "attention", "factor": 1.5}),
                    ("comm_2x", "kernel_speedup", {"kernel_class": "comm", "factor": 2.0})])
    by = {r["scenario"]: r for r in w.iter_rows(named=True)}
    assert by["attn"]["predicted_ns"] == pytest.approx(_mean_step(fast), rel=0.02)
    assert by["comm_2x"]["speedup"] > 1.0


def test_overlapped_comm_hides_dp_growth_until_it_dominates(tmp_path):
    """Comm on its own stream overlaps compute. DP 2 -> 8 costs little while comm stays hidden; the
    prediction follows a rerun with the comm time the alpha-beta model gives for 8 ranks."""
    sizes = [1 << 20, 4 << 20, 16 << 20, 8 << 20, 2 << 20]
    def steps(n_ranks):
        out = []
        for b in sizes:
            out.append([{"name": "ampere_sgemm_128x64_nn", "stream": 7, "dur": 3000},
                        {"name": "ncclKernel_AllReduce_RING_LL_Sum_float", "stream": 20, "dur": synth.comm_us("allreduce", b, n_ranks),
                         "coll": "allreduce", "nelems": b // 4, "group": 2}])
        return out
    base = synth.make_trace(steps(2))
    g = _graph(base, tmp_path)
    m = fit_comm_model(g)
    assert m.latency_ns == pytest.approx(20_000, rel=0.05)
    assert m.bandwidth_bps == pytest.approx(10e9, rel=0.05)
    truth = synth.make_trace(steps(8))
    pred = iteration_time(dp_degree(g, dp_new=8, dp_old=2, model=m))
    assert pred == pytest.approx(_mean_step(truth), rel=0.03)
    assert pred >= iteration_time(g)  # more ranks, more bytes on the wire per rank: never faster


def test_remove_sync_and_layers(tmp_path):
    # CPU-heavy loop: launches are slow relative to kernels, a device sync per step
    base = synth.make_trace(_steps(50, 50), launch_us=40, gap_us=20)
    g = _graph(base, tmp_path)
    w = predict(g, [("no_sync", "remove_sync", {}), ("layers_x2", "layers", {"layers_old": 4, "layers_new": 8}),
                    ("layers_half", "layers", {"layers_old": 4, "layers_new": 2})])
    by = {r["scenario"]: r for r in w.iter_rows(named=True)}
    assert by["no_sync"]["speedup"] >= 1.0
    assert by["layers_x2"]["speedup"] < 0.6 and by["layers_half"]["speedup"] > 1.5


def test_unknown_edit_is_refused(tmp_path):
    g = _graph(synth.make_trace(_steps(400, 50)), tmp_path)
    with pytest.raises(ValueError, match="unknown edit"):
        predict(g, [("x", "nope", {})])


def test_layers_scale_only_the_marked_layers(tmp_path):
    """Embedding (300 us, outside any layer) + L transformer layers (200 us GEMM each, launched inside a
    transformer_layer forward span). 2 -> 4 layers must match a rerun with 4 layers, not scale the embedding."""
    def steps(n_layers):
        return [[{"name": "embedding_kernel", "stream": 7, "dur": 300}]
                + [{"name": "ampere_sgemm_128x64_nn", "stream": 7, "dur": 200, "layer": True} for _ in range(n_layers)]
                for _ in range(4)]
    base = synth.make_trace(steps(2))
    truth = synth.make_trace(steps(4))
    g = _graph(base, tmp_path)
    t = g.tasks
    assert t.filter(pl.col("in_layer") & (pl.col("kind") == "gpu"))["name"].unique().to_list() == ["ampere_sgemm_128x64_nn"]
    w = predict(g, [("layers_x2", "layers", {"layers_old": 2, "layers_new": 4})])
    assert w["predicted_ns"][0] == pytest.approx(_mean_step(truth), rel=0.03)
    # scaling every compute kernel instead (no layer marks) would also double the embedding
    unmarked = g.copy()
    unmarked.tasks = unmarked.tasks.with_columns(in_layer=pl.lit(False))
    w2 = predict(unmarked, [("layers_x2", "layers", {"layers_old": 2, "layers_new": 4})])
    assert w2["predicted_ns"][0] > _mean_step(truth) * 1.15
