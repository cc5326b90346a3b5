"""Make the MindSpore trace fixture ``tests/data/traces/mindspore_trace_view.json``.

A small ``trace_view.json`` in the shape MindSpore's profiler writes and the reference tool
reads: device ops in an ``Ascend Op`` process, where every step starts with the same
``MatMul-op`` op, and cell scopes in a ``Scope Layer`` process: ``Default`` spans (forward)
and ``Gradients`` spans (backward) on thread 0, the layer cells inside them on thread 1.

Five steps of two micro-batches, a model of an embedding, four decoder layers and an LM head.
Per micro-batch a decoder layer's forward takes 1.0 ms and its backward 2.0 ms, the
embedding 0.3 ms forward, the head 0.5 ms forward; in step 3 layer 2's forward is inflated
past 10 % of the step (an outlier the reader drops). Run from the repository root:
``python scripts/make_mindspore_fixture.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "traces" / "mindspore_trace_view.json"
STEPS, MICRO_BATCHES, LAYERS = 5, 2, 4
FWD_US, BWD_US, EMB_US, HEAD_US, GAP_US = 1000, 2000, 300, 500, 50


def main() -> None:
    events = [
        {"name": "process_name", "ph": "M", "pid": 2, "tid": 0, "args": {"name": "Ascend Op"}},
        {"name": "process_name", "ph": "M", "pid": 3, "tid": 0, "args": {"name": "Scope Layer"}},
    ]
    t = 0.0
    prefix = "Default/model-LlamaModel"

    def cell(name: str, dur: float, scope: str) -> None:
        nonlocal t
        full = f"{prefix}/{name}" if scope == "Default" else f"Gradients/{prefix}/{name}"
        events.append({"name": full, "ph": "X", "pid": 3, "tid": 1, "ts": t, "dur": dur})
        events.append({"name": f"Kernel-op{len(events)}", "ph": "X", "pid": 2, "tid": 7, "ts": t, "dur": dur})
        t += dur + GAP_US

    for step in range(STEPS):
        events.append({"name": "MatMul-op12", "ph": "X", "pid": 2, "tid": 7, "ts": t, "dur": 10.0})
        t += 20.0
        for _ in range(MICRO_BATCHES):
            start = t
            cell("tok_embeddings-LlamaEmbedding", EMB_US, "Default")
            for i in range(LAYERS):
                slow = step == 3 and i == 2
                cell(f"layers-CellList/{i}-LLamaDecodeLayer", FWD_US * (40 if slow else 1), "Default")
            cell("lm_head-Linear", HEAD_US, "Default")
            events.append({"name": "Default", "ph": "X", "pid": 3, "tid": 0, "ts": start, "dur": t - start})
            start = t
            for i in reversed(range(LAYERS)):
                cell(f"layers-CellList/{i}-LLamaDecodeLayer", BWD_US, "Gradients")
            events.append({"name": "Gradients", "ph": "X", "pid": 3, "tid": 0, "ts": start, "dur": t - start})
        t += 200.0
    events.append({"name": "MatMul-op12", "ph": "X", "pid": 2, "tid": 7, "ts": t, "dur": 10.0})
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(events) + "\n")


if __name__ == "__main__":
    main()
