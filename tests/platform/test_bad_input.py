"""Bad input, with real files through the real pipeline (registration + Dagster runs): each bad
file or row gets a clear reason in rejected_records, the rest still flows, counts add up."""
import gzip
import json
import os
import shutil
import time

import polars as pl
import pytest

from tests.paths import REAL
from fleetscope.warehouse import Warehouse
from fleetscope.jobs.runner import run_all


def _flows(n=5, t0=1_700_000_000_000_000_000):
    return pl.DataFrame({
        "start_ns": [t0 + i * 1000 for i in range(n)], "duration_ns": [500] * n,
        "src_ip": ["10.0.0.1"] * n, "dst_ip": ["10.0.0.2"] * n, "bytes": [1 << 20] * n,
        "path": [["leaf1", "spine1", "leaf2"]] * n,
    })


@pytest.fixture
def bad_landing(fleet_env):
    landing, warehouse, _ = fleet_env
    (landing / "flows").mkdir()
    _flows().write_parquet(landing / "flows" / "good.parquet")
    shutil.copy(landing / "flows" / "good.parquet", landing / "flows" / "good_again_other_name.parquet")
    (landing / "flows" / "bad_rows.csv").write_text(
        "start_ns,end_ns,src_ip,dst_ip,bytes,path\n"
        "100,200,10.0.0.1,10.0.0.2,4096,leaf1>spine1>leaf2\n"   # row 1 ok
        "300,250,10.0.0.1,10.0.0.2,4096,\n"                     # row 2 negative duration
        "300,400,10.0.0.1,10.0.0.2,-7,\n"                       # row 3 negative bytes
        "300,400,10.0.0.1,10.0.0.2,lots,\n"                     # row 4 wrong type
        "300,400,10.0.0.1\n"                                    # row 5 missing fields
        "300,400,10.0.0.1,10.0.0.2,10,a>b,surplus\n"            # row 6 extra field
        "500,600,10.0.0.3,10.0.0.4,8192,leaf3\n")               # row 7 ok
    (landing / "flows" / "no_bytes_column.csv").write_text("start_ns,end_ns,src_ip,dst_ip\n1,2,a,b\n")
    (landing / "flows" / "extra_column.csv").write_text("start_ns,duration_ns,src_ip,dst_ip,bytes,vlan\n1,2,a,b,3,77\n")
    (landing / "flows" / "empty.csv").write_text("")
    (landing / "flows" / "still_copying.csv.part").write_text("start_ns,end_ns,src_ip,dst_ip,bytes\n1,2,a,")
    raw = gzip.compress(b"start_ns,end_ns,src_ip,dst_ip,bytes\n" + b"1,2,a,b,3\n" * 2000)
    (landing / "flows" / "truncated.csv.gz").write_bytes(raw[: len(raw) // 2])
    cap = landing / "traces" / "cap1"
    cap.mkdir(parents=True)
    real = REAL / "hta" / "critical_path__simple_add__benchmark_result_493459_1694039959_trace.json.gz"
    shutil.copy(real, cap / "rank0.json.gz")
    data = real.read_bytes()
    (cap / "rank1.json.gz").write_bytes(data[: len(data) // 3])             # truncated gzip
    (cap / "rank2.json").write_text('{"traceEvents": [{"ph": "X", "name": ')  # malformed JSON
    (cap / "rank3.json").write_text(json.dumps({"hello": "not a trace"}))   # valid JSON, not a trace
    tim = landing / "timings" / "cap2"
    tim.mkdir(parents=True)
    rows = [dict(rank=0, kind="api", name="optimizer.step", issue_ns=10, start_ns=10, end_ns=20),
            dict(rank=0, kind="api", name="gc", issue_ns=30, start_ns=30, end_ns=25)]       # negative duration
    (tim / "rank0.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n{not json\n")
    return landing, warehouse


def test_bad_input_is_quarantined_and_the_rest_flows(bad_landing):
    landing, warehouse = bad_landing
    report = run_all(landing, warehouse, settle_s=0, log=lambda *_: None)
    assert not report.failed, report.failed
    wh = Warehouse(warehouse)
    rej = wh.read("rejected_records")
    by_file = {f: g for (f,), g in rej.group_by(["source_file"])}

    def reasons(f):
        return " | ".join(by_file[f]["reason"].to_list())

    # row-level: each bad row of bad_rows.csv with its row number and reason
    bad = by_file["flows/bad_rows.csv"].sort("row_number")
    assert bad["row_number"].to_list() == [2, 3, 4, 5, 6]
    assert "duration must be >= 0" in bad["reason"][0]
    assert "bytes must be > 0" in bad["reason"][1]
    assert "'lots' is not a valid" in bad["reason"][2] or "lots is not a valid" in bad["reason"][2]
    assert "3 fields but the header has 6" in bad["reason"][3]
    assert "7 fields but the header has 6" in bad["reason"][4]
    # file-level
    assert "missing required column(s) ['bytes']" in reasons("flows/no_bytes_column.csv")
    assert "empty file" in reasons("flows/empty.csv")
    assert "truncated or corrupt gzip" in reasons("flows/truncated.csv.gz")
    assert "already landed as partition good" in reasons("flows/good_again_other_name.parquet")
    assert "gzip" in reasons("traces/cap1/rank1.json.gz").lower()
    assert "json" in reasons("traces/cap1/rank2.json").lower()
    assert "traceEvents" in reasons("traces/cap1/rank3.json")
    # timings: a malformed JSON line and a negative duration, row-level
    t = by_file["timings/cap2/rank0.jsonl"].sort("row_number")
    assert t["row_number"].to_list() == [2, 3]
    assert "duration" in t["reason"][0] and "malformed JSON" in t["reason"][1]
    # the rest flows: good rows, the extra-column file, the real trace, the good timing row
    flows = wh.read("flows")
    assert flows.filter(pl.col("source_file") == "flows/bad_rows.csv").height == 2
    assert flows.filter(pl.col("source_file") == "flows/good.parquet").height == 5
    assert flows.filter(pl.col("source_file") == "flows/extra_column.csv").height == 1
    assert flows.filter(pl.col("source_file") == "flows/good_again_other_name.parquet").height == 0
    ev = wh.read("trace_events")
    assert ev.height > 100 and set(ev["source_file"].unique()) == {"traces/cap1/rank0.json.gz"}
    assert wh.read("timings").height == 1
    # the partial file is deferred, not ingested and not lost
    assert any(rel.endswith("still_copying.csv.part") for rel, _ in report.registration.deferred)
    # counts add up for the csv: rows read = kept + rejected
    assert 7 == flows.filter(pl.col("source_file") == "flows/bad_rows.csv").height + bad.height


def test_rerun_is_idempotent_and_recent_files_wait(bad_landing):
    landing, warehouse = bad_landing
    run_all(landing, warehouse, settle_s=0, log=lambda *_: None)
    wh = Warehouse(warehouse)
    n_flows, n_rej = wh.read("flows").height, wh.read("rejected_records").height
    report = run_all(landing, warehouse, settle_s=0, log=lambda *_: None)
    assert report.registration.n_to_run == 0  # nothing new landed
    assert (wh.read("flows").height, wh.read("rejected_records").height) == (n_flows, n_rej)
    # a file written just now waits for the settle time
    _flows(3, t0=1_800_000_000_000_000_000).write_parquet(landing / "flows" / "fresh.parquet")
    report = run_all(landing, warehouse, settle_s=60, log=lambda *_: None, only_new=True)
    assert any("fresh.parquet" in rel and "settles" in why for rel, why in report.registration.deferred)
    old = time.time() - 120
    os.utime(landing / "flows" / "fresh.parquet", (old, old))
    report = run_all(landing, warehouse, settle_s=60, log=lambda *_: None, only_new=True)
    assert wh.read("flows").height == n_flows + 3
