"""How soon the Explorer's choose tab stops after Cancel, at several moments of a choice.

Run: python benchmarks/explorer_stop.py [--after 3 10 25 40]

llama2_70b on 16 devices, global batch 64, 56000 MB, 5 s per setup (the Explorer's choose
tab, driven from code as the tests do). For each moment: press Choose, wait that many
seconds, press Cancel, and report the seconds until ``sapptk.choose`` returned (the status
line says "stopped by Cancel" then) and until the tab was done (table and ranking figure
drawn), with the progress line at that moment. The baseline is the moment itself: a stop
that took as long as the choice had run would be no stop at all. Prints the load average.
"""

from __future__ import annotations

import argparse
import os
import time

import sapptk.choosing
from sapptk.config import PipelineConfig
from sapptk.explorer import Explorer
from sapptk.profile import bundled_profile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--after", type=float, nargs="+", default=[3.0, 10.0, 25.0, 40.0],
                        help="seconds after Choose at which Cancel is pressed")
    args = parser.parse_args()
    real = sapptk.choosing.choose
    returned: list[float] = []

    def timed(*a, **k):
        try:
            return real(*a, **k)
        finally:
            returned.append(time.monotonic())

    sapptk.choosing.choose = timed  # the tab imports it when it runs
    explorer = Explorer(bundled_profile("llama2_70b"), PipelineConfig(8, 16, memory_budget=56000), time_limit=10)
    tab = explorer.chooser
    tab.devices.value, tab.global_batch.value, tab.time_limit.value = 16, 64, 5
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    print("| Cancel after (s) | choose returned (s) | tab done (s) | returned / after | progress at Cancel |")
    print("|---:|---:|---:|---:|---|")
    for after in args.after:
        tab.choose_button.click()
        time.sleep(after)
        progress = tab.progress.value
        pressed = time.monotonic()
        tab.cancel_button.click()
        tab.wait(120)
        done = time.monotonic() - pressed
        back = returned[-1] - pressed
        print(f"| {after:.0f} | {back:.2f} | {done:.2f} | {back / after:.3f} | {progress} |", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
