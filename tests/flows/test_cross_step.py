"""The cross-step detector (fleetscope.flows.job_health) on hand-built step timelines: a sustained
slowdown is a warning; two steps the flows did not split (one row, twice the time and twice the
gradient bytes) and a long warm-up after a launch are not. A slowdown that covers most of the span,
or ends inside it, is judged against the job's faster level (stats.level_shift)."""
import polars as pl
import pytest

from fleetscope.flows import FlowConfig
from fleetscope.flows.job_health import job_health, job_steps

S = 1_000_000_000
GRAD = 64 << 20
IPS = ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]


def timeline(durations: list[float], units: list[int] | None = None, t0: float = 0.0,
             margin: int = 0) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Step rows of one 4-rank job (every rank the same step times) and its flows' span. durations in
    seconds; units: how many steps of gradient traffic each row carries (1 each by default); the first
    `margin` steps lie in the window's margin (not claimed: the window before judged them)."""
    units = units or [1] * len(durations)
    rows, t = [], t0
    for k, (d, u) in enumerate(zip(durations, units)):
        for ip in IPS:
            rows.append(("job-1", ip, k, int(t * S), int((t + d) * S), k > 0, k >= margin, u * GRAD))
        t += d
    st = pl.DataFrame(rows, schema=["job_id", "ip", "job_step", "start_ns", "end_ns", "start_observed", "claimed", "dp_bytes"],
                      orient="row")
    ipf = pl.DataFrame({"job_id": ["job-1"], "start_ns": [int(t0 * S)], "end_ns": [int(t * S)]})
    return st, ipf


def warnings(durations, units=None, t0=0.0, data_start=0.0, margin=0) -> list[dict]:
    st, ipf = timeline(durations, units, t0, margin)
    end = int(ipf["end_ns"][0])
    bg = pl.DataFrame(schema={"ip": pl.Utf8, "start_ns": pl.Int64, "end_ns": pl.Int64, "bytes": pl.Int64})
    rows, _ = job_health(st, ipf, bg, (int(data_start * S), end + 10 * S), int(t0 * S), end + 10 * S, "w", FlowConfig())
    return [r for r in rows if r["severity"] in ("warning", "critical")]


def jitter(n: int, d: float = 1.0) -> list[float]:
    return [d * (1 + 0.004 * ((7 * k) % 5 - 2)) for k in range(n)]


def test_a_sustained_slowdown_is_a_warning():
    w = warnings(jitter(30) + jitter(12, 1.5) + jitter(30))
    assert [r["detector"] for r in w] == ["flows.cross_step"]
    assert 1.4e9 < w[0]["value"] < 1.6e9 and 0.95e9 < w[0]["baseline"] < 1.05e9


def test_slow_steps_of_the_margin_are_not_this_windows_slowdown():
    """The margin's steps are history: the window before claimed and judged them. Its last steps ran
    15 % slower and this window's are back at the job's level: a rolling median reaching back into
    the margin must not report them again, against this window's faster level (2,048-GPU healthy
    fleet, seed 1001: a warning on steps the window before had found typical)."""
    assert warnings(jitter(5, 1.15) + jitter(40), margin=5) == []
    # ... while a slowdown that goes on into the window is this window's
    w = warnings(jitter(5, 1.15) + jitter(10, 1.15) + jitter(30), margin=5)
    assert [r["detector"] for r in w] == ["flows.cross_step"]
    assert 1.1e9 < w[0]["value"] < 1.2e9


def test_steps_the_flows_did_not_split_are_not_a_slowdown():
    # twelve pairs of steps each seen as one: twice the time, twice the gradient traffic
    assert warnings(jitter(30) + jitter(12, 2.0) + jitter(30), [1] * 30 + [2] * 12 + [1] * 30) == []


