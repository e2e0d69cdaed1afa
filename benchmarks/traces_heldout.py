"""Trace-only captures of held-out real jobs (issue 23): layouts and op rows the rules were not designed
on, analysed end to end by `fleetscope run`, and the graph-rebuilding what-ifs checked against real
re-runs.

The jobs: benchmarks/traces_heldout_job.py (torch.distributed.pipelining's 1F1B / GPipe, DeviceMesh or
plain process groups or none, DDP or one flattened gradient bucket, unannotated Block layers), run
in network namespaces, 2 ranks per emulated host, hosts joined by 200 Mbit/s links (the recorder's
fabric, as benchmarks/traces_whatif_rerun.py). Nothing of these jobs was looked at while the rules
were designed (fleetscope.traces.layout, fleetscope.ingest.trace_timings.derive_ops, layer
inference in fleetscope.traces.graph): every figure here is out of sample.

Captures analysed (only their trace files go to the landing folder; no capture.json, no timings):
  pp4       4 ranks, PP4, DeviceMesh groups, 1F1B
  pp2_dp3   6 ranks, PP2 x DP3, plain new_group groups (described `undefined`), GPipe
  dp4       4 ranks, DP4 with DistributedDataParallel on the default group (no subgroups)
  pp2_dp2   4 ranks, PP2 x DP2, DeviceMesh, 1F1B: the base of the re-run checks
Re-runs (their step times only): pp2_dp4, pp2_dp1, pp4_dp2, pp1_dp2 (the same bucket), pp2_dp2_l16.

Printed per capture: the layout in `captures` / `capture_ranks` against the job's own truth; the
what-if scenarios (DP, PP, layers); step_forecasts baseline; variability_models rows; XPUTimer step
throughput rows; then each what-if of the base capture (the platform's own `whatif` rows) against the
re-run's measured step time (the job's clock, mean of the profiled steps, slowest rank).

    sudo .venv/bin/python -m benchmarks.traces_heldout [--record DIR] [--data DIR]

--record DIR records every job into DIR (needs root and torch; with --rounds N the base and its re-runs
N times in rotation into DIR/r<k>, medians over the rounds); --data DIR analyses recordings made before
(default: tests/data/heldout, the committed ones: the first round of the set recorded after the rules
were changed on the first look, see docs/figures/traces.md)."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import polars as pl

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data" / "heldout"

# name -> (pp, dp, layers, groups, schedule, dp_impl); 4 microbatches, blocks of 5 ms forward / 10 ms backward
CONFIGS = {
    "pp4": (4, 1, 8, "mesh", "1f1b", "bucket"),
    "pp2_dp3": (2, 3, 8, "groups", "gpipe", "bucket"),
    "dp4": (1, 4, 8, "none", "1f1b", "ddp"),
    "pp2_dp2": (2, 2, 8, "mesh", "1f1b", "bucket"),
    "pp2_dp4": (2, 4, 8, "mesh", "1f1b", "bucket"),
    "pp2_dp1": (2, 1, 8, "mesh", "1f1b", "bucket"),
    "pp4_dp2": (4, 2, 8, "mesh", "1f1b", "bucket"),
    "pp1_dp2": (1, 2, 8, "mesh", "1f1b", "bucket"),
    "pp2_dp2_l16": (2, 2, 16, "mesh", "1f1b", "bucket"),
}
ANALYSED = ["pp4", "pp2_dp3", "dp4", "pp2_dp2"]
BASE = "pp2_dp2"
# base what-if scenario -> the re-run that is its truth
RERUNS = {"dp_x2": "pp2_dp4", "dp_half": "pp2_dp1", "pp_x2": "pp4_dp2", "pp_half": "pp1_dp2", "layers_x2": "pp2_dp2_l16"}


def record(out: Path, name: str, mbit: float = 200.0) -> Path:
    from benchmarks.traces_whatif_rerun import run_job

    pp, dp, layers, groups, schedule, dp_impl = CONFIGS[name]
    d = run_job(out / name, "benchmarks.traces_heldout_job", pp * dp, 2, mbit,
                ["--pp", str(pp), "--layers", str(layers), "--groups", groups, "--schedule", schedule, "--dp-impl", dp_impl],
                port=29641)
    if name not in ANALYSED:  # a re-run: only its step times are needed
        for f in d.glob("*.pt.trace.json*"):
            f.unlink()
    return d


def truth(d: Path) -> pl.DataFrame:
    rows = [json.loads(f.read_text()) for f in sorted((d / "truth").glob("rank*.json"))]
    return pl.DataFrame([{k: r[k] for k in ("rank", "stage", "dp_rank", "tp_rank", "pp", "dp", "tp", "world")} for r in rows])


def measured_step_ns(d: Path) -> float:
    """Mean step time of the profiled steps by the job's own clock, slowest rank."""
    per_rank = []
    for f in sorted((d / "truth").glob("rank*.json")):
        st = [s["dur_ns"] for s in json.loads(f.read_text())["steps"] if s["profiled"]]
        per_rank.append(sum(st) / len(st))
    return max(per_rank)


