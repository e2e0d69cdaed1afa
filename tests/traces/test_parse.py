import gzip
import json
import shutil

import polars as pl
import pytest

from fleetscope.tables import TABLES
from fleetscope.ingest.traces import TraceError, read_capture, read_trace
from tests.traces.conftest import ALL_TRACES, load_json, real

_CAT = {"cpu_op": "cpu_op", "user_annotation": "user_annotation", "cuda_runtime": "cuda_runtime", "kernel": "kernel",
        "gpu_memcpy": "gpu_memcpy", "gpu_memset": "gpu_memset", "cuda_sync": "cuda_sync",
        "gpu_user_annotation": "gpu_user_annotation", "python_function": "python_function"}


@pytest.mark.parametrize("path", ALL_TRACES, ids=lambda p: p.name[:40])
def test_every_real_trace_matches_json_ground_truth(path):
    doc = load_json(path)
    truth = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") != "Trace"]
    # a file without distributedInfo.rank gets its rank from the caller (test_rank_sources covers the rules)
    tf = read_trace(path, "cap", rank=None if (doc.get("distributedInfo") or {}).get("rank") is not None else 0)
    ev = tf.events
    TABLES["trace_events"].validate(ev)
    assert ev.height == len(truth)
    base = doc.get("baseTimeNanoseconds") or 0
    # timestamps, durations, categories, correlation ids event by event
    exp_ts = [base + round(e["ts"] * 1000) for e in truth]
    assert max(abs(a - b) for a, b in zip(ev["ts_ns"].to_list(), exp_ts)) <= 1
    assert ev["dur_ns"].to_list() == [round(e.get("dur", 0) * 1000) for e in truth]
    assert ev["cat"].to_list() == [_CAT.get(e["cat"], "other") for e in truth]
    assert ev["name"].to_list() == [e["name"] for e in truth]
    assert ev["correlation"].to_list() == [(e.get("args") or {}).get("correlation") for e in truth]
    assert (ev["end_ns"] == ev["ts_ns"] + ev["dur_ns"]).all()
    gpu = ev.filter(pl.col("cat").is_in(["kernel", "gpu_memcpy", "gpu_memset"]))
    assert gpu["stream"].null_count() == 0 and gpu["device"].null_count() == 0
    assert tf.meta["n_raw_events"] == len(doc["traceEvents"])
    rank = (doc.get("distributedInfo") or {}).get("rank")
    if rank is not None:
        assert tf.meta["rank_source"] == "distributedInfo" and (ev["rank"] == rank).all()


def test_rank_sources(tmp_path):
    assert read_trace(real("cpu_only"), "c").meta["rank"] == 34
    # a single-process run (no distributedInfo, no collectives): rank 0
    tf = read_trace(real("amd_trace"), "c")
    assert tf.meta["rank_source"] == "single_process" and tf.meta["rank"] == 0
    # a rank of a distributed job (NCCL collectives) without distributedInfo: its rank is unknowable
    src = real("distributed_info_unavailable")
    with pytest.raises(TraceError, match="cannot tell which rank.*rename it rank<R>"):
        read_trace(src, "c")
    for name, rank in (("job_rank7.json.gz", 7), ("rank_3.json.gz", 3), ("node1_rank-12.json.gz", 12), ("RANK5.json.gz", 5)):
        renamed = tmp_path / name
        shutil.copy(src, renamed)
        tf = read_trace(renamed, "c")
        assert tf.meta["rank_source"] == "file_name" and (tf.events["rank"] == rank).all(), name
    # Kineto's default name host_pid.ts.pt.trace.json carries the pid, never taken for a rank
    for name in ("trace_12.json.gz", "node020_28338.1795452262410.pt.trace.json.gz", "frank3.json.gz"):
        other = tmp_path / name
        shutil.copy(src, other)
        with pytest.raises(TraceError, match="cannot tell which rank"):
            read_trace(other, "c")
    assert read_trace(tmp_path / "trace_12.json.gz", "c", rank=3).meta["rank"] == 3


def test_plain_json_and_bare_array(tmp_path):
    src = real("critical_path__cuda_event_sync__")
    plain = tmp_path / "rank0.json"
    plain.write_bytes(gzip.decompress(src.read_bytes()))
    a = read_trace(src, "c").events
    b = read_trace(plain, "c").events
    assert a.drop("source_file").equals(b.drop("source_file"))
    bare = tmp_path / "bare_rank2.json"
    bare.write_text(json.dumps(load_json(src)["traceEvents"]))
    c = read_trace(bare, "c")
    assert c.meta["rank"] == 2 and c.events.height == a.height


