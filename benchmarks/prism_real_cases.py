"""Issue 22's figures: the what-if straggler analysis (fleetscope.prism.stragglers) and the
baseline step-time forecast (fleetscope.prism.forecast) on data nobody here shaped, each against
a truth the code never sees:

- ST, the real trace of the StragglerAnalysis artifact: no_stragglers against the artifact's own
  ideal (result-ST.json), the verdicts against its known cause (stage 3 too long), the baseline
  forecast fitted on the first half of its steps and scored on the second half;
- real gloo PP x DP jobs (fleetscope.collectors.recorder.cases) with one cause made for real (a
  CPU-throttled worker, variable sequence lengths, a heavy last stage), each run at the same time
  as a re-run without the cause: no_stragglers against the re-run's measured step time (the
  ranks' own logs), the verdicts against the cause the runner injected, the forecast fitted on
  the first half and scored on the second; the re-runs are healthy jobs (nothing may be raised);
- speed: the what-if of a 128-rank (DP32 x PP4), 40-step trace.

In / out of sample (IN_SAMPLE below): seed 0's recordings were looked at while the method was
designed; the throttled-worker cases of seeds 1 and 2 changed it after they were first scored;
the other cases of seeds 1 and 2 and everything from seed 3 on were recorded and scored after
the method was frozen. ST was looked at while designing (in sample).

    .venv/bin/python -m benchmarks.prism_real_cases                       # committed recordings + ST + speed
    .venv/bin/python -m benchmarks.prism_real_cases --dir DIR [--only cases]   # recordings in DIR
    sudo .venv/bin/python -m fleetscope.collectors.recorder.cases --out DIR --seed 3   # record new ones
"""
from __future__ import annotations

import argparse
import json
import re
import resource
import time
from pathlib import Path

import numpy as np
import polars as pl

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data" / "prism_real"
# recordings a choice was made on: all of seed 0 (designed on it); the throttled-worker cases of
# seeds 1 and 2, whose misses (a collective of the worker's stage taken at its own median; the
# worker hidden by the all-reduce it slows for its peers) changed the method after they were
# first scored; the throttled worker of seed 8 (PP2 x DP4), whose ideal_ns (17 % above its re-run)
# changed how ideal_ns takes a collective. Everything else was recorded and scored after the method
# was frozen (seeds 5-10: 2026-11-28, a quiet box).
IN_SAMPLE = {(None, 0), ("slow_worker", 1), ("slow_worker", 2), ("slow_worker", 8)}


def in_sample(kind: str, seed: int) -> bool:
    return (None, seed) in IN_SAMPLE or (kind, seed) in IN_SAMPLE
TARGET_KS, TARGET_MEAN_PCT, TARGET_IDEAL_PCT = 0.10, 1.0, 5.0


def expected_causes(truth: dict) -> dict:
    """What the verdicts must name (and nothing else), from the runner's own record of the cause."""
    k = truth["kind"]
    return {"workers": {truth["slow_worker"]["rank"]} if k == "slow_worker" else set(),
            "stages": {truth["pp"] - 1} if k == "heavy_stage" else set(), "seq": k == "seq"}


def score(v: pl.DataFrame, want: dict) -> dict:
    """Hits, misses and false labels among the loud (warning / critical) verdicts: a rank, a stage,
    the sequence-length job verdict, and anything else loud that is not the job's own summary."""
    loud = v.filter(pl.col("severity").is_in(["warning", "critical"]))
    ranks = {int(x) for x in loud.filter(pl.col("scope") == "rank")["subject"].to_list()}
    stages = {int(x) for x in loud.filter(pl.col("scope") == "stage")["subject"].to_list()}
    seq = loud.filter(pl.col("metric") == "sequence_length_imbalance").height > 0
    other = loud.filter(~pl.col("scope").is_in(["rank", "stage"]) & (pl.col("metric") != "sequence_length_imbalance")
                        & (pl.col("detector") != "prism.no_stragglers"))
    job = loud.filter(pl.col("detector") == "prism.no_stragglers").height
    any_cause = bool(want["workers"] or want["stages"] or want["seq"])
    hits = len(ranks & want["workers"]) + len(stages & want["stages"]) + int(seq and want["seq"])
    misses = len(want["workers"] - ranks) + len(want["stages"] - stages) + int(want["seq"] and not seq)
    false = len(ranks - want["workers"]) + len(stages - want["stages"]) + int(seq and not want["seq"]) + other.height \
        + (job if not any_cause else 0)
    return {"hits": hits, "misses": misses, "false": false,
            "loud": "; ".join(f"{r['scope']} {r['subject']} {r['severity']} ({r['team']})" for r in loud.iter_rows(named=True))}


