"""flowcap: packets (a pcap taken at a switch / bridge) -> flow records (docs/CONTRACT.md 1.2)."""
from fleetscope.collectors.flowcap.pcap2flows import packets_to_flows, read_pcap, write_flows  # noqa: F401