def test_nccl_metadata_against_args(real_dir):
    path = real("nccl_parser_config")
    doc = load_json(path)
    truth = [e for e in doc["traceEvents"] if e.get("cat") == "kernel" and "Collective name" in e.get("args", {})]
    ev = read_trace(path, "c").events.filter((pl.col("cat") == "kernel") & pl.col("is_comm"))
    assert ev.height == len(truth) > 0
    size = {"Float": 4, "Long": 8, "Half": 2, "BFloat16": 2, "Int": 4, "Double": 8, "Byte": 1}
    assert ev["msg_bytes"].to_list() == [e["args"]["In msg nelems"] * size[e["args"]["dtype"]] for e in truth]
    assert ev["collective"].to_list() == [e["args"]["Collective name"] for e in truth]
    assert set(ev["group_size"].to_list()) == {2} and set(ev["pg_name"].to_list()) == {"0"}
    assert ev["group_ranks"].to_list()[0] == "[0, 1]"
    # gloo annotations in the CPU-only trace: size from the first input tensor's dims x float
    cpu = read_trace(real("cpu_only"), "c").events.filter(pl.col("is_comm"))
    assert set(cpu["collective"].to_list()) == {"allreduce"}
    truth = [e for e in load_json(real("cpu_only"))["traceEvents"] if e.get("name") == "gloo:all_reduce"]
    assert sorted(cpu.filter(pl.col("name") == "gloo:all_reduce")["msg_bytes"].to_list()) == sorted(
        e["args"]["Input Dims"][0][0] * 4 for e in truth)


def test_sync_events_and_amd(real_dir):
    ev = read_trace(real("critical_path__alexnet"), "c").events.filter(pl.col("cat") == "cuda_sync")
    assert set(ev["sync_kind"].to_list()) == {"Stream Sync", "Context Sync", "Stream Wait Event"}
    ev = read_trace(real("critical_path__cuda_event_sync_multi"), "c").events.filter(pl.col("cat") == "cuda_sync")
    assert ev.filter(pl.col("sync_kind") == "Event Sync")["wait_on_event_corr"].is_not_null().any()
    amd = read_trace(real("amd_trace"), "c").events
    k = amd.filter(pl.col("cat") == "kernel")
    launches = amd.filter(pl.col("name").str.starts_with("hip") & pl.col("correlation").is_in(k["correlation"].implode()))
    assert k.height == 14 and launches.height == k.height
    assert amd["ts_ns"].min() > 1_700_000_000 * 10**9  # baseTimeNanoseconds applied


def _expect_error(path, *words):
    with pytest.raises(TraceError) as ei:
        read_trace(path, "c")
    msg = str(ei.value)
    assert str(path) in msg
    for w in words:
        assert w in msg, msg


