"""The recorder for real: a short healthy recording end to end, and the two fault elements a
kernel without netem needs (tbf rate limit, NFQUEUE delay) measured on a live link. Needs root,
network namespaces, tcpdump, ethtool, iptables; skips saying which is missing."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time

import polars as pl
import pytest

from tests.paths import REPO
from tests.recorder.validate import check_recording

pytestmark = [pytest.mark.netns, pytest.mark.slow, pytest.mark.torch]


def _need(*tools: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to create network namespaces")
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        pytest.skip(f"missing {missing} (apt-get install -y tcpdump ethtool iptables iproute2)")


def _namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def test_short_healthy_recording_end_to_end(tmp_path):
    _need("ip", "tcpdump", "ethtool", "tc")
    pytest.importorskip("torch")
    out = tmp_path / "rec"
    p = subprocess.run([sys.executable, "-m", "fleetscope.collectors.recorder", "--scenario", "healthy", "--seconds", "15",
                        "--seed", "3", "--out", str(out)], capture_output=True, text=True, cwd=REPO, timeout=400)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    d = check_recording(out)
    assert not list(out.rglob("*.pcap")), "the pcaps are deleted once converted"
    # everything the recorder created is gone: namespaces carry their recorder's pid, and no
    # namespace may outlive its recorder (others may be recording at the same time)
    leaked = [m.group(0) for m in re.finditer(r"fsrec(\d+)-\S+", _namespaces()) if not os.path.exists(f"/proc/{m.group(1)}")]
    assert not leaked, leaked

    # per-pair traffic matches the truth's job membership: the DP and PP pairs carry the jobs'
    # bytes, a job's other pairs only gloo's control messages, and no pair crosses jobs
    fl = d["flows"].with_columns(ip_a=pl.min_horizontal("src_ip", "dst_ip"), ip_b=pl.max_horizontal("src_ip", "dst_ip"))
    by = fl.group_by("ip_a", "ip_b").agg(b=pl.col("bytes").sum())
    truth = pl.concat([d["pairs"].select("ip_a", "ip_b", "job_id", "comm_type"),
                       d["other"].select("ip_a", "ip_b", "job_id", "comm_type")])
    bg = set(d["background"]["ip"])
    m = by.join(truth, on=["ip_a", "ip_b"], how="left")
    unknown = m.filter(pl.col("job_id").is_null() & ~pl.col("ip_a").is_in(bg) & ~pl.col("ip_b").is_in(bg))
    assert unknown.height == 0, unknown
    for job_id, g in m.filter(pl.col("job_id").is_not_null()).group_by("job_id"):
        dp_pp = g.filter(pl.col("comm_type") != "other")["b"]
        other = g.filter(pl.col("comm_type") == "other")["b"]
        assert dp_pp.len() >= 1 and dp_pp.min() > 1_000_000, (job_id, g)
        if other.len():
            assert other.max() * 20 < dp_pp.min(), (job_id, g)
    # the infrastructure server's traffic is there too (checkpoint store, probes), never to a job's pair
    assert fl.filter(pl.col("src_ip").is_in(bg) | pl.col("dst_ip").is_in(bg)).height > 0


def test_fault_elements_rate_limit_and_delay_on_a_live_link():
    """tbf and the NFQUEUE delay client as the slow_link scenario uses them, on a two-host fabric:
    the round trip grows by twice the delay (both directions), a bulk transfer runs at the rate."""
    _need("ip", "ethtool", "tc", "iptables")
    from fleetscope.collectors.recorder.fabric import Fabric, Host

    fab = Fabric([Host("a", "10.201.0.1", "leaf1"), Host("b", "10.201.0.2", "leaf1")], ["leaf1"], "spine1")
    procs = []
    probe = ("import socket,sys,time\n"
             "s=socket.create_connection(('10.201.0.2',9000));s.setsockopt(socket.IPPROTO_TCP,socket.TCP_NODELAY,1)\n"
             "r=[]\n"
             "for _ in range(15):\n"
             "    t=time.perf_counter();s.sendall(b'x');s.recv(1);r.append(time.perf_counter()-t);time.sleep(0.02)\n"
             "t=time.perf_counter();s.sendall(b'B'+bytes(3_000_000));s.recv(1);bulk=time.perf_counter()-t\n"
             "r.sort();print(r[len(r)//2],bulk)\n")
    server = ("import socket\n"
              "l=socket.socket();l.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);l.bind(('0.0.0.0',9000));l.listen()\n"
              "while True:\n"
              "    c,_=l.accept();c.setsockopt(socket.IPPROTO_TCP,socket.TCP_NODELAY,1)\n"
              "    while True:\n"
              "        b=c.recv(1)\n"
              "        if not b: break\n"
              "        if b==b'B':\n"
              "            n=3_000_000\n"
              "            while n>0: n-=len(c.recv(min(n,1<<20)))\n"
              "        c.sendall(b'k')\n")

    def measure():
        p = subprocess.run(["ip", "netns", "exec", fab.hosts[0].ns, sys.executable, "-c", probe],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        rtt, bulk = map(float, p.stdout.split())
        return rtt, bulk

    try:
        fab.up()
        procs.append(subprocess.Popen(["ip", "netns", "exec", fab.hosts[1].ns, sys.executable, "-c", server]))
        procs.append(subprocess.Popen(["ip", "netns", "exec", fab.sw, sys.executable, "-m",
                                       "fleetscope.collectors.recorder.nfqdelay", "--queue", "0", "--delay-ms", "10"],
                                      stdout=subprocess.PIPE, text=True))
        assert procs[1].stdout.readline().strip() == "ready"
        time.sleep(0.3)
        rtt0, bulk0 = measure()
        h = fab.hosts[0]
        fab.delay_rules(h.port, 0, add=True)
        fab.tbf(h.ns, "eth0", 40e6)
        fab.tbf(fab.sw, h.port, 40e6)
        rtt1, bulk1 = measure()
        fab.delay_rules(h.port, 0, add=False)
        fab.untbf(h.ns, "eth0")
        fab.untbf(fab.sw, h.port)
        rtt2, _ = measure()
    finally:
        for p in procs:
            p.kill()
        fab.down()
    assert rtt0 < 0.008 and rtt2 < 0.008, (rtt0, rtt2)
    assert 0.019 < rtt1 - rtt0 < 0.045, (rtt0, rtt1)      # +2 x 10 ms, plus scheduling on a busy box
    assert bulk1 > 0.5 and bulk1 > 5 * bulk0, (bulk0, bulk1)  # 3 MB at 40 Mbit/s: >= 0.6 s
    assert fab.sw not in _namespaces()
