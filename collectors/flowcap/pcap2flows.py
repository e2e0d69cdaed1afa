"""Turn a packet capture into flow records the way a switch-mirroring collector would.

A pure-Python pcap reader (no dpkt): classic libpcap files with micro- or nanosecond timestamps
(`tcpdump --time-stamp-precision=nano`), Ethernet (or Linux cooked SLL) + IPv4 + TCP/UDP.
Packets are grouped by 5-tuple; pure ACKs (no payload) are not data and are skipped; each
5-tuple's packets are split into bursts on idle gaps (a flow record per burst: what NCCL's
per-message RDMA writes look like to ERSPAN). Times are integer nanoseconds.

    python -m fleetscope.collectors.flowcap.pcap2flows capture.pcap flows.parquet --idle-gap-us 1000 --switch br0
"""
from __future__ import annotations

import argparse
import struct
from pathlib import Path

import polars as pl

_MAGIC = {0xA1B2C3D4: ("<", 1000), 0xD4C3B2A1: (">", 1000), 0xA1B23C4D: ("<", 1), 0x4D3CB2A1: (">", 1)}


def read_pcap(path: str | Path) -> pl.DataFrame:
    """Packets: ts_ns, src_ip, dst_ip, proto, src_port, dst_port, payload (L4 payload bytes)."""
    data = Path(path).read_bytes()
    if len(data) < 24:
        raise ValueError(f"{path}: not a pcap file (only {len(data)} bytes)")
    magic = struct.unpack("<I", data[:4])[0]
    if magic not in _MAGIC:
        raise ValueError(f"{path}: unsupported capture format (magic {magic:#x}); write classic pcap "
                         "with tcpdump -w (pcapng is not supported)")
    end, mult = _MAGIC[magic]
    linktype = struct.unpack(end + "I", data[20:24])[0]
    if linktype == 1:
        l2, ethertype_at = 14, 12  # Ethernet
    elif linktype == 113:
        l2, ethertype_at = 16, 14  # Linux cooked capture
    else:
        raise ValueError(f"{path}: link type {linktype} not supported (Ethernet or Linux SLL only)")
    rec = struct.Struct(end + "IIII")
    ts, src, dst, proto, sp, dp, pay = [], [], [], [], [], [], []
    off, n = 24, len(data)
    while off + 16 <= n:
        sec, frac, incl, _orig = rec.unpack_from(data, off)
        off += 16
        pkt = data[off:off + incl]
        off += incl
        if len(pkt) < l2 + 20 or pkt[ethertype_at:ethertype_at + 2] != b"\x08\x00":
            continue  # not IPv4 (ARP, IPv6 neighbour discovery)
        ip = l2
        ihl = (pkt[ip] & 0x0F) * 4
        total = int.from_bytes(pkt[ip + 2:ip + 4], "big")
        p = pkt[ip + 9]
        if p not in (6, 17) or len(pkt) < ip + ihl + 4:
            continue
        l4 = ip + ihl
        if p == 6:
            if len(pkt) < l4 + 13:
                continue
            payload = total - ihl - ((pkt[l4 + 12] >> 4) * 4)
        else:
            payload = total - ihl - 8
        ts.append(sec * 1_000_000_000 + frac * mult)
        src.append(pkt[ip + 12:ip + 16])
        dst.append(pkt[ip + 16:ip + 20])
        proto.append(p)
        sp.append(int.from_bytes(pkt[l4:l4 + 2], "big"))
        dp.append(int.from_bytes(pkt[l4 + 2:l4 + 4], "big"))
        pay.append(payload)

    def dotted(bs: list[bytes]) -> list[str]:
        return [f"{b[0]}.{b[1]}.{b[2]}.{b[3]}" for b in bs]

    return pl.DataFrame({"ts_ns": pl.Series(ts, dtype=pl.Int64), "src_ip": dotted(src), "dst_ip": dotted(dst),
                         "proto": pl.Series(proto, dtype=pl.Int32), "src_port": pl.Series(sp, dtype=pl.Int32),
                         "dst_port": pl.Series(dp, dtype=pl.Int32), "payload": pl.Series(pay, dtype=pl.Int64)},
                        schema_overrides={"src_ip": pl.Utf8, "dst_ip": pl.Utf8})


def packets_to_flows(packets: pl.DataFrame, idle_gap_ns: int = 1_000_000, switch: str | None = None) -> pl.DataFrame:
    """Data packets -> one flow record per burst of a 5-tuple (a new burst after idle_gap_ns of
    silence). Columns per docs/CONTRACT.md 1.2: start_ns, end_ns, duration_ns, src_ip, dst_ip, bytes,
    packets, src_port, dst_port, path."""
    key = ["src_ip", "dst_ip", "proto", "src_port", "dst_port"]
    p = packets.filter(pl.col("payload") > 0).sort([*key, "ts_ns"])
    p = p.with_columns(new=(pl.col("ts_ns").diff().over(key).fill_null(idle_gap_ns + 1) > idle_gap_ns))
    p = p.with_columns(burst=pl.col("new").cum_sum().over(key))
    f = p.group_by([*key, "burst"]).agg(start_ns=pl.col("ts_ns").min(), end_ns=pl.col("ts_ns").max(),
                                       bytes=pl.col("payload").sum(), packets=pl.len().cast(pl.Int64))
    f = f.with_columns(duration_ns=pl.col("end_ns") - pl.col("start_ns"),
                       path=pl.lit([switch] if switch else None, dtype=pl.List(pl.Utf8)))
    return f.select("start_ns", "end_ns", "duration_ns", "src_ip", "dst_ip", "bytes", "packets", "src_port",
                    "dst_port", "path").sort("start_ns")


def write_flows(flows: pl.DataFrame, out: str | Path) -> Path:
    out = Path(out)
    if out.suffix == ".parquet":
        flows.write_parquet(out)
    else:  # csv: path joined by '>' as docs/CONTRACT.md 1.2 allows
        flows.with_columns(path=pl.col("path").list.join(">")).write_csv(out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pcap")
    ap.add_argument("out", help="flows file (.parquet or .csv)")
    ap.add_argument("--idle-gap-us", type=float, default=1000.0, help="split a 5-tuple's packets into bursts after this much silence")
    ap.add_argument("--switch", default=None, help="switch name to record as the flows' path")
    a = ap.parse_args(argv)
    flows = packets_to_flows(read_pcap(a.pcap), int(a.idle_gap_us * 1000), a.switch)
    write_flows(flows, a.out)
    print(f"{flows.height} flows -> {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
