"""The parallel layout from the traces themselves (fleetscope.traces.layout, issue 23): world size, TP /
PP / DP degrees and each rank's stage and replica, checked against what the jobs wrote about
themselves (never read by the code under test): real gloo recordings of two generators
(tests/data/whatif: per-rank steps/*.json; tests/data/heldout: truth/*.json), the simulator's GPU
capture (its ground-truth job file), and hand-made process-group tables for tensor parallelism."""
import json
import json as _json
from pathlib import Path

import polars as pl
import pytest

from fleetscope.ingest.partitions import _trace_file_row
from fleetscope.ingest.traces import read_trace, trace_files
from fleetscope.traces.layout import COMM_EVENT_COLUMNS, capture_layout, desc_dim, infer_layout

DATA = Path(__file__).resolve().parents[1] / "data"


def _read(folder: Path) -> tuple[pl.DataFrame, pl.DataFrame]:
    rows, evs = [], []
    for f in trace_files(folder):
        tf = read_trace(f, folder.name)
        rows.append(_trace_file_row(folder.name, f.name, tf.meta, tf.events.height))
        evs.append(tf.events)
    return pl.DataFrame(rows), pl.concat(evs, how="diagonal_relaxed")


def _truth(folder: Path) -> pl.DataFrame:
    sub = "truth" if (folder / "truth").is_dir() else "steps"
    rows = [json.loads(f.read_text()) for f in sorted((folder / sub).glob("rank*.json"))]
    assert rows, f"no truth files in {folder / sub}"
    return pl.DataFrame([{"rank": r["rank"], "stage": r["stage"], "dp_rank": r["dp_rank"], "pp": r["pp"], "dp": r["dp"]} for r in rows])


REAL_CAPTURES = [DATA / "whatif" / n for n in ("pp2_dp2", "pp4_dp2", "pp2_dp4", "pp1_dp2")] + \
    [DATA / "heldout" / n for n in ("pp4", "pp2_dp3", "dp4", "pp2_dp2")]


@pytest.mark.parametrize("folder", REAL_CAPTURES, ids=lambda p: f"{p.parent.name}-{p.name}")
def test_layout_of_real_gloo_captures_matches_what_the_ranks_logged(folder):
    files, ev = _read(folder)
    lay = capture_layout(files, ev.select([c for c in COMM_EVENT_COLUMNS if c in ev.columns]))
    tr = _truth(folder)
    assert (lay.pp, lay.dp, lay.tp, lay.world_size) == (int(tr["pp"][0]), int(tr["dp"][0]), 1, tr.height), lay
    got = lay.ranks.select("rank", "stage", "dp_rank").sort("rank")
    assert got.equals(tr.select(pl.col(c).cast(pl.Int32) for c in ("rank", "stage", "dp_rank")).sort("rank")), (got, lay.source)
    assert lay.source.startswith("traces:") and "capture.json" not in lay.source


