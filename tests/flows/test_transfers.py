"""What a transfer is (fleetscope.flows.network.flow_residuals): records of one stream that abut in time are
the pieces of one transfer when an exporter cut it by time, and as many transfers when whole transfers ran
back to back (a ring paced by a congested switch: its sender is never idle). A transfer's size class picks
the rate it is judged against, so a slowed ring's chunks merged into one record-sized class have no healthy
level to be slow against (demo seed 806)."""
import numpy as np
import polars as pl

from fleetscope.flows import FlowConfig
from fleetscope.flows.network import flow_residuals

S = 1_000_000_000
PATH = ["leaf0", "spine", "leaf1"]


def stream(records: list[tuple[int, int, int]]) -> pl.DataFrame:
    """One directed pair's records (start_ns, duration_ns, bytes) on one 5-tuple, as a DP pair of job-1."""
    return pl.DataFrame({
        "start_ns": [s for s, _, _ in records], "end_ns": [s + d for s, d, _ in records],
        "src_ip": "10.0.0.1", "dst_ip": "10.0.1.1", "bytes": [b for _, _, b in records],
        "src_port": 50270, "dst_port": 4791, "src_qp": 7, "dst_qp": 9,
        "path": [PATH] * len(records), "pid": 0})


PAIRS = pl.DataFrame({"pid": [0], "job_id": ["job-1"], "comm_type": ["DP"], "dp_group": [0]})


def chunks(t0: float, t1: float, size: int, rate: float, gap_s: float, rng) -> list[tuple[int, int, int]]:
    """Chunks of `size` bytes at `rate` bytes/ns (a few microseconds of jitter) from t0 to t1 s, `gap_s`
    apart (0: back to back, each starting where the last ended)."""
    out, t = [], int(t0 * S)
    while True:
        d = int(size / rate) + int(rng.normal(0, 2_000))
        if t + d >= t1 * S:
            return out
        out.append((t, d, size))
        t += d + int(gap_s * S)


def test_a_ring_paced_back_to_back_keeps_its_chunks_size_class_and_shows_slow():
    size, rate = 426_666_667, 16.98
    rng = np.random.default_rng(0)
    # healthy: chunks with compute gaps between them; then a congested switch holds the ring to 42 % of
    # its rate and the sender is never idle: its chunks' records abut
    recs = chunks(0, 20, size, rate, 0.05, rng) + chunks(20, 60, size, rate * 0.42, 0.0, rng)
    r = flow_residuals(stream(recs), PAIRS, FlowConfig())
    slow = r.filter(pl.col("start_ns") >= 20 * S)
    assert slow.height > 100
    assert set(slow["size"].unique()) == set(r.filter(pl.col("start_ns") < 20 * S)["size"].unique())
    assert abs(slow["e_hist"].median() - np.log(0.42)) < 0.05


def test_the_pieces_of_a_transfer_cut_by_time_stay_one_transfer():
    """An exporter's active timeout cuts a 3.2 GB transfer into 100 ms pieces, more and smaller ones when
    it moves slowly: they are one transfer of 3.2 GB whether it is slowed or not, so the slowed pieces
    are judged against the healthy transfer's rate, not against smaller transfers'. (A link's rate
    varies a little from piece to piece, so the pieces' bytes do: at an exactly constant rate they would
    be chunks of one size moved back to back, which is the other case.)"""
    size, timeout = 3_200_000_000, 100_000_000
    rng = np.random.default_rng(1)
    recs = []
    for k in range(60):
        t, left = k * S, size
        while left > 0:
            rate = (32.0 if k < 20 else 16.0) * rng.uniform(0.97, 1.03)
            d = max(1, min(timeout, int(left / rate)))
            b = left if d < timeout else min(left, int(rate * d))
            recs.append((t, d, b))
            t, left = t + d, left - b
    r = flow_residuals(stream(recs), PAIRS, FlowConfig())
    assert set(r["size"].unique()) == {32}          # log2(3.2e9) = 31.6
    assert abs(r.filter(pl.col("start_ns") >= 20 * S)["e_hist"].median() - np.log(0.5)) < 0.05


