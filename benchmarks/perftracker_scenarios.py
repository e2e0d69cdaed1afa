"""PerfTracker localization on the simulator's scenarios and on the real StragglerAnalysis trace.

    .venv/bin/python -m benchmarks.perftracker_scenarios [--seeds 0,1,2,3] [--history 3] [--scenarios a,b,...]

For each scenario and seed (fault places are drawn from the seed): render it with `--history` earlier
healthy captures of the same job (fleetscope.sim.capture.scenario_capture), read what landed (traces,
timings, hw) the way the platform does, compute patterns + verdicts of the history captures in time
order and then of the scenario's capture with those patterns as the job's history, and compare the
warning / critical verdicts with the ground truth (which the analysis never sees): the truth function
must be named by a verdict routed to the truth team (a function verdict naming it, or a straggling-rank
verdict whose evidence puts the excess in it), and the ranks it names are scored against the truth
ranks. Every other warning/critical verdict is counted as a false verdict. The thresholds were set
looking at seed 0 and at the real recordings chosen for development (see docs/figures/perftracker.md):
seeds >= 1 are out-of-sample."""
from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parents[1]

from fleetscope.ingest.hw import read_hw  # noqa: E402
from fleetscope.ingest.timings import read_capture_layout, read_timings  # noqa: E402
from fleetscope.perftracker.analyze import diagnose_op_capture, diagnose_trace_capture  # noqa: E402
from fleetscope.ingest.traces import read_capture  # noqa: E402

SCENARIOS = ["healthy", "throttled_racks", "nvlink_down", "slow_dataloader", "cpu_bound_forward", "gc_stall", "slow_stage_worker"]
REAL = ROOT / ".." / "shared" / "data" / "real" / "straggler_analysis"


def _diagnose(landing: Path, cap: str, history):
    cap_dir = landing / "traces" / cap
    events = read_capture(cap_dir, cap)
    timings = read_timings(landing / "timings" / cap, cap)
    hw = pl.concat([read_hw(p).kept for p in sorted((landing / "hw").glob(f"hw-{cap}.parquet"))])
    return diagnose_trace_capture(events, cap, hw=hw, timings=timings, layout=read_capture_layout(cap_dir),
                                  history=pl.concat(history) if history else None)


