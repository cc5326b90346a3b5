"""Make the synthetic dry run ``data/calibration/llama3.1-70b_tp8_dry_run.yaml``.

Its peaks are the simulator's for Llama 3.1 70B as ``estimate_profile`` gives it (TP 8, 8192
tokens, H100) with every static figure x 1.08, every activation x 1.25 and a constant of
3000 MB, on 4 stages of 1F1B with 8 micro-batches. ``calibrate(file, prior=estimate)`` must
give those scales back (``tests/test_calibration_prior.py``); the README and
``docs/estimation.md`` use it as the reader's "one dry run". Run from the repository root:
``python scripts/make_dry_run_fixture.py``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

import sapptk
from sapptk.calibration.memory_model import UNKNOWNS
from sapptk.calibration.prior import prior_basis
from sapptk.models import Parallel
from sapptk.schedules import build

OUT = Path("data/calibration/llama3.1-70b_tp8_dry_run.yaml")
STATIC, ACTIVATION, CONSTANT = 1.08, 1.25, 3000.0
STAGES, MICRO_BATCHES = 4, 8


def main() -> None:
    prior = sapptk.estimate_profile("llama3.1-70b", Parallel(tp=8, seq_length=8192), "h100")
    values = prior_basis(prior) @ np.array([STATIC, ACTIVATION, CONSTANT])
    truth = {name: float(values[i]) for i, name in enumerate(UNKNOWNS)}
    per = prior.num_body_layers // STAGES
    full = [per, per // 2, 0, 0]  # layers with full recompute per stage
    select = [0, per // 2, per // 2, 0]  # layers with select recompute only
    activation = np.array([truth["activation_full"] * f + truth["activation_select"] * s
                           + truth["activation_none"] * (per - f - s) for f, s in zip(full, select, strict=True)])
    params = np.full(STAGES, truth["param"] * per)
    params[0] += truth["head"]
    params[-1] += truth["tail"]
    program = build("1f1b", stages=STAGES, micro_batches=MICRO_BATCHES)
    sim = sapptk.simulate(program, forward=1.0, backward=2.0, activation=activation, params=params)
    peaks = sim.peak_memory.to_numpy() + truth["constant"]
    shape = f"{STAGES} stages, 1F1B, {MICRO_BATCHES} micro-batches"
    OUT.write_text(f"""# A dry run of Llama 3.1 70B (TP 8, 8192 tokens) on {shape},
# in the reference tool's "init" calibration format. Synthetic (scripts/make_dry_run_fixture.py):
# its peaks are the simulator's for the profile that
# sapptk.estimate_profile("llama3.1-70b", Parallel(tp=8, seq_length=8192), "h100") gives, with
# every static figure x {STATIC}, every activation x {ACTIVATION} and a constant of {CONSTANT:g} MB, so
# calibrate(this file, prior=that estimate) gives those scales back. Stage 0 recomputes all its
# layers, stage 1 half of them fully and half select, stage 2 half select.
pipeline_config:
  pipeline_num: {STAGES}
  num_layer: {prior.num_body_layers}
  offset: 0

recompute_config:
  recompute: {full}
  select_recompute: {[f + s for f, s in zip(full, select, strict=True)]}
  select_comm_recompute: false

memory_usage:
  head_memory: {peaks[0]:.3f}
  tail_memory: {peaks[-1]:.3f}
  body_memories:
    stage_id: [1, 2]
    memories: [{peaks[1]:.3f}, {peaks[2]:.3f}]
""", encoding="utf-8")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