def test_a_transfer_whose_bytes_an_exporter_split_equally_over_its_pieces_moves_at_its_own_rate():
    """An exporter that cuts a transfer every 100 ms but writes its bytes in equal shares over the pieces
    (demo seed 821) leaves a short remainder piece "moving" at many times the link's rate; mirrored from
    both ends, every piece is written twice. Each piece is judged at its transfer's rate (its bytes over
    its pieces' time): a healthy pair's level is not lifted by its remainders (nor doubled by the twins),
    so the pieces sit on it, and a pair slowed to half sits at half."""
    size, timeout = 1_000_000_000, 100_000_000
    recs = []
    for k in range(60):
        rate = 8.0 if k < 30 else 4.0
        n = int(np.ceil(size / rate / timeout))
        t = k * S
        for i in range(n):
            d = timeout if i < n - 1 else int(size / rate) - (n - 1) * timeout
            recs += [(t, d, size // n)] * 2
            t += d
    r = flow_residuals(stream(recs), PAIRS, FlowConfig())
    assert np.allclose(r["x"].to_numpy(), np.log(np.where(r["start_ns"].to_numpy() < 30 * S, 8.0, 4.0)), atol=1e-3)
    assert abs(r.filter(pl.col("start_ns") >= 30 * S)["e_hist"].median() - np.log(0.5)) < 0.05
    assert abs(r.filter(pl.col("start_ns") < 30 * S)["e_hist"].median()) < 0.05


def ring(records: list[tuple[int, int, int, int]]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """A DP ring's records (hop, start_ns, duration_ns, bytes), hop h from 10.0.h.1 to the next member,
    and its pairs (one DP group of job-1)."""
    n = 1 + max(h for h, *_ in records)
    f = pl.DataFrame({
        "start_ns": [s for _, s, _, _ in records], "end_ns": [s + d for _, s, d, _ in records],
        "src_ip": [f"10.0.{h}.1" for h, *_ in records], "dst_ip": [f"10.0.{(h + 1) % n}.1" for h, *_ in records],
        "bytes": [b for *_, b in records], "src_port": 50270, "dst_port": 4791,
        "src_qp": [7 + h for h, *_ in records], "dst_qp": 9, "path": [PATH] * len(records),
        "pid": [h for h, *_ in records]})
    pairs = pl.DataFrame({"pid": list(range(n)), "job_id": "job-1", "comm_type": "DP", "dp_group": 0})
    return f, pairs


def test_ring_members_waiting_for_the_last_one_to_enter_move_at_the_link_rate():
    """Members enter a collective on their own; an exporter's flowlet holds an early member's first
    chunk, its wait for the last one and the rest, ending with the ring (demo and 64-GPU fleets: healthy
    rings' early members "stalled" on their links). Each record is judged from when the last member
    entered: every hop moves at the link's rate whoever was last, while a ring of staggered hops (gloo's
    chunks passed on one after the other, ends far apart) keeps each record's own time."""
    rng = np.random.default_rng(4)
    size, rate = 4_000_000, 8.0             # 0.5 ms on the wire
    recs, stag = [], []
    for k in range(60):
        t = k * S // 2
        last = int(rng.integers(4))
        end = t + int(size / rate)
        for h in range(4):
            wait = 0 if h == last else int(rng.uniform(1e6, 3e6))
            recs.append((h, t - wait, end + int(rng.uniform(0, 2_000)) - (t - wait), size))
            # a staggered ring: hop h starts when hop h-1 is half done, at the link's rate or at half of it
            stag.append((h, t + h * int(size / rate / 2), int(size / (rate if k % 2 else rate / 2)), size))
    r = flow_residuals(*ring(recs), FlowConfig())
    assert np.allclose(r["x"].to_numpy(), np.log(rate), atol=0.02)
    s = flow_residuals(*ring(stag), FlowConfig())
    own = np.log(size / (s["end_ns"] - s["start_ns"]).to_numpy())
    assert np.allclose(s["x"].to_numpy(), own, atol=1e-6)


def test_an_early_members_wait_cut_into_timer_pieces_is_not_its_transfer():
    """Two members all-reduce each step, one always entering late (a slow GPU); an active-timeout
    exporter cuts each transfer into timer pieces of equal bytes whose times are rounded (a piece may
    start a nanosecond after the last one ended) and only the last piece ends with the collective (demo
    seed 811: the early member's pieces holding its wait read as a stalled link). Judged per transfer
    from when the late member entered, both move at the link's rate. (Collectives that follow each
    other back to back are streams: network.collective_wait, and the test below.)"""
    size, rate, timer = 200_000_000, 40.0, 3_600_000       # 5 ms on the wire, cut every 3.6 ms
    wait = 2_000_000
    recs, t = [], 0
    for k in range(200):
        end = t + wait + int(size / rate)
        for h, s in ((0, t), (1, t + wait)):                # member 0 early, member 1 late
            n = -(-(end - s) // timer)
            cuts = [s + i * timer for i in range(n)] + [end]
            # rounding: a piece but the last ends a nanosecond before the next one starts
            recs += [(h, a, b - a - (i < n - 1), size // n) for i, (a, b) in enumerate(zip(cuts[:-1], cuts[1:]))]
        t = end + 3_000_000                                 # compute before the next step's collective
    r = flow_residuals(*ring(recs), FlowConfig())
    assert np.allclose(r["x"].to_numpy(), np.log(rate), atol=0.02), r.group_by("src_ip").agg(pl.col("x").median())


def test_a_congested_hop_streaming_chunks_keeps_its_slow_rate():
    """A three-member ring whose two hops through a congested leaf move each chunk continuously at half
    the rate while the third, fed by them, starts each chunk half-way and ends with them (demo seed 819):
    the slow hops were sending, not waiting to enter, so they stay slow against the ring's healthy
    start (the flows before the congestion)."""
    size, rate = 70_000_000, 42.0
    full = int(size / rate)
    recs, t = [], 0
    for k in range(600):
        slow = k >= 200
        d = 2 * full if slow else full
        nxt = t + d + 30_000
        recs += [(0, t, d, size), (2, t, d, size)] if slow else [(h, t, d, size) for h in (0, 2)]
        recs.append((1, t + d - full, full, size))
        t = nxt + (0 if slow else 2_000_000)
    r = flow_residuals(*ring(recs), FlowConfig())
    late = r.filter((pl.col("start_ns") >= recs[3 * 200][1]) & pl.col("src_ip").is_in(["10.0.0.1", "10.0.2.1"]))
    assert abs(late["x"].median() - np.log(rate / 2)) < 0.02


def test_a_held_transfer_merged_into_a_size_of_its_own_is_stalled_against_the_pairs_slowest_class():
    """A link that goes down holds a two-member group's bucket: the exporter writes the whole 119 MB in
    one 650 ms record, twice, where the pair moves its 26 MB pieces in 4 ms every 100 ms (64-GPU seed
    2191). That size class is measured at two moments only: its own level is the stall, so its single
    transfers are judged against the pair's slowest class measured at many moments. The same pair's
    healthy classes keep their own level (no stall)."""
    rng = np.random.default_rng(3)
    recs = [(int(t * S) + int(rng.integers(0, 1000)), 4_000_000 + int(rng.normal(0, 20_000)), 26_214_400)
            for t in np.arange(0, 60, 0.1)]
    # (on four queue pairs: eight records, enough for a level by count)
    held = [(int(61.4 * S) + q, 650_000_000, 119_215_317) for q in range(4)] \
        + [(int(62.96 * S) + q, 517_000_000, 119_215_317) for q in range(4)]
    f = pl.concat([stream(recs), stream(held).with_columns(src_qp=pl.Series([10, 11, 12, 13] * 2))], how="vertical_relaxed")
    r = flow_residuals(f, PAIRS, FlowConfig())
    held = r.filter(pl.col("start_ns") > 61 * S)
    assert held.height == 8 and (held["e_hist_s"].fill_null(0.0) < np.log(0.1)).all(), held.select("size", "x", "e_hist_s")
    # the healthy pieces: within their own jitter of their level
    assert r.filter(pl.col("start_ns") < 61 * S)["e_hist_s"].abs().max() < 0.1


def test_a_transfer_timed_within_the_clocks_resolution_sets_no_stall_level():
    """An exporter writes some 512 KB transfers as records of 1 ns (nanosecond stamps): "moving" at
    e^13 bytes/ns, four of a class's eight set its median level far above the link's, and the class's
    healthy transfers read as stalled against it (64-GPU seed 2196). A time within the clock's tick
    measures no rate: those transfers are judged by no single-transfer (stall) level and set none."""
    size, rate = 524_288, 10.6
    rng = np.random.default_rng(5)
    timed = [(int(t * S) + int(rng.integers(1, 999)), int(size / rate), size) for t in np.arange(0.0, 60, 7.5)]
    flat = [(int(t * S) + 3 * S + int(rng.integers(1, 999)), 1, size) for t in np.arange(0.0, 60, 15)]
    r = flow_residuals(stream(timed + flat), PAIRS, FlowConfig())
    flat_rows = r.filter(pl.col("end_ns") - pl.col("start_ns") == 1)
    assert flat_rows.height == len(flat) and flat_rows["e_hist_s"].is_null().all() and flat_rows["e_peer_s"].is_null().all()
    kept = r.filter(pl.col("end_ns") - pl.col("start_ns") > 1)
    assert kept.height == len(timed) and kept["e_hist_s"].is_not_null().all() and kept["e_hist_s"].abs().max() < 0.01
