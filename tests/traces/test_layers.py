"""Layers found in traces no span names (fleetscope.traces.layers): the tandem repeat of the forward
operators, checked against the job's own `layers.<i>` annotations hidden from the code under test
(tests/data/whatif), on jobs whose layers sit inside containers (held-out recordings: DDP and a
pipeline schedule's Forward N boxes), and the data-parallel what-if of a job without data
parallelism, whose gradients are sized from the layers' parameter shapes, against its real re-run."""
import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from fleetscope.ingest.traces import read_capture
from fleetscope.traces.layers import infer_layer_spans, repeat_unit

DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.mark.parametrize("seq,want", [
    ("xABCABCABCy", (1, 3, 3)),       # a unit of 3, three copies, between glue
    ("ABABABAB", (0, 2, 4)),           # the shortest unit that covers most, not ABAB twice
    ("ABCDE", (0, 0, 0)),             # nothing repeats
    ("AABAAB", (0, 3, 2)),            # AAB twice covers 6; A A (unit 1) covers 2
])
def test_repeat_unit(seq, want):
    assert repeat_unit(np.array([ord(c) for c in seq])) == want


def test_layers_found_without_names_are_the_annotated_ones():
    """pp2_dp2 of the what-if job: 8 layers, 4 per stage, each in record_function("layers.<i>"). Hidden,
    the repeat gives the same layers: 4 per rank, numbered 0-3 on stage 0 and 4-7 on stage 1, each
    starting where the annotated one starts (within the annotation's own entry, tens of microseconds)."""
    ev = read_capture(DATA / "whatif" / "pp2_dp2")
    named = ev.filter(pl.col("name").str.contains(r"^layers\.\d+$"))
    stage = {j["rank"]: j["stage"] for j in (json.loads(f.read_text()) for f in (DATA / "whatif" / "pp2_dp2" / "steps").glob("*.json"))}
    sp = infer_layer_spans(ev.filter(~pl.col("name").str.contains(r"^layers\.\d+$")), stage)
    assert sp.height == named.height
    got = sp.group_by("rank").agg(pl.col("layer").unique().sort()).sort("rank")
    want = named.group_by("rank").agg(pl.col("name").str.extract(r"(\d+)").cast(pl.Int32).unique().sort().alias("layer")).sort("rank")
    assert got.equals(want.select(pl.col("rank").cast(pl.Int32), "layer"))
    j = sp.sort("s0").join_asof(named.select(pl.col("rank").cast(pl.Int32), a=pl.col("ts_ns"), n=pl.col("name")).sort("a"),
                                left_on="s0", right_on="a", by="rank", strategy="nearest", check_sortedness=False)
    assert (j["n"].str.extract(r"(\d+)").cast(pl.Int32) == j["layer"]).all()
    assert ((j["s0"] - j["a"]).abs() < 1_000_000).all()  # a layer is ~6.5 ms


@pytest.mark.parametrize("name,per_rank", [("dp4", 8), ("pp2_dp3", 4)])
def test_layers_inside_containers(name, per_rank):
    """DistributedDataParallel.forward (dp4) and torch pipelining's `Forward N` boxes (pp2_dp3, GPipe)
    hold the whole forward pass: the layers are found one level down; the jobs' truth files say how many
    Blocks each rank holds."""
    d = DATA / "heldout" / name
    truth = json.loads(next((d / "truth").glob("rank*.json")).read_text())
    assert truth["layers"] // truth["pp"] == per_rank
    sp = infer_layer_spans(read_capture(d))
    assert set(sp.group_by("rank").agg(pl.col("layer").n_unique())["layer"].to_list()) == {per_rank}


def test_dp_what_if_for_a_job_without_data_parallelism_against_its_rerun():
    """pp2_dp1 (the what-if job's recording without DP) -> DP 2: every rank all-reduces the gradients of
    its layers' parameters (sized from record_shapes) before the optimizer; the re-run at DP 2 (pp2_dp2,
    its own clock) is the truth. Tuned on this pair (in-sample)."""
    from fleetscope.traces.graph import build_graph
    from fleetscope.traces.whatif import EDITS, iteration_time

    g = build_graph(read_capture(DATA / "whatif" / "pp2_dp1"), "x")
    assert g.meta["grad_bytes"] == {0: 4 * (512 * 512 + 512) * 4, 1: 4 * (512 * 512 + 512) * 4}  # 4 Linear(512, 512) per stage
    pred = iteration_time(EDITS["dp_degree"](g, dp_new=2, dp_old=1))

    def measured(d):
        per = [json.loads(f.read_text())["steps"] for f in (DATA / "whatif" / d / "steps").glob("rank*.json")]
        return max(np.mean([s["dur_ns"] for s in st if s["profiled"]]) for st in per)
    assert abs(pred - measured("pp2_dp2")) / measured("pp2_dp2") < 0.10
    assert pred > iteration_time(g)