def _hits(loud: pl.DataFrame, names: list[str], team: str) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(verdicts naming the truth function, those routed to the truth team). A straggling-rank verdict
    names it when the function is among the top places of its excess."""
    def names_it(row) -> bool:
        if any(n in (row["subject"] or "") for n in names):
            return True
        if row["scope"] == "rank":
            fns = [f["function"] for f in json.loads(row["evidence"]).get("functions", [])[:3]]
            return any(n in f or f in n for n in names for f in fns)
        return False
    mask = [names_it(r) for r in loud.iter_rows(named=True)]
    hit = loud.filter(pl.Series(mask, dtype=pl.Boolean)) if loud.height else loud
    return hit, hit.filter(pl.col("team") == team)


def run_scenario(scenario: str, seed: int, tmp: Path, n_history: int) -> dict:
    from fleetscope.sim.capture import scenario_capture

    t0 = time.perf_counter()
    landing, truth = scenario_capture(tmp / f"{scenario}-{seed}", scenario, seed, history=n_history)
    t_render = time.perf_counter() - t0
    caps = sorted(p.name for p in (landing / "traces").iterdir())
    cap = f"job-{scenario.replace('_', '-')}-s{seed}"
    history = []
    for h in [c for c in caps if c != cap]:  # the job's earlier captures, oldest first
        history.append(_diagnose(landing, h, history)[0])
    t0 = time.perf_counter()
    pats, verdicts = _diagnose(landing, cap, history)
    t_analyze = time.perf_counter() - t0
    loud = verdicts.filter(pl.col("severity").is_in(["warning", "critical"]))
    row = {"scenario": scenario, "seed": seed, "history": len(history), "render_s": round(t_render, 1), "analyze_s": round(t_analyze, 1),
           "patterns": pats.height, "loud_verdicts": loud.height}
    if not truth:
        row.update(truth_function="-", truth_team="-", detected=loud.height == 0, team_ok=True, rank_recall=None, rank_precision=None,
                   other_functions=loud.height, off_truth_ranks=loud.height,
                   verdict="nothing reported" if loud.height == 0 else "FALSE ALARMS: " + " | ".join(loud["explanation"].str.slice(0, 100)))
        return row
    tdf = pl.DataFrame(truth)
    t_ranks = set(tdf["rank"].to_list())
    team = tdf["team"][0]
    names = [n for n in {tdf["function"][0], tdf["kernel"][0]} if n]
    hit, hit_team = _hits(loud, names, team)
    ranks = set()
    for ev in hit_team["evidence"].to_list():
        ranks |= set(json.loads(ev).get("ranks", []))
    all_ranks = [set(json.loads(ev).get("ranks", [])) for ev in loud["evidence"].to_list()]
    recall = len(ranks & t_ranks) / len(t_ranks) if t_ranks else None
    precision = len(ranks & t_ranks) / len(ranks) if ranks else 0.0
    row.update(truth_function=tdf["function"][0][-40:], truth_team=team, truth_ranks=len(t_ranks), detected=hit_team.height > 0,
               team_ok=hit_team.height > 0 and hit.filter(pl.col("team") != team).height == 0,
               rank_recall=None if recall is None else round(recall, 2), rank_precision=round(precision, 2),
               other_functions=loud.height - hit.height,
               off_truth_ranks=sum(1 for r in all_ranks if not r <= t_ranks),
               verdict=(hit_team["explanation"][0][:160] if hit_team.height else (hit["explanation"][0][:160] if hit.height else "MISSED")))
    return row


def run_real() -> dict:
    t0 = time.perf_counter()
    tm = read_timings(REAL, "straggler_analysis")
    pats, verdicts = diagnose_op_capture(tm, "straggler_analysis")
    dt = time.perf_counter() - t0
    loud = verdicts.filter(pl.col("severity").is_in(["warning", "critical"]))
    stage = loud.filter((pl.col("scope") == "stage") & (pl.col("subject") == "3") & (pl.col("team") == "algorithm"))
    return {"scenario": "real:straggler_analysis", "analyze_s": round(dt, 2), "patterns": pats.height, "loud_verdicts": loud.height,
            "truth_function": "stage 3 (too long)", "truth_team": "algorithm", "detected": stage.height > 0, "team_ok": stage.height > 0,
            "other_functions": loud.height - stage.height, "off_truth_ranks": loud.filter(pl.col("scope") != "stage").height,
            "verdict": stage["explanation"][0][:150] if stage.height else "MISSED"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="0,1,2,3", help="seed 0 was looked at while setting thresholds; the others are out-of-sample")
    ap.add_argument("--history", type=int, default=3, help="earlier healthy captures of the same job (0: none)")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="pt_scen_") as tmp:
        for seed in [int(x) for x in a.seeds.split(",")]:
            for s in a.scenarios.split(","):
                rows.append(run_scenario(s, seed, Path(tmp), a.history))
                print(json.dumps(rows[-1]), flush=True)
                shutil.rmtree(Path(tmp) / f"{s}-{seed}", ignore_errors=True)
    rows.append(run_real())
    print(json.dumps(rows[-1]))
    df = pl.DataFrame(rows, infer_schema_length=None)
    cols = [c for c in ["scenario", "seed", "history", "truth_function", "truth_team", "truth_ranks", "detected", "team_ok", "rank_recall",
                        "rank_precision", "loud_verdicts", "other_functions", "off_truth_ranks", "analyze_s"] if c in df.columns]
    with pl.Config(tbl_rows=100, tbl_width_chars=250, fmt_str_lengths=40, tbl_cols=20, tbl_hide_dataframe_shape=True):
        print(df.select(cols))
    sim = df.filter(pl.col("scenario") != "real:straggler_analysis")
    for label, part in (("in-sample (seed 0)", sim.filter(pl.col("seed") == 0)), ("out-of-sample (seeds >= 1)", sim.filter(pl.col("seed") > 0))):
        if part.height == 0:
            continue
        faulty = part.filter(pl.col("truth_team") != "-")
        print(f"{label}: detected {int(faulty['detected'].sum())}/{faulty.height} faults with the right team "
              f"{int(faulty['team_ok'].sum())}/{faulty.height}; healthy captures with a warning/critical verdict "
              f"{int((~part.filter(pl.col('truth_team') == '-')['detected']).sum())}/{part.filter(pl.col('truth_team') == '-').height}; "
              f"false verdicts (other functions) {int(part['other_functions'].sum())}, verdicts naming ranks outside the truth "
              f"{int(faulty['off_truth_ranks'].sum())}")
    for r in rows:
        print(f"- {r['scenario']} s{r.get('seed', '-')}: {r['verdict']}")


if __name__ == "__main__":
    main()