def analyse(src: Path, work: Path) -> Path:
    """A landing folder with only the trace files of the analysed captures; `fleetscope run` over it."""
    landing = work / "landing"
    shutil.rmtree(work, ignore_errors=True)
    for name in ANALYSED:
        dst = landing / "traces" / f"heldout-{name}"
        dst.mkdir(parents=True)
        for f in sorted((src / name).glob("*.pt.trace.json*")):
            shutil.copy(f, dst / f.name)
    wh = work / "warehouse.duckdb"
    env = {**os.environ, "DAGSTER_HOME": str(work / ".dagster")}
    t = time.perf_counter()
    p = subprocess.run([str(Path(sys.executable).parent / "fleetscope"), "run", "--landing", str(landing), "--warehouse", str(wh),
                        "--settle-seconds", "0"], env=env, cwd=REPO, capture_output=True, text=True)
    print(f"fleetscope run over {len(ANALYSED)} trace-only captures: {time.perf_counter() - t:.1f} s, rc {p.returncode}")
    if p.returncode != 0:
        print(p.stdout[-3000:], p.stderr[-3000:])
    notes = [line for line in p.stdout.splitlines() if line.startswith("  [heldout") or line.startswith("      (assets")]
    if notes:
        print("what the run summary says the analyses could not do:\n" + "\n".join(notes))
    return wh


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--record", default="", help="record every job into this folder first (root, torch)")
    ap.add_argument("--data", default=str(DATA), help="recordings to analyse (default: the committed ones)")
    ap.add_argument("--work", default="", help="folder for the landing and warehouse (default: a temporary one)")
    ap.add_argument("--rounds", type=int, default=1, help="with --record: record the re-run family (base and re-runs) this many "
                    "times in rotation into DIR/r<k> (a shared machine's load moves step times: medians over rounds)")
    a = ap.parse_args()
    src = Path(a.data)
    if a.record:
        src = Path(a.record)
        for k in range(a.rounds):
            dst = src if a.rounds == 1 else src / f"r{k}"
            for name in CONFIGS if k == 0 else [BASE, *RERUNS.values()]:
                t = time.perf_counter()
                record(dst, name)
                print(f"recorded {dst.name}/{name} in {time.perf_counter() - t:.0f} s (load average {os.getloadavg()[0]:.1f})", flush=True)
    rounds = sorted(p for p in src.glob("r[0-9]*") if p.is_dir())
    if rounds:  # several rounds: the captures of the first, then each round's base predicts, its re-runs measure
        work = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="fleetscope-heldout-"))
        report(rounds[0], work / "captures")
        return rerun_rounds(rounds, work / "rounds")
    report(src, Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="fleetscope-heldout-")))


