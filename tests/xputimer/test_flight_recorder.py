"""PyTorch Flight Recorder dumps from a real gloo job (torch records gloo collectives when
TORCH_FR_BUFFER_SIZE is set): 3 ranks, rank 2 never issues the 6th collective of the default group
and rank 1 issues a broadcast where the others issue the 6th all_reduce of a second group. The
dumps are torch's own (its pickle format and default file names); fleetscope names the first
mismatching collective of each group and the ranks concerned, and torch's own analyzer
(torch.distributed.flight_recorder.fr_trace) agrees on the missing rank."""
from __future__ import annotations

import json
import os
import pickle
import socket
import subprocess
import sys

import polars as pl
import pytest

torch = pytest.importorskip("torch")  # the job needs torch; the analysis does not

WORKER = r"""
import os, sys, torch, torch.distributed as dist
rank, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, TORCH_FR_BUFFER_SIZE="1000")
dist.init_process_group("gloo", rank=rank, world_size=3)
g2 = dist.new_group([0, 1, 2])
t = torch.ones(8)
for _ in range(5):
    dist.all_reduce(t)
    dist.all_reduce(t, group=g2)
if rank != 2:
    dist.all_reduce(t, async_op=True)                        # rank 2 never issues the default group's #6
if rank == 1:
    dist.broadcast(torch.ones(8), 0, group=g2, async_op=True)  # rank 1: another collective as group 2's #6
else:
    dist.all_reduce(torch.ones(8), group=g2, async_op=True)
import torch._C._distributed_c10d as c
open(f"{out}/nccl_trace_rank_{rank}", "wb").write(c._dump_fr_trace(includeCollectives=True, onlyActive=False))
os._exit(0)  # the mismatched collectives never complete: leave without waiting for them
"""


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    out = tmp_path_factory.mktemp("fr") / "stacks" / "inc-fr"
    out.mkdir(parents=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    ps = [subprocess.Popen([sys.executable, "-c", WORKER, str(r), port, str(out)]) for r in range(3)]
    assert [p.wait(timeout=180) for p in ps] == [0, 0, 0]
    return out


def test_first_mismatch_and_missing_ranks(dumps):
    from fleetscope.xputimer.flight import analyze_dumps

    c, notes = analyze_dumps(dumps)
    assert notes == []
    rows = {r["group_desc"]: r for r in c.iter_rows(named=True)}
    world = rows["default_pg"]
    assert (world["seq"], world["collective"], world["problem"]) == (6, "all_reduce", "missing_ranks")
    assert json.loads(world["ranks"]) == [2] and json.loads(world["ranks_present"]) == [0, 1]
    other = [r for d, r in rows.items() if d != "default_pg"][0]
    assert (other["seq"], other["problem"], json.loads(other["ranks"])) == (6, "collective_type_mismatch", [1])


def test_hang_verdict_names_the_missing_rank(dumps):
    from fleetscope.xputimer.hang import diagnose_hang

    h = diagnose_hang(dumps, job_id="j")  # no stack dumps at all: the progress is enough
    assert h.ranks.height == 0
    assert h.verdicts.select("scope", "subject", "team", "metric").rows() == [
        ("rank", "2", "operations", "hang_missing_from_collective")]
    assert "all_reduce #6" in h.verdicts["explanation"][0]


def test_torch_analyzer_agrees(dumps, tmp_path):
    """torch's fr_trace on the same dumps. Its builder needs process-group names in pg_config, which
    torch 2.13's gloo recorder leaves empty (KeyError in build_collectives): they are filled in on a
    copy from the entries' own group names before running it."""
    from fleetscope.ingest.flight_recorder import read_dump

    for f in sorted(dumps.iterdir()):
        d = read_dump(f)
        names = {tuple(e["process_group"]) for e in d["entries"]}
        d["pg_config"] = {n: {"name": n, "desc": desc, "ranks": "[0, 1, 2]"} for n, desc in names}
        d.pop("rank")
        (tmp_path / f.name).write_bytes(pickle.dumps(d))
    p = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    text = p.stdout + p.stderr
    assert "Not all ranks joining collective, sequence number: 6" in text, text[-2000:]
    assert "missing ranks: {2}" in text


def test_dumps_ingested_and_bad_pickles_quarantined(dumps, tmp_path):
    """Through ingestion: the entries land in collective_progress; a pickle that would run code
    (a global reference) is refused with a reason, never loaded."""
    import shutil

    from fleetscope.ingest.partitions import ingest_incident
    from fleetscope.warehouse import Warehouse

    landing = tmp_path / "landing"
    shutil.copytree(dumps, landing / "stacks" / "inc-fr")

    class Evil:
        def __reduce__(self):
            return (os.system, ("true",))
    (landing / "stacks" / "inc-fr" / "evil_trace_rank_9").write_bytes(pickle.dumps({"entries": [Evil()]}))
    wh = Warehouse(tmp_path / "wh" / "w.duckdb")
    wh.init()
    s = ingest_incident(wh, landing, "inc-fr")
    cp = wh.read("collective_progress", partitions=["inc-fr"])
    assert sorted(cp["rank"].unique().to_list()) == [0, 1, 2]
    world = cp.filter(pl.col("pg_desc") == "default_pg")
    assert world.filter(pl.col("rank") == 2)["seq"].max() == 5 and world.filter(pl.col("rank") == 0)["seq"].max() == 6
    rej = wh.read("rejected_records")
    assert s.files_rejected == 1 and "refusing to load posix.system" in rej["reason"][0]