def test_bad_files(tmp_path):
    src = real("negative_queue")
    trunc = tmp_path / "trunc.json.gz"
    trunc.write_bytes(src.read_bytes()[: src.stat().st_size // 2])
    _expect_error(trunc, "truncated gzip")
    text = gzip.decompress(src.read_bytes())
    cut = tmp_path / "cut.json"
    cut.write_bytes(text[: len(text) // 2])
    _expect_error(cut, "truncated")
    bad = tmp_path / "bad.json"
    bad.write_bytes(text[:5000].replace(b'"ph"', b'"ph" "', 3) + text[5000:])
    _expect_error(bad, "malformed JSON")
    notrace = tmp_path / "notrace.json"
    notrace.write_text(json.dumps({"schemaVersion": 1, "events": [1, 2]}))
    _expect_error(notrace, "no 'traceEvents'")
    broken = tmp_path / "broken.json"
    broken.write_text('{"schemaVersion": 1, "foo": [1, 2')
    _expect_error(broken, "malformed JSON")
    empty = tmp_path / "empty.json"
    empty.write_bytes(b"")
    _expect_error(empty, "empty")
    csv = tmp_path / "x.json"
    csv.write_text("a,b\n1,2\n")
    _expect_error(csv, "not JSON")
    garbage = tmp_path / "garbage.json.gz"
    garbage.write_bytes(b"\x1f\x8b" + b"\x00" * 50)
    _expect_error(garbage, "gzip")


def test_small_blocks_give_the_same_events(monkeypatch):
    import fleetscope.ingest.traces as P

    path = real("nccl_parser_config")
    ref = read_trace(path, "c").events
    monkeypatch.setattr(P, "BLOCK_BYTES", 100_003)  # many blocks, events cut at arbitrary bytes
    assert read_trace(path, "c").events.equals(ref)


def test_reading_in_processes_gives_the_same_events_and_errors(tmp_path):
    """A capture's files read by spawned processes (the compiled scanner in each) give the frames read
    here, in the order of the files, and a bad file its own error in its place."""
    from fleetscope.ingest.traces import read_traces

    files = [real("timeline_analysis"), real("nccl_parser_config"), tmp_path / "cut.json", real("trace_filter")]
    text = gzip.decompress(real("negative_queue").read_bytes())
    files[2].write_bytes(text[: len(text) // 2])
    here = read_traces(files, "c", processes=1)
    there = read_traces(files, "c", processes=2)
    for a, b in zip(here, there):
        if isinstance(a, TraceError):
            assert type(b) is TraceError and str(a) == str(b) and "truncated" in str(a)
        else:
            assert a.events.equals(b.events) and a.meta == b.meta
    assert isinstance(here[2], TraceError) and sum(isinstance(x, TraceError) for x in here) == 1


def test_read_capture(tmp_path):
    cap = tmp_path / "job1"
    cap.mkdir()
    shutil.copy(real("timeline_analysis"), cap / "a.json.gz")
    shutil.copy(real("trace_filter"), cap / "b.json.gz")
    (cap / "capture.json").write_text('{"job_id": "j"}')
    ev = read_capture(cap)
    assert sorted(ev["rank"].unique().to_list()) == [0, 1]
    assert (ev["capture_id"] == "job1").all()
    shutil.copy(real("timeline_analysis"), cap / "c.json.gz")
    with pytest.raises(TraceError, match="both rank 0"):
        read_capture(cap)


def test_derived_tables():
    from fleetscope.traces.tables import trace_collectives, trace_iterations, trace_syncs

    ev = read_trace(real("nccl_parser_config"), "c").events
    c = trace_collectives(ev)
    truth = [e for e in load_json(real("nccl_parser_config"))["traceEvents"]
             if e.get("cat") == "kernel" and "Collective name" in e.get("args", {})]
    assert c.height == len(truth)
    assert c.filter(pl.col("collective") == "allreduce")["seq"].sort().to_list() == list(range(c.filter(pl.col("collective") == "allreduce").height))
    gloo = trace_collectives(read_trace(real("cpu_only"), "c").events)
    assert gloo.height == 10 and set(gloo["collective"].to_list()) == {"allreduce"}
    it = trace_iterations(read_trace(real("negative_queue"), "c").events)
    steps = sorted(int(e["name"].split("#")[1]) for e in load_json(real("negative_queue"))["traceEvents"]
                   if e.get("name", "").startswith("ProfilerStep#"))
    assert it["iteration"].to_list() == steps
    s = trace_syncs(read_trace(real("critical_path__alexnet"), "c").events)
    assert s.filter(pl.col("source") == "cuda_sync")["kind"].value_counts().sort("kind").rows() == [
        ("context_sync", 5), ("stream_sync", 16), ("stream_wait_event", 20)]
    assert s.filter((pl.col("source") == "cuda_runtime") & (pl.col("kind") == "stream_sync")).height == 16


@pytest.mark.parametrize("indent", [None, 1, 4])
def test_scanner_handles_strings_with_json_syntax_and_layouts(tmp_path, indent, monkeypatch):
    import fleetscope.ingest.traces as P

    names = ['void k<{lambda()#1}>(float [4], "q\\\\")', "a}b]c,{", 'esc \\"}{\\" x', "tab\there", "ünïcode ✓"]
    events = [{"ph": "X", "cat": "kernel", "name": n, "pid": 0, "tid": 7, "ts": 1000 + i, "dur": 2,
               "args": {"correlation": i, "stream": 7, "device": 0, "grid": [[1, 2], {"x": "}"}]}} for i, n in enumerate(names)]
    doc = {"deviceProperties": [{"name": "[traceEvents]"}], "x": "\"traceEvents\": [", "traceEvents": events,
           "distributedInfo": {"rank": 5}, "baseTimeNanoseconds": 1_000_000_000}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc, indent=indent, ensure_ascii=(indent == 4)))
    monkeypatch.setattr(P, "BLOCK_BYTES", 97)  # blocks cut inside strings and escapes
    tf = read_trace(path, "c")
    assert tf.meta["rank"] == 5
    assert tf.events["name"].to_list() == names
    assert tf.events["ts_ns"].to_list() == [1_000_000_000 + (1000 + i) * 1000 for i in range(len(names))]
    assert tf.events["correlation"].to_list() == list(range(len(names)))


@pytest.mark.parametrize("path", ALL_TRACES[:6] + ALL_TRACES[-6:], ids=lambda p: p.name[:40])
def test_compiled_scanner_reads_what_the_general_path_reads(path, monkeypatch):
    """The compiled block scanner (fleetscope.ingest.trace_scan) and the general path (msgspec cut + polars'
    NDJSON reader) give the same trace_events, metadata and rare args (NCCL metadata, syncs, shapes)."""
    import fleetscope.ingest.traces as P

    rank = None if (load_json(path).get("distributedInfo") or {}).get("rank") is not None else 0
    fast = read_trace(path, "c", rank=rank)
    monkeypatch.setattr(P, "FAST_SCAN", False)
    general = read_trace(path, "c", rank=rank)
    assert fast.events.equals(general.events) and fast.meta == general.meta


def _scan_all(text: bytes):
    """(statuses, events read) of the scanner over text, block after block as the reader cuts them."""
    from fleetscope.ingest.trace_scan import END, FALLBACK, Scanner

    sc, pos, first, stats, n = Scanner(), 0, True, [], 0
    while True:
        st, used, frame, _, end = sc.scan(text[pos:], first)
        stats.append(st)
        n += frame.height if frame is not None else 0
        if st in (END, FALLBACK) or frame is None:
            return stats, n
        pos, first = pos + used, False


def test_scanner_gives_up_on_what_it_does_not_read_and_the_general_path_reads_it(tmp_path, monkeypatch):
    """Events the scanner does not read its own way (escapes or non-ASCII text, a key twice, a float id, a
    boolean name, numbers it cannot convert exactly by its fast path) come out as the general path reads
    them: it hands the block over there. Numbers beyond the fast path in ts / dur are converted by float()."""
    import fleetscope.ingest.traces as P
    from fleetscope.ingest.trace_scan import END, FALLBACK

    base = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 4, "tid": 5, "ts": 10, "dur": 2,
            "args": {"External id": 1, "Input Dims": [[2, 3], [], [[1]]], "x": {"y": [True, False, None, -1.5e-3]}}}
    clean = [base, {**base, "ts": 1683564901548726.0, "dur": 0.125}, {**base, "ts": 12345.678, "pid": "Spans", "tid": -3},
             {**base, "ts": 1683564901548726.123, "dur": 1e-3}, {"ph": "i", "name": None, "ts": 7}, {},
             {**base, "args": None}, {**base, "args": {"stream": "0x0", "correlation": 9, "device": 0}}]
    odd = [{**base, "name": 'esc "q"'}, {**base, "name": "ünï"}, {**base, "args": {"External id": 2.0}}, {**base, "cat": True},
           {**base, "args": {"correlation": 10 ** 19}}, {**base, "tid": 1.5}]
    for events, scanned in ((clean, True), (odd, False)):
        text = json.dumps(events, ensure_ascii=False).encode()[1:]  # the array's text after its '['
        stats, n = _scan_all(text)
        assert (stats[-1] == END and n == len(events)) if scanned else (stats[0] == FALLBACK and n == 0), stats
        path = tmp_path / "t.json"
        path.write_text(json.dumps({"traceEvents": events, "distributedInfo": {"rank": 0}}, ensure_ascii=False))
        fast = read_trace(path, "c").events
        monkeypatch.setattr(P, "FAST_SCAN", False)
        general = read_trace(path, "c").events
        monkeypatch.setattr(P, "FAST_SCAN", True)
        assert fast.equals(general)
    # a key twice in one event: which one counts is the general path's rule
    dup = b'{"ph": "X", "ph": "i", "ts": 1, "dur": 1, "name": "a"}]'
    assert _scan_all(dup)[0] == [FALLBACK]
    # it stops at the first event it does not read (the reader then hands the whole block to the general path)
    mixed = json.dumps(clean[:3] + odd[:1] + clean[:2]).encode()[1:]
    assert _scan_all(mixed) == ([FALLBACK], 3)
    path.write_text(json.dumps({"traceEvents": clean[:3] + odd[:1] + clean[:2], "distributedInfo": {"rank": 0}}))
    fast = read_trace(path, "c").events
    monkeypatch.setattr(P, "FAST_SCAN", False)
    assert fast.equals(read_trace(path, "c").events)


def test_malformed_json_is_refused_as_before_with_the_scanner(tmp_path, monkeypatch):
    """Malformed JSON inside the array: the scanner hands the block over, and the general path's error is
    the file's reason (the same text as without the scanner)."""
    import fleetscope.ingest.traces as P

    good = json.dumps({"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 1})
    for body in (good + ", {\"ph\": \"X\", \"ts\": 01}", good + ", {\"ph\" \"X\"}", good + ", 5", good + ",]", good + " {}",
                 good + ', {"name": "a\\qb"}', good + ', {"x": [1, 2}'):
        path = tmp_path / "bad.json"
        path.write_text('{"distributedInfo": {"rank": 0}, "traceEvents": [' + body + "]}")
        with pytest.raises(TraceError) as fast:
            read_trace(path, "c")
        monkeypatch.setattr(P, "FAST_SCAN", False)
        with pytest.raises(TraceError) as general:
            read_trace(path, "c")
        monkeypatch.setattr(P, "FAST_SCAN", True)
        assert str(fast.value) == str(general.value), body
