"""Sensor settings from the environment (the code location reads files where it runs, with the
same environment as the CLI)."""
import os

SETTLE_S = float(os.environ.get("FLEETSCOPE_SETTLE_SECONDS", "5"))
INTERVAL_S = int(os.environ.get("FLEETSCOPE_SENSOR_INTERVAL_SECONDS", "30"))
