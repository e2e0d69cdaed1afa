"""The emulated fabric: one network namespace per host (its NIC is `eth0`), and every switch a
Linux bridge inside one switch namespace: leaf bridges for the hosts, joined through a spine
bridge by veth uplinks. Keeping the switches in their own namespace keeps their iptables rules,
qdiscs and bridge sysctls away from the machine and from anyone else's namespaces; deleting the
namespaces removes everything. Names carry the recorder's pid (`fsrec<pid>-...`), so concurrent
recorders never collide and a recorder that died can be cleaned up by the next one.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass

PREFIX = "fsrec"


def sh(*cmd: str, ns: str | None = None, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
    full = (["ip", "netns", "exec", ns] if ns else []) + list(cmd)
    p = subprocess.run(full, capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise RuntimeError(f"`{' '.join(full)}` failed ({p.returncode}): {p.stderr.strip()[-500:]}")
    return p


def _ns_pids(ns: str) -> list[int]:
    p = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
    return [int(x) for x in p.stdout.split()] if p.returncode == 0 else []


def delete_namespaces(names: list[str]) -> None:
    """Kill whatever still runs inside (only our own processes live there), then delete."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = [pid for ns in names for pid in _ns_pids(ns)]
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        if pids and sig == signal.SIGTERM:
            time.sleep(1.0)
    for ns in names:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def clean_stale() -> list[str]:
    """Namespaces left by recorders whose process is gone (killed with SIGKILL, machine hiccup)."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    stale = []
    for line in out.splitlines():
        m = re.match(rf"({PREFIX}(\d+)-\S+)", line.strip())
        if m and not os.path.exists(f"/proc/{m.group(2)}"):
            stale.append(m.group(1))
    delete_namespaces(stale)
    return stale


@dataclass
class Host:
    name: str       # emulated host name (topology `host`)
    ip: str
    leaf: str
    ns: str = ""
    port: str = ""  # the switch-side veth of its link
    monitor_ip: str = ""  # infrastructure server only: the prober's second address


class Fabric:
    def __init__(self, hosts: list[Host], leaves: list[str], spine: str, prefix_len: int = 16, tag: str | None = None):
        tag = tag or f"{PREFIX}{os.getpid()}"
        self.sw = f"{tag}-sw"
        self.hosts, self.leaves, self.spine, self.plen = hosts, leaves, spine, prefix_len
        for i, h in enumerate(hosts):
            h.ns, h.port = f"{tag}-h{i}", f"p{i}"
        self.namespaces = [self.sw] + [h.ns for h in hosts]

    def uplink(self, leaf: str) -> str:
        """The spine's port toward `leaf` (its egress carries traffic into that leaf)."""
        return f"d-{leaf}"[:15]

    def up(self) -> None:
        sw = self.sw
        sh("ip", "netns", "add", sw)
        self._quiet(sw)
        for br in self.leaves + [self.spine]:
            sh("ip", "-n", sw, "link", "add", br, "type", "bridge", "stp_state", "0")
            sh("ip", "-n", sw, "link", "set", br, "up")
        for leaf in self.leaves:
            up, down = f"u-{leaf}"[:15], self.uplink(leaf)
            sh("ip", "-n", sw, "link", "add", up, "type", "veth", "peer", "name", down)
            sh("ip", "-n", sw, "link", "set", up, "master", leaf)
            sh("ip", "-n", sw, "link", "set", down, "master", self.spine)
            for d in (up, down):
                self._offloads_off(sw, d)
                sh("ip", "-n", sw, "link", "set", d, "up")
        for h in self.hosts:
            sh("ip", "netns", "add", h.ns)
            self._quiet(h.ns)
            sh("ip", "-n", sw, "link", "add", h.port, "type", "veth", "peer", "name", "eth0", "netns", h.ns)
            sh("ip", "-n", sw, "link", "set", h.port, "master", h.leaf)
            self._offloads_off(sw, h.port)
            self._offloads_off(h.ns, "eth0")
            sh("ip", "-n", sw, "link", "set", h.port, "up")
            sh("ip", "-n", h.ns, "addr", "add", f"{h.ip}/{self.plen}", "dev", "eth0")
            sh("ip", "-n", h.ns, "link", "set", "eth0", "up")
            sh("ip", "-n", h.ns, "link", "set", "lo", "up")

    @staticmethod
    def _quiet(ns: str) -> None:
        # no IPv6 (router solicitations, MLD): the capture should hold what the jobs send
        sh("sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1", ns=ns, check=False)

    @staticmethod
    def _offloads_off(ns: str, dev: str) -> None:
        # without this the bridge carries 64 KB TSO/GRO super-packets instead of MTU frames
        sh("ethtool", "-K", dev, "tso", "off", "gso", "off", "gro", "off", ns=ns)

    def add_address(self, ns: str, ip: str) -> None:
        sh("ip", "-n", ns, "addr", "add", f"{ip}/{self.plen}", "dev", "eth0")

    # -- faults ------------------------------------------------------------------------------
    @staticmethod
    def tbf(ns: str, dev: str, rate_bps: float) -> None:
        """Rate-limit a device's egress (token bucket; the kernel has no netem)."""
        burst = max(32_000, int(rate_bps / 8 / 250))
        sh("tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{int(rate_bps)}bit", "burst", str(burst),
           "latency", "200ms", ns=ns)

    @staticmethod
    def untbf(ns: str, dev: str) -> None:
        sh("tc", "qdisc", "del", "dev", dev, "root", ns=ns, check=False)

    def delay_rules(self, port: str, queue: int, add: bool) -> None:
        """Send every frame entering or leaving the switch through `port` to the delay queue
        (bridge FORWARD hook: on the host's OUTPUT chain TCP Small Queues would cap the rate)."""
        if add:
            # the bridge hands frames to iptables only with this (set inside the switch namespace)
            sh("sysctl", "-q", "-w", "net.bridge.bridge-nf-call-iptables=1", ns=self.sw, check=False)
        op = "-A" if add else "-D"
        for match in (["--physdev-in", port], ["--physdev-out", port, "--physdev-is-bridged"]):
            sh("iptables", op, "FORWARD", "-m", "physdev", *match, "-j", "NFQUEUE", "--queue-num", str(queue),
               "--queue-bypass", ns=self.sw, check=add)

    def down(self) -> None:
        delete_namespaces(self.namespaces)
