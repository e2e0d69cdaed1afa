"""python -m fleetscope.collectors.recorder --scenario NAME --out DIR [--layout L --seconds S --seed N]  (root)"""
import argparse
import json
import sys

from fleetscope.collectors.recorder.record import LAYOUTS, SCENARIOS, record


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fleetscope.collectors.recorder",
                                 description="Record two real PyTorch gloo jobs on six emulated hosts (needs root).")
    ap.add_argument("--scenario", choices=SCENARIOS, required=True)
    ap.add_argument("--out", required=True, help="folder for landing/ and ground_truth/")
    ap.add_argument("--layout", choices=sorted(LAYOUTS), default="pp2dp2+dp2",
                    help="the jobs recorded (record.LAYOUTS): the default is a PP2 x DP2 job beside a DDP DP2 job")
    ap.add_argument("--seconds", type=float, default=35.0, help="capture length")
    ap.add_argument("--seed", type=int, default=0, help="names, addresses, placement, fault place and times")
    ap.add_argument("--no-background", dest="background", action="store_false",
                    help="no checkpoint store / monitoring probes (job traffic only)")
    ap.add_argument("--stacks", action="store_true", help="Python stacks in the Kineto traces (~3x larger files)")
    ap.add_argument("--overwrite", action="store_true")
    a = ap.parse_args(argv)
    try:
        s = record(a.scenario, a.out, a.seconds, a.seed, a.background, a.overwrite, a.stacks, layout=a.layout)
    except (PermissionError, FileNotFoundError, FileExistsError, ValueError) as e:
        print(f"recorder: {e}", file=sys.stderr)
        return 2
    print(json.dumps({k: s[k] for k in ("scenario", "fault", "steps_in_capture", "flows", "seconds_wall", "capture")},
                     indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
