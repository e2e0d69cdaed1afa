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
    (landing / "flows" / "extra_column.csv").write_text("start_ns,duration_ns,src_ip,dst_ip,bytes,vlan\n1,2,10.0.0.5,10.0.0.6,3,77\n")
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


# ---------------------------------------------------------------- dialects real exporters write
def _flow_rows(n=50, t0=1_700_000_000_000_000_000):
    return [{"start_ns": t0 + i * 1000, "end_ns": t0 + i * 1000 + 500, "src_ip": f"10.0.0.{i % 7 + 1}",
             "dst_ip": "10.0.1.1", "bytes": 4096 + i, "path": "leaf1>spine1>leaf2"} for i in range(n)]


def _write_csv(path, rows, cols, quoting=None, eol="\n", bom=False, extra=None):
    import csv
    import io

    buf = io.StringIO(newline="")
    w = csv.writer(buf, quoting=quoting if quoting is not None else csv.QUOTE_MINIMAL, lineterminator=eol)
    w.writerow(cols + list(extra or {}))
    for r in rows:
        w.writerow([r[c] for c in cols] + list((extra or {}).values()))
    data = buf.getvalue().encode()
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + data)
    return path


def test_csv_dialects_keep_every_row(tmp_path):
    """Quoted header and fields (QUOTE_ALL, as many exporters write), CRLF, a BOM, columns in another
    order, extra columns whose values hold separators, quotes and line breaks: every row kept, the
    same values as a plain file."""
    import csv

    from fleetscope.ingest.flows import read_flows

    rows = _flow_rows()
    cols = ["start_ns", "end_ns", "src_ip", "dst_ip", "bytes", "path"]
    plain = read_flows(_write_csv(tmp_path / "plain.csv", rows, cols))
    assert plain.kept.height == len(rows) and plain.rejected.height == 0
    want = plain.kept.drop("source_file").sort("start_ns")
    variants = {
        "quoted_all.csv": dict(quoting=csv.QUOTE_ALL),
        "crlf.csv": dict(eol="\r\n"),
        "bom_quoted_crlf.csv": dict(quoting=csv.QUOTE_ALL, eol="\r\n", bom=True),
        "nonnumeric.csv": dict(quoting=csv.QUOTE_NONNUMERIC),
    }
    for name, kw in variants.items():
        r = read_flows(_write_csv(tmp_path / name, rows, cols, **kw))
        assert r.rejected.height == 0, (name, r.rejected)
        assert r.kept.drop("source_file").sort("start_ns").equals(want), name
    # only the header quoted (`"ip","host",...` over unquoted numbers), as the issue's exporter wrote
    qh = tmp_path / "quoted_header_only.csv"
    qh.write_bytes(b",".join(b'"%s"' % c.encode() for c in cols) + b"\r\n"
                   + (tmp_path / "crlf.csv").read_bytes().split(b"\r\n", 1)[1])
    r = read_flows(qh)
    assert r.rejected.height == 0 and r.kept.drop("source_file").sort("start_ns").equals(want)
    # any column order, extra columns with awkward values (a comma, a quote, a line break)
    reordered = ["path", "bytes", "dst_ip", "start_ns", "src_ip", "end_ns"]
    extra = {"note": 'a "quoted", multi\nline note', "vlan": "7"}
    r = read_flows(_write_csv(tmp_path / "reordered_extra.csv", rows, reordered, quoting=csv.QUOTE_ALL,
                              eol="\r\n", bom=True, extra=extra))
    assert r.rejected.height == 0 and r.n_read == len(rows)
    assert r.kept.drop("source_file").sort("start_ns").equals(want)
    assert any("note" in n and "vlan" in n for n in r.notes)
    # gzip of the same quoted file
    import gzip

    raw = (tmp_path / "bom_quoted_crlf.csv").read_bytes()
    (tmp_path / "bom_quoted_crlf.csv.gz").write_bytes(gzip.compress(raw))
    r = read_flows(tmp_path / "bom_quoted_crlf.csv.gz")
    assert r.kept.drop("source_file").sort("start_ns").equals(want)


def test_quoted_topology_is_read(tmp_path):
    import csv

    from fleetscope.ingest.topology import read_topology

    rows = [{"ip": f"10.0.0.{i}", "host": f"h{i // 8:02d}", "leaf": f"leaf{i % 2}", "rail": i % 8} for i in range(16)]
    r = read_topology(_write_csv(tmp_path / "topo.csv", rows, ["host", "ip", "rail", "leaf"], quoting=csv.QUOTE_ALL,
                                 eol="\r\n", bom=True))
    assert r.rejected.height == 0 and r.kept.height == 16
    assert r.kept["ip"].to_list() == [x["ip"] for x in rows] and r.kept["rail"].to_list() == [i % 8 for i in range(16)]


