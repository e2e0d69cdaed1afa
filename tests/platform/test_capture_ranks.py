"""Which machine each rank ran on: from the timings' host column, the trace's kernel device and
Kineto's default file name; ranks without a trace placed by their position among the host's ranks."""
import polars as pl

from fleetscope.ingest.captures import capture_ranks


def test_hosts_from_timings_devices_from_traces_and_the_rest_by_local_rank():
    timings = pl.DataFrame({"rank": [0, 1, 2, 3, 4, 5], "host": ["h1", "h1", "h1", "h2", "h2", "h2"], "stage": [0, 0, 0, 1, 1, 1]})
    trace = pl.DataFrame({"rank": [1, 1, 4], "cat": ["kernel", "cpu_op", "kernel"], "device": [5, None, 2],
                          "source_file": ["traces/c/h1_123.1700000000000.pt.trace.json.gz"] * 2 + ["traces/c/rank4.json"]})
    r = capture_ranks("c", timings, trace)
    got = {row["rank"]: (row["host"], row["device"], row["device_source"]) for row in r.iter_rows(named=True)}
    # h1: rank 1 is on device 5 per its kernels, so ranks 0 and 2 sit beside it (4 and 6)
    assert got[0] == ("h1", 4, "local rank") and got[1] == ("h1", 5, "trace") and got[2] == ("h1", 6, "local rank")
    assert got[3] == ("h2", 1, "local rank") and got[4] == ("h2", 2, "trace") and got[5] == ("h2", 3, "local rank")
    assert set(r["source"]) == {"timings"}


def test_traces_only_take_the_host_from_kinetos_file_name_never_a_pid():
    trace = pl.DataFrame({"rank": [0, 1], "cat": ["kernel", "kernel"], "device": [0, 1],
                          "source_file": ["traces/c/node-7.cluster_4242.1700000000123.pt.trace.json",
                                          "traces/c/node-7.cluster_4243.1700000000124.pt.trace.json.gz"]})
    r = capture_ranks("c", None, trace)
    assert r["host"].to_list() == ["node-7.cluster", "node-7.cluster"] and set(r["source"]) == {"trace file name"}
    assert r["device"].to_list() == [0, 1]
    unnamed = capture_ranks("c", None, trace.with_columns(source_file=pl.lit("traces/c/rank0.json")))
    assert unnamed["host"].null_count() == 2 and set(unnamed["source"]) == {"none"}
