"""Pandera (polars backend) schemas for every table fleetscope writes, and the helpers that
make a frame conform to a schema and split off rows that break it.

Each stage's schemas live in their own module (landing.py, flows.py, ...) and are registered in
TABLES so the warehouse can create empty tables and views for them."""
from fleetscope.schemas.base import (  # noqa: F401
    TABLES,
    ValidationResult,
    conform,
    empty_frame,
    polars_schema,
    register,
    validate_rows,
)
