"""Dagster resources: where the warehouse and the landing zone are, and analysis settings.
Paths come from the environment (FLEETSCOPE_WAREHOUSE, FLEETSCOPE_LANDING) so the CLI, the UI,
the daemon and tests all point at the same files."""
from __future__ import annotations

import os
from pathlib import Path

from dagster import ConfigurableResource

from fleetscope.warehouse import Warehouse

DEFAULT_WAREHOUSE = "data/warehouse.duckdb"
DEFAULT_LANDING = "data/landing"


def warehouse_path() -> str:
    return os.environ.get("FLEETSCOPE_WAREHOUSE", DEFAULT_WAREHOUSE)


def landing_path() -> str:
    return os.environ.get("FLEETSCOPE_LANDING", DEFAULT_LANDING)


class WarehouseResource(ConfigurableResource):
    """The DuckDB warehouse (views) and its parquet tables. An empty path means
    FLEETSCOPE_WAREHOUSE at run time (so the CLI, UI, daemon and tests share one setting)."""
    path: str = ""

    def get(self) -> Warehouse:
        return Warehouse(self.path or warehouse_path())


class LandingResource(ConfigurableResource):
    """The landing folder; an empty path means FLEETSCOPE_LANDING at run time."""
    path: str = ""

    @property
    def root(self) -> Path:
        return Path(self.path or landing_path())


class AnalysisSettings(ConfigurableResource):
    """Knobs shared by the analyses (all have paper defaults)."""
    window_seconds: int = 60          # LLMPrism time window
    window_margin_seconds: int = 30   # flows read before a window so straddling steps are complete
    k_sigma: float = 3.0


def default_resources() -> dict:
    return {
        "warehouse": WarehouseResource(),
        "landing": LandingResource(),
        "settings": AnalysisSettings(window_seconds=int(os.environ.get("FLEETSCOPE_WINDOW_SECONDS", "60"))),
    }
