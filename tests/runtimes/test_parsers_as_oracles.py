"""Megatron-LM's and torchtitan's own code as oracles for sapptk's exports (``runtimes`` extra).

260 random plans (seeded; the 200-odd on a line go through Megatron too): one-chunk and
two-chunk schedules, 2–8 stages, uneven layers, empty stages, stages holding only the head
or only the tail, and recompute that is uniform, "the first k layers of every chunk" or mixed. For each:

* Megatron (megatron-core, no CUDA needed): ``PipelineParallelLayerLayout`` parses and
  validates the exported ``--pipeline-model-parallel-layout``, and Megatron's model-building
  functions ``get_num_layers_to_build`` / ``get_transformer_layer_offset`` give every
  (rank, chunk) the plan's layers; the uniform-layout flags, when exported, give the same
  map; the recompute flags pass ``TransformerConfig``'s checks, and Megatron's own
  ``TransformerBlock._checkpointed_forward`` recomputes exactly the layers the export says
  (its checkpoint function replaced by a recorder).
* torchtitan 0.2.2's ``pipeline_module_split`` (in a subprocess) builds on every rank the
  plan's virtual stages with the plan's modules (0.3.0's ``_pipeline_module_split`` can run
  the same check: see the test's parameters).

Multi-token prediction layers (Megatron's ``m``) are checked in the layout grammar only
(sapptk's profiles have no MTP layers): sapptk's parser and Megatron's agree on random
layout strings with them.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the runtimes extra is not installed: pip install -e '.[runtimes]'")
pytest.importorskip("megatron.core", reason="the runtimes extra is not installed: pip install -e '.[runtimes]'")

from megatron.core import parallel_state  # noqa: E402
from megatron.core.transformer import transformer_block  # noqa: E402
from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402
from megatron.core.transformer.transformer_layer import get_transformer_layer_offset  # noqa: E402

from sapptk.config import PipelineConfig  # noqa: E402
from sapptk.formats import megatron  # noqa: E402
from sapptk.formats.expressible import counts_from_layers  # noqa: E402
from sapptk.plan import make_plan  # noqa: E402
from sapptk.profile import MODES, LayerGroup, ModeCost, Profile  # noqa: E402

pytestmark = pytest.mark.slow

PLANS = 260
ONE_CHUNK = ("gpipe", "1f1b", "zb-h1", "interleaved")
TWO_CHUNK = ("interleaved", "interleaved-rf", "interleaved-lm", "interleaved-zb", "interleaved-megatron", "zb-v",
             "dualpipe-v")
NONE, SELECT, FULL = (MODES.index(m) for m in ("none", "select", "full"))
PROBE = Path(__file__).with_name("torchtitan_probe.py")
TORCHTITAN_0_3 = Path(sys.prefix) / "torchtitan-0.3.0"


def _profile(layers: int) -> Profile:
    body = LayerGroup("layer", "body", layers, 1.0, 10.0, {"none": ModeCost(2.0, 8.0), "select": ModeCost(2.1, 5.0),
                                                          "full": ModeCost(3.0, 1.0)})
    return Profile("oracle", (LayerGroup("emb", "head", 1, 0.5, 20.0), body, LayerGroup("out", "tail", 1, 1.0, 20.0)))


def random_plan(seed: int):
    """A seeded random plan (see the module docstring)."""
    rng = random.Random(seed)
    two = seed % 2 == 1
    name = rng.choice(TWO_CHUNK if two else ONE_CHUNK)
    v = 2 if two else 1
    p = rng.choice((2, 3, 4, 8) if not name.startswith(("zb-v", "dualpipe")) else (2, 3, 4))
    m = rng.choice((p, p + 1, 2 * p, 2 * p + 1, 3 * p)) if name != "dualpipe-v" else rng.choice((2 * p, 2 * p + 3))
    n = rng.randint(1, 5 * p * v)
    cells = p * v
    layers = [0] * cells
    shape = rng.random()
    ends = [0, cells - 1]
    for _ in range(n):  # uneven, some stages empty; sometimes the head or the tail stage holds nothing else
        vs = rng.randrange(cells)
        while (shape < 0.25 and vs == ends[0] and cells > 1) or (0.25 <= shape < 0.5 and vs == ends[1] and cells > 1):
            vs = rng.randrange(cells)
        layers[vs] += 1
    kind = rng.choice(("none", "select", "full", "block", "mixed"))
    k = rng.randint(1, 3)
    picks = {(vs, pos): rng.choice((NONE, SELECT, FULL)) for vs in range(cells) for pos in range(layers[vs])}

    def mode(vs: int, pos: int) -> int:
        if kind == "block":
            return FULL if pos < k else NONE
        if kind == "mixed":
            return picks[(vs, pos)]
        return MODES.index(kind)

    profile = _profile(n)
    config = PipelineConfig(p, m, v, name)
    return make_plan(profile, config, counts_from_layers(profile, layers, mode), status="given"), layers


PLAN_CASES = [random_plan(seed) for seed in range(PLANS)]


def _model_map(cfg: TransformerConfig, p: int, v: int) -> list[tuple[int, int]]:
    """(layers, offset) per virtual stage c·p + s, from Megatron's model-building functions."""
    out = [(0, 0)] * (p * v)
    parallel_state.set_virtual_pipeline_model_parallel_world_size(v if v > 1 else None)
    try:
        for s in range(p):
            parallel_state.set_pipeline_model_parallel_rank(s)
            for c in range(v):
                vp = c if v > 1 else None
                out[c * p + s] = (transformer_block.get_num_layers_to_build(cfg, vp_stage=vp, pp_rank=s),
                                  int(get_transformer_layer_offset(cfg, vp_stage=vp, pp_rank=s)))
    finally:
        parallel_state.set_pipeline_model_parallel_rank(None)
        parallel_state.set_virtual_pipeline_model_parallel_world_size(None)
    return out


