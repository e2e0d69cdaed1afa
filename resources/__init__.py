"""Dagster resources: where the warehouse and the landing zone are, and analysis settings.
Paths come from the environment (FLEETSCOPE_WAREHOUSE, FLEETSCOPE_LANDING) so the CLI, the UI,
the daemon and tests all point at the same files."""
from __future__ import annotations

import os
from pathlib import Path

from dagster import ConfigurableResource, EnvVar  # noqa: F401

from fleetscope.warehouse import Warehouse

DEFAULT_WAREHOUSE = "data/warehouse.duckdb"
DEFAULT_LANDING = "data/landing"


def warehouse_path() -> str:
    return os.environ.get("FLEETSCOPE_WAREHOUSE", DEFAULT_WAREHOUSE)


def landing_path() -> str:
    return os.environ.get("FLEETSCOPE_LANDING", DEFAULT_LANDING)


class WarehouseResource(ConfigurableResource):
    """The DuckDB warehouse (views) and its parquet tables."""
    path: str = DEFAULT_WAREHOUSE

    def get(self) -> Warehouse:
        return Warehouse(self.path)


class LandingResource(ConfigurableResource):
    path: str = DEFAULT_LANDING
    settle_seconds: float = 2.0

    @property
    def root(self) -> Path:
        return Path(self.path)


class AnalysisSettings(ConfigurableResource):
    """Knobs shared by the analyses (all have paper defaults)."""
    window_seconds: int = 60          # LLMPrism time window
    window_margin_seconds: int = 30   # flows read before a window so straddling steps are complete
    k_sigma: float = 3.0


def default_resources() -> dict:
    return {
        "warehouse": WarehouseResource(path=warehouse_path()),
        "landing": LandingResource(path=landing_path(),
                                   settle_seconds=float(os.environ.get("FLEETSCOPE_SETTLE_SECONDS", "2"))),
        "settings": AnalysisSettings(window_seconds=int(os.environ.get("FLEETSCOPE_WINDOW_SECONDS", "60"))),
    }
