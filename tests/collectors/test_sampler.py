"""The host sampler's NIC and CPU counters on a real interface: a veth pair between two network
namespaces (named with this process's id; removed afterwards), a known number of bytes sent
across while the sampler runs inside the sender's namespace, as it runs inside a job's host."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

REPO = Path(__file__).resolve().parents[2]
PAYLOAD = 24 << 20


def _sh(*cmd):
    subprocess.run(cmd, check=True, capture_output=True, text=True)


@pytest.fixture()
def veth_pair():
    if os.geteuid() != 0:
        pytest.fail("this test creates network namespaces: run it as root (the recorder's tests need root too)")
    pid = os.getpid()
    a, b = f"fs14a{pid}", f"fs14b{pid}"
    va, vb = f"v{pid}a"[:15], f"v{pid}b"[:15]
    try:
        _sh("ip", "netns", "add", a)
        _sh("ip", "netns", "add", b)
        _sh("ip", "link", "add", va, "type", "veth", "peer", "name", vb)
        _sh("ip", "link", "set", va, "netns", a)
        _sh("ip", "link", "set", vb, "netns", b)
        _sh("ip", "-n", a, "addr", "add", "10.214.0.1/24", "dev", va)
        _sh("ip", "-n", b, "addr", "add", "10.214.0.2/24", "dev", vb)
        for ns, v in ((a, va), (b, vb)):
            _sh("ip", "-n", ns, "link", "set", v, "up")
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
        yield a, b, va
    finally:
        for ns in (a, b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


SERVER = "import socket;s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);s.bind(('10.214.0.2',7171));s.listen();c,_=s.accept()\nn=0\nwhile True:\n d=c.recv(1<<20)\n if not d: break\n n+=len(d)\nprint(n)"
CLIENT = f"import socket,time;time.sleep(1.0);c=socket.create_connection(('10.214.0.2',7171));c.sendall(b'x'*{PAYLOAD});c.close()"


def test_nic_counters_measure_the_bytes_sent(veth_pair, tmp_path):
    a, b, va = veth_pair
    srv = subprocess.Popen(["ip", "netns", "exec", b, sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    time.sleep(0.5)
    samp = subprocess.Popen(["ip", "netns", "exec", a, sys.executable, "-m", "fleetscope.collectors.nvml_sampler",
                             "--landing", str(tmp_path), "--duration-s", "4", "--rate-hz", "50", "--no-nvml", "--host", "h-a"],
                            cwd=REPO, stdout=subprocess.PIPE, text=True)
    subprocess.run(["ip", "netns", "exec", a, sys.executable, "-c", CLIENT], check=True, timeout=60)
    out, _ = samp.communicate(timeout=60)
    got, _ = srv.communicate(timeout=60)
    assert int(got) == PAYLOAD
    assert f"NICs ['{va}']" in out
    hw = pl.read_parquet(tmp_path / "hw" / "*.parquet").sort("ts_ns")
    assert hw["gpu"].unique().to_list() == ["h-a/cpu"] and hw["host"].unique().to_list() == ["h-a"]
    # bytes/s integrated over the sample intervals = the bytes on the wire: the payload plus TCP/IP headers
    dt = hw["ts_ns"].diff().fill_null(0) / 1e9
    sent = (hw["nic_tx_bps"].fill_null(0) * dt).sum()
    assert PAYLOAD <= sent <= 1.15 * PAYLOAD, sent / PAYLOAD
    assert (hw["nic_rx_bps"].fill_null(0) * dt).sum() < 0.1 * PAYLOAD  # only the ACKs come back
    assert hw["cpu_util_pct"].drop_nulls().is_between(0, 100).all() and hw["cpu_util_pct"].drop_nulls().len() > 0
