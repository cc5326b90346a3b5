"""Estimate benchmark: the 96-layer Llama-2 shape behind ``data/llama2_70b.json`` estimated
at a stated layout and compared with that measured profile field by field; then the time of
one ``estimate_profile`` call against a baseline run in the same script (reading the
measured profile from its JSON file, ``load_profile``).

Run: ``.venv/bin/python benchmarks/estimate.py [--calls N]``

The layout (docs/estimation.md explains how the profile's own figures point to it): the
Llama-2-70B card with 96 layers, sequence 2048, micro-batch 1, tensor parallel 2 without
sequence parallelism, no flash attention, bf16 weights and gradients, the distributed
optimizer over 64 data-parallel ranks, on an Ascend 910B. The measured profile's memory
figures read as MiB (its full-recompute activation, 32, is exactly 2·s·h bytes in MiB), so
ours are printed in MB (the profile's unit) and in MiB.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

from sapptk.models import Parallel, card, estimate_profile, hardware
from sapptk.profile import load_profile

ROOT = Path(__file__).resolve().parents[1]
MEASURED = ROOT / "data" / "llama2_70b.json"
MIB = 2**20 / 1e6  # MB per MiB

LAYOUT = Parallel(tp=2, sequence_parallel=False, seq_length=2048, micro_batch_size=1, flash_attention=False,
                  compute_dtype="bf16", grad_dtype="bf16", sharding="distributed", dp=64)


def _row(field: str, ours_mb: float, measured: float) -> str:
    ours_mib = ours_mb / MIB
    ratio = measured / ours_mib if ours_mib else float("nan")
    return f"{field:32s} {ours_mb:12.2f} {ours_mib:12.2f} {measured:12.2f} {ratio:9.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    model = replace(card("llama2-70b"), num_layers=96, moe_layers=())
    device = hardware("ascend910b")
    profile = estimate_profile(model, LAYOUT, device)
    measured = load_profile(MEASURED)
    print(f"layout: {LAYOUT}\nhardware: {device.name} (matmul_efficiency {device.matmul_efficiency})")
    print(f"{'field':32s} {'ours MB':>12s} {'ours MiB':>12s} {'measured':>12s} {'meas/ours':>9s}  (times: ms)")
    body, mbody = profile.body[0], measured.body[0]
    print(_row("body params", body.params, mbody.params))
    for mode in mbody.modes:
        print(_row(f"body activation {mode}", body.modes[mode].activation, mbody.modes[mode].activation))
    print(_row("head params", profile.head.params, measured.head.params))
    print(_row("tail params", profile.tail.params, measured.tail.params))
    ratio = mbody.forward / body.forward
    print(f"{'body forward':32s} {body.forward:12.3f} {'':12s} {mbody.forward:12.3f} {ratio:9.3f}")
    for mode in mbody.modes:
        ours, theirs = body.modes[mode].backward, mbody.modes[mode].backward
        print(f"{'body backward ' + mode:32s} {ours:12.3f} {'':12s} {theirs:12.3f} {theirs / ours:9.3f}")
    print(f"{'head forward':32s} {profile.head.forward:12.3f} {'':12s} {measured.head.forward:12.3f}")
    print(f"{'tail forward':32s} {profile.tail.forward:12.3f} {'':12s} {measured.tail.forward:12.3f}")

    cases = [("llama2-70b", LAYOUT, "ascend910b"), ("llama3.1-405b", Parallel(tp=8, seq_length=8192), "h100"),
             ("deepseek-v3", Parallel(tp=1, ep=8, dp=8, seq_length=4096), "h800"),
             ("qwen3-235b-a22b", Parallel(tp=4, ep=8, dp=8, seq_length=4096), "h100")]
    t0 = time.perf_counter()
    for _ in range(args.calls):
        load_profile(MEASURED)
    baseline = (time.perf_counter() - t0) / args.calls
    print(f"\nbaseline load_profile(data/llama2_70b.json): {baseline * 1e3:.3f} ms per call")
    for name, layout, hw in cases:
        t0 = time.perf_counter()
        for _ in range(args.calls):
            estimate_profile(name, layout, hw)
        per = (time.perf_counter() - t0) / args.calls
        print(f"estimate_profile({name!r}): {per * 1e3:.3f} ms per call ({per / baseline:.2f} x the baseline)")


if __name__ == "__main__":
    main()
