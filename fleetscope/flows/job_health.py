"""Job-level verdicts from reconstructed steps (LLMPrism IV-D cross-step), with the job's life
events told apart from slowdowns.

A step is judged against the job's own robust history (the window and its margin): a sustained
slowdown is a run of steps whose rolling median over `step_run` steps stands above the job's typical
rolling median (its faster level where its steps shift level inside the span: a slowdown that began
early leaves most steps slow) by more than the bar (one long step, a checkpoint or a stall, cannot lift it). The scale of that test is the spread of the job's own rolling
means (so scheduling noise that comes in short bursts widens it), and the bar is the Bonferroni z
of the window's false-alarm budget (fleetscope.flows.stats), plus a practical floor
(min_rel_excess). Benign events are `info`, never warnings:

- launch: the job's traffic starts inside the span (its first steps are slow: warm-up, compile);
- a single long step: a checkpoint save or load (the job's NICs move large transfers to non-job
  addresses meanwhile), or a pause with no such traffic (dataloader stall, GC, host side);
- stop: the traffic ends before the window does, after a complete step (finished) or in the middle
  of one (crashed or hung: a step had begun and no step end followed).
"""
from __future__ import annotations

import json

import polars as pl
from scipy.stats import binom

from fleetscope.flows.config import FlowConfig
from fleetscope.common import robust_sigma
from fleetscope.flows.stats import bonferroni_z, fmt_ms, level_shift, typical, typical_split, window_alpha


def job_steps(st_all: pl.DataFrame) -> pl.DataFrame:
    """One row per job step (median duration over the job's ips), margin steps included. `units`: how
    many steps' worth of gradient traffic the reconstructed step carries (its DP bytes against the job's
    usual step's, to the nearest whole number, at least 1; 1 where the job has no DP traffic): two steps
    whose boundary the flows did not show are one row of twice the duration and twice the bytes, while
    a slowed step moves its usual bytes. `dur` is per unit: the time of one step of training."""
    js = st_all.filter("start_observed").group_by("job_id", "job_step").agg(
        dur=(pl.col("end_ns") - pl.col("start_ns")).median().cast(pl.Float64), s=pl.col("start_ns").min(),
        e=pl.col("end_ns").max(), claimed=pl.col("claimed").any(), n_ip=pl.len(),
        dpb=pl.col("dp_bytes").median().cast(pl.Float64),
    ).sort("job_id", "job_step")
    usual = pl.col("dpb").filter(pl.col("dpb") > 0).median().over("job_id")
    js = js.with_columns(units=pl.when(usual > 0).then((pl.col("dpb") / usual).round(0).clip(lower_bound=1.0))
                         .otherwise(1.0).fill_null(1.0))
    # ... and lasts as long as that many steps at least (to the nearest whole step, as the bytes):
    # pieces of a step that the flows cut apart carry uneven shares of its gradients in about equal
    # times, and a piece with twice another's bytes is no two steps
    one = pl.col("dur").filter(pl.col("units") == 1.0).median().over("job_id")
    return js.with_columns(units=pl.when(pl.col("dur") >= (pl.col("units") - 0.5) * one.fill_null(0.0))
                           .then("units").otherwise(1.0)) \
        .with_columns(dur=pl.col("dur") / pl.col("units")).drop("dpb")


def job_spans(ipf_all: pl.DataFrame) -> pl.DataFrame:
    """First and last DP/PP flow of each job over window + margin."""
    return ipf_all.group_by("job_id").agg(f0=pl.col("start_ns").min(), l0=pl.col("end_ns").max())


