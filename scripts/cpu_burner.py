"""Load the machine the way a busy CI runner does, to check that a test waits on events and not on
speed: `python scripts/cpu_burner.py --procs 6 --seconds 900 -- <command>` runs <command> beside
`procs` processes that spin on the CPU, prints the load average every 30 s and at the end, and
stops the spinners when the command ends (or after `seconds`, whichever comes first). Never used
by the suite itself."""

from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
import time


def spin(until: float) -> None:
    while time.monotonic() < until:
        pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=int, default=6, help="spinning processes (default 6)")
    parser.add_argument("--seconds", type=float, default=900.0, help="the spinners stop after this long at most")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command to run beside them (after --)")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    until = time.monotonic() + args.seconds
    spinners = [multiprocessing.Process(target=spin, args=(until,), daemon=True) for _ in range(args.procs)]
    for p in spinners:
        p.start()
    started = time.monotonic()
    try:
        child = subprocess.Popen(command)
        while child.poll() is None:
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                print(f"[cpu_burner] {time.monotonic() - started:6.0f} s: load average {os.getloadavg()}", flush=True)
        print(f"[cpu_burner] done after {time.monotonic() - started:.0f} s: load average {os.getloadavg()}", flush=True)
        return child.returncode
    finally:
        for p in spinners:
            p.terminate()
        for p in spinners:
            p.join()


if __name__ == "__main__":
    sys.exit(main())
