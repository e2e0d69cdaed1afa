"""Lumos: profiler trace ingestion, execution graphs, replay and what-if analysis."""
from fleetscope.traces.parse import TraceError, TraceFile, read_capture, read_trace  # noqa: F401