def job_health(st_all: pl.DataFrame, ipf_all: pl.DataFrame, bg_ip: pl.DataFrame, data_span: tuple[int, int],
               ws: int, we: int, wid: str, cfg: FlowConfig) -> tuple[list[dict], dict]:
    """(verdict rows, stats {n_tests, z_bar}). bg_ip: background flows (ip, start_ns, end_ns, bytes) of
    GPU addresses with non-job peers (storage, monitoring), for telling a checkpoint from a stall."""
    js = job_steps(st_all)
    if js.height == 0:
        return [], {"n_tests": 0, "z_bar": None}
    L = max(1, cfg.step_run)
    span = job_spans(ipf_all)
    js = js.join(span, on="job_id", how="left")
    # the typical step of each job and its robust scale; the first steps after a launch are warm-up
    # launched inside the span: no traffic for a while (>= 2 typical steps) after the data begin
    js = js.with_columns(k=pl.int_range(pl.len()).over("job_id"),
                         launched=(pl.col("f0") > data_span[0] + pl.max_horizontal(
                             pl.lit(cfg.launch_quiet_ns), 2 * pl.col("dur").median().over("job_id"))))
    # ... and last until its first step of typical duration (within max_rel_spread of the job's median):
    # a warm-up can take many steps (compilation, allocator growth, a first pass over the data)
    typical0 = typical(pl.col("dur"), pl.col("dur").median().over("job_id"), cfg.max_rel_spread)
    js = js.with_columns(first_typical=pl.col("k").filter(typical0).min().over("job_id").fill_null(0))
    warm = pl.col("launched") & (pl.col("k") < pl.max_horizontal(pl.lit(cfg.warmup_steps), "first_typical"))
    # the job's level may shift once in the span (a slowdown's onset, or its end: stats.level_shift):
    # its baseline is then the faster level (most of the span may already be slow), and its scales the
    # spread around each level (two levels are no spread of the job's steps)
    seq = js.filter(~warm).group_by("job_id", maintain_order=True).agg(pl.col("job_step"), pl.col("dur"))
    cuts = [(j, st[k] if k else None) for j, st, d in zip(seq["job_id"], seq["job_step"], seq["dur"])
            for k in [level_shift(d.to_numpy(), L, cfg.min_rel_excess)]]
    js = js.join(pl.DataFrame(cuts, schema={"job_id": pl.Utf8, "cut": js.schema["job_step"]}, orient="row"),
                 on="job_id", how="left").with_columns(seg=(pl.col("job_step") >= pl.col("cut")).fill_null(False))
    # ... and a job launched inside the span that began at its slower level and shifted to the faster
    # one was warming up until the shift: a fault slows a running job, it does not end where the job
    # settles (a 384-GPU job launched in the 16,384-GPU healthy fleet's minute, its steps seen as
    # pieces: the first 12 s of pieces slower than the rest, past the first typical one; thirteen
    # warnings). Began: its first L steps after the fixed warm-up over the later level by more than a
    # slowdown's floor (a job that ran at its level first and then slowed is slowed, however long: where
    # the slow stretch holds most steps, the first typical step is a slow one and the warm-up above
    # swallows the fast start)
    after = pl.col("dur").filter(~warm & pl.col("seg")).median().over("job_id")
    began = pl.col("dur").filter((pl.col("k") >= cfg.warmup_steps) & (pl.col("k") < cfg.warmup_steps + L)) \
        .median().over("job_id")
    js = js.with_columns(warm=warm | (pl.col("launched") & ~pl.col("seg")
                                      & (began > (1 + cfg.min_rel_excess) * after).fill_null(False)))
    warm = pl.col("warm")
    js = js.with_columns(
        # warm-up steps never enter a rolling median of later steps
        roll=pl.when(~warm).then("dur").rolling_median(L).over("job_id"),
        lvl=pl.col("dur").filter(~warm).median().over("job_id", "seg"),
    ).with_columns(rlvl=pl.col("roll").filter(~warm).median().over("job_id", "seg"))
    js = js.with_columns(
        base=pl.col("lvl").min().over("job_id"),
        scale1=robust_sigma((pl.col("dur") - pl.col("lvl")).filter(~warm)).over("job_id"),
        roll_base=pl.col("rlvl").min().over("job_id"),
        roll_scale=robust_sigma((pl.col("roll") - pl.col("rlvl")).filter(~warm)).over("job_id"),
    ).with_columns(
        # a perfectly regular job has no spread: a floor keeps sub-percent jitter from being news
        roll_scale=pl.max_horizontal("roll_scale", cfg.min_rel_scale * pl.col("base")),
        scale1=pl.max_horizontal("scale1", cfg.min_rel_scale * pl.col("base")),
    )
    n_jobs = js["job_id"].n_unique()
    # a job whose steps are mostly far from its typical step (fewer than min_typical of them within
    # max_rel_spread of it) is one whose steps were not reconstructed reliably: nothing is judged
    # on them (said as info); a real slowdown leaves most steps typical of their level, which may
    # shift once (stats.typical_split: a slowdown's onset)
    share = js.filter(~warm).group_by("job_id").agg(pl.col("dur")).with_columns(
        share=pl.col("dur").map_elements(lambda d: typical_split(d.to_numpy(), cfg.max_rel_spread, L)[0],
                                         return_dtype=pl.Float64)).select("job_id", "share")
    js = js.join(share, on="job_id", how="left").with_columns(
        reliable=pl.col("share").fill_null(1.0) >= cfg.min_typical).drop("share")
    warm = warm | ~pl.col("reliable")
    judged = js.filter(pl.col("claimed") & ~warm & pl.col("roll").is_not_null())
    n_tests = max(judged.height, 1)
    z = bonferroni_z(window_alpha(cfg.fa_per_job_hour, n_jobs, we - ws), n_tests)
    js = js.with_columns(
        slow=pl.col("claimed") & ~warm & pl.col("roll").is_not_null()
        & (pl.col("roll") > pl.col("roll_base") + pl.max_horizontal(z * pl.col("roll_scale"),
                                                                    cfg.min_rel_excess * pl.col("base"))),
        long1=pl.col("claimed") & ~warm
        & (pl.col("dur") > pl.col("base") + pl.max_horizontal(z * pl.col("scale1"), cfg.min_rel_excess * pl.col("base"))),
    )
    # a flagged rolling mean covers its last L steps: the run spans them
    js = js.with_columns(in_run=pl.col("slow").cast(pl.Int8).reverse().rolling_max(L, min_samples=1)
                         .reverse().over("job_id").cast(pl.Boolean))
    js = js.with_columns(run=(pl.col("in_run") != pl.col("in_run").shift(1)).fill_null(True).cum_sum().over("job_id"))
    rows: list[dict] = []
    # A window speaks for the steps it claims: the margin's steps were judged by the window that
    # claimed them, against its own level. A rolling median reaches L - 1 steps back into the margin,
    # so a run's slowness is its claimed steps' (2,048-GPU healthy fleet, seed 1001: a run of margin
    # steps that the window before had judged typical, flagged +10 % against the faster level this
    # window's split found, while the window's own steps of the run were at that level)
    runs = js.filter("in_run").group_by("job_id", "run").agg(
        dur=pl.col("dur").filter("claimed").median(), base=pl.col("base").first(), s=pl.col("s").min(), e=pl.col("e").max(),
        n=pl.len(), first=pl.col("job_step").min(), last=pl.col("job_step").max(),
        zmax=((pl.col("roll") - pl.col("roll_base")) / pl.col("roll_scale")).max()).sort("job_id", "s")
    # the run's own steps must be slow too (an alternation of short and long steps can lift a
    # rolling median while its steps are typical: a reconstruction artefact, not a slowdown)
    runs = runs.filter(pl.col("dur") > (1 + cfg.min_rel_excess) * pl.col("base"))
    # ... and together more than the job's own steps would be by chance: k of the run's m steps long
    # (over min_rel_excess above the typical step) against the share q of long steps among all the
    # job's judged steps, binomial tail, Bonferroni over the runs tested. A job whose steps are long
    # one time in three (a reconstruction that splits a step unevenly) has runs of them by chance; a
    # slowdown clusters its long steps, however many it has. Runs of L steps overlap: n_tests / L of
    # them are distinct
    long_ = pl.col("dur") > (1 + cfg.min_rel_excess) * pl.col("base")
    # (where the job's level shifted, its steps at the faster level: the slower one is the slowdown)
    q = js.filter(pl.col("claimed") & ~warm & (pl.col("lvl") == pl.col("base"))).group_by("job_id").agg(q=long_.mean())
    # (the run from its first long step to its last: a rolling median's run reaches L - 1 steps back)
    kk = js.filter("in_run").with_columns(i=pl.int_range(pl.len()).over("job_id", "run")).group_by("job_id", "run").agg(
        k=long_.sum(), m=pl.col("i").filter(long_).max() - pl.col("i").filter(long_).min() + 1)
    runs = runs.join(kk, on=["job_id", "run"]).join(q, on="job_id", how="left")
    if runs.height:
        p = binom.sf(runs["k"].to_numpy() - 1, runs["m"].fill_null(0).to_numpy(), runs["q"].fill_null(0.0).to_numpy())
        runs = runs.filter(pl.Series(p < window_alpha(cfg.fa_per_job_hour, n_jobs, we - ws) / max(n_tests / L, 1)))
    for r in runs.iter_rows(named=True):
        rows.append(dict(
            detector="flows.cross_step", scope="job", subject=r["job_id"], job_id=r["job_id"], start_ns=r["s"],
            end_ns=r["e"], metric="step_duration_ns", value=float(r["dur"]), baseline=float(r["base"]),
            severity="warning", team="infrastructure", window_id=wid,
            evidence=json.dumps({"job_steps": [r["first"], r["last"]], "n_steps": r["n"], "z": round(r["zmax"], 2),
                                 "z_bar": round(z, 2), "n_tests": n_tests}),
            explanation=f"{r['n']} consecutive step(s) of {r['job_id']} took {fmt_ms(r['dur'])} (median), "
                        f"{r['dur'] / r['base'] - 1:+.0%} vs its usual {fmt_ms(r['base'])}: a sustained slowdown"))
    # isolated long steps: checkpoint or pause (info)
    single = js.filter(pl.col("long1") & ~pl.col("in_run"))
    if single.height:
        rows += _pauses(single, js, st_all, bg_ip, wid)
    rows += _life(js, span, data_span, ws, we, wid, cfg)
    for r in js.filter(~pl.col("reliable") & pl.col("claimed")).group_by("job_id").agg(
            s=pl.col("s").min(), e=pl.col("e").max(), base=pl.col("base").first(), sc=pl.col("roll_scale").first()).iter_rows(named=True):
        rows.append(dict(detector="flows.cross_step", scope="job", subject=r["job_id"], job_id=r["job_id"], start_ns=r["s"],
                         end_ns=r["e"], metric="step_spread", value=float(r["sc"]), baseline=float(r["base"]),
                         severity="info", team="infrastructure", window_id=wid,
                         explanation=f"steps of {r['job_id']} vary too much ({fmt_ms(r['sc'])} around {fmt_ms(r['base'])}) "
                                     "to be judged: its step boundaries are not clear in its flows"))
    return rows, {"n_tests": n_tests, "z_bar": z}


