#!/usr/bin/env bash
# Set up everything fleetscope needs on a fresh machine with Python 3.11+ and pip:
# a virtualenv in .venv with the pinned dependencies (constraints.txt) and fleetscope itself (with its
# test tools and the `scale` extra: dagster-dask, dagster-postgres).
#   --with-collectors  also torch==2.13.0 (collectors and their tests run real PyTorch jobs)
#   --with-system      also Debian packages the test suite uses (chromium for the UI test,
#                      tcpdump/iproute2/ethtool/iptables for the real-traffic tests and the recorder); needs root
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
collectors=0; system=0
for a in "$@"; do
  case "$a" in
    --with-collectors) collectors=1 ;;
    --with-system) system=1 ;;
    *) echo "unknown option $a" >&2; exit 2 ;;
  esac
done
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -c constraints.txt -e ".[test,scale]"
if [ "$collectors" = 1 ]; then
  # exact pin: on these machines a local CPU wheel; a looser spec would pull GBs of CUDA
  .venv/bin/python -m pip install -q "torch==2.13.0"
fi
if [ "$system" = 1 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  need=""
  command -v chromium >/dev/null || need="$need chromium chromium-driver"
  command -v tcpdump >/dev/null || need="$need tcpdump"
  command -v ip >/dev/null || need="$need iproute2"
  command -v ethtool >/dev/null || need="$need ethtool"      # the recorder turns offloads off
  command -v iptables >/dev/null || need="$need iptables"    # the recorder's link delay (NFQUEUE)
  if [ -n "$need" ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $need >/dev/null) \
      || echo "setup: could not install$need; tests that need them will skip and say why" >&2
  fi
fi
echo "setup: ready (.venv)"
