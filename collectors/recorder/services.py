"""The fleet's non-training traffic, from one infrastructure namespace with two addresses:
a checkpoint store (TCP: ranks upload checkpoints and download them at launch) and a
pingmesh-style monitor that sends a small UDP probe to every host NIC every `--probe-s`.
Real GPU NICs carry both next to the jobs; neither is job traffic.

    python -m fleetscope.collectors.recorder.services --storage IP:PORT --monitor IP --probe IP,IP,...

Protocol of the store: 1 byte op + 8 byte big-endian length; `P` then that many bytes (discarded),
`G` answers that many bytes.
"""
from __future__ import annotations

import argparse
import signal
import socket
import socketserver
import struct
import threading
import time


class _Store(socketserver.BaseRequestHandler):
    def handle(self):
        hdr = self._read(9)
        if len(hdr) < 9:
            return
        op, n = hdr[:1], struct.unpack(">Q", hdr[1:])[0]
        if op == b"P":
            while n > 0:
                got = self.request.recv(min(n, 1 << 20))
                if not got:
                    return
                n -= len(got)
            self.request.sendall(b"k")
        elif op == b"G":
            chunk = bytes(1 << 16)
            while n > 0:
                self.request.sendall(chunk[:min(n, len(chunk))])
                n -= min(n, len(chunk))

    def _read(self, n):
        b = b""
        while len(b) < n:
            got = self.request.recv(n - len(b))
            if not got:
                break
            b += got
        return b


def storage_put(addr: tuple[str, int], data: bytes) -> None:
    with socket.create_connection(addr, timeout=30) as s:
        s.sendall(b"P" + struct.pack(">Q", len(data)) + data)
        s.recv(1)


def storage_get(addr: tuple[str, int], n: int) -> int:
    with socket.create_connection(addr, timeout=30) as s:
        s.sendall(b"G" + struct.pack(">Q", n))
        got = 0
        while got < n:
            b = s.recv(1 << 20)
            if not b:
                break
            got += len(b)
        return got


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--storage", required=True, help="IP:PORT to serve checkpoints on")
    ap.add_argument("--monitor", required=True, help="source address of the probes")
    ap.add_argument("--probe", default="", help="comma-separated host addresses to probe")
    ap.add_argument("--probe-s", type=float, default=0.5)
    a = ap.parse_args(argv)
    host, port = a.storage.rsplit(":", 1)
    socketserver.ThreadingTCPServer.allow_reuse_address = True
    srv = socketserver.ThreadingTCPServer((host, int(port)), _Store)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    stop = threading.Event()
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, lambda *_: stop.set())
    print("ready", flush=True)
    targets = [t for t in a.probe.split(",") if t]
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.bind((a.monitor, 0))
    seq = 0
    while not stop.wait(a.probe_s):
        seq += 1
        for t in targets:  # nobody answers on the port: the host's ICMP reply is not a flow
            u.sendto(struct.pack(">Qq", seq, time.time_ns()) + bytes(48), (t, 33434))
    srv.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
