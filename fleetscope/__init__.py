"""fleetscope: Dagster-free analysis library. Dagster wiring lives in the repo-root packages
assets/, resources/, jobs/ and definitions.py; everything here can be imported and tested alone."""

__version__ = "0.1.0"
