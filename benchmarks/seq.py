"""Chosen slice boundaries against equal slices, on a Llama-3-70B-like model at long context.

Run: ``.venv/bin/python benchmarks/seq.py [--time-limit S] [--lengths 32768 65536 131072]``

For each sequence length, schedule (``seq1f1b``; ``seq-interleaved`` with v = 2) and k (4, 8),
p = 8 and m = 8: ``balance`` (equal slices, no memory budget) gives the layers, then
``choose_slices`` picks the boundaries for that plan. Prints the step time and the bubble
(idle / busy, all devices) with equal lengths and with the chosen ones, and the bubble saved;
both are simulated in this process (ratios, not seconds, are the figures to read).

The profile is built here from the model's shapes (h = 8192, 80 layers, 64 query and 8 K/V
heads of 128, FFN 28672, vocabulary 128256; TP = 8, bf16, flash attention; 400 TFLOP/s per
device): a layer's forward does 2 · 855.6 M FLOPs per token in its matmuls and 2 · S · h per
token in causal attention, so the attention share is 2·S·h / (1.711 G + 2·S·h) (23.9 % at 32K,
55.7 % at 128K); backward twice the forward; K/V 2 · 8 · 128 · 2 bytes / TP per token.
"""

from __future__ import annotations

import argparse
import time

from sapptk.balancer import balance
from sapptk.config import PipelineConfig
from sapptk.profile import LayerGroup, ModeCost, Profile
from sapptk.solver.slices import choose_slices

HIDDEN, LAYERS, KV_HEADS, HEAD_DIM, FFN, VOCAB = 8192, 80, 8, 128, 28672, 128256
TP, FLOPS_PER_MS = 8, 400e12 / 1e3  # tensor parallel; FLOP per ms per device


def llama3_70b_like(seq: int) -> Profile:
    """A Llama-3-70B-like profile at ``seq`` tokens per sample (one sample per micro-batch)."""
    linear = 2 * (2 * HIDDEN * HIDDEN + 2 * HIDDEN * KV_HEADS * HEAD_DIM + 3 * HIDDEN * FFN) * seq
    attention = 2 * seq * seq * HIDDEN  # QK^T and AV over the causal half
    forward = (linear + attention) / TP / FLOPS_PER_MS
    activation = 34 * seq * HIDDEN / TP / 1e6  # MB, sequence parallel, flash attention
    params = (2 * HIDDEN * HIDDEN + 2 * HIDDEN * KV_HEADS * HEAD_DIM + 3 * HIDDEN * FFN) * 7.5 / TP / 1e6
    layer = LayerGroup(
        "decoder", "body", LAYERS, forward, params,
        {"none": ModeCost(2 * forward, activation), "full": ModeCost(3 * forward, 2 * seq * HIDDEN / TP / 1e6)},
        kv_mb_per_token=2 * KV_HEADS * HEAD_DIM * 2 / TP / 1e6, attention_share=attention / (linear + attention),
    )
    head = LayerGroup("embedding", "head", 1, 0.05, VOCAB * HIDDEN * 7.5 / TP / 1e6)
    lm_head = 2 * seq * HIDDEN * VOCAB / TP / FLOPS_PER_MS
    tail = LayerGroup("lm_head", "tail", 1, lm_head, VOCAB * HIDDEN * 7.5 / TP / 1e6,
                      {"none": ModeCost(2 * lm_head, 4 * seq * VOCAB / TP / 1e6)})
    return Profile(f"llama3_70b_like_{seq // 1024}k", (head, layer, tail), seq_length=seq)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=5.0)
    parser.add_argument("--lengths", type=int, nargs="+", default=[32768, 65536, 131072])
    args = parser.parse_args()
    print(f"p = 8, m = 8, balance time limit {args.time_limit:g} s, 2 CP-SAT workers; bubble = idle / busy")
    print("tokens | schedule | k | attention share | equal step ms | chosen step ms | equal bubble | chosen bubble "
          "| bubble saved | chosen lengths | search s")
    for seq in args.lengths:
        profile = llama3_70b_like(seq)
        share = profile.body[0].attention_share
        for schedule, chunks in (("seq1f1b", 1), ("seq-interleaved", 2)):
            for k in (4, 8):
                plan = balance(profile, PipelineConfig(8, 8, chunks, schedule, splits=k), time_limit=args.time_limit)
                began = time.perf_counter()
                choice = choose_slices(profile, plan.config, plan.counts)
                seconds = time.perf_counter() - began
                busy = plan.simulation.summary["busy_ms"].sum()
                assert abs(plan.step_time - choice.equal_step_time) < 1e-6 * plan.step_time
                print(f"{seq} | {schedule} v={chunks} | {k} | {share:.3f} | {choice.equal_step_time:,.0f} | "
                      f"{choice.step_time:,.0f} | {choice.equal_idle / busy:.4f} | {choice.idle / busy:.4f} | "
                      f"{choice.bubble_gain:.1%} | {list(choice.lengths)} | {seconds:.2f}")


if __name__ == "__main__":
    main()
