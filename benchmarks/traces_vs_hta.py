"""Profiler traces, fleetscope vs Holistic Trace Analysis, side by side on one capture of 16 real GPU ranks.

The capture: shared/data/real/hta/negative_queue_length_values_check__rank0.json.gz (rank 0 of a
16-rank A100 job) laid out as 16 rank files with distinct distributedInfo.rank. That file holds
108,936 events; `--copies 2` (the default) puts two time-shifted copies of its events in every rank
file (ids and correlations shifted too, as a longer profile would be), so each rank holds >= 200 K
events. The capture is trace-only (no capture.json: its layout comes from the traces) unless
--declared. Each tool runs in a fresh process; peak memory is the largest SUM of the resident memory
of the process and all its children at once (sampled every 20 ms), not the largest single process.

Printed, per round (--repeat N alternates the two N times; the load average before each is printed):
  HTA 0.5.0   TraceAnalysis(trace_dir=...) load: wall time, events/s, peak RSS
  fleetscope  the whole `fleetscope run` over that capture's landing folder (the CLI: ingest, layout,
              graphs, replay, what-ifs, patterns, metrics, forecasts, stragglers, the warehouse writes,
              the fleet job), wall, CPU, peak RSS; ratio to HTA's load (target >= 3x faster, memory no
              higher than HTA's), and the Dagster runs' own durations
then what the trace-only capture got (layout, what-if scenarios, forecast, models, throughput) and the
median ratio over the rounds.
  --profile   additionally the trace_events ingest alone and each per-capture analysis in one process

HTA (holistictraceanalysis==0.5.0 with pandas<3, which it needs) lives in its own virtualenv outside the
repository (--hta-venv, default $HTA_VENV or .hta-venv in the repository, git-ignored; created when missing).

    .venv/bin/python -m benchmarks.traces_vs_hta [--ranks 16] [--copies 2] [--repeat 3] [--profile] [--skip-hta]
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / ".." / "shared" / "data" / "real" / "hta" / "negative_queue_length_values_check__rank0.json.gz"
CAPTURE = "hta-negq-16r"


# ------------------------------------------------------------------------------------- the capture
def _shift(doc: dict, copies: int) -> list[dict]:
    """The events, repeated `copies` times one after another in time (ids and correlations shifted so
    every copy is a distinct stretch of the same job, as a longer profile would be)."""
    ev = doc["traceEvents"]
    timed = [e for e in ev if isinstance(e.get("ts"), (int, float))]
    t0 = min(e["ts"] for e in timed)
    span = max(e["ts"] + (e.get("dur") or 0) for e in timed) - t0 + 1000.0
    id_keys = ("External id", "correlation", "Ev Idx")
    max_id = 1 + max([int(e.get("id", 0)) for e in ev if isinstance(e.get("id"), int)] +
                     [int(v) for e in ev for k, v in (e.get("args") or {}).items() if k in id_keys and isinstance(v, int)] + [0])
    out = []
    for k in range(copies):
        for e in ev:
            if k and e.get("ph") == "M":
                continue  # metadata once
            e2 = dict(e)
            if k:
                if isinstance(e2.get("ts"), (int, float)):
                    e2["ts"] = e2["ts"] + k * span
                if isinstance(e2.get("id"), int):
                    e2["id"] = e2["id"] + k * max_id
                if e2.get("args"):
                    e2["args"] = {a: (v + k * max_id if a in id_keys and isinstance(v, int) else v) for a, v in e2["args"].items()}
            out.append(e2)
    return out


def build_capture(root: Path, ranks: int, copies: int, declared: bool = False) -> tuple[Path, int]:
    """landing/traces/<CAPTURE>/rank<R>.json.gz and hta/<R>.json.gz links; returns (landing, raw events in
    all files). Trace-only (no capture.json: the layout comes from the traces) unless `declared`. Cached
    under root by (ranks, copies, declared)."""
    landing = root / "landing"
    folder = landing / "traces" / CAPTURE
    stamp = root / "built.json"
    if stamp.exists() and json.loads(stamp.read_text()) .get("key") == [ranks, copies, declared]:
        return landing, json.loads(stamp.read_text())["events"]
    shutil.rmtree(root, ignore_errors=True)
    folder.mkdir(parents=True)
    (root / "hta").mkdir()
    with gzip.open(SOURCE.resolve(), "rt") as fh:
        doc = json.load(fh)
    events = _shift(doc, copies)
    meta = {k: v for k, v in doc.items() if k != "traceEvents"}
    body = ",\n".join(json.dumps(e) for e in events)
    for r in range(ranks):
        m = dict(meta)
        m["distributedInfo"] = {**meta.get("distributedInfo", {}), "rank": r, "world_size": ranks}
        head = json.dumps(m)[:-1] + ',\n"traceEvents": [\n'
        path = folder / f"rank{r}.json.gz"
        with gzip.open(path, "wt", compresslevel=6) as fh:
            fh.write(head + body + "\n]}\n")
        (root / "hta" / f"rank{r}.json.gz").symlink_to(path)
    if declared:
        (folder / "capture.json").write_text(json.dumps({"job_id": "hta-negq", "parallel": {"dp": ranks, "pp": 1, "tp": 1}}))
    n = len(events) * ranks
    stamp.write_text(json.dumps({"key": [ranks, copies, declared], "events": n}))
    return landing, n


# ------------------------------------------------------------------------------- measuring a process
def _tree_rss_kb(pid: int) -> int:
    """Resident memory of pid and all its descendants now (kB)."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as fh:
                st = fh.read()
            ppid = int(st.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(d))
        except (OSError, ValueError, IndexError):
            continue
    total, todo = 0, [pid]
    page_kb = os.sysconf("SC_PAGE_SIZE") // 1024
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/statm") as fh:
                total += int(fh.read().split()[1]) * page_kb
        except (OSError, ValueError):
            pass
        todo += children.get(p, [])
    return total


