"""A link delay for a kernel without sch_netem: an nfnetlink_queue client that holds every queued
packet for a fixed delay and then accepts it, in arrival order.

    ip netns exec SWITCH_NS python -m fleetscope.collectors.recorder.nfqdelay --queue 0 --delay-ms 5
    # plus: iptables -A FORWARD -m physdev --physdev-in PORT -j NFQUEUE --queue-num 0 --queue-bypass

Raw netlink (no libnetfilter_queue, no compiled extension): the packets are copied as metadata
only (the packet id), and because every packet waits the same time, releasing is one
NFQNL_MSG_VERDICT_BATCH ("accept every id <= N") per due prefix, so a busy link costs a few
syscalls per millisecond. Fail-open is set: if the queue fills up, the kernel passes packets
instead of dropping them; with --queue-bypass on the rule, packets pass when this client is gone.
Prints `ready` once bound; exits on SIGTERM/SIGINT (the rule must be removed first or the
packets still held are dropped with the queue)."""
from __future__ import annotations

import argparse
import collections
import os
import select
import signal
import socket
import struct
import time

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_CONFIG, NFQNL_MSG_VERDICT_BATCH = 0, 2, 3
NFQA_PACKET_HDR, NFQA_VERDICT_HDR = 1, 2
NFQA_CFG_CMD, NFQA_CFG_PARAMS, NFQA_CFG_QUEUE_MAXLEN, NFQA_CFG_MASK, NFQA_CFG_FLAGS = 1, 2, 3, 4, 5
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NFQA_CFG_F_FAIL_OPEN = 1
NF_ACCEPT = 1
NLM_F_REQUEST, NLM_F_ACK = 1, 4
NLMSG_ERROR = 2
SOL_NETLINK, NETLINK_NO_ENOBUFS = 270, 5


def _attr(kind: int, payload: bytes) -> bytes:
    a = struct.pack("=HH", 4 + len(payload), kind) + payload
    return a + b"\0" * (-len(a) % 4)


class DelayQueue:
    def __init__(self, queue: int, delay_ns: int, maxlen: int = 65536):
        self.queue, self.delay_ns, self.seq = queue, delay_ns, 0
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        self.sock.setsockopt(SOL_NETLINK, NETLINK_NO_ENOBUFS, 1)
        self.sock.bind((0, 0))
        self._config(_attr(NFQA_CFG_CMD, struct.pack(">BBH", NFQNL_CFG_CMD_BIND, 0, 0)))
        self._config(_attr(NFQA_CFG_PARAMS, struct.pack(">IB", 0, NFQNL_COPY_META))
                     + _attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack(">I", maxlen))
                     + _attr(NFQA_CFG_MASK, struct.pack(">I", NFQA_CFG_F_FAIL_OPEN))
                     + _attr(NFQA_CFG_FLAGS, struct.pack(">I", NFQA_CFG_F_FAIL_OPEN)))
        self.sock.setblocking(False)
        self.held: collections.deque = collections.deque()   # (release_ns, packet id), arrival order
        self.n_packets = 0

    def _send(self, msg_type: int, flags: int, body: bytes) -> None:
        self.seq += 1
        nfgen = struct.pack("=BB", socket.AF_UNSPEC, 0) + struct.pack(">H", self.queue)
        payload = nfgen + body
        self.sock.send(struct.pack("=IHHII", 16 + len(payload), (NFNL_SUBSYS_QUEUE << 8) | msg_type,
                                   NLM_F_REQUEST | flags, self.seq, 0) + payload)

    def _config(self, attrs: bytes) -> None:
        self._send(NFQNL_MSG_CONFIG, NLM_F_ACK, attrs)
        data = self.sock.recv(65536)
        _, mtype, _, _, _ = struct.unpack_from("=IHHII", data)
        if mtype == NLMSG_ERROR:
            err = struct.unpack_from("=i", data, 16)[0]
            if err:
                raise OSError(-err, f"nfnetlink_queue config refused: {os.strerror(-err)}")

    def _receive(self, now: int) -> None:
        while True:
            try:
                data = self.sock.recv(1 << 20)
            except BlockingIOError:
                return
            off = 0
            while off + 16 <= len(data):
                length, mtype, _, _, _ = struct.unpack_from("=IHHII", data, off)
                if length < 16:
                    break
                if mtype == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
                    a, end = off + 20, off + length       # nlmsghdr (16) + nfgenmsg (4)
                    while a + 4 <= end:
                        alen, atype = struct.unpack_from("=HH", data, a)
                        if alen < 4:
                            break
                        if atype & 0x3FFF == NFQA_PACKET_HDR:
                            self.held.append((now + self.delay_ns, struct.unpack_from(">I", data, a + 4)[0]))
                            self.n_packets += 1
                            break
                        a += (alen + 3) & ~3
                off += (length + 3) & ~3

    def _release(self, now: int) -> None:
        last = None
        while self.held and self.held[0][0] <= now:
            last = self.held.popleft()[1]
        if last is not None:
            self._send(NFQNL_MSG_VERDICT_BATCH, 0, _attr(NFQA_VERDICT_HDR, struct.pack(">II", NF_ACCEPT, last)))

    def run(self, stop) -> None:
        while not stop():
            now = time.monotonic_ns()
            timeout = 0.05 if not self.held else max(0.0, (self.held[0][0] - now) / 1e9)
            r, _, _ = select.select([self.sock], [], [], timeout)
            now = time.monotonic_ns()
            if r:
                self._receive(now)
            self._release(now)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--queue", type=int, default=0)
    ap.add_argument("--delay-ms", type=float, required=True)
    a = ap.parse_args(argv)
    stopping = []
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, lambda *_: stopping.append(1))
    try:
        os.nice(-10)   # the delay is only as exact as this loop's scheduling on a busy box
    except OSError:
        pass
    q = DelayQueue(a.queue, int(a.delay_ms * 1e6))
    print("ready", flush=True)
    q.run(lambda: bool(stopping))
    print(f"released {q.n_packets} packets", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