def _pauses(single: pl.DataFrame, js: pl.DataFrame, st_all: pl.DataFrame, bg_ip: pl.DataFrame, wid: str) -> list[dict]:
    """A long step during which the job's NICs move transfers to or from non-job addresses at several
    times their usual rate (and not a negligible amount next to the job's own DP bytes) is a checkpoint
    save or load; without them it is a pause (dataloader stall, GC, host side)."""
    ips = st_all.select("job_id", "ip").unique()
    per_job = st_all.filter("start_observed").group_by("job_id", "job_step").agg(dp=pl.col("dp_bytes").sum()) \
        .group_by("job_id").agg(dp_step=pl.col("dp").median())
    span = js.group_by("job_id").agg(t0=pl.col("s").min(), t1=pl.col("e").max())
    x = single.join(per_job, on="job_id", how="left").with_columns(bg_bytes=pl.lit(0, dtype=pl.Int64), rate_all=pl.lit(0.0))
    if bg_ip.height:
        b = bg_ip.join(ips, on="ip")
        tot = b.join(span, on="job_id").filter((pl.col("start_ns") >= pl.col("t0")) & (pl.col("start_ns") < pl.col("t1"))) \
            .group_by("job_id").agg(bg_all=pl.col("bytes").sum()).join(span, on="job_id") \
            .select("job_id", rate_all=pl.col("bg_all") / (pl.col("t1") - pl.col("t0")).clip(lower_bound=1))
        moved = b.join(single.select("job_id", "job_step", "s", "e"), on="job_id") \
            .filter((pl.col("start_ns") < pl.col("e")) & (pl.col("end_ns") > pl.col("s"))) \
            .group_by("job_id", "job_step").agg(bg_bytes=pl.col("bytes").sum().cast(pl.Int64))
        x = x.drop("bg_bytes", "rate_all").join(moved, on=["job_id", "job_step"], how="left") \
            .join(tot, on="job_id", how="left").with_columns(pl.col("bg_bytes").fill_null(0), pl.col("rate_all").fill_null(0.0))
    out = []
    for r in x.iter_rows(named=True):
        rate = r["bg_bytes"] / max(r["e"] - r["s"], 1)
        ckpt = r["bg_bytes"] > 0 and rate >= 4 * r["rate_all"] and r["bg_bytes"] >= 0.01 * (r["dp_step"] or 0)
        what = ("a checkpoint save or load: the job's NICs moved "
                f"{r['bg_bytes'] / 1e6:.0f} MB to or from non-job addresses meanwhile" if ckpt else
                "a pause with no extra traffic: a dataloader stall, garbage collection or host-side wait")
        out.append(dict(detector="flows.job_event", scope="step", subject=f"{r['job_id']}/step{r['job_step']}",
                        job_id=r["job_id"], start_ns=r["s"], end_ns=r["e"], metric="step_duration_ns",
                        value=float(r["dur"]), baseline=float(r["base"]), severity="info", team="algorithm",
                        window_id=wid, evidence=json.dumps({"event": "checkpoint" if ckpt else "pause",
                                                            "background_bytes": r["bg_bytes"]}),
                        explanation=f"one step of {r['job_id']} took {fmt_ms(r['dur'])} vs its usual "
                                    f"{fmt_ms(r['base'])}, alone: {what}"))
    return out


