"""Robust statistics shared by the flow verdicts, and the false-alarm budget that sets their bars.

A fleet of thousands of GPUs runs thousands of tests per window (every job's steps, every DP group,
every NIC and switch per time bin). A fixed k-sigma bar then raises false alarms in proportion to
the fleet's size. Instead the bar comes from a budget: `fa_per_job_hour` false alarms per job-hour
allowed to one detector, spread over the tests it runs in the window (Bonferroni: each test at
alpha / m). The baseline and scale of every test come from the data: a job's own steps, a switch's
or NIC's peers in the same collective, never from nominal bandwidths."""
from __future__ import annotations

import numpy as np
import polars as pl
from scipy.stats import norm


def typical(value: pl.Expr, ref: pl.Expr, spread: float) -> pl.Expr:
    """A typical step: its duration (or volume) within `spread` (config max_rel_spread) of the
    reference, the job's median step. One definition for the splits' regularity, the withholding of
    unclear steps and the cross-step warm-up."""
    return (value / ref - 1).abs() <= spread


def _splits(n: int, min_side: int) -> np.ndarray:
    """Candidate split points of a sequence of n (each side at least min_side), on a grid of at most
    ~64 (a shift is found within a few steps of it)."""
    if n < 2 * min_side:
        return np.zeros(0, dtype=int)
    return np.unique(np.linspace(min_side, n - min_side, num=min(64, n - 2 * min_side + 1)).astype(int))


def typical_split(d: np.ndarray, spread: float, min_side: int) -> tuple[float, int]:
    """(share, k): the share of a job's steps (durations in order) typical of their level, allowing
    the level one shift, and where it shifts (0: no shift). The best single split (each side at least
    min_side steps) into two runs, each judged against its own median (stats.typical), or none. A
    slowdown's onset (or its end) moves a job's steps to a new level where they stay typical; a split
    that does not find the steps' boundaries leaves steps that stray from any level. A median over the
    whole window would call every step after a large slowdown atypical and withhold exactly the steps
    that show it."""
    d = np.asarray(d, dtype=np.float64)
    n = len(d)
    if n == 0:
        return 1.0, 0

    def share(x: np.ndarray) -> float:
        m = np.median(x)
        return float((np.abs(x / m - 1) <= spread).sum()) if m > 0 else 0.0

    best, at = share(d), 0
    for k in _splits(n, min_side):
        v = share(d[:k]) + share(d[k:])
        if v > best:
            best, at = v, int(k)
    return best / n, at


def level_shift(d: np.ndarray, min_side: int, min_rel: float) -> int:
    """Where a job's steps (durations in order) move from one level to another: the split with the
    least absolute deviation around the two sides' medians (a robust single change point), kept when
    the two levels differ by more than min_rel of the lower; 0 when there is none. A slowdown that
    began early in the span leaves most steps slow, and their median is no baseline: the faster
    level is the job's own (a fault slows a job, never speeds it up)."""
    d = np.asarray(d, dtype=np.float64)
    n = len(d)
    ks = _splits(n, min_side)
    if len(ks) == 0:
        return 0
    cost = [np.abs(d[:k] - np.median(d[:k])).sum() + np.abs(d[k:] - np.median(d[k:])).sum() for k in ks]
    k = int(ks[int(np.argmin(cost))])
    a, b = np.median(d[:k]), np.median(d[k:])
    return k if min(a, b) > 0 and max(a, b) > (1 + min_rel) * min(a, b) else 0


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
