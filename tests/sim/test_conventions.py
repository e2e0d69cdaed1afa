"""The simulator's conventions are per-seed draws: they really vary, they are reproducible, and a
test can pin any of them."""
from __future__ import annotations

import numpy as np
import pytest

from fleetscope.sim.conventions import FIXED, draw_conventions, flat_values
from fleetscope.sim.fabric import build_fabric
from fleetscope.sim.jobs import place_jobs

WINDOW = (0, 60_000_000_000)


@pytest.mark.parametrize("gpus", [128, 2048])
def test_every_fleet_convention_takes_several_values_over_20_seeds(gpus):
    seen: dict[str, set] = {}
    for seed in range(20):
        for k, v in flat_values(draw_conventions(seed, gpus)).items():
            # per-collector conventions vary across a fleet's collectors as well as across seeds
            seen.setdefault(k, set()).update(v if "[]" in k else [repr(v)])
    assert len(seen) > 60
    constant = sorted(k for k, v in seen.items() if len(v) < 2 and k not in FIXED)
    assert not constant, f"conventions that never vary over 20 seeds: {constant}"


def test_every_job_convention_takes_several_values_over_20_seeds():
    attrs = ["tp", "pp", "dp_style", "algo", "channels", "qps", "p2p_channels", "cross_rail", "bidir", "overlap",
             "variable_seq", "equal_buckets", "n_microbatches", "gpus_per_host", "transport"]
    seen = {a: set() for a in attrs}
    step = []
    for seed in range(20):
        conv = draw_conventions(seed, 2048)
        fab = build_fabric(2048, conv, seed)
        jobs, _ = place_jobs(fab, None, np.random.default_rng([seed, 1]), WINDOW, conv)
        for j in jobs:
            for a in attrs:
                seen[a].add(getattr(j, a))
            seen.setdefault("restricted_nics", set()).add(len(j.nic_slots) < j.local)
            seen.setdefault("launched", set()).add(j.launch_ns is not None)
            seen.setdefault("finishes", set()).add(j.stop_ns is not None)
            seen.setdefault("crashes", set()).add(j.crash_ns is not None)
            seen.setdefault("checkpoints", set()).add(bool(j.checkpoints))
            seen.setdefault("stalls", set()).add(bool(j.stalls))
            step.append(j.target_step_ns / 1e9)
    constant = sorted(a for a, v in seen.items() if len(v) < 2)
    assert not constant, f"job conventions that never vary: {constant}"
    assert {"ddp", "megatron", "zero", "fsdp"} <= seen["dp_style"] and {"ring", "tree", "auto"} <= seen["algo"]
    assert {1, 2, 4, 8} <= seen["tp"] and max(seen["qps"]) >= 2
    # jobs of very different step times
    assert min(step) < 0.5 and max(step) > 6


def test_same_seed_same_conventions_and_overrides_pin_one():
    a, b = draw_conventions(7, 256), draw_conventions(7, 256)
    assert a == b
    c = draw_conventions(7, 256, {"collectors": {"cutting": "flowlet", "loss_rate": 0.0}, "fabric": {"routing": "ecmp"}})
    assert c["collectors"]["cutting"] == "flowlet" and c["collectors"]["loss_rate"] == 0.0 and c["fabric"]["routing"] == "ecmp"
    assert {x["cutting"] for x in c["collectors"]["per_collector"]} == {"flowlet"}
    assert c["fabric"]["addressing"] == a["fabric"]["addressing"]      # the rest is the seed's


def test_held_out_seeds_draw_from_the_same_distributions():
    """Nothing depends on the seed's value: seeds >= 1000 see every value seeds 0-49 see, at
    similar frequencies, for a few categorical conventions."""
    def freq(seeds, key):
        vals = [flat_values(draw_conventions(s, 256))[key] for s in seeds]
        return {v: vals.count(v) / len(vals) for v in set(vals)}
    for key in ("fabric.addressing", "fabric.routing", "collectors.cutting", "topology.format"):
        lo, hi = freq(range(0, 50), key), freq(range(1000, 1050), key)
        assert set(lo) == set(hi), key
        assert max(abs(lo[v] - hi[v]) for v in lo) < 0.3, (key, lo, hi)


def test_plain_conventions_pin_the_simplest_fleet_and_one_convention_can_be_added(tmp_path):
    from fleetscope.sim import simulate
    from fleetscope.sim.conventions import PLAIN, merge
    from tests.sim.conftest import Fleet

    s = simulate(tmp_path / "plain", gpus=64, seed=4, captures=False, conventions=PLAIN)
    f = Fleet(tmp_path / "plain", s)
    files = f.files()
    assert set(files["format"]) == {"parquet"} and set(files["cutting"]) == {"bucket"}
    assert s["flow_records"] == s["flows_modelled"] + s["background_flows"]       # nothing lost or split
    s2 = simulate(tmp_path / "flowlet", gpus=64, seed=4, captures=False,
                  conventions=merge(PLAIN, {"collectors": {"cutting": "flowlet", "flowlet_idle_ns": 5_000_000}}))
    f2 = Fleet(tmp_path / "flowlet", s2)
    assert set(f2.files()["cutting"]) == {"flowlet"} and s2["flow_records"] < s["flow_records"]
    # the same fleet underneath
    assert f.truth("pairs").equals(f2.truth("pairs")) and f.truth("steps").equals(f2.truth("steps"))