def _life(js: pl.DataFrame, span: pl.DataFrame, data_span: tuple[int, int], ws: int, we: int, wid: str,
          cfg: FlowConfig) -> list[dict]:
    """Launch and stop of each job inside the window (info)."""
    out = []
    per = js.group_by("job_id").agg(
        base=pl.col("base").first(), first_dur=pl.col("dur").filter(pl.col("k") == 0).first(),
        last_e=pl.col("e").max(), f0=pl.col("f0").first(), l0=pl.col("l0").first())
    for r in per.iter_rows(named=True):
        base = r["base"] or 0.0
        if r["f0"] is not None and r["f0"] > data_span[0] + cfg.launch_quiet_ns and ws <= r["f0"] < we:
            fd = r["first_dur"]
            slow = f"; its first step took {fmt_ms(fd)} vs {fmt_ms(base)} later (warm-up)" if fd and base and fd > 1.2 * base else ""
            out.append(dict(detector="flows.job_event", scope="job", subject=r["job_id"], job_id=r["job_id"],
                            start_ns=r["f0"], end_ns=r["f0"], metric="job_launch_ns", value=float(r["f0"]),
                            baseline=None, severity="info", team="algorithm", window_id=wid,
                            evidence=json.dumps({"event": "launch"}),
                            explanation=f"{r['job_id']} started inside the window{slow}"))
        quiet = max(cfg.launch_quiet_ns, 3 * base)
        if r["l0"] is not None and r["l0"] < min(we, data_span[1]) - quiet and ws <= r["l0"] < we:
            mid = r["last_e"] is not None and r["l0"] > r["last_e"] + 0.2 * base
            what = ("in the middle of a step (traffic of a step that never completed): crashed or hung" if mid
                    else "after a complete step: finished or stopped")
            out.append(dict(detector="flows.job_event", scope="job", subject=r["job_id"], job_id=r["job_id"],
                            start_ns=r["l0"], end_ns=r["l0"], metric="job_stop_ns", value=float(r["l0"]),
                            baseline=None, severity="info", team="algorithm", window_id=wid,
                            evidence=json.dumps({"event": "crash" if mid else "finish"}),
                            explanation=f"{r['job_id']} stopped sending inside the window, {what}"))
    return out