def _load(uptime: str) -> float | None:
    m = re.search(r"load average: ([\d.]+)", uptime or "")
    return float(m.group(1)) if m else None


def case_row(d: Path) -> dict:
    from fleetscope.collectors.recorder.cases import case_timings
    from fleetscope.prism.forecast import heldout_check, straggler_verdicts
    from fleetscope.prism.stragglers import analyze_stragglers

    truth = json.loads((d / "truth.json").read_text())
    rerun = d.parent / f"{d.name}-rerun"
    truth_ideal = json.loads((rerun / "truth.json").read_text())["measured_step_ns"] if rerun.exists() else truth["measured_step_ns"]
    t = case_timings(d)
    t0 = time.perf_counter()
    a = analyze_stragglers(t)
    dt = time.perf_counter() - t0
    v = straggler_verdicts(a)
    s = a.summary.row(0, named=True)
    ho = heldout_check(a.graph)
    ns = s["ideal_with_gaps_ns"]
    return {"case": d.name, "kind": truth["kind"] if not d.name.endswith("-rerun") else "healthy (re-run)",
            "sample": "in" if in_sample(truth["kind"], truth["seed"]) else "out", "layout": f"PP{truth['pp']}xDP{truth['dp']}",
            "steps": len(a.graph.steps), "load_1min": _load(truth.get("uptime_before")), "load_after": _load(truth.get("uptime_after")),
            "measured_ms": truth["measured_step_ns"] / 1e6, "truth_ideal_ms": truth_ideal / 1e6,
            "no_stragglers_ms": ns / 1e6, "ideal_err_pct": 100 * (ns / truth_ideal - 1), "ideal_ns_ms": a.ideal_ns / 1e6,
            "S": a.S, "mw": s["mw"], "ms": s["ms"], "mseq": s["mseq"],
            "ho_ks": ho["heldout_ks"], "ho_floor": ho["heldout_ks_noise_floor"], "halves_ks": ho["halves_ks"],
            "ho_mean_pct": ho["heldout_mean_error_pct"], "halves_mean_pct": ho["halves_mean_diff_pct"],
            **score(v, expected_causes(truth) if not d.name.endswith("-rerun") else {"workers": set(), "stages": set(), "seq": False}),
            "whatif_s": dt}


def cases_section(folder: Path) -> pl.DataFrame:
    dirs = sorted(p.parent for p in folder.glob("*/truth.json"))
    if not dirs:
        raise SystemExit(f"no recorded cases in {folder} (record some: fleetscope.collectors.recorder.cases)")
    df = pl.DataFrame([case_row(d) for d in dirs])
    print(f"\n== real gloo jobs ({folder}); truth: the re-run's measured step (ranks' logs) and the injected cause")
    with pl.Config(tbl_rows=60, tbl_cols=40, tbl_width_chars=320, float_precision=3, fmt_str_lengths=80):
        print(df.select("case", "kind", "sample", "layout", "steps", "load_1min", "measured_ms", "truth_ideal_ms", "no_stragglers_ms",
                        "ideal_err_pct", "ideal_ns_ms", "S", "mw", "ms", "mseq", "hits", "misses", "false", "whatif_s"))
        print(df.select("case", "sample", "ho_ks", "ho_floor", "halves_ks", "ho_mean_pct", "halves_mean_pct", "loud"))
    for sample in ("in", "out"):
        x = df.filter(pl.col("sample") == sample)
        if x.height == 0:
            continue
        print(f"RESULT {'in-sample' if sample == 'in' else 'out-of-sample'} ({x.height} runs): no_stragglers within {TARGET_IDEAL_PCT:.0f} % of the re-run: "
              f"{(x['ideal_err_pct'].abs() <= TARGET_IDEAL_PCT).sum()}/{x.height} (max |err| {x['ideal_err_pct'].abs().max():.1f} %); "
              f"verdicts: {x['hits'].sum()} hits, {x['misses'].sum()} misses, {x['false'].sum()} false; "
              f"held-out KS <= {TARGET_KS}: {(x['ho_ks'] <= TARGET_KS).sum()}/{x.height} (median {x['ho_ks'].median():.3f}; the "
              f"halves' own KS median {x['halves_ks'].median():.3f}); held-out mean within {TARGET_MEAN_PCT:.0f} %: "
              f"{(x['ho_mean_pct'].abs() <= TARGET_MEAN_PCT).sum()}/{x.height}")
        sw = x.filter(pl.col("kind") == "slow_worker")
        if sw.height:
            print(f"  one slow worker: mw {', '.join(f'{m:.2f}' for m in sw['mw'])}; no_stragglers vs ideal_ns "
                  + ", ".join(f"{100 * (a / b - 1):+.1f} %" for a, b in zip(sw["no_stragglers_ms"], sw["ideal_ns_ms"])))
    return df


