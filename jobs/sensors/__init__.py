"""Sensors, one per file: what makes runs happen without a person clicking. All but the
degradation sensor request what the one planner (fleetscope.jobs.planner) says is due."""
from fleetscope.jobs.sensors.critical_verdicts import critical_verdict_sensor
from fleetscope.jobs.sensors.degradation import degradation_sensor
from fleetscope.jobs.sensors.flow_windows import flow_window_sensor
from fleetscope.jobs.sensors.incidents import incident_sensor
from fleetscope.jobs.sensors.landing import landing_sensor
from fleetscope.jobs.sensors.problems import problems_sensor

ALL_SENSORS = [landing_sensor, flow_window_sensor, incident_sensor, problems_sensor, critical_verdict_sensor, degradation_sensor]
