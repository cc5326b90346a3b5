"""Make the Megatron-LM cross-check fixture: ``tests/data/megatron_theoretical_memory.json``.

Runs ``compute_weight_and_optimizer_memory`` and ``compute_activation_memory`` from
Megatron-LM's ``megatron/training/theoretical_memory_usage.py`` (read from a checkout
given on the command line; nothing of Megatron is copied into sapptk) on the setups
below, and writes their figures (MiB, as Megatron prints them) with the commit they came
from. The tests compare sapptk's estimate with these numbers and check that every
difference is the one ``docs/estimation.md`` explains.

Usage, from the repository root::

    git clone https://github.com/NVIDIA/Megatron-LM ../Megatron-LM
    python scripts/make_megatron_memory_fixture.py ../Megatron-LM

The module is executed with its one relative import (``from .utils import ...``)
replaced by stand-ins, so neither torch nor Megatron's package is needed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "megatron_theoretical_memory.json"
FILE = "megatron/training/theoretical_memory_usage.py"

# Megatron arguments for each setup; the sapptk card and layout the tests pair them with.
BASE = dict(
    group_query_attention=False, num_query_groups=None, num_experts=None, swiglu=False,
    moe_shared_expert_intermediate_size=None, moe_layer_freq=1, moe_ffn_hidden_size=None, mtp_num_layers=None,
    normalization="LayerNorm", multi_latent_attention=False, moe_latent_size=None, moe_router_topk=1,
    add_bias_linear=False, expert_tensor_parallel_size=1, expert_model_parallel_size=1,
    untie_embeddings_and_output_weights=False, virtual_pipeline_model_parallel_size=None,
    sequence_parallel=True, recompute_granularity="selective", micro_batch_size=1,
)
SETUPS = [
    dict(name="gpt3-175b dense MHA", card="gpt3-175b", tp=8, pp=8, dp=8, ep=1, seq_length=2048,
         args=dict(hidden_size=12288, num_attention_heads=96, kv_channels=128, ffn_hidden_size=4 * 12288,
                   num_layers=96, padded_vocab_size=50257)),
    dict(name="llama3.1-70b GQA SwiGLU", card="llama3.1-70b", tp=8, pp=4, dp=4, ep=1, seq_length=8192,
         args=dict(hidden_size=8192, num_attention_heads=64, kv_channels=128, ffn_hidden_size=28672, num_layers=80,
                   padded_vocab_size=128256, group_query_attention=True, num_query_groups=8, swiglu=True,
                   normalization="RMSNorm", untie_embeddings_and_output_weights=True)),
    dict(name="mixtral-8x7b MoE", card="mixtral-8x7b", tp=2, pp=4, dp=8, ep=8, seq_length=4096,
         args=dict(hidden_size=4096, num_attention_heads=32, kv_channels=128, ffn_hidden_size=14336, num_layers=32,
                   padded_vocab_size=32000, group_query_attention=True, num_query_groups=8, swiglu=True,
                   normalization="RMSNorm", untie_embeddings_and_output_weights=True, num_experts=8,
                   moe_ffn_hidden_size=14336, moe_router_topk=2)),
    dict(name="deepseek-v3 MLA MoE", card="deepseek-v3", tp=2, pp=16, dp=32, ep=64, seq_length=4096,
         args=dict(hidden_size=7168, num_attention_heads=128, kv_channels=128, ffn_hidden_size=18432, num_layers=61,
                   padded_vocab_size=129280, swiglu=True, normalization="RMSNorm",
                   untie_embeddings_and_output_weights=True, num_experts=256, moe_ffn_hidden_size=2048,
                   moe_router_topk=8, moe_shared_expert_intermediate_size=2048,
                   moe_layer_freq=[0] * 3 + [1] * 58, multi_latent_attention=True, q_lora_rank=1536,
                   kv_lora_rank=512, qk_head_dim=128, qk_pos_emb_head_dim=64, v_head_dim=128)),
]


def _load(checkout: Path) -> dict:
    source = (checkout / FILE).read_text(encoding="utf-8")
    source = source.replace("from .utils import is_hybrid_model, print_rank_0", "")
    namespace: dict = {"is_hybrid_model": lambda args: False, "print_rank_0": lambda *a, **k: None}
    exec(compile(source, FILE, "exec"), namespace)  # noqa: S102 - the user's own checkout
    return namespace


def main(checkout: str) -> None:
    root = Path(checkout)
    commit = subprocess.run(["git", "-C", str(root), "log", "-1", "--format=%H", "--", FILE],
                            capture_output=True, text=True, check=True).stdout.strip()
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    megatron = _load(root)
    mib = 1024 * 1024
    rows = []
    for setup in SETUPS:
        for distributed in (False, True):
            fields = {**BASE, **setup["args"], "tensor_model_parallel_size": setup["tp"],
                      "pipeline_model_parallel_size": setup["pp"], "data_parallel_size": setup["dp"],
                      "expert_model_parallel_size": setup["ep"], "seq_length": setup["seq_length"],
                      "use_distributed_optimizer": distributed,
                      "world_size": setup["tp"] * setup["pp"] * setup["dp"]}
            args = SimpleNamespace(**fields)
            weights = megatron["compute_weight_and_optimizer_memory"](args) / mib
            activation = megatron["compute_activation_memory"](args, num_microbatches=setup["pp"]) / mib
            rows.append({
                "name": setup["name"], "card": setup["card"], "tp": setup["tp"], "pp": setup["pp"],
                "dp": setup["dp"], "ep": setup["ep"], "seq_length": setup["seq_length"], "micro_batch_size": 1,
                "distributed_optimizer": distributed, "num_microbatches": setup["pp"],
                "megatron_args": {k: v for k, v in fields.items() if k in setup["args"] or k in BASE},
                "weight_and_optimizer_mib": weights, "activation_mib": activation,
            })
    OUT.write_text(json.dumps({
        "source": f"NVIDIA/Megatron-LM {FILE}",
        "file_commit": commit,
        "checkout_head": head,
        "units": "MiB (2**20 bytes), first pipeline stage, as report_theoretical_memory prints",
        "setups": rows,
    }, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {OUT} ({len(rows)} setups) from {FILE} at {commit}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python scripts/make_megatron_memory_fixture.py PATH_TO_MEGATRON_CHECKOUT")
    main(sys.argv[1])
