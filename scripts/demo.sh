#!/usr/bin/env bash
# README command 1: set everything up, then simulate the demo fleet and run every asset on it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/fleetscope demo "$@"