def test_layout_of_the_simulators_gpu_capture(tmp_path):
    from fleetscope.sim.capture.scenarios import scenario_capture

    landing, _ = scenario_capture(tmp_path, "healthy", seed=7)
    job = json.loads((tmp_path / "ground_truth" / "capture_job.json").read_text())
    folder = next((landing / "traces").iterdir())
    files, ev = _read(folder)
    lay = infer_layout(files, ev.select([c for c in COMM_EVENT_COLUMNS if c in ev.columns]))
    assert (lay.tp, lay.pp, lay.dp, lay.world_size) == (job["tp"], job["pp"], job["dp"], job["tp"] * job["pp"] * job["dp"])
    # the simulator numbers ranks tp fastest, then dp, then pp (Megatron)
    tp, dp = job["tp"], job["dp"]
    want = {r: (r // (tp * dp), (r // tp) % dp, r % tp) for r in range(lay.world_size)}
    assert {r: (s, d, t) for r, s, d, t in lay.ranks.iter_rows()} == want


def _files(groups: dict[int, list[dict]], world: int) -> pl.DataFrame:
    return pl.DataFrame([{"rank": r, "world_size": world, "pg_config": _json.dumps(g)} for r, g in groups.items()])


def _pg(desc: str, ranks: list[int]) -> dict:
    return {"pg_name": desc, "pg_desc": desc, "pg_size": len(ranks), "ranks": ranks}


def test_megatron_group_descriptions_give_tp_pp_dp():
    # TP2 x DP2 x PP2 in Megatron's order: tp fastest, then dp, then pp
    world, tp, dp = 8, 2, 2
    groups = {}
    for r in range(world):
        s, d, t = r // (tp * dp), (r // tp) % dp, r % tp
        groups[r] = [_pg("default_pg", list(range(world))),
                     _pg("TENSOR_MODEL_PARALLEL_GROUP", [s * 4 + d * 2 + k for k in range(tp)]),
                     _pg("DATA_PARALLEL_GROUP", [s * 4 + k * 2 + t for k in range(dp)]),
                     _pg("PIPELINE_MODEL_PARALLEL_GROUP", [k * 4 + d * 2 + t for k in range(2)]),
                     _pg("TENSOR_AND_DATA_PARALLEL_GROUP", [s * 4 + k for k in range(4)])]
    lay = infer_layout(_files(groups, world), None)
    assert (lay.tp, lay.pp, lay.dp, lay.world_size) == (2, 2, 2, 8)
    assert {r: (s, d, t) for r, s, d, t in lay.ranks.iter_rows()} == {r: (r // 4, (r // 2) % 2, r % 2) for r in range(8)}
    assert not any("not the world size" in n for n in lay.notes)


def test_undescribed_groups_tell_tensor_from_data_parallel_by_where_their_collectives_run():
    """Two families of 'undefined' groups inside one stage, NCCL kernels naming their group: the family
    whose all-reduces run in the forward pass (before the step's first autograd node) is tensor-parallel.
    TP groups are {0,2},{1,3} here (not adjacent ranks, so the rank-distance fallback alone would pick
    the wrong family)."""
    world = 4
    tp_groups, dp_groups = [[0, 2], [1, 3]], [[0, 1], [2, 3]]
    groups = {r: [_pg("default_pg", [0, 1, 2, 3])] + [_pg("undefined", g) for g in tp_groups + dp_groups if r in g] for r in range(world)}
    rows = []
    for r in range(world):
        tpg = next(g for g in tp_groups if r in g)
        dpg = next(g for g in dp_groups if r in g)
        rows.append({"rank": r, "name": "ProfilerStep#1", "cat": "user_annotation", "ts_ns": 0, "end_ns": 1000, "tid": "1"})
        rows.append({"rank": r, "name": "autograd::engine::evaluate_function: MmBackward0", "cat": "cpu_op", "ts_ns": 500,
                     "end_ns": 510, "tid": "1"})
        for k in range(3):  # forward: all-reduces in the TP group
            rows.append({"rank": r, "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "cat": "kernel", "ts_ns": 100 + 100 * k,
                         "end_ns": 150 + 100 * k, "tid": "7", "stream": 7, "is_comm": True, "collective": "allreduce",
                         "msg_bytes": 4096, "pg_name": f"tp{tpg[0]}", "group_ranks": str(tpg), "group_size": 2})
        rows.append({"rank": r, "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "cat": "kernel", "ts_ns": 800, "end_ns": 900,
                     "tid": "8", "stream": 8, "is_comm": True, "collective": "allreduce", "msg_bytes": 1 << 20, "pg_name": f"dp{dpg[0]}",
                     "group_ranks": str(dpg), "group_size": 2})
    ev = pl.DataFrame(rows).with_columns(pl.col("is_comm").fill_null(False), ph=pl.lit("X"), pid=pl.lit("1"),
                                         rank=pl.col("rank").cast(pl.Int32))
    lay = infer_layout(_files(groups, world), ev)
    assert (lay.tp, lay.dp, lay.pp) == (2, 2, 1), (lay.notes, lay.source)
    assert {r: (d, t) for r, _, d, t in lay.ranks.iter_rows()} == {0: (0, 0), 1: (1, 0), 2: (0, 1), 3: (1, 1)}, lay.source
    assert "forward pass" in lay.source


def test_capture_json_overrides_and_says_so():
    files, ev = _read(DATA / "whatif" / "pp2_dp2")
    lay = capture_layout(files, ev.select([c for c in COMM_EVENT_COLUMNS if c in ev.columns]), {"pp": 1, "dp": 4})
    assert (lay.pp, lay.dp) == (1, 4) and lay.source == "capture.json"
    assert any("capture.json overrides" in n and "pp 2 -> 1" in n for n in lay.notes)
    assert lay.ranks["stage"].to_list() == [0, 0, 0, 0]


def test_no_distributed_info_says_what_it_assumed():
    files = pl.DataFrame({"rank": [0, 1], "world_size": [None, None], "pg_config": [None, None]},
                         schema={"rank": pl.Int32, "world_size": pl.Int32, "pg_config": pl.Utf8})
    lay = infer_layout(files, None)
    assert lay.world_size == 2 and lay.dp == 2 and lay.pp == 1
    assert any("world size" in n for n in lay.notes) and any("assumed" in n or "taken as" in n for n in lay.notes)


@pytest.mark.parametrize("desc,dim", [("TENSOR_MODEL_PARALLEL_GROUP", "tp"), ("mesh_tp", "tp"), ("PIPELINE_MODEL_PARALLEL_GROUP", "pp"),
                                      ("mesh_pp", "pp"), ("DATA_PARALLEL_GROUP", "dp"), ("mesh_dp_shard", "dp"), ("fsdp", "dp"),
                                      ("TENSOR_AND_DATA_PARALLEL_GROUP", None), ("MODEL_PARALLEL_GROUP", None), ("EMBEDDING_GROUP", None),
                                      ("default_pg", None), ("undefined", None), ("mesh_dp_cp", None)])
def test_group_descriptions(desc, dim):
    assert desc_dim(desc) == dim
