"""The command line's help: `simulate --help` lists the simulator's fault kinds, and every other command
starts without importing the simulator (it cost ~2 s on every `fleetscope run`)."""
import subprocess
import sys


def test_simulate_help_lists_every_fault_kind_and_other_commands_do_not_import_the_simulator():
    from fleetscope.sim.faults import KINDS
    out = subprocess.run([sys.executable, "-m", "fleetscope.cli", "simulate", "--help"], capture_output=True, text=True, check=True).stdout
    assert "{kinds}" not in out
    assert all(k in out for k in KINDS)
    probe = "import sys, fleetscope.cli as c; c.build_parser().parse_args(['sql', 'select 1']); print(sorted(m for m in sys.modules if m.startswith('fleetscope.sim')))"
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]", loaded