def st_section() -> None:
    from benchmarks.prism_common import REAL, real_timings
    from fleetscope.prism.forecast import forecast_capture
    from fleetscope.prism.structure import build_job_graph
    from fleetscope.prism.forecast import heldout_check

    t = real_timings()
    fc = forecast_capture(t, seed=0, plots=False, scale_ranks=(65536,))
    a = fc.stragglers
    res = json.loads((REAL / "result-ST.json").read_text())
    sa_ideal = float(np.mean(list(res["step_t_noblk"].values()))) * 1e9
    ns_row = fc.step_forecasts.filter(pl.col("scenario") == "no_stragglers").row(0, named=True)
    b = fc.step_forecasts.filter(pl.col("scenario") == "baseline").row(0, named=True)
    ho = heldout_check(build_job_graph(t))
    loud = fc.verdicts.filter(pl.col("severity").is_in(["warning", "critical"]))
    print("== ST (real trace of the StragglerAnalysis artifact, DP2 x PP4, 32 steps; in sample)")
    print(f"no_stragglers {ns_row['mean_ns'] / 1e9:.4f} s (step_forecasts) = straggler_summary {a.summary['ideal_with_gaps_ns'][0] / 1e9:.4f} s "
          f"vs the artifact's ideal {sa_ideal / 1e9:.4f} s: {100 * (ns_row['mean_ns'] / sa_ideal - 1):+.2f} %; "
          f"ideal_ns {a.ideal_ns / 1e9:.4f} s ({100 * (a.ideal_ns / sa_ideal - 1):+.2f} %)")
    print(f"baseline forecast in sample: KS {b['ks_vs_measured']:.3f}, mean {b['mean_error_pct']:+.2f} %; fitted on the first "
          f"{ho['n_fit']} steps, scored on the last {ho['n_scored']}: KS {ho['heldout_ks']:.3f} (a perfect model: "
          f"{ho['heldout_ks_noise_floor']:.3f}; the halves' own KS {ho['halves_ks']:.3f}), mean {ho['heldout_mean_error_pct']:+.2f} % "
          f"(halves differ by {ho['halves_mean_diff_pct']:+.2f} %)")
    print("verdicts (loud): " + "; ".join(f"{r['scope']} {r['subject']} {r['severity']} ({r['team']})" for r in loud.iter_rows(named=True)))


def speed_section() -> None:
    from benchmarks.prism_common import real_timings
    from fleetscope.prism.stragglers import analyze_stragglers
    from fleetscope.sim.derived import derive_case

    c = derive_case(real_timings(), "seq_imbalance", seed=101, dp=32, n_steps=40)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times, cpu = [], []
    for _ in range(5):
        t0, c0 = time.perf_counter(), time.process_time()
        a = analyze_stragglers(c.timings)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    up = open("/proc/loadavg").read().split()[:3]
    print(f"\n== speed: what-if analysis of a 128-rank (DP32 x PP4), 40-step trace ({c.timings.height} op records, "
          f"{a.graph.n_slots} op slots, {a.attribution.height} what-if groups), step structure included")
    print(f"RESULT {min(times):.2f} s best, {np.median(times):.2f} s median of 5 (target 2 s); CPU time {min(cpu):.2f} s best, "
          f"{np.median(cpu):.2f} s median (what the machine's other load does not inflate); process peak RSS "
          f"+{(rss1 - rss0) / 1024:.0f} MiB; load average {' '.join(up)}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=str(DATA), help="folder of recorded cases")
    ap.add_argument("--only", default="", help="st, cases or speed")
    a = ap.parse_args()
    if a.only in ("", "st"):
        st_section()
    if a.only in ("", "cases"):
        cases_section(Path(a.dir))
    if a.only in ("", "speed"):
        speed_section()


if __name__ == "__main__":
    main()
