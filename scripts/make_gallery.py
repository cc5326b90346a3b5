"""Regenerate the gallery of docs/figures.md: every figure function of ``sapptk.viz`` drawn in
the paper style (two columns) and written as a PNG to docs/figures/, from the bundled
Llama2-70B profile, a small real sweep and the calibration example.

    python scripts/make_gallery.py            # about a minute; needs the export extra and Chromium

The images are what ``viz.export_png`` writes; ``viz.export_svg`` / ``viz.export_pdf`` give the
same figures as vector graphics.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "figures"


def main() -> int:
    from sapptk import viz
    from sapptk.balancer import balance
    from sapptk.calibration import calibrate, validate
    from sapptk.config import PipelineConfig
    from sapptk.plan import even_split
    from sapptk.profile import bundled_profile
    from sapptk.sweeps import sweep

    began = time.perf_counter()
    profile = bundled_profile("llama2_70b")
    config = PipelineConfig(4, 8, 2, "interleaved", memory_budget=60000)
    plan = balance(profile, config, time_limit=10, stall_time=2, seed=0)
    even = even_split(profile, config, "auto")
    frame = sweep(profile, {"stages": [4], "micro_batches": [8], "schedule": ["1f1b", "interleaved"],
                            "chunks": [1, 2], "memory_budget": [50000, 65000, 80000]},
                  point_time_limit=2, progress=False)
    frame = frame[~((frame["schedule"] == "interleaved") & (frame["chunks"] == 1))]
    cal = calibrate(ROOT / "data" / "calibration" / "init_demo.yaml")
    check = validate(cal.dry_run_plan(0), cal.observed(0))
    figures = {
        "timeline": lambda: viz.timeline(plan),
        "compare": lambda: viz.compare(plan, even, labels=["balanced", "even split"], memory=True),
        "stage_bars": lambda: viz.stage_bars(plan),
        "step_time_by_budget": lambda: viz.step_time_by_budget(frame),
        "heatmap": lambda: viz.heatmap(frame.assign(setup=frame["schedule"].astype(str) + " v="
                                                    + frame["chunks"].astype(str)), "memory_budget_mb", "setup"),
        "pareto": lambda: viz.pareto(frame),
        "sensitivity_plot": lambda: viz.sensitivity_plot(plan.sensitivity(samples=400, seed=0)),
        "critical_plot": lambda: viz.critical_plot(plan),
        "validation_plot": lambda: viz.validation_plot(check),
    }
    OUT.mkdir(parents=True, exist_ok=True)
    driver = viz.chromium_driver()
    try:
        with viz.style("paper", columns=2):
            for name, make in figures.items():
                path = viz.export_png(make(), OUT / f"{name}.png", dpi=96, driver=driver)
                print(f"{path.relative_to(ROOT)}: {path.stat().st_size:,} bytes")
    finally:
        viz.close_driver(driver)
    print(f"{len(figures)} figures in {time.perf_counter() - began:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