def _expected_map(layers: list[int]) -> list[tuple[int, int]]:
    return [(n, int(sum(layers[:vs]))) for vs, n in enumerate(layers)]


def _config(n: int, p: int, v: int, **kw) -> TransformerConfig:
    return TransformerConfig(num_layers=n, hidden_size=8, num_attention_heads=2, pipeline_model_parallel_size=p,
                             virtual_pipeline_model_parallel_size=v if v > 1 else None,
                             pipeline_dtype=torch.float32, **kw)


class _Recorder:
    """Stands in for Megatron's checkpoint function: runs the layers, marking them recomputed."""

    def __init__(self) -> None:
        self.inside = False

    def __call__(self, forward, distribute, *args):
        self.inside = True
        try:
            return forward(*args[:5])
        finally:
            self.inside = False


def _recomputed(cfg: TransformerConfig, n: int, monkeypatch) -> list[bool]:
    """Which of a chunk's n layers Megatron's ``_checkpointed_forward`` runs under its checkpoint."""
    recorder = _Recorder()
    marks: list[bool] = []

    def layer(**kwargs):
        marks.append(recorder.inside)
        return kwargs["hidden_states"], kwargs["context"]

    monkeypatch.setattr(transformer_block.tensor_parallel, "checkpoint", recorder)
    block = types.SimpleNamespace(config=cfg, num_layers_per_pipeline_rank=n, _get_layer=lambda i: layer)
    x = torch.zeros(1, requires_grad=True)
    transformer_block.TransformerBlock._checkpointed_forward(block, x, None, None, None, None, None, None, False)
    return marks


def _megatron_flags(args: tuple[str, ...]) -> dict:
    flags = megatron.parse_args(args)
    kw = {}
    if "recompute-granularity" in flags:
        kw["recompute_granularity"] = flags["recompute-granularity"]
    if "recompute-method" in flags:
        kw["recompute_method"] = flags["recompute-method"]
    if "recompute-num-layers" in flags:
        kw["recompute_num_layers"] = int(flags["recompute-num-layers"])
    if "recompute-modules" in flags:
        kw["recompute_modules"] = list(flags["recompute-modules"])
    return kw


MEGATRON_CASES = [(i, plan, layers) for i, (plan, layers) in enumerate(PLAN_CASES)
                  if tuple(plan.config.program().placement) == tuple(range(plan.config.stages)) * plan.config.chunks]


def test_the_plans_cover_the_shapes():
    names = {plan.config.schedule for plan, _ in PLAN_CASES}
    assert set(ONE_CHUNK) | set(TWO_CHUNK) <= names
    assert any(layers[0] == 0 for _, layers in PLAN_CASES) and any(layers[-1] == 0 for _, layers in PLAN_CASES)
    assert any(0 in layers[1:-1] for _, layers in PLAN_CASES)
    assert len(MEGATRON_CASES) >= 200  # Megatron has no V placement


