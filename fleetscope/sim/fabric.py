"""Rail-optimized leaf/spine fabric of the simulated fleet, with per-seed naming and routing.

Hosts of 8 GPUs, one RDMA NIC (one ip) per GPU. GPU i of every host sits on rail i; a leaf per rail
per group of hosts (hosts_per_leaf drawn per seed); spines above. Traffic between NICs under one
leaf crosses that leaf only; otherwise it goes up to a spine and down to the destination leaf. The
spine is either pinned per source leaf (`static`: the topology's spine column is exact) or chosen
per 5-tuple by ECMP hashing (`ecmp`: different queue pairs of one ring hop cross different spines,
and the topology has no spine column).

Addresses, host names and switch names follow one of several real-world schemes per seed, so that
nothing (a host, a rail, a job) can be read from an address pattern: only the topology says which
host an ip belongs to.

Endpoints are integers: GPU NICs 0..G-1, then service servers (storage, then monitoring). Switches
are integers too; names are looked up only when rendering.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass

import numpy as np
import polars as pl

GPUS_PER_HOST = 8
HOSTS_PER_RACK = 2
HOSTS_PER_POD = 128
GPU_MODEL = "H100-SXM5-80GB"
NIC_BW = 42.5e9          # achievable bytes/s per 400 Gb/s RDMA NIC and direction


def mix(*xs) -> np.ndarray:
    """A vectorized 64-bit hash of integer arrays (splitmix-style), broadcast to a common shape."""
    arrs = np.broadcast_arrays(*[np.asarray(x) for x in xs])
    h = np.zeros(arrs[0].shape, np.uint64)
    for i, x in enumerate(arrs):
        x = x.astype(np.int64).astype(np.uint64)
        h = (h ^ (x + np.uint64(0x9E3779B97F4A7C15 + i))) * np.uint64(0xBF58476D1CE4E5B9)
        h ^= h >> np.uint64(31)
        h = h * np.uint64(0x94D049BB133111EB)
        h ^= h >> np.uint64(29)
    return h


def flow_hash(src, dst, ch, qp, kind) -> np.ndarray:
    """Identity of one queue pair's flow (its 5-tuple): ports, QP numbers and ECMP spines derive from it."""
    return mix(src, dst, ch, qp, kind)


