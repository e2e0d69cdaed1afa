#!/usr/bin/env bash
# README command 2: set everything up (including torch for the collectors and the Debian packages
# the browser and real-traffic tests use), lint with ruff, then run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --with-collectors --with-system
.venv/bin/ruff check .
# the slowest tests in every log: where the CI time goes (aim: under 15 min)
exec .venv/bin/python -m pytest -q -rs --durations=25 "$@"