@pytest.mark.parametrize(("seed", "plan", "layers"), MEGATRON_CASES, ids=[f"plan{c[0]}" for c in MEGATRON_CASES])
def test_megatron_builds_the_exported_layout(seed, plan, layers, monkeypatch):
    c = plan.config
    out = plan.export("megatron").data
    n = plan.profile.num_body_layers
    parsed = PipelineParallelLayerLayout(out.layout, c.stages)
    parsed.validate_layer_layout(num_layers=n, mtp_num_layers=None)
    assert _model_map(_config(n, c.stages, c.chunks, pipeline_model_parallel_layout=out.layout),
                      c.stages, c.chunks) == _expected_map(layers)
    if out.uniform is not None:
        flags = megatron.parse_args(out.uniform)
        kw = {"num_layers_in_first_pipeline_stage": int(flags["decoder-first-pipeline-num-layers"])
              if "decoder-first-pipeline-num-layers" in flags else None,
              "num_layers_in_last_pipeline_stage": int(flags["decoder-last-pipeline-num-layers"])
              if "decoder-last-pipeline-num-layers" in flags else None}
        assert _model_map(_config(n, c.stages, c.chunks, **kw), c.stages, c.chunks) == _expected_map(layers)
    # the recompute flags: Megatron's checks, then its own choice of the layers to recompute
    kw = _megatron_flags(out.recompute)
    cfg = _config(n, c.stages, c.chunks, pipeline_model_parallel_layout=out.layout, **kw)
    expressed = np.asarray(out.expressed_counts)[0]  # (modes, virtual stages) of the one body group
    for vs, count in enumerate(layers):
        if kw.get("recompute_granularity") == "full":
            full = sum(_recomputed(cfg, count, monkeypatch)) if count else 0
            assert (expressed[FULL, vs], expressed[NONE, vs]) == (full, count - full)
        elif kw.get("recompute_granularity") == "selective":
            assert kw["recompute_modules"] == ["core_attn"] and expressed[SELECT, vs] == count
        else:
            assert expressed[NONE, vs] == count


def test_megatron_and_sapptk_read_layout_strings_alike():
    """The grammar, MTP layers included: sapptk's parse_layout against Megatron's parser."""
    rng = random.Random(7)
    for _ in range(300):
        stages = []
        for _ in range(rng.randint(1, 6)):
            stage = "".join(rng.choice("tttm") for _ in range(rng.randint(0, 4)))
            stages.append(stage)
        stages[0] = "E" + stages[0]
        stages[-1] += "L"
        text = "|".join(stages)
        if rng.random() < 0.5 and len(stages) > 2:  # a bracketed group
            group = "|".join(stages[1:-1]) + "|"
            text = f"{stages[0]}|({group})*{rng.randint(1, 3)},{stages[-1]}"
        text = text.replace("tttt", "t*4")
        ours = megatron.parse_layout(text)
        theirs = PipelineParallelLayerLayout.parse_str_to_list(text)
        names = {"embedding": "E", "loss": "L", "decoder": "t", "mtp": "m"}
        assert ours == ["".join(names[x.name] for x in stage) for stage in theirs], text


def _torchtitan_split(release: str, tmp_path: Path) -> dict:
    items = []
    for plan, _ in PLAN_CASES:
        out = plan.export("torchtitan").data
        parts = out.settings["python" if release == "0.3.0" else "toml"]["parts"]
        items.append({"schedule": out.schedule, "degree": plan.config.stages, "parts": parts})
    source, result = tmp_path / f"plans_{release}.json", tmp_path / f"split_{release}.json"
    source.write_text(json.dumps(items), encoding="utf-8")
    env = dict(os.environ)
    if release == "0.3.0":
        if not TORCHTITAN_0_3.is_dir():
            pytest.skip(f"torchtitan 0.3.0 is not installed beside 0.2.2 in {TORCHTITAN_0_3}")
        env["PYTHONPATH"] = str(TORCHTITAN_0_3) + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, str(PROBE), "--split", str(source), str(result)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(result.read_text(encoding="utf-8"))


# 0.3.0 builds what 0.2.2 builds on the cases of test_torchtitan.py; running its split on these
# plans too costs about 45 s of CI under load: pass "0.3.0" here to check it on them as well
@pytest.mark.parametrize("release", ["0.2.2"])
def test_torchtitan_splits_every_plan_as_exported(release, tmp_path):
    pytest.importorskip("torchtitan", reason="the runtimes extra is not installed: pip install -e '.[runtimes]'")
    got = _torchtitan_split(release, tmp_path)
    assert got["version"] == release
    mismatches = []
    for (plan, layers), ranks in zip(PLAN_CASES, got["plans"], strict=True):
        placement = plan.config.program().placement
        starts = np.concatenate([[0], np.cumsum(layers)])
        for rank, stages in enumerate(ranks):
            want = sorted(vs for vs, d in enumerate(placement) if d == rank)
            if sorted(i for i, _ in stages) != want:
                mismatches.append((plan.config.schedule, rank, "stages", stages))
            for vs, names in stages:
                expect = {f"layers.{i}.{w}" for i in range(starts[vs], starts[vs + 1]) for w in ("bias", "weight")}
                expect |= {"tok_embeddings.weight"} if vs == 0 else set()
                if vs == len(layers) - 1:
                    expect |= {"norm.bias", "norm.weight", "output.bias", "output.weight"}
                if set(names) != expect:
                    mismatches.append((plan.config.schedule, rank, vs, sorted(set(names) ^ expect)))
    assert mismatches == []
    assert len(got["plans"]) == PLANS
