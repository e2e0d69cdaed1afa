"""Rail-optimized leaf/spine fabric of the simulated fleet.

Hosts of 8 GPUs, one RDMA NIC (one ip) per GPU. GPU i of every host sits on rail i; a leaf per rail
per group of hosts; spines above. Traffic between NICs under one leaf crosses that leaf only;
otherwise it goes up through the source leaf's uplink spine (static, so the topology's `spine`
column is exactly the spine that leaf's outbound flows cross) and down to the destination leaf.

Endpoints are integers: GPU NICs 0..G-1, then out-of-topology background servers (storage,
monitoring). Switches are integers too; names are looked up only when rendering.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

GPUS_PER_HOST = 8
HOSTS_PER_RACK = 2
HOSTS_PER_POD = 128


@dataclass
class Fabric:
    n_gpus: int
    n_hosts: int
    hosts_per_leaf: int
    n_groups: int
    n_spines: int
    # per endpoint (GPUs then background servers)
    ip: np.ndarray          # str
    leaf: np.ndarray        # int switch id
    host_idx: np.ndarray    # int (-1 for background)
    # per switch id
    switch_name: np.ndarray  # str
    n_bg: int

    # ---- GPU-level helpers -------------------------------------------------------------------
    @property
    def host_name(self) -> np.ndarray:
        return np.array([f"h{h:04d}" for h in range(self.n_hosts)])

    def gpu_name(self) -> np.ndarray:
        h = np.arange(self.n_gpus) // GPUS_PER_HOST
        g = np.arange(self.n_gpus) % GPUS_PER_HOST
        return np.array([f"h{a:04d}/gpu{b}" for a, b in zip(h, g)])

    def rack_of_host(self, h) -> np.ndarray:
        return np.asarray(h) // HOSTS_PER_RACK

    def spine_of_leaf(self, leaf: np.ndarray) -> np.ndarray:
        return self.first_spine_id + (np.asarray(leaf) % self.n_spines)

    @property
    def first_spine_id(self) -> int:
        return len(self.switch_name) - self.n_spines

    def path_switches(self, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(leaf_src, spine or -1, leaf_dst or -1) switch ids per flow, vectorized."""
        ls, ld = self.leaf[src], self.leaf[dst]
        same = ls == ld
        sp = np.where(same, -1, self.spine_of_leaf(ls))
        return ls, sp, np.where(same, -1, ld)

    def collector_of(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """ERSPAN collector that mirrors a flow: the one serving the ingress leaf (source leaf for GPU
        senders, destination leaf for background senders). One collector per 8 leaf groups x 2 rails."""
        ep = np.where(self.host_idx[src] >= 0, src, dst)
        h = self.host_idx[ep]
        rail = ep % GPUS_PER_HOST
        return (h // self.hosts_per_leaf // 8) * 4 + rail // 2

    def n_collectors(self) -> int:
        return ((self.n_groups + 7) // 8) * 4

    def topology(self) -> pl.DataFrame:
        """docs/CONTRACT.md 1.1 topology rows, one per GPU NIC."""
        g = np.arange(self.n_gpus)
        h = g // GPUS_PER_HOST
        hosts = self.host_name
        leaf = self.leaf[: self.n_gpus]
        return pl.DataFrame({
            "ip": self.ip[: self.n_gpus],
            "host": hosts[h],
            "gpu": self.gpu_name(),
            "leaf": self.switch_name[leaf],
            "spine": self.switch_name[self.spine_of_leaf(leaf)],
            "rail": (g % GPUS_PER_HOST).astype(np.int64),
            "rack": np.array([f"rack{r:03d}" for r in range(self.rack_of_host(self.n_hosts - 1) + 1)])[self.rack_of_host(h)],
            "pod": np.array([f"pod{p}" for p in range(h.max() // HOSTS_PER_POD + 1)])[h // HOSTS_PER_POD],
        })


def build_fabric(n_gpus: int, n_storage: int | None = None, n_monitors: int = 2) -> Fabric:
    if n_gpus <= 0 or n_gpus % GPUS_PER_HOST:
        raise ValueError(f"gpus must be a positive multiple of {GPUS_PER_HOST} (hosts of 8 GPUs), got {n_gpus}")
    n_hosts = n_gpus // GPUS_PER_HOST
    hosts_per_leaf = 2 if n_hosts <= 16 else (4 if n_hosts <= 64 else 16)
    n_groups = (n_hosts + hosts_per_leaf - 1) // hosts_per_leaf
    n_spines = 4 if n_hosts <= 64 else 16
    n_storage = n_storage if n_storage is not None else max(2, n_hosts // 32)
    n_bg = n_storage + n_monitors

    g = np.arange(n_gpus)
    h = g // GPUS_PER_HOST
    rail = g % GPUS_PER_HOST
    pod, hin = h // HOSTS_PER_POD, h % HOSTS_PER_POD
    gpu_ip = np.char.add(np.char.add(np.char.add(np.char.add("10.", pod.astype(str)), "."),
                                     np.char.add(hin.astype(str), ".")), (rail + 1).astype(str))
    bg = np.arange(n_bg)
    bg_ip = np.array([f"172.20.{i // 250}.{i % 250 + 1}" for i in bg[:n_storage]]
                     + [f"172.31.0.{i + 1}" for i in range(n_monitors)])
    n_leaf = n_groups * GPUS_PER_HOST
    n_bg_leaf = 2
    leaf_gpu = (h // hosts_per_leaf) * GPUS_PER_HOST + rail
    leaf_bg = n_leaf + (bg % n_bg_leaf)
    names = ([f"leaf-{grp:03d}-r{r}" for grp in range(n_groups) for r in range(GPUS_PER_HOST)]
             + [f"leaf-svc-{i}" for i in range(n_bg_leaf)]
             + [f"spine-{s:02d}" for s in range(n_spines)])
    return Fabric(
        n_gpus=n_gpus, n_hosts=n_hosts, hosts_per_leaf=hosts_per_leaf, n_groups=n_groups, n_spines=n_spines,
        ip=np.concatenate([gpu_ip.astype(object), bg_ip.astype(object)]).astype(str),
        leaf=np.concatenate([leaf_gpu, leaf_bg]).astype(np.int64),
        host_idx=np.concatenate([h, -np.ones(n_bg, dtype=np.int64)]).astype(np.int64),
        switch_name=np.array(names), n_bg=n_bg,
    )
