"""Every file the simulator lands is valid per CONTRACT in its own dialect (read by an independent
RFC 4180 / parquet reader), the late and the resent file exist, and files.csv describes them."""
from __future__ import annotations

import gzip
import ipaddress
import json

import polars as pl
import pyarrow.parquet as pq

from tests.sim.contract import BOM, flows_per_contract, raw_text, read_table


def _dialect(row) -> dict:
    return dict(eval(row["dialect"])) if row["dialect"] else {}   # noqa: S307 - our own repr of a list of pairs


def test_every_landed_file_is_listed_and_valid_in_its_dialect(many_seeds):
    formats, codecs, dialects = set(), set(), set()
    for fleet in many_seeds:
        files = fleet.truth("files")
        on_disk = {str(p.relative_to(fleet.landing)) for p in fleet.landing.rglob("*") if p.is_file()}
        assert on_disk == set(files["file"]), (fleet.root, on_disk ^ set(files["file"]))
        for r in files.iter_rows(named=True):
            p = fleet.landing / r["file"]
            formats.add(r["format"])
            if r["format"] == "parquet":
                meta = pq.ParquetFile(p).metadata
                codec = meta.row_group(0).column(0).compression.lower() if meta.num_row_groups else "none"
                codecs.add(codec)
                assert codec.replace("lz4_raw", "lz4") == r["codec"], (codec, r["codec"])
            else:
                raw = p.read_bytes()
                if r["format"] == "csv.gz":
                    assert raw[:2] == b"\x1f\x8b"
                    raw = gzip.decompress(raw)            # a complete stream: trailer and CRC check
                d = _dialect(r)
                dialects.add(tuple(sorted(d.items())))
                assert raw.startswith(BOM) == d["bom"]
                body = raw[len(BOM):] if d["bom"] else raw
                first = body.split(b"\n", 1)[0]
                assert first.endswith(b"\r") == (d["line_terminator"] == "\r\n")
                assert first.startswith(b'"') == (d["header_quoted"] or d["quote_style"] == "always")
            if r["kind"] == "flows":
                df = flows_per_contract(p)
                assert df.height == r["n_records"]
                c = fleet.conventions["collectors"]["per_collector"][r["collector"]]
                key = df["start_ns"] if c["row_order"] == "start" else df["end_ns"]
                assert key.is_sorted(), (r["file"], c["row_order"])          # first-packet or expiry order
                if c["time_resolution_ns"] > 1:
                    assert (df["start_ns"] % c["time_resolution_ns"] == 0).all()
                assert int(df["start_ns"].min()) == r["first_start_ns"] and int(df["start_ns"].max()) == r["last_start_ns"]
                want_end = r["time_columns"] in ("end", "both")
                cols = read_table(p).columns
                assert ("end_ns" in cols) == want_end and ("duration_ns" in cols) == (r["time_columns"] != "end")
            else:
                t = read_table(p)
                assert {"ip", "host"} <= set(t.columns) and t["ip"].null_count() == 0 and t["ip"].n_unique() == t.height
    # the seeds exercise several formats, codecs and dialects
    assert {"parquet"} < formats and len(codecs) >= 2 and len(dialects) >= 3


def test_one_late_and_one_resent_file(many_seeds):
    for fleet in many_seeds:
        f = fleet.files()
        late, dup = f.filter(pl.col("role") == "late"), f.filter(pl.col("role") == "duplicate")
        assert late.height == 1 and dup.height == 1
        # the resent file is byte-identical to its original, under another name
        d = dup.row(0, named=True)
        assert d["file"] != d["duplicate_of"]
        assert (fleet.landing / d["file"]).read_bytes() == (fleet.landing / d["duplicate_of"]).read_bytes()
        # the late file landed last, and its records belong to a period another file of its collector covers
        mt = {r: (fleet.landing / r).stat().st_mtime for r in f["file"]}
        lf = late.row(0, named=True)
        assert mt[lf["file"]] == max(mt.values())
        same = f.filter((pl.col("collector") == lf["collector"]) & (pl.col("role") == "regular"))
        assert same.height >= 1
        assert (same["last_start_ns"] <= lf["first_start_ns"]).any() or (same["first_start_ns"] <= lf["first_start_ns"]).any()


def test_topology_dialect_and_service_hosts(many_seeds):
    seen_service, seen_plain = False, False
    for fleet in many_seeds:
        conv = fleet.conventions["topology"]
        topo = fleet.topology()
        jobs = fleet.truth("jobs")
        bgh = fleet.truth("background_hosts")
        assert set(jobs["ip"]) <= set(topo["ip"])
        # addresses as exporters write them: canonical text (RFC 5952 for IPv6), one per NIC
        assert all(str(ipaddress.ip_address(x)) == x for x in topo["ip"]) and topo["ip"].n_unique() == topo.height
        listed = set(bgh["ip"]) & set(topo["ip"])
        if conv["service_hosts"]:
            assert listed == set(bgh["ip"])
            seen_service = True
        else:
            assert not listed
            seen_plain = True
        for extra in conv["extra_columns"]:
            assert extra in topo.columns
        assert ("spine" in topo.columns) == conv["has_spine"] and ("gpu" in topo.columns) == conv["has_gpu"]
    assert seen_service and seen_plain


def test_conventions_json_names_what_was_used(many_seeds):
    for fleet in many_seeds:
        conv = json.loads((fleet.truth_dir / "conventions.json").read_text())
        files = fleet.files()
        for r in files.iter_rows(named=True):
            c = conv["collectors"]["per_collector"][r["collector"]]
            assert (c["format"], c["cutting"], c["time_columns"]) == (r["format"], r["cutting"], r["time_columns"])
        lay = fleet.truth("job_layout")
        assert set(conv["jobs_drawn"]["dp_style"]) == set(lay["dp_style"])
        raw = raw_text(fleet.landing / files["file"][0])
        assert raw      # readable
