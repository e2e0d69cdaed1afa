"""The one shape every analysis returns (flows, traces, perftracker, xputimer, prism, hang):

    tables     warehouse table name -> validated frame (each name is a table in fleetscope.tables,
               and a Dagster asset of the same name; the analysis knows nothing of that list)
    verdicts   anomaly_verdicts rows (fleetscope.findings.verdicts.make_verdicts), possibly empty
    notes      sentences for people: what was skipped and why, where the data came from
    warnings   what makes the answer incomplete and needs a person (no topology landed, flows but
               no job found): shown loudly in the run summary, the asset metadata and the UI
    artifacts  files for people, name -> bytes (PNG plots, Perfetto/Chrome trace JSON); the wiring
               writes them beside the warehouse (<warehouse>.exports/) and shows plots in the UI

So an asset is a short loop: write each table, write the verdicts, attach notes and artifacts.
Tables are also readable by name (`result["jobs"]`, and "anomaly_verdicts" for the verdicts)."""
from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from fleetscope.findings.verdicts import make_verdicts


@dataclass
class Analysis:
    tables: dict[str, pl.DataFrame] = field(default_factory=dict)
    verdicts: pl.DataFrame | None = None
    notes: list[str] = field(default_factory=list)
    artifacts: dict[str, bytes] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.verdicts is None:
            self.verdicts = make_verdicts([])

    def __getitem__(self, name: str) -> pl.DataFrame:
        return self.verdicts if name == "anomaly_verdicts" else self.tables[name]

    def __contains__(self, name: str) -> bool:
        return name == "anomaly_verdicts" or name in self.tables

    def get(self, name: str, default=None):
        return self[name] if name in self else default


def skipped(note: str, warn: bool = False) -> Analysis:
    """An analysis that had nothing to work on: no tables, no verdicts, the reason as a note (and as
    a warning when a person must act for the analysis to run)."""
    return Analysis(notes=[note], warnings=[note] if warn else [])