def report(src: Path, work: Path) -> None:
    """The trace-only captures of one recording: their layout, analyses and what-ifs vs the re-runs."""
    from fleetscope.warehouse import Warehouse

    wh = Warehouse(analyse(src, work))
    caps = wh.read("captures")
    ranks = wh.read("capture_ranks")
    whatif = wh.read("whatif")
    fc = wh.read("step_forecasts")
    vm = wh.read("variability_models")
    thr = wh.read("xputimer_step_throughput")
    strag = wh.read("straggler_summary")
    verd = wh.read("anomaly_verdicts").filter(pl.col("severity").is_in(["warning", "critical"]))
    rows, ok_all = [], True
    for name in ANALYSED:
        cap = f"heldout-{name}"
        tr = truth(src / name)
        c = caps.filter(pl.col("capture_id") == cap).to_dicts()
        c = c[0] if c else {}
        got = ranks.filter(pl.col("capture_id") == cap).select("rank", "stage", "dp_rank").sort("rank")
        want = tr.select("rank", "stage", "dp_rank").sort("rank").with_columns(pl.all().cast(pl.Int32))
        degrees_ok = all(c.get(k) == int(tr[k][0]) for k in ("pp", "dp", "tp")) and c.get("world_size") == int(tr["world"][0])
        places_ok = got.height == want.height and got.equals(want)
        scen = sorted(whatif.filter(pl.col("capture_id") == cap)["scenario"].to_list())
        has = {k: any(s.startswith(k) for s in scen) for k in ("dp_", "pp_", "layers_")}
        row = {"capture": name, "layout (tp,pp,dp,world)": f"{c.get('tp')},{c.get('pp')},{c.get('dp')},{c.get('world_size')}",
               "truth": f"1,{tr['pp'][0]},{tr['dp'][0]},{tr['world'][0]}", "degrees ok": degrees_ok, "ranks placed ok": places_ok,
               "whatif DP/PP/layers": "/".join("y" if has[k] else "-" for k in ("dp_", "pp_", "layers_")),
               "baseline forecast": fc.filter((pl.col("capture_id") == cap) & (pl.col("scenario") == "baseline")).height > 0,
               "variability rows": vm.filter(pl.col("capture_id") == cap).height,
               "xputimer throughput rows": thr.filter(pl.col("capture_id") == cap).height,
               "straggler what-if": strag.filter(pl.col("capture_id") == cap).height > 0,
               "warning/critical": verd.filter(pl.col("capture_id") == cap).height}
        rows.append(row)
        ok_all &= degrees_ok and places_ok and row["baseline forecast"] and row["variability rows"] > 0 and row["xputimer throughput rows"] > 0
        if c.get("notes"):
            print(f"  {name}: captures.notes: {c['notes']}")
    with pl.Config(tbl_rows=20, tbl_cols=20, tbl_width_chars=220, fmt_str_lengths=40):
        print(pl.DataFrame(rows))
    base_meas = measured_step_ns(src / BASE)
    w = whatif.filter(pl.col("capture_id") == f"heldout-{BASE}")
    checks = []
    for scen, target in RERUNS.items():
        r = w.filter(pl.col("scenario") == scen)
        if r.height == 0 or not (src / target / "truth").is_dir():
            checks.append({"what-if": scen, "re-run": target, "predicted_ms": None, "rerun_ms": None, "error_pct": None,
                           "no_change_error_pct": None})
            continue
        pred, meas = float(r["predicted_ns"][0]), measured_step_ns(src / target)
        checks.append({"what-if": scen, "re-run": target, "predicted_ms": pred / 1e6, "rerun_ms": meas / 1e6,
                       "error_pct": (pred - meas) / meas * 100, "no_change_error_pct": (base_meas - meas) / meas * 100})
    ck = pl.DataFrame(checks)
    print(f"base {BASE}: measured step {base_meas / 1e6:.1f} ms; replayed {w['baseline_ns'][0] / 1e6 if w.height else float('nan'):.1f} ms")
    with pl.Config(tbl_rows=20, tbl_cols=10, tbl_width_chars=200, float_precision=1):
        print(ck)
    e = ck["error_pct"].drop_nulls().abs()
    print(f"RESULT held-out trace-only captures (out of sample): {sum(r['degrees ok'] and r['ranks placed ok'] for r in rows)}/{len(rows)} "
          f"layouts right; every capture with baseline forecast, variability models and XPUTimer throughput: {ok_all}; "
          f"what-ifs vs re-runs: mean |error| {e.mean() if e.len() else float('nan'):.1f} %, worst {e.max() if e.len() else float('nan'):.1f} % "
          f"over {e.len()} of {len(RERUNS)}; 'no change' off by {ck['no_change_error_pct'].drop_nulls().abs().mean():.1f} %")


def rerun_rounds(rounds: list[Path], work: Path) -> None:
    """The what-ifs of each round's base capture (a trace-only `fleetscope run`) against the same round's
    re-runs; per-scenario medians over the rounds."""
    from fleetscope.warehouse import Warehouse

    rows = []
    for r in rounds:
        landing = work / r.name / "landing" / "traces" / f"heldout-{BASE}"
        shutil.rmtree(work / r.name, ignore_errors=True)
        landing.mkdir(parents=True)
        for f in sorted((r / BASE).glob("*.pt.trace.json*")):
            shutil.copy(f, landing / f.name)
        wh_path = work / r.name / "warehouse.duckdb"
        p = subprocess.run([str(Path(sys.executable).parent / "fleetscope"), "run", "--landing", str(landing.parents[1]), "--warehouse",
                            str(wh_path), "--settle-seconds", "0"], env={**os.environ, "DAGSTER_HOME": str(work / r.name / ".dagster")},
                           cwd=REPO, capture_output=True, text=True)
        if p.returncode != 0:
            print(p.stdout[-2000:], p.stderr[-2000:])
        w = Warehouse(wh_path).read("whatif", partitions=[f"heldout-{BASE}"])
        base = measured_step_ns(r / BASE)
        for scen, target in RERUNS.items():
            x = w.filter(pl.col("scenario") == scen)
            if x.height and (r / target / "truth").is_dir():
                meas = measured_step_ns(r / target)
                rows.append({"round": r.name, "what-if": scen, "predicted_ms": float(x["predicted_ns"][0]) / 1e6, "rerun_ms": meas / 1e6,
                             "base_ms": base / 1e6, "error_pct": (float(x["predicted_ns"][0]) - meas) / meas * 100,
                             "no_change_error_pct": (base - meas) / meas * 100})
    df = pl.DataFrame(rows)
    med = df.group_by("what-if", maintain_order=True).agg(pl.col("predicted_ms", "rerun_ms", "base_ms").median(),
                                                          pl.col("error_pct").median(), pl.col("no_change_error_pct").median())
    with pl.Config(tbl_rows=40, tbl_cols=10, tbl_width_chars=200, float_precision=1):
        print(df)
        print(med)
    e = med["error_pct"].abs()
    print(f"RESULT what-ifs of the held-out base vs real re-runs, medians over {len(rounds)} rounds: mean |error| {e.mean():.1f} %, "
          f"worst {e.max():.1f} % ({len(med)} what-ifs); 'no change' off by {med['no_change_error_pct'].abs().mean():.1f} %")


if __name__ == "__main__":
    main()
