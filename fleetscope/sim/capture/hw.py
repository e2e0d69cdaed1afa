"""NVML-style GPU samples (docs/CONTRACT.md 1.5) whose clocks, throttle reasons, utilization and link
throughput match the faults: a throttled GPU runs a lower SM clock with the NVML thermal / power
throttle bits set and lower SM utilization; a GPU whose NVLink is down moves its intra-host traffic
over PCIe (NVLink zero, PCIe up). Vectorized over (gpu x sample)."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import polars as pl

from fleetscope.schemas.base import conform
from fleetscope.sim.capture.faults import DEFAULT_MAGNITUDE, _as_list
from fleetscope.sim.capture.schemas import HW_OUT

# NVML clocks-event (throttle) reason bits
GPU_IDLE = 0x1
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
SW_THERMAL = 0x20
HW_THERMAL = 0x40
HW_POWER_BRAKE = 0x80

SM_CLOCK_MAX = 1980.0
POWER_LIMIT = 700.0


def _target_mask(fault: dict, gpus: pl.DataFrame) -> np.ndarray:
    names = set(_as_list(fault.get("subject"))) | set(_as_list(fault.get("ips"))) | set(_as_list(fault.get("hosts")))
    mask = np.zeros(gpus.height, bool)
    for col in ("ip", "gpu", "host", "rack"):
        if col in gpus.columns:
            mask |= gpus[col].cast(pl.Utf8).is_in(list(names)).to_numpy()
    return mask


def hw_frame(gpus: pl.DataFrame, faults: list[dict], start_ns: int, end_ns: int, seed: int,
             period_ns: int = 1_000_000_000, activity: pl.DataFrame | None = None) -> pl.DataFrame:
    """activity (optional): per-gpu busy intervals (gpu, start_ns, end_ns, resource in compute|nvlink|pcie|nic,
    bytes) from a simulated capture; with it, utilization and link throughput follow what the GPU ran."""
    for c in ("host", "gpu"):
        if c not in gpus.columns:
            raise ValueError(f"render_hw: gpus frame needs columns host, gpu (and ip); missing {c!r}")
    if end_ns <= start_ns or period_ns <= 0:
        raise ValueError(f"render_hw: empty window [{start_ns}, {end_ns}) or period {period_ns}")
    rng = np.random.default_rng([seed, 15])
    G = gpus.height
    ts = np.arange(start_ns, end_ns, period_ns, dtype=np.int64)
    T = len(ts)
    gi = np.repeat(np.arange(G), T)
    tt = np.tile(ts, G)
    n = G * T
    clock = np.minimum(SM_CLOCK_MAX, 1965.0 + rng.normal(0, 12, n))
    util = np.clip(rng.normal(95, 2.5, n), 0, 100)
    power = np.clip(rng.normal(610, 25, n), 80, POWER_LIMIT)
    temp = rng.normal(62, 3, n)
    reasons = np.zeros(n, np.int64)
    pcie = np.abs(rng.normal(2.0e9, 0.4e9, n))
    nvl = np.abs(rng.normal(90e9, 12e9, n))
    nic = np.abs(rng.normal(30e9, 5e9, n))
    slow = np.ones(n)
    if activity is not None and activity.height:
        busy = _busy_fraction(activity, gpus["gpu"].to_list(), ts, period_ns)
        util = np.clip(100 * busy["compute"].reshape(-1) + rng.normal(0, 1.0, n), 0, 100)
        nvl = busy["nvlink_bps"].reshape(-1) * np.exp(rng.normal(0, 0.03, n))
        pcie = np.maximum(pcie * 0.5, busy["pcie_bps"].reshape(-1))
        nic = busy["nic_bps"].reshape(-1) * np.exp(rng.normal(0, 0.03, n))
        power = np.clip(120 + 5.2 * util + rng.normal(0, 10, n), 80, POWER_LIMIT)
    for f in faults:
        kind = str(f.get("kind", ""))
        if kind not in ("slow_gpu", "throttled_racks", "nvlink_down"):
            continue
        m = _target_mask(f, gpus)[gi]
        fs, fe = f.get("start_ns"), f.get("end_ns")
        if fs is not None and fe is not None:
            m &= (tt >= int(fs)) & (tt < int(fe))
        if not m.any():
            continue
        mag = f.get("magnitude")
        mag = DEFAULT_MAGNITUDE[kind] if mag is None or (isinstance(mag, float) and np.isnan(mag)) else float(mag)
        if kind in ("slow_gpu", "throttled_racks"):
            slow[m] = np.maximum(slow[m], max(mag, 1.0))
            if kind == "slow_gpu":
                reasons[m] |= HW_THERMAL | SW_THERMAL
                temp[m] = rng.normal(88, 1.5, m.sum())
            else:
                reasons[m] |= HW_SLOWDOWN | HW_POWER_BRAKE
                power[m] = np.minimum(power[m], rng.normal(420, 20, m.sum()))
            # a throttled GPU is busy longer but gets less done per cycle: lower SM activity per sample
            util[m] = np.clip(util[m] * 0.78, 0, 100)
        else:
            pcie[m] = np.abs(rng.normal(19e9, 1.5e9, m.sum())) + nvl[m] * 0.02
            nvl[m] = 0.0
    clock = np.where(slow > 1, SM_CLOCK_MAX / slow + rng.normal(0, 8, n), clock)
    df = pl.DataFrame({
        "ts_ns": tt, "host": gpus["host"].cast(pl.Utf8).to_numpy()[gi], "gpu": gpus["gpu"].cast(pl.Utf8).to_numpy()[gi],
        "sm_clock_mhz": np.round(clock, 0), "sm_clock_max_mhz": np.full(n, SM_CLOCK_MAX), "power_w": np.round(power, 1),
        "power_limit_w": np.full(n, POWER_LIMIT), "temp_c": np.round(temp, 1), "util_gpu_pct": np.round(util, 1),
        "util_mem_pct": np.round(np.clip(util * 0.55 + rng.normal(0, 3, n), 0, 100), 1), "throttle_reasons": reasons,
        "pcie_tx_bps": pcie, "pcie_rx_bps": pcie * np.exp(rng.normal(0, 0.02, n)),
        "nvlink_tx_bps": nvl, "nvlink_rx_bps": nvl * np.exp(rng.normal(0, 0.02, n)),
        "nic_tx_bps": nic, "nic_rx_bps": nic * np.exp(rng.normal(0, 0.02, n)),
    })
    return HW_OUT.validate(conform(df, HW_OUT))


def _busy_fraction(act: pl.DataFrame, gpu_order: list[str], ts: np.ndarray, period: int) -> dict[str, np.ndarray]:
    """Share of each sample period each resource was busy, and bytes/s moved, per (gpu, sample)."""
    G, T = len(gpu_order), len(ts)
    gidx = {g: i for i, g in enumerate(gpu_order)}
    out = {"compute": np.zeros((G, T)), "nvlink_bps": np.zeros((G, T)), "pcie_bps": np.zeros((G, T)), "nic_bps": np.zeros((G, T))}
    a = act.filter(pl.col("gpu").is_in(gpu_order))
    if a.height == 0:
        return out
    g = np.array([gidx[x] for x in a["gpu"].to_list()])
    s = a["start_ns"].to_numpy().astype(np.int64)
    e = a["end_ns"].to_numpy().astype(np.int64)
    res = a["resource"].to_numpy()
    nbytes = a["bytes"].fill_null(0).to_numpy().astype(float)
    t0 = ts[0]
    # split each interval over the sample bins it covers (intervals are short: a few bins at most)
    b0 = np.clip((s - t0) // period, 0, T - 1)
    b1 = np.clip((e - 1 - t0) // period, 0, T - 1)
    nb = (b1 - b0 + 1).astype(np.int64)
    rep = np.repeat(np.arange(len(s)), nb)
    off = np.arange(nb.sum()) - np.repeat(np.cumsum(nb) - nb, nb)
    b = b0[rep] + off
    lo = np.maximum(s[rep], t0 + b * period)
    hi = np.minimum(e[rep], t0 + (b + 1) * period)
    ov = np.maximum(hi - lo, 0).astype(float)
    dur = np.maximum(e - s, 1).astype(float)[rep]
    for key, mask in (("compute", res[rep] == "compute"),):
        np.add.at(out[key], (g[rep][mask], b[mask]), ov[mask] / period)
    for key, r in (("nvlink_bps", "nvlink"), ("pcie_bps", "pcie"), ("nic_bps", "nic")):
        mask = res[rep] == r
        np.add.at(out[key], (g[rep][mask], b[mask]), nbytes[rep][mask] * ov[mask] / dur[mask] / (period / 1e9))
    out["compute"] = np.clip(out["compute"], 0, 1)
    return out


def render_hw(landing_dir: Path, gpus: pl.DataFrame, faults: list[dict], start_ns: int, end_ns: int, seed: int,
              period_ns: int = 1_000_000_000, activity: pl.DataFrame | None = None, name: str | None = None) -> Path:
    df = hw_frame(gpus, faults, start_ns, end_ns, seed, period_ns, activity)
    d = Path(landing_dir) / "hw"
    d.mkdir(parents=True, exist_ok=True)
    path = d / (name or f"hw-{start_ns}-{seed}.parquet")
    tmp = path.with_name("." + path.name + ".tmp")
    df.write_parquet(tmp)
    os.replace(tmp, path)
    return path
