"""Sensor settings from the environment (the code location reads files where it runs, with the
same environment as the CLI)."""
import os

SETTLE_S = float(os.environ.get("FLEETSCOPE_SETTLE_SECONDS", "5"))
INTERVAL_S = int(os.environ.get("FLEETSCOPE_SENSOR_INTERVAL_SECONDS", "30"))
# a job is blocked when silent this long at least (above the tracer's 30 s flush plus a sensor tick)
BLOCKED_MIN_IDLE_S = float(os.environ.get("FLEETSCOPE_BLOCKED_MIN_IDLE_SECONDS", "120"))
