"""Step structure from timings: replaying the measured op durations must give back the measured
step times, on the real StragglerAnalysis trace and on simulated jobs."""
import numpy as np
import polars as pl
import pytest

from fleetscope.prism.structure import StructureError, build_job_graph, replay_job_graph, subset_steps


def test_real_trace_replay_reproduces_measured_steps(real_timings):
    g = build_job_graph(real_timings)
    assert len(g.steps) == 32 and g.n_ranks == 8
    assert g.layout["pp"] == 4 and g.layout["dp"] == 2 and g.layout["microbatches"] == 4
    assert g.layout["schedule"] == "1f1b"
    rel = np.abs(replay_job_graph(g, g.gap, g.dur) / g.measured_step_ns - 1)
    assert rel.max() < 1e-4
    # Megatron's fused send_forward_recv_backward is one slot, synchronized with its peer stage
    assert "backward-recv+forward-send" in set(g.slot_names())
    # the waits are not part of intrinsic durations: stage 0's fused send/recv blocks ~0.5 s in
    # step 23 but its transfer is sub-millisecond
    fused = g.slot_names() == "backward-recv+forward-send"
    assert np.median(g.dur[fused]) < 2e6


def test_simulated_job_replay_and_concurrent_collectives(sim_healthy):
    t, _, _, cap = sim_healthy
    g = build_job_graph(t)
    assert g.capture_id == cap and g.layout["tp"] == 2 and g.layout["pp"] == 2 and g.layout["dp"] == 4
    rel = np.abs(replay_job_graph(g, g.gap, g.dur) / g.measured_step_ns - 1)
    assert rel.max() < 5e-3
    conc = set(g.slots.filter(pl.col("concurrent"))["name"].to_list())
    assert conc == {"grads-all-reduce"}  # the gradient all-reduce overlaps the last backward


def test_a_step_with_a_missing_op_is_left_out_with_a_note(real_timings):
    step = 263
    row = real_timings.with_row_index("i").filter((pl.col("step") == step) & (pl.col("rank") == 5) & (pl.col("name") == "optimizer"))["i"][0]
    t = real_timings.with_row_index("i").filter(pl.col("i") != row).drop("i")
    g = build_job_graph(t)
    assert step not in g.steps.tolist() and len(g.steps) == 31
    assert any(str(step) in n and "left out" in n for n in g.notes)


def test_timings_without_steps_are_refused_with_a_reason(real_timings):
    with pytest.raises(StructureError, match="no step numbers"):
        build_job_graph(real_timings.with_columns(step=pl.lit(None, dtype=pl.Int64)))
    with pytest.raises(StructureError, match="one capture"):
        build_job_graph(pl.concat([real_timings, real_timings.with_columns(capture_id=pl.lit("other"))]))


def _replay_slot_by_slot(g, gap, dur):
    """The recurrence written out slot by slot in the graph's topological order (the definition
    the level-by-level replay must agree with)."""
    S = max(gap.shape[1], dur.shape[1])
    gap, dur = np.broadcast_to(gap, (g.n_slots, S)), np.broadcast_to(dur, (g.n_slots, S))
    ready, ready_seq = np.zeros((g.n_ranks, S)), np.zeros((g.n_ranks, S))
    arrive = np.zeros((g.n_slots, S))
    conc, after_all = g.concurrent, g.slots["after_all"].to_numpy()
    arrive[g.first_slot] = gap[g.first_slot]
    for i in g.order:
        w = g.waits[i]
        start = np.maximum(arrive[i], arrive[w].max(axis=0)) if len(w) else arrive[i]
        r = g.slot_rank[i]
        end = start + dur[i]
        ready[r] = np.maximum(ready[r], end)
        if not conc[i]:
            ready_seq[r] = np.maximum(ready_seq[r], end)
        n = g.next_slot[i]
        if n >= 0:
            arrive[n] = (start if conc[n] else ready[r] if after_all[n] else ready_seq[r]) + gap[n]
    return ready.max(axis=0)


@pytest.mark.parametrize("which", ["real", "simulated"])
def test_level_replay_equals_the_slot_by_slot_recurrence(which, real_timings, sim_healthy):
    """On the real trace (p2p pairs, fused slots) and a simulated job with a collective beside the
    backward (concurrent slots), for measured and for randomly perturbed durations."""
    g = build_job_graph(real_timings if which == "real" else sim_healthy[0])
    rng = np.random.default_rng(0)
    for gap, dur in ((g.gap, g.dur), (g.gap[:, :1] * 0, g.dur * rng.lognormal(0, 0.5, g.dur.shape))):
        ref = _replay_slot_by_slot(g, gap, dur)
        assert np.allclose(replay_job_graph(g, gap, dur), ref, rtol=1e-12, atol=1.0)
        # float32 (the what-ifs): within 1e-6 of the step
        got32 = replay_job_graph(g, gap.astype(np.float32), dur.astype(np.float32))
        assert np.abs(got32 / ref - 1).max() < 1e-6


def test_subset_of_steps_keeps_the_structure(real_timings):
    g = build_job_graph(real_timings)
    h = subset_steps(g, np.arange(16))
    assert len(h.steps) == 16 and h.n_slots == g.n_slots and h.gap.shape == (g.n_slots, 16)
    assert np.allclose(replay_job_graph(h, h.gap, h.dur), g.measured_step_ns[:16], rtol=1e-4)
    with pytest.raises(StructureError):
        subset_steps(g, np.zeros(32, dtype=bool))
