"""The warehouse under the conditions DESIGN.md warns about: a run killed mid-write, several
writer processes at once, and a person holding the .duckdb file open while pipelines run."""
import signal
import subprocess
import sys
import textwrap
import time

import duckdb
import polars as pl

from fleetscope.warehouse import Warehouse, partition_filename

PY = sys.executable


def test_partition_names_are_safe_and_unique():
    assert partition_filename("flows-abc123") == "flows-abc123"
    a, b = partition_filename("a/b"), partition_filename("a:b")
    assert "/" not in a and a != b


def test_killed_writer_leaves_previous_partition_readable(tmp_path):
    """The writer is killed while its temporary file exists and grows (inside the write, not before
    it): readers keep seeing the previous partition, and no half-written file shows as a partition."""
    wh = Warehouse(tmp_path / "w.duckdb")
    wh.init()
    wh.write_partition("flows", "p1", pl.DataFrame({"start_ns": [1, 2, 3], "src_ip": ["a"] * 3}))
    code = textwrap.dedent(f"""
        import numpy as np, polars as pl
        from fleetscope.warehouse import Warehouse
        wh = Warehouse({str(tmp_path / 'w.duckdb')!r})
        n = 80_000_000  # a write of several seconds
        df = pl.DataFrame({{"start_ns": np.arange(n, dtype=np.int64), "src_ip": pl.repeat("a", n, eager=True)}})
        print("writing", flush=True)
        wh.write_partition("flows", "p1", df)
        print("done", flush=True)
    """)
    p = subprocess.Popen([PY, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "writing"
    table_dir = tmp_path / "w.tables" / "flows"
    deadline, tmp = time.time() + 60, []
    while time.time() < deadline and p.poll() is None:  # kill only once the temporary file exists and has bytes
        tmp = [f for f in table_dir.iterdir() if f.name.endswith(".tmp") and f.stat().st_size > 0]
        if tmp:
            break
        time.sleep(0.005)
    assert tmp, "the writer finished (or never started) its temporary file before it could be killed"
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert any(f.name.endswith(".tmp") for f in table_dir.iterdir()), "killed inside the write: its temporary file is left"
    df = wh.read("flows")
    assert df["start_ns"].to_list() == [1, 2, 3]
    assert wh.partitions("flows") == ["p1"]  # no half-written file visible under a table name
    assert wh.sql("SELECT count(*) AS n FROM flows")["n"][0] == 3


def test_concurrent_writer_processes(tmp_path):
    wh = Warehouse(tmp_path / "w.duckdb")
    wh.init()
    code = textwrap.dedent("""
        import polars as pl, sys
        from fleetscope.warehouse import Warehouse
        wh = Warehouse(sys.argv[1]); wid = int(sys.argv[2])
        for i in range(15):
            wh.write_partition("flows", f"w{wid}-{i}", pl.DataFrame({"start_ns": [wid * 1000 + i] * 100, "src_ip": ["x"] * 100}))
            wh.publish_views(retries=20, wait_s=0.05)
    """)
    procs = [subprocess.Popen([PY, "-c", code, str(tmp_path / "w.duckdb"), str(w)]) for w in range(3)]
    assert all(p.wait(timeout=120) == 0 for p in procs)
    df = wh.read("flows")
    assert df.height == 3 * 15 * 100
    assert df["start_ns"].n_unique() == 45
    with duckdb.connect(str(tmp_path / "w.duckdb"), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM flows").fetchone()[0] == 4500


def test_reader_holding_the_file_does_not_block_writers(tmp_path):
    wh = Warehouse(tmp_path / "w.duckdb")
    wh.init()
    hold = subprocess.Popen([PY, "-c", textwrap.dedent(f"""
        import duckdb, sys, time
        con = duckdb.connect({str(tmp_path / 'w.duckdb')!r}, read_only=True)
        print(con.execute("SELECT count(*) FROM flows").fetchone()[0], flush=True)
        sys.stdin.readline()
        print(con.execute("SELECT count(*) FROM flows").fetchone()[0], flush=True)
    """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert hold.stdout.readline().strip() == "0"
    # while the person's session is open: writes succeed, a new table's view is deferred, never an error
    wh.write_partition("flows", "p", pl.DataFrame({"start_ns": [5, 6], "src_ip": ["a", "b"]}))
    wh.write_partition("brand_new_table", "p", pl.DataFrame({"x": [1]}))
    assert wh.publish_views(retries=2, wait_s=0.05) is False
    assert wh.sql("SELECT count(*) AS n FROM flows")["n"][0] == 2
    hold.stdin.write("\n")
    hold.stdin.flush()
    assert hold.stdout.readline().strip() == "2"  # the open session sees new data through its view
    hold.wait(timeout=30)
    assert wh.publish_views() is True
    with duckdb.connect(str(tmp_path / "w.duckdb"), read_only=True) as con:
        assert con.execute("SELECT x FROM brand_new_table").fetchall() == [(1,)]