def measure(cmd: list[str], env: dict | None = None, cwd: Path | None = None, timeout: int = 3600) -> dict:
    """Run cmd; wall seconds, CPU seconds of its process tree (user + system: steadier than wall time
    on a shared machine), peak summed RSS of its process tree (MB), its stdout."""
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd)
    peak = [0]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], _tree_rss_kb(proc.pid))
            done.wait(0.02)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    out, _ = proc.communicate(timeout=timeout)
    wall = time.perf_counter() - t0
    done.set()
    th.join()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed (rc {proc.returncode}):\n{out[-3000:]}")
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    return {"s": wall, "cpu_s": cpu, "peak_mb": peak[0] / 1024, "out": out}


def ensure_hta(venv: Path) -> Path:
    py = venv / "bin" / "python"
    if not (py.exists() and subprocess.run([str(py), "-c", "import hta"], capture_output=True).returncode == 0):
        print(f"installing holistictraceanalysis==0.5.0 (with pandas<3) into {venv} ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "holistictraceanalysis==0.5.0", "pandas<3"], check=True)
    return py


HTA = r"""
import json, logging, sys, time
logging.disable(logging.CRITICAL)
t = time.perf_counter()
from hta.trace_analysis import TraceAnalysis
t_import = time.perf_counter() - t
t = time.perf_counter()
a = TraceAnalysis(trace_dir=sys.argv[1])
dt = time.perf_counter() - t
rows = sum(len(a.t.get_trace(r)) for r in a.t.get_all_traces())
print(json.dumps({"load_s": dt, "import_s": t_import, "rows": rows}))
"""

OURS_INGEST = r"""
import json, sys, time
from pathlib import Path
t = time.perf_counter()
from fleetscope.ingest.partitions import ingest_traces_capture
from fleetscope.warehouse import Warehouse
t_import = time.perf_counter() - t
wh = Warehouse(Path(sys.argv[2]))
wh.init()
t = time.perf_counter()
s = ingest_traces_capture(wh, Path(sys.argv[1]), sys.argv[3])
dt = time.perf_counter() - t
print(json.dumps({"load_s": dt, "import_s": t_import, "rows": s.rows_kept, "files": s.files_in, "rejected": s.files_rejected}))
"""

PROFILE = r"""
import json, sys, time
from pathlib import Path
import polars as pl
from fleetscope.warehouse import Warehouse
wh = Warehouse(Path(sys.argv[1])); key = sys.argv[2]
out = {}
t = time.perf_counter(); ev = wh.read("trace_events", partitions=[key]); out["read trace_events"] = time.perf_counter() - t
from fleetscope.traces import analyze_capture as lumos
from fleetscope.perftracker import analyze_capture as perftracker
t = time.perf_counter(); lumos(ev, capture_id=key); out["traces.analyze_capture (graphs, replay, what-if)"] = time.perf_counter() - t
t = time.perf_counter(); perftracker(ev, capture_id=key, job_id="hta-negq"); out["perftracker.analyze_capture"] = time.perf_counter() - t
print(json.dumps(out))
"""


JSON_LIBS = r"""
# How fast can each JSON library turn one real trace into columns? (the choice behind fleetscope.ingest.traces)
import json, sys, time, zlib
from operator import attrgetter
import polars as pl
path = sys.argv[1]
text = zlib.decompress(open(path, "rb").read(), 31)
FIELDS = ("ph", "cat", "name", "pid", "tid", "ts", "dur")
ARGS = ("External id", "correlation", "device", "stream", "Sequence number", "Fwd thread id")

def columns_from_dicts(ev):  # dict per event (json, orjson): one Python pass per column
    d = {f: [e.get(f) for e in ev] for f in FIELDS}
    a = [e.get("args") or {} for e in ev]
    d.update({k: [x.get(k) for x in a] for k in ARGS})
    return pl.DataFrame({k: pl.Series(v, dtype=pl.Utf8 if k in ("ph", "cat", "name", "pid", "tid", "stream") else pl.Float64, strict=False)
                         for k, v in d.items()})

def lib_json():
    return columns_from_dicts(json.loads(text)["traceEvents"])

def lib_orjson():
    import orjson
    return columns_from_dicts(orjson.loads(text)["traceEvents"])

def lib_simdjson():
    import simdjson
    ev = simdjson.Parser().parse(text)["traceEvents"]
    return columns_from_dicts([e.as_dict() for e in ev])

def lib_msgspec_structs():
    import msgspec
    class Args(msgspec.Struct, gc=False, frozen=True):
        ext: int | None = msgspec.field(default=None, name="External id")
        correlation: int | None = None
        device: int | None = None
        stream: int | str | None = None
        seq: int | None = msgspec.field(default=None, name="Sequence number")
        fwd: int | None = msgspec.field(default=None, name="Fwd thread id")
    class Ev(msgspec.Struct, gc=False):
        ph: str | None = None
        cat: str | None = None
        name: str | None = None
        pid: int | str | None = None
        tid: int | str | None = None
        ts: float | None = None
        dur: float | None = None
        args: Args = Args()
    class Doc(msgspec.Struct, gc=False):
        traceEvents: list[Ev]
    ev = msgspec.json.Decoder(Doc).decode(text).traceEvents
    d = {f: list(map(attrgetter(f), ev)) for f in FIELDS}
    a = list(map(attrgetter("args"), ev))
    d.update({k: list(map(attrgetter(k), a)) for k in ("ext", "correlation", "device", "stream", "seq", "fwd")})
    return pl.DataFrame({k: pl.Series(v, dtype=pl.Utf8 if k in ("ph", "cat", "name", "pid", "tid", "stream") else pl.Float64, strict=False)
                         for k, v in d.items()})

def lib_fleetscope_columns():  # the same columns as above: msgspec cuts raw events, polars' NDJSON reader parses them
    import fleetscope.ingest.traces as T
    start = T._find_trace_events(text[:1 << 16])
    pos, first, out = start, True, []
    while True:
        used, nd, raws, tail = T._split_events(text[pos:pos + T.BLOCK_BYTES], first, False, path, pos)
        if nd is None:
            break
        out.append(T._parse_block(nd, path, pos))
        pos, first = pos + used, False
    return pl.concat(out)

def lib_fleetscope():  # msgspec cuts raw events, polars' NDJSON reader makes the columns (the whole read, normalized)
    from fleetscope.ingest.traces import read_trace
    return read_trace(path).events

for name, fn in [("json + Python columns", lib_json), ("orjson + Python columns", lib_orjson),
                 ("pysimdjson + Python columns", lib_simdjson), ("msgspec typed structs + columns", lib_msgspec_structs),
                 ("msgspec cut raw events + polars NDJSON (the same columns)", lib_fleetscope_columns),
                 ("fleetscope (msgspec cut + polars NDJSON + normalize)", lib_fleetscope)]:
    try:
        fn()
        best = min((lambda t: (fn(), time.process_time() - t)[1])(time.process_time()) for _ in range(3))
        print(f"    {name:<56} {best:6.2f} CPU-s", flush=True)
    except ImportError as exc:
        print(f"    {name:<56} not installed ({exc.name}: pip install it to compare)")
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=16)
    ap.add_argument("--copies", type=int, default=2, help="time-shifted copies of the source's events per rank file")
    ap.add_argument("--hta-venv", default=os.environ.get("HTA_VENV", str(Path(__file__).resolve().parents[1] / ".hta-venv")))
    ap.add_argument("--work", default=None, help="folder for the capture and warehouses (default: a temp folder)")
    ap.add_argument("--skip-hta", action="store_true")
    ap.add_argument("--profile", action="store_true", help="also time each per-capture analysis in one process")
    ap.add_argument("--skip-run", action="store_true", help="only the ingest (no fleetscope run)")
    ap.add_argument("--processes", type=int, default=None, help="processes reading a capture's files (default: fleetscope's choice)")
    ap.add_argument("--json-libs", action="store_true", help="also compare JSON libraries on one rank file (CPU-s, one thread)")
    ap.add_argument("--declared", action="store_true", help="land a capture.json with the layout (default: trace-only)")
    ap.add_argument("--repeat", type=int, default=1, help="measure HTA and the whole run this many times, alternating")
    a = ap.parse_args()
    work = Path(a.work) if a.work else Path(tempfile.gettempdir()) / "fleetscope-traces-vs-hta"
    work.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    landing, n_events = build_capture(work / "capture", a.ranks, a.copies, a.declared)
    print(f"capture: {a.ranks} ranks x {n_events // a.ranks:,} events = {n_events:,} events "
          f"({sum(p.stat().st_size for p in (landing / 'traces' / CAPTURE).glob('*.gz')) / 1e6:.0f} MB gzipped; "
          f"built or found in {time.perf_counter() - t:.0f} s)", flush=True)
    py = sys.executable
    res = {}
    if a.json_libs:
        one = sorted((landing / "traces" / CAPTURE).glob("*.json.gz"))[0]
        print(f"JSON libraries, one rank file ({one.name}, {n_events // a.ranks:,} events; POLARS_MAX_THREADS=1):", flush=True)
        print(measure([py, "-c", JSON_LIBS, str(one)], env={**os.environ, "POLARS_MAX_THREADS": "1"}, cwd=REPO)["out"].rstrip())
    hta_py = ensure_hta(Path(a.hta_venv)) if not a.skip_hta else None
    env = {**os.environ, **({"FLEETSCOPE_TRACE_PROCESSES": str(a.processes)} if a.processes else {})}
    rounds = []
    for k in range(a.repeat):  # side by side: HTA's load, then the whole fleetscope run, on the same machine state
        if hta_py is not None:
            load0 = os.getloadavg()[0]
            m = measure([str(hta_py), "-c", HTA, str(work / "capture" / "hta")], cwd=work)
            res["hta"] = h = {**m, **json.loads(m["out"].strip().splitlines()[-1]), "load": load0}
            print(f"[{k}] HTA 0.5.0 TraceAnalysis load: {h['load_s']:.1f} s = {n_events / h['load_s']:,.0f} events/s; "
                  f"peak RSS {h['peak_mb']:,.0f} MB (process tree; process {h['s']:.1f} s wall incl. {h['import_s']:.1f} s imports, "
                  f"{h['cpu_s']:.1f} CPU-s; load average before {load0:.1f})", flush=True)
        if a.skip_run:
            break
        run_dir = work / "wh-run"
        shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir()
        # a run files incident requests into the landing folder; the next run would analyse them too
        shutil.rmtree(landing / "incidents", ignore_errors=True)
        load0 = os.getloadavg()[0]
        m = measure([str(Path(py).parent / "fleetscope"), "run", "--landing", str(landing), "--warehouse", str(run_dir / "w.duckdb"),
                     "--settle-seconds", "0"], env={**env, "DAGSTER_HOME": str(run_dir / ".dagster")}, cwd=REPO)
        res["run"] = {**m, "load": load0}
        runs = re.findall(r"\[\s*\d+\]\s+(\S+)\s+(\S*)\s+(ok|FAILED)\s+([\d.]+)s", m["out"])
        line = (f"[{k}] fleetscope run (CLI, whole capture): {m['s']:.1f} s wall, {m['cpu_s']:.1f} CPU-s, peak RSS {m['peak_mb']:,.0f} MB "
                f"(load average before {load0:.1f})")
        if "hta" in res:
            h = res["hta"]
            rounds.append((h["load_s"] / m["s"], m["peak_mb"] / h["peak_mb"]))
            line += (f"; {rounds[-1][0]:.2f}x faster than HTA's load alone (target >= 3x); memory {rounds[-1][1]:.2f}x HTA's "
                     "(target <= 1)")
        print(line, flush=True)
        for job, key, ok, sec in runs:
            print(f"    dagster run {job:<20} {key:<16} {ok:>6} {float(sec):6.1f} s")
        if any(ok != "ok" for *_, ok, _ in runs):
            print(m["out"][-3000:])
    if "run" in res:
        summarize_capture(work / "wh-run" / "w.duckdb")
    if rounds:
        sp = sorted(r[0] for r in rounds)
        print(f"RESULT whole run vs HTA's load, {len(rounds)} round(s): {sp[len(sp) // 2]:.2f}x (median; all "
              f"{', '.join(f'{x:.2f}' for x in sp)}); memory {max(r[1] for r in rounds):.2f}x HTA's at most")
    if a.profile:
        wh_dir = work / "wh-ingest"
        shutil.rmtree(wh_dir, ignore_errors=True)
        wh_dir.mkdir()
        m = measure([py, "-c", OURS_INGEST, str(landing), str(wh_dir / "w.duckdb"), CAPTURE], cwd=REPO, env=env)
        g = {**m, **json.loads(m["out"].strip().splitlines()[-1])}
        print(f"fleetscope trace_events ingest alone: {g['load_s']:.2f} s = {n_events / g['load_s']:,.0f} events/s; process {g['s']:.1f} s "
              f"wall, {g['cpu_s']:.1f} CPU-s; peak RSS {g['peak_mb']:,.0f} MB", flush=True)
        p = measure([py, "-c", PROFILE, str(wh_dir / "w.duckdb"), CAPTURE], cwd=REPO)
        for k, v in json.loads(p["out"].strip().splitlines()[-1]).items():
            print(f"    in one process: {k:<52} {v:6.1f} s")
    print(json.dumps({k: {kk: vv for kk, vv in v.items() if kk != "out"} for k, v in res.items()}))


def summarize_capture(warehouse: Path) -> None:
    """What the trace-only capture got: its layout from the traces, the what-if scenarios, the forecast,
    models and throughput rows (issue 23's checks on the HTA traces)."""
    import polars as pl

    from fleetscope.warehouse import Warehouse

    wh = Warehouse(warehouse)
    c = wh.read("captures", partitions=[CAPTURE]).row(0, named=True)
    scen = sorted(wh.read("whatif", partitions=[CAPTURE])["scenario"].to_list())
    fc = wh.read("step_forecasts", partitions=[CAPTURE])
    print(f"capture layout: tp {c['tp']} pp {c['pp']} dp {c['dp']} world {c['world_size']} ({c['layout_source']}); notes: {c['notes']}")
    print(f"whatif scenarios: {scen}; step_forecasts baseline rows: {fc.filter(pl.col('scenario') == 'baseline').height}; "
          f"variability_models rows: {wh.read('variability_models', partitions=[CAPTURE]).height}; XPUTimer step throughput rows: "
          f"{wh.read('xputimer_step_throughput', partitions=[CAPTURE]).height}")


if __name__ == "__main__":
    main()
