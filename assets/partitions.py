"""Dynamic partition sets: one partition per landed file, capture, incident or flow window."""
from dagster import DynamicPartitionsDefinition

topology_files = DynamicPartitionsDefinition(name="topology_files")
flow_files = DynamicPartitionsDefinition(name="flow_files")
hw_files = DynamicPartitionsDefinition(name="hw_files")
captures = DynamicPartitionsDefinition(name="captures")
incidents = DynamicPartitionsDefinition(name="incidents")
flow_windows = DynamicPartitionsDefinition(name="flow_windows")

BY_NAME = {p.name: p for p in (topology_files, flow_files, hw_files, captures, incidents, flow_windows)}
