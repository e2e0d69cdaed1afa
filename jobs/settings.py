"""The daemon's settings (sensor intervals, waits) from the environment (the code location reads files where it runs, with the
same environment as the CLI)."""
import os

SETTLE_S = float(os.environ.get("FLEETSCOPE_SETTLE_SECONDS", "5"))
INTERVAL_S = int(os.environ.get("FLEETSCOPE_SENSOR_INTERVAL_SECONDS", "30"))
# a job is blocked when silent this long at least (above the tracer's 30 s flush plus a sensor tick)
BLOCKED_MIN_IDLE_S = float(os.environ.get("FLEETSCOPE_BLOCKED_MIN_IDLE_SECONDS", "120"))
# the answers (problems, fleet health, incident reports): rebuilt once the verdicts were quiet this
# long, and at most this long after a change they do not show yet (tick + wait + run < 2 minutes)
ANSWERS_INTERVAL_S = int(os.environ.get("FLEETSCOPE_ANSWERS_INTERVAL_SECONDS", str(min(INTERVAL_S, 15))))
ANSWERS_QUIET_S = float(os.environ.get("FLEETSCOPE_ANSWERS_QUIET_SECONDS", "20"))
ANSWERS_MAX_WAIT_S = float(os.environ.get("FLEETSCOPE_ANSWERS_MAX_WAIT_SECONDS", "60"))
# how long a stage waits for the stages it reads from, on a fleet that never goes quiet
HOLD_S = float(os.environ.get("FLEETSCOPE_STAGE_HOLD_SECONDS", "300"))
