"""Forecast accuracy of the `baseline` scenario: KS distance and mean error of the predicted
step-time distribution against the measured steps, on the real StragglerAnalysis trace and on
simulated jobs. Also printed: the KS a perfect model would show against that few measured
steps (noise floor), and the held-out check of issue 22 (fitted on the first half of the steps,
scored on the second half, next to the KS between the two halves themselves).

    .venv/bin/python -m benchmarks.prism_accuracy
"""
from __future__ import annotations

import time

import numpy as np
import polars as pl

from benchmarks.prism_common import real_timings, simulated  # noqa: E402
from fleetscope.prism.forecast import fit_step_model, heldout_check, ks_distance, ks_noise_floor, sample_step_times  # noqa: E402
from fleetscope.prism.structure import build_job_graph, replay_job_graph  # noqa: E402

N = 10_000


def evaluate(name: str, t: pl.DataFrame) -> dict:
    t0 = time.perf_counter()
    g = build_job_graph(t)
    sm = fit_step_model(g)
    rng = np.random.default_rng(0)
    T = sample_step_times(sm, N, rng)
    meas = g.measured_step_ns
    out = {"capture": name, "steps": len(meas), "ranks": g.n_ranks,
           "measured_mean_s": meas.mean() / 1e9, "pred_mean_s": T.mean() / 1e9,
           "mean_err_pct": 100 * (T.mean() / meas.mean() - 1), "ks": ks_distance(T, meas),
           "ks_floor": ks_noise_floor(T, len(meas), rng),
           "replay_max_err_pct": 100 * np.abs(replay_job_graph(g, g.gap, g.dur) / meas - 1).max()}
    ho = heldout_check(g, N)
    out.update(heldout_ks=ho["heldout_ks"], heldout_floor=ho["heldout_ks_noise_floor"], halves_ks=ho["halves_ks"],
               heldout_mean_err_pct=ho["heldout_mean_error_pct"], halves_mean_pct=ho["halves_mean_diff_pct"],
               seconds=time.perf_counter() - t0)
    return out


def main() -> None:
    rows = [evaluate("real: StragglerAnalysis trace-ST (DP2 x PP4)", real_timings())]
    for sc in ("healthy", "slow_gpu", "slow_stage_worker", "throttled_racks"):
        t, _ = simulated(sc)
        rows.append(evaluate(f"sim: {sc}", t))
    # with more measured steps the KS noise floor drops: is the model itself within 0.10?
    t, _ = simulated("slow_gpu", n_steps=200)
    rows.append(evaluate("sim: slow_gpu, 200 steps", t))
    df = pl.DataFrame(rows)
    with pl.Config(tbl_cols=20, tbl_width_chars=250, float_precision=4):
        print(df)
    print("targets: KS <= 0.10 and |mean error| <= 1 %  (PRISM paper: KS 20.8 %, mean within 0.85 %)")


if __name__ == "__main__":
    main()
