"""`no_stragglers` on the real StragglerAnalysis trace next to the ideal step time that tool's
own what-if simulation reports in result-ST.json / ms-ST.json (a reference, not ground truth),
and the per-stage attribution of both.

    .venv/bin/python -m benchmarks.prism_ideal
"""
from __future__ import annotations

import json

import numpy as np

from benchmarks.prism_common import REAL, real_timings  # noqa: E402
from fleetscope.prism.forecast import attribution, fit_step_model, ideal_columns  # noqa: E402
from fleetscope.prism.structure import build_job_graph, replay_job_graph  # noqa: E402


def main() -> None:
    g = build_job_graph(real_timings())
    sm = fit_step_model(g)
    res = json.loads((REAL / "result-ST.json").read_text())
    ms = json.loads((REAL / "ms-ST.json").read_text())
    sa_ideal = float(np.mean(list(res["step_t_noblk"].values())))
    ours_med = float(replay_job_graph(g, *ideal_columns(sm, "median"))[0]) / 1e9
    ours_mean = float(replay_job_graph(g, *ideal_columns(sm, "mean"))[0]) / 1e9
    meas = g.measured_step_ns.mean() / 1e9
    print(f"measured mean step                      : {meas:.4f} s   (StragglerAnalysis tori {ms['tori']:.4f} s)")
    print(f"StragglerAnalysis ideal (step_t_noblk)  : {sa_ideal:.4f} s   slowdown {meas / sa_ideal:.3f}x (its blocking_slowdown {res['blocking_slowdown']:.3f})")
    print(f"fleetscope no_stragglers (median/op type): {ours_med:.4f} s   slowdown {meas / ours_med:.3f}x")
    print(f"fleetscope no_stragglers (mean/op type)  : {ours_mean:.4f} s   slowdown {meas / ours_mean:.3f}x   diff vs SA {100 * (ours_mean / sa_ideal - 1):+.2f} %")
    _, _, rows = attribution(sm)
    ours = {r["subject"].split(":")[1]: r["slowdown"] for r in rows if r["subject"].startswith("stage:")}
    print("per-stage slowdown when only that stage keeps its measured durations (ours | StragglerAnalysis):")
    for s, v in sorted(res["blocking_decompose_by_stage"].items()):
        print(f"  stage {s}: {ours.get(s, float('nan')):.3f} | {v:.3f}")


if __name__ == "__main__":
    main()