@dataclass
class Fabric:
    n_gpus: int
    n_hosts: int
    hosts_per_leaf: int
    n_groups: int
    n_spines: int
    routing: str
    # per endpoint (GPUs then service servers)
    ip: np.ndarray           # str
    leaf: np.ndarray         # int switch id
    host_idx: np.ndarray     # int (-1 for service servers)
    # per host / per service server
    host_names: np.ndarray
    service_names: np.ndarray
    service_role: np.ndarray   # storage | monitoring
    # per switch id
    switch_name: np.ndarray
    n_storage: int
    n_monitors: int
    collector_of_leaf: np.ndarray
    n_coll: int
    mirror: str
    seed: int

    @property
    def n_bg(self) -> int:
        return self.n_storage + self.n_monitors

    @property
    def host_name(self) -> np.ndarray:
        return self.host_names

    def gpu_name(self) -> np.ndarray:
        g = np.arange(self.n_gpus)
        return np.char.add(np.char.add(self.host_names[g // GPUS_PER_HOST], "/gpu"), (g % GPUS_PER_HOST).astype(str))

    def rack_of_host(self, h) -> np.ndarray:
        return np.asarray(h) // HOSTS_PER_RACK

    @property
    def first_spine_id(self) -> int:
        return len(self.switch_name) - self.n_spines

    def spine_of_leaf(self, leaf: np.ndarray) -> np.ndarray:
        """Static routing: the spine a leaf's outbound flows cross."""
        return self.first_spine_id + (np.asarray(leaf) % self.n_spines)

    def path_switches(self, src: np.ndarray, dst: np.ndarray, fhash: np.ndarray | None = None
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(leaf_src, spine or -1, leaf_dst or -1) switch ids per flow, vectorized. fhash: the flow's
        5-tuple hash (ECMP routing picks the spine from it)."""
        src, dst = np.asarray(src), np.asarray(dst)
        ls, ld = self.leaf[src], self.leaf[dst]
        same = ls == ld
        if self.routing == "ecmp" and fhash is not None:
            sp = self.first_spine_id + (np.asarray(fhash) >> np.uint64(7)) % np.uint64(self.n_spines)
            sp = sp.astype(np.int64)
        else:
            sp = self.spine_of_leaf(ls)
        return ls, np.where(same, -1, sp), np.where(same, -1, ld)

    def collectors_of(self, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """ERSPAN collector mirroring a flow at its ingress leaf (the sender's), and with mirror=both
        also at its egress leaf (-1 when not mirrored twice)."""
        a = self.collector_of_leaf[self.leaf[src]]
        if self.mirror == "both":
            return a, self.collector_of_leaf[self.leaf[dst]]
        return a, np.full(a.shape, -1, a.dtype)

    def topology(self, service_hosts: bool = False) -> pl.DataFrame:
        """CONTRACT 1.1 topology rows, one per GPU NIC (and per service server when listed), with
        every column the fleet knows; the renderer drops and adds columns per its dialect."""
        g = np.arange(self.n_gpus)
        h = g // GPUS_PER_HOST
        leaf = self.leaf[: self.n_gpus]
        rng = np.random.default_rng([self.seed, 61])
        racks = self.rack_of_host(h)
        df = pl.DataFrame({
            "ip": self.ip[: self.n_gpus],
            "host": self.host_names[h],
            "gpu": self.gpu_name(),
            "leaf": self.switch_name[leaf],
            "spine": self.switch_name[self.spine_of_leaf(leaf)],
            "rail": (g % GPUS_PER_HOST).astype(np.int64),
            "rack": np.char.add("rack", np.char.zfill(racks.astype(str), 3)),
            "pod": np.char.add("pod", (h // HOSTS_PER_POD).astype(str)),
            "serial": np.char.add("SN", np.char.zfill(rng.integers(0, 10**8, self.n_gpus).astype(str), 8)),
            "nic": np.char.add("mlx5_", (g % GPUS_PER_HOST).astype(str)),
            "mac": _macs(rng, self.n_gpus),
            "status": np.full(self.n_gpus, "up"),
            "switch_port": np.char.add("Ethernet1/", (h % self.hosts_per_leaf + 1).astype(str)),
            "asset_tag": np.char.add("AT-", np.char.zfill((h * 7919 % 100000).astype(str), 5)),
            "gpu_model": np.full(self.n_gpus, GPU_MODEL),
            "os_image": np.full(self.n_gpus, "ubuntu-22.04-cuda12.4"),
        })
        if service_hosts and self.n_bg:
            s = np.arange(self.n_bg)
            ep = self.n_gpus + s
            sl = self.leaf[ep]
            svc = pl.DataFrame({
                "ip": self.ip[ep], "host": self.service_names, "gpu": pl.Series([None] * self.n_bg, dtype=pl.Utf8),
                "leaf": self.switch_name[sl], "spine": self.switch_name[self.spine_of_leaf(sl)],
                "rail": pl.Series([None] * self.n_bg, dtype=pl.Int64),
                "rack": np.full(self.n_bg, "rack-svc"), "pod": np.full(self.n_bg, "pod-svc"),
                "serial": np.char.add("SN", np.char.zfill(rng.integers(0, 10**8, self.n_bg).astype(str), 8)),
                "nic": np.full(self.n_bg, "mlx5_0"), "mac": _macs(rng, self.n_bg), "status": np.full(self.n_bg, "up"),
                "switch_port": np.char.add("Ethernet1/", (s + 1).astype(str)),
                "asset_tag": np.char.add("AT-S", s.astype(str)),
                "gpu_model": pl.Series([None] * self.n_bg, dtype=pl.Utf8),
                "os_image": np.full(self.n_bg, "storage-os-7"),
            })
            df = pl.concat([df, svc], how="vertical_relaxed")
        return df


def _macs(rng, n) -> np.ndarray:
    out = np.full(n, "b8:ce:f6")
    for col in rng.integers(0, 256, (3, n)):
        out = np.char.add(np.char.add(out, ":"), np.char.mod("%02x", col))
    return out


def _ipv4(a, b, c, d) -> np.ndarray:
    s = np.char.add(np.char.add(np.asarray(a).astype(str), "."), np.asarray(b).astype(str))
    s = np.char.add(np.char.add(s, "."), np.asarray(c).astype(str))
    return np.char.add(np.char.add(s, "."), np.asarray(d).astype(str))


def _gpu_ips(scheme: str, n_gpus: int, rng: np.random.Generator) -> np.ndarray:
    g = np.arange(n_gpus)
    h, rail = g // GPUS_PER_HOST, g % GPUS_PER_HOST
    if scheme == "pod_host_rail":          # 10.<pod>.<host in pod>.<rail+1>: the host is in the prefix
        return _ipv4(10, h // HOSTS_PER_POD, h % HOSTS_PER_POD, rail + 1)
    if scheme == "rail_subnet":            # one L3 subnet per rail: a host's NICs share no prefix
        return _ipv4(10, 64 + rail, h // 250, h % 250 + 1)
    if scheme == "shuffled":               # DHCP-style pool in no particular order
        k = rng.permutation(n_gpus)
        return _ipv4(10, 200 + k // 62500, (k // 250) % 250, k % 250 + 1)
    if scheme == "ipv6":                   # per-rail /64s, written in RFC 5952 canonical form
        return np.array([ipaddress.IPv6Address(f"fd00:a{r:x}:{hh >> 8:x}::{(hh & 255) + 1:x}").compressed
                         for hh, r in zip(h.tolist(), rail.tolist())])
    raise ValueError(f"unknown addressing scheme {scheme!r}")


def _host_names(scheme: str, n_hosts: int, rng: np.random.Generator) -> np.ndarray:
    h = np.arange(n_hosts)
    if scheme == "short":
        return np.char.add("h", np.char.zfill(h.astype(str), 4))
    if scheme == "rack_slot":
        return np.char.add(np.char.add(np.char.add("gpu-r", np.char.zfill((h // HOSTS_PER_RACK).astype(str), 3)), "-s"),
                           np.char.zfill((h % HOSTS_PER_RACK + 1).astype(str), 2))
    if scheme == "fqdn":                   # inventory numbers unrelated to the physical position
        k = rng.permutation(n_hosts) + int(rng.integers(100, 900))
        return np.char.add(np.char.add("node", np.char.zfill(k.astype(str), 5)), ".cluster.internal")
    raise ValueError(f"unknown host naming {scheme!r}")


def _switch_names(scheme: str, n_groups: int, n_svc_leaf: int, n_spines: int, rng: np.random.Generator) -> list[str]:
    if scheme == "plain":
        return ([f"leaf-{grp:03d}-r{r}" for grp in range(n_groups) for r in range(GPUS_PER_HOST)]
                + [f"leaf-svc-{i}" for i in range(n_svc_leaf)] + [f"spine-{s:02d}" for s in range(n_spines)])
    if scheme == "tiered":
        return ([f"T1-G{grp:03d}-R{r}" for grp in range(n_groups) for r in range(GPUS_PER_HOST)]
                + [f"T1-SVC{i}" for i in range(n_svc_leaf)] + [f"T2-S{s:02d}" for s in range(n_spines)])
    if scheme == "serial":
        n = n_groups * GPUS_PER_HOST + n_svc_leaf + n_spines
        codes = rng.choice(16 ** 6, size=n, replace=False)
        return [f"sw-{c:06x}" for c in codes]
    raise ValueError(f"unknown switch naming {scheme!r}")


def build_fabric(n_gpus: int, conv: dict | None = None, seed: int = 0) -> Fabric:
    if n_gpus <= 0 or n_gpus % GPUS_PER_HOST:
        raise ValueError(f"gpus must be a positive multiple of {GPUS_PER_HOST} (hosts of 8 GPUs), got {n_gpus}")
    if conv is None:
        from fleetscope.sim.conventions import draw_conventions
        conv = draw_conventions(seed, n_gpus)
    fc, cc = conv["fabric"], conv["collectors"]
    rng = np.random.default_rng([seed, 60])
    n_hosts = n_gpus // GPUS_PER_HOST
    hpl = min(int(fc["hosts_per_leaf"]), max(1, n_hosts))
    n_groups = (n_hosts + hpl - 1) // hpl
    n_spines = int(fc["n_spines"])
    n_storage = max(2, int(round(n_hosts * float(fc["storage_per_host"]))))
    n_monitors = int(fc["n_monitors"])
    n_bg = n_storage + n_monitors

    g = np.arange(n_gpus)
    h, rail = g // GPUS_PER_HOST, g % GPUS_PER_HOST
    gpu_ip = _gpu_ips(fc["addressing"], n_gpus, rng)
    bg = np.arange(n_bg)
    if fc["addressing"] == "ipv6":
        bg_ip = np.array([ipaddress.IPv6Address(f"fd00:ffff::{i + 1:x}").compressed for i in range(n_storage)]
                         + [ipaddress.IPv6Address(f"fd00:fffe::{i + 1:x}").compressed for i in range(n_monitors)])
    else:
        bg_ip = np.concatenate([_ipv4(172, 20, bg[:n_storage] // 250, bg[:n_storage] % 250 + 1),
                                _ipv4(172, 31, 0, np.arange(n_monitors) + 1)])
    n_leaf = n_groups * GPUS_PER_HOST
    n_svc_leaf = 2
    leaf_gpu = (h // hpl) * GPUS_PER_HOST + rail
    leaf_bg = n_leaf + (bg % n_svc_leaf)
    names = _switch_names(fc["switch_naming"], n_groups, n_svc_leaf, n_spines, rng)
    host_names = _host_names(fc["host_naming"], n_hosts, rng)
    if fc["host_naming"] == "fqdn":
        svc_names = np.array([f"stor{i:03d}.cluster.internal" for i in range(n_storage)]
                             + [f"mon{i:02d}.cluster.internal" for i in range(n_monitors)])
    else:
        svc_names = np.array([f"stor-{i:03d}" for i in range(n_storage)] + [f"mon-{i:02d}" for i in range(n_monitors)])
    # which collector mirrors each leaf
    n_coll = int(cc["n"])
    leaf_ids = np.arange(n_leaf + n_svc_leaf)
    grp, lrail = leaf_ids // GPUS_PER_HOST, leaf_ids % GPUS_PER_HOST
    if cc["assignment"] == "leaf_block":
        col = np.minimum(grp * n_coll // max(1, n_groups), n_coll - 1)
    elif cc["assignment"] == "rail":
        col = lrail % n_coll
    else:
        col = (mix(leaf_ids, seed) % np.uint64(n_coll)).astype(np.int64)
    col[n_leaf:] = np.arange(n_svc_leaf) % n_coll
    return Fabric(
        n_gpus=n_gpus, n_hosts=n_hosts, hosts_per_leaf=hpl, n_groups=n_groups, n_spines=n_spines, routing=fc["routing"],
        ip=np.concatenate([gpu_ip.astype(object), bg_ip.astype(object)]).astype(str),
        leaf=np.concatenate([leaf_gpu, leaf_bg]).astype(np.int64),
        host_idx=np.concatenate([h, -np.ones(n_bg, dtype=np.int64)]).astype(np.int64),
        host_names=host_names, service_names=svc_names,
        service_role=np.array(["storage"] * n_storage + ["monitoring"] * n_monitors),
        switch_name=np.array(names), n_storage=n_storage, n_monitors=n_monitors,
        collector_of_leaf=col.astype(np.int64), n_coll=n_coll, mirror=cc["mirror"], seed=seed,
    )