def test_a_row_with_twice_the_bytes_is_two_steps_only_if_it_takes_about_twice_the_time():
    """Two steps seen as one carry twice the gradients in twice the time; a piece of a step that the
    flows cut apart may carry twice another piece's bytes in the same time, and is one row, not two
    steps (halving its time made the pieces with one share look twice as slow as the "usual" step:
    33 warnings on the simulator's healthy seed 2215, an FSDP job cut into 10-20 ms pieces)."""
    durs = [1.0, 1.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    units = [1, 1, 2, 1, 2, 2, 1, 1]
    st, _ = timeline(durs, units)
    js = job_steps(st).sort("job_step")
    # (step 0's start is not observed: no row)
    assert js["units"].to_list() == [1.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert js["dur"].to_list() == pytest.approx([1e9] * 7)


def test_a_long_warm_up_after_a_launch_is_not_a_slowdown():
    # launched 20 s into the data; its first eight steps take 2.3 s (compilation, allocator growth)
    assert warnings(jitter(8, 2.3) + jitter(60), t0=20.0) == []


def test_a_launch_whose_first_level_is_its_slower_one_is_warming_up():
    """Launched 20 s into the data, the job's first dozen steps run 70 % slower than the rest (one of
    them, early, already typical: steps the flows see as pieces of a longer step vary): the job settles
    at its faster level, and a fault does not end where a job settles (a 384-GPU job launched inside
    the 16,384-GPU healthy fleet's minute: thirteen warnings)."""
    assert warnings([1.7, 1.0] + jitter(12, 1.7) + jitter(40), t0=20.0) == []
    # ... while a job that slows down after its launch, at its usual level first, is slowed
    w = warnings([1.7, 1.0] + jitter(20) + jitter(12, 1.7) + jitter(20), t0=20.0)
    assert [r["detector"] for r in w] == ["flows.cross_step"]
    # ... even where its slow stretch holds most of the time before it recovers (the level before the
    # shift is then the slower one: 64-GPU seed 2627's straggler, in a job launched the minute before)
    w = warnings([1.7, 1.0] + jitter(10) + jitter(40, 1.4) + jitter(20), t0=20.0)
    assert [r["detector"] for r in w] and {r["detector"] for r in w} == {"flows.cross_step"}


def test_steps_long_one_time_in_four_by_chance_are_not_a_slowdown():
    """An uneven split (an FSDP unit's gathers cut a step in two unequal parts): a quarter of the
    job's steps are twice as long, here and there; runs of three long in five occur by chance, and
    the job's own share of long steps says so."""
    import numpy as np

    rng = np.random.default_rng(5)
    d = [2.0 if x else 1.0 for x in rng.random(300) < 0.25]
    assert warnings([v * j for v, j in zip(d, jitter(300))]) == []
    # the same job with a sustained slowdown (twelve long steps in a row) is still a warning
    d2 = d[:150] + [2.0] * 12 + d[150:]
    assert [r["detector"] for r in warnings([v * j for v, j in zip(d2, jitter(312))])] == ["flows.cross_step"]


def test_a_slowdown_over_most_of_the_span_is_a_warning():
    """A fault that began early in the span (ten steps in) leaves most steps slow: their median is no
    baseline, the job's level before the shift is."""
    for before in (30, 20, 10):
        w = warnings(jitter(before) + jitter(60, 1.35))
        assert [r["detector"] for r in w] == ["flows.cross_step"], before
        assert 0.95e9 < w[0]["baseline"] < 1.05e9 and 1.3e9 < w[0]["value"] < 1.4e9


def test_a_slowdown_that_ends_inside_the_span_is_a_warning():
    w = warnings(jitter(45, 1.35) + jitter(25))
    assert [r["detector"] for r in w] == ["flows.cross_step"]
    assert 0.95e9 < w[0]["baseline"] < 1.05e9


def test_a_level_shift_keeps_a_split_typical_and_pieces_do_not():
    """stats.typical_split: steps that move to a new level stay typical of it; a split that cuts steps
    into pieces of two sizes (a step's halves, ring chunks of two kinds) does not become regular by
    allowing a shift; neither does a jittery split."""
    import numpy as np

    from fleetscope.flows.stats import level_shift, typical_split

    shift = np.array(jitter(28, 0.81) + jitter(30, 1.10))
    assert typical_split(shift, 0.25, 5) > (0.95, 27)
    assert level_shift(shift, 5, 0.10) == 28
    pieces = np.array(([0.15, 0.15, 0.30, 0.30] * 8) + ([0.04, 0.04, 0.08, 0.08] * 8))
    assert typical_split(pieces, 0.25, 5)[0] < 0.6
    rng = np.random.default_rng(1)
    assert typical_split(rng.uniform(0.3, 1.7, 80), 0.25, 5)[0] < 0.6
    # healthy jitter: no shift, whatever the split
    assert level_shift(np.array(jitter(80)), 5, 0.10) == 0


def test_pieces_of_one_collective_are_withheld_and_job_wide_steps_are_not():
    """A job launched late in the window shows one all-reduce: each of its rings' evenly spaced
    chunks reconstructs as a "step" seen on that ring's addresses only (2,048-GPU seed 1800: a
    17 ms level shift among them read as a slowdown). Its steps are withheld as not job-wide; a job
    whose every step covers all its ranks (one rank missing a step at an edge included) is kept."""
    from fleetscope.flows.window import withheld_jobs

    ms = 1_000_000
    rows = []
    rings = [[f"10.1.{r}.{i}" for i in range(4)] for r in range(8)]
    k = 0
    for r, ring in enumerate(rings):
        t0 = (10_000 + 40 * r) * ms
        for c in range(19):  # this ring's chunks, 17 ms apart, at its own time
            rows += [("job-late", ip, k, t0 + c * 17 * ms, t0 + (c + 1) * 17 * ms, True) for ip in ring]
            k += 1
    ips = [f"10.2.0.{i}" for i in range(8)]
    for s in range(12):  # job-wide 1 s steps; one rank misses the last one
        rows += [("job-ok", ip, s, s * 1000 * ms, (s + 1) * 1000 * ms, s > 0) for ip in ips if not (s == 11 and ip == ips[0])]
    st = pl.DataFrame(rows, schema=["job_id", "ip", "job_step", "start_ns", "end_ns", "start_observed"], orient="row")
    out = withheld_jobs(st, FlowConfig())
    assert list(out) == ["job-late"] and "not job-wide" in out["job-late"]