def test_malformed_rows_of_a_quoted_csv_are_rejected_with_their_row_numbers(tmp_path):
    """Field counts are judged RFC-4180-wise (a comma inside quotes is not a separator): a short and
    a long record are rejected with their data-row numbers, a bad value with its own; nothing else is
    lost and the counts add up."""
    from fleetscope.ingest.flows import read_flows

    text = ('"start_ns","end_ns","src_ip","dst_ip","bytes","path"\r\n'
            '100,200,"10.0.0.1","10.0.0.2",4096,"leaf1>spine1"\r\n'          # row 1 ok
            '300,400,"10.0.0.1"\r\n'                                          # row 2 short
            '300,400,"10.0.0.1","10.0.0.2",10,"a,b",surplus\r\n'              # row 3 long (7 fields)
            '300,400,"10.0.0.1","10.0.0.2","lots",""\r\n'                     # row 4 bad value
            '500,600,"10.0.0.3","10.0.0.4",8192,"leaf,3"\r\n')                # row 5 ok (comma inside quotes)
    (tmp_path / "bad.csv").write_text(text, newline="")
    r = read_flows(tmp_path / "bad.csv")
    assert r.kept.height == 2 and r.kept["path"].to_list() == [["leaf1", "spine1"], ["leaf,3"]]
    rej = r.rejected.sort("row_number")
    assert rej["row_number"].to_list() == [2, 3, 4]
    assert "3 fields but the header has 6" in rej["reason"][0]
    assert "7 fields but the header has 6" in rej["reason"][1]
    assert "lots" in rej["reason"][2]
    assert r.n_read == 5 == r.kept.height + r.rejected.height


@pytest.mark.parametrize("damage", ["no_trailer", "bad_crc", "bad_length", "cut_in_half", "second_member_cut"])
def test_damaged_gzip_is_quarantined_as_truncated(tmp_path, damage):
    """A .csv.gz whose trailer is missing or whose CRC / length does not match is a damaged copy:
    the whole file is refused with a reason, never half-ingested."""
    from fleetscope.ingest.flows import read_flows
    from fleetscope.ingest.tabular import IngestError

    body = b"start_ns,end_ns,src_ip,dst_ip,bytes\n" + b"".join(b"%d,%d,10.0.0.1,10.0.0.2,3\n" % (i, i + 1) for i in range(5000))
    raw = gzip.compress(body)
    bad = {
        "no_trailer": raw[:-8],
        "bad_crc": raw[:-8] + bytes([raw[-8] ^ 0xFF]) + raw[-7:],
        "bad_length": raw[:-4] + bytes([raw[-4] ^ 0x01]) + raw[-3:],
        "cut_in_half": raw[: len(raw) // 2],
        "second_member_cut": raw + gzip.compress(body)[:-8],
    }[damage]
    (tmp_path / "f.csv.gz").write_bytes(bad)
    with pytest.raises(IngestError, match="truncated or corrupt gzip"):
        read_flows(tmp_path / "f.csv.gz")
    (tmp_path / "ok.csv.gz").write_bytes(raw + gzip.compress(body))  # two complete members: fine
    assert read_flows(tmp_path / "ok.csv.gz").kept.height == 10000


@pytest.mark.parametrize("codec", ["none", "snappy", "gzip", "brotli", "zstd", "lz4"])
def test_parquet_of_any_codec_is_read(tmp_path, codec):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from fleetscope.ingest.flows import read_flows

    rows = _flow_rows(200)
    t = pa.Table.from_pylist(rows)
    pq.write_table(t, tmp_path / f"f.{codec}.parquet", compression=codec)
    r = read_flows(tmp_path / f"f.{codec}.parquet")
    assert r.kept.height == 200 and r.rejected.height == 0
    assert r.kept["bytes"].to_list() == [x["bytes"] for x in rows]


def test_parquet_timestamps_are_nanoseconds(tmp_path):
    """start_ns written as a parquet TIMESTAMP (here microseconds) is read as ns since the epoch."""
    from datetime import datetime, timezone

    from fleetscope.ingest.flows import read_flows

    t0 = datetime(2026, 11, 21, 12, 0, tzinfo=timezone.utc)
    df = pl.DataFrame({"start_ns": [t0, t0], "duration_ns": [10, 20], "src_ip": ["10.0.0.1"] * 2, "dst_ip": ["10.0.0.2"] * 2,
                       "bytes": [1, 2]}).with_columns(pl.col("start_ns").dt.cast_time_unit("us"))
    df.write_parquet(tmp_path / "ts.parquet")
    r = read_flows(tmp_path / "ts.parquet")
    assert r.kept["start_ns"].to_list() == [int(t0.timestamp()) * 1_000_000_000] * 2


def test_rows_whose_addresses_are_not_addresses_are_quarantined(tmp_path):
    """src_ip "a", an octet of 300, a host name: quarantined with the reason; IPv4 and IPv6 rows kept."""
    from fleetscope.ingest.flows import read_flows

    p = tmp_path / "flows.csv"
    p.write_text("start_ns,end_ns,src_ip,dst_ip,bytes\n1000,2000,10.0.0.1,10.0.0.2,5000\n1000,2000,a,b,5000\n"
                 "1000,2000,fd00::1,fd00::2,5000\n1000,2000,10.0.0.300,10.0.0.2,5000\n1000,2000,10.0.0.1,host-7,5000\n")
    r = read_flows(p)
    assert r.kept["src_ip"].to_list() == ["10.0.0.1", "fd00::1"]
    assert r.rejected["row_number"].sort().to_list() == [2, 4, 5]
    assert all("not an IPv4 or IPv6 address" in x for x in r.rejected["reason"].to_list())
