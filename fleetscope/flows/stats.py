"""Robust statistics shared by the flow verdicts, and the false-alarm budget that sets their bars.

A fleet of thousands of GPUs runs thousands of tests per window (every job's steps, every DP group,
every NIC and switch per time bin). A fixed k-sigma bar then raises false alarms in proportion to
the fleet's size. Instead the bar comes from a budget: `fa_per_job_hour` false alarms per job-hour
allowed to one detector, spread over the tests it runs in the window (Bonferroni: each test at
alpha / m). The baseline and scale of every test come from the data: a job's own steps, a switch's
or NIC's peers in the same collective, never from nominal bandwidths."""
from __future__ import annotations

import polars as pl
from scipy.stats import norm


def typical(value: pl.Expr, ref: pl.Expr, spread: float) -> pl.Expr:
    """A typical step: its duration (or volume) within `spread` (config max_rel_spread) of the
    reference, the job's median step. One definition for the splits' regularity, the withholding of
    unclear steps and the cross-step warm-up."""
    return (value / ref - 1).abs() <= spread


# share trimmed off each side by trimmed_mean (20 %: Wilcox's usual choice for Yuen's test)
TRIM = 0.2


def trimmed_mean(x: pl.Expr, trim: float = TRIM) -> pl.Expr:
    """Mean of the middle of x (group or window context). The level of a pair's flows, or of a cell of
    them: their rates are often bimodal (a ring's chunks at two rates), where a median flips between
    the modes on a small change of their shares, and a mean follows a few stalled flows."""
    return x.filter((x >= x.quantile(trim, "nearest")) & (x <= x.quantile(1 - trim, "nearest"))).mean()


def winsorized_std(x: pl.Expr, trim: float = TRIM) -> pl.Expr:
    """Standard deviation of x with each tail clipped at its trim quantile (the scale of Yuen's test)."""
    return x.clip(x.quantile(trim, "nearest"), x.quantile(1 - trim, "nearest")).std()


def window_alpha(fa_per_job_hour: float, n_jobs: int, window_ns: int) -> float:
    """False-alarm probability one detector may spend on the whole window."""
    return min(0.5, fa_per_job_hour * max(n_jobs, 1) * window_ns / 3.6e12)


def bonferroni_z(alpha: float, n_tests: int) -> float:
    """One-sided z bar of each of n_tests tests so that P(any false alarm) <= alpha (Gaussian tails)."""
    return float(norm.isf(alpha / max(int(n_tests), 1)))


def fmt_ms(ns: float) -> str:
    return f"{ns / 1e6:.1f} ms" if ns < 10e9 else f"{ns / 1e9:.1f} s"
