"""Make the PyTorch trace fixture: a tiny GPT trained a few steps on CPU under torch.profiler.

Writes ``tests/data/traces/tiny_gpt.pt.trace.json.gz`` (the profiler's Chrome trace, gzipped)
and, beside it, ``tiny_gpt.direct.json``: the same run's layer times measured directly with
``time.perf_counter`` (forward: around each layer's ``record_function`` range; backward:
between the layer's full-backward pre-hook and hook), per step, micro-batch and layer.

Needs the optional extra: ``pip install -e ".[fixtures]"`` (torch). Run from the repository
root: ``python scripts/make_trace_fixture.py``. The tests read the committed files and never
need torch.
"""

from __future__ import annotations

import gzip
import json
import statistics
import time
from pathlib import Path

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function, schedule

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "traces"
LAYERS, WIDTH, HEADS, TOKENS, VOCAB = 3, 256, 4, 256, 512
MICRO_BATCHES, WAIT, WARMUP, ACTIVE = 2, 1, 1, 4


class Block(nn.Module):
    """A pre-norm GPT block; tokens are a (T, d) matrix so every linear layer is one addmm."""

    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.qkv, self.proj = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
        self.fc, self.out = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.ln1(x)).split(WIDTH, dim=1)
        shape = (TOKENS, HEADS, WIDTH // HEADS)
        q, k, v = (t.reshape(shape).transpose(0, 1) for t in (q, k, v))
        att = torch.softmax((q @ k.transpose(1, 2)) / (WIDTH // HEADS) ** 0.5 + MASK, dim=-1)
        x = x + self.proj((att @ v).transpose(0, 1).reshape(TOKENS, WIDTH))
        return x + self.out(torch.nn.functional.gelu(self.fc(self.ln2(x))))


MASK = torch.full((TOKENS, TOKENS), float("-inf")).triu(1)


class TinyGPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, WIDTH)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm, self.lm_head = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, VOCAB)


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = TinyGPT()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    direct: list[dict] = []
    state: dict = {}

    def pre_hook(name):
        def hook(module, grad_output):
            state[name] = time.perf_counter()
        return hook

    def post_hook(name):
        def hook(module, grad_input, grad_output):
            direct.append({"step": state["step"], "micro_batch": state["mb"], "layer": name, "phase": "backward",
                           "ms": (time.perf_counter() - state[name]) * 1e3})
        return hook

    for i, block in enumerate(model.layers):
        block.register_full_backward_pre_hook(pre_hook(f"layers.{i}"))
        block.register_full_backward_hook(post_hook(f"layers.{i}"))

    def forward_layer(name, fn, x):
        t0 = time.perf_counter()  # the clock brackets the profiler's range
        with record_function(name):
            y = fn(x)
        direct.append({"step": state["step"], "micro_batch": state["mb"], "layer": name, "phase": "forward",
                       "ms": (time.perf_counter() - t0) * 1e3})
        return y

    steps = WAIT + WARMUP + ACTIVE
    prof = profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                   schedule=schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=1))
    with prof:
        for step in range(steps):
            state["step"] = step - WAIT - WARMUP  # 0 = first recorded step
            opt.zero_grad()
            for mb in range(MICRO_BATCHES):
                state["mb"] = mb
                tokens = torch.randint(0, VOCAB, (TOKENS + 1,))
                x = forward_layer("embedding", model.embedding, tokens[:-1])
                for i, block in enumerate(model.layers):
                    x = forward_layer(f"layers.{i}", block, x)
                logits = forward_layer("lm_head", lambda h: model.lm_head(model.norm(h)), x)
                loss = nn.functional.cross_entropy(logits, tokens[1:])
                loss.backward()
            opt.step()
            prof.step()
    OUT.mkdir(parents=True, exist_ok=True)
    raw = OUT / "tiny_gpt.pt.trace.json"
    prof.export_chrome_trace(str(raw))
    with raw.open("rb") as src, open(str(raw) + ".gz", "wb") as out, \
            gzip.GzipFile(raw.name, "wb", compresslevel=9, fileobj=out, mtime=0) as dst:
        dst.write(src.read())
    raw.unlink()
    recorded = [d for d in direct if d["step"] >= 0]
    summary = {}
    for group, pattern in (("head", "embedding"), ("body", "layers."), ("tail", "lm_head")):
        for phase in ("forward", "backward"):
            values = [d["ms"] for d in recorded if d["layer"].startswith(pattern) and d["phase"] == phase]
            if values:
                summary[f"{group}/{phase}"] = statistics.median(values)
    meta = {"layers": LAYERS, "width": WIDTH, "heads": HEADS, "tokens": TOKENS, "vocab": VOCAB,
            "micro_batches": MICRO_BATCHES, "recorded_steps": ACTIVE, "torch": torch.__version__,
            "threads": torch.get_num_threads()}
    (OUT / "tiny_gpt.direct.json").write_text(
        json.dumps({"about": meta, "median_ms": summary, "samples": recorded}, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
