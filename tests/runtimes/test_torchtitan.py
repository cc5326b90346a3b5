"""sapptk's torchtitan exports loaded by torchtitan itself (``runtimes`` extra).

Uneven plans for every schedule PyTorch can run, at p = 2, m with and without m mod p = 0,
each recompute mode torchtitan has: the TOML is loaded by torchtitan 0.2.2's
``ConfigManager`` and the Python config module by torchtitan 0.3.0's (``--module/--config``,
installed beside 0.2.2 in ``<venv>/torchtitan-0.3.0``), each in a process launched from
another directory than the export's (the schedule CSV must still be found). Each release's
own module split and schedule builder must build the plan's stages on every rank, its
micro-batches and its order, and 0.3.0 exactly what 0.2.2 builds.
"""

from __future__ import annotations

import csv
import io
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the runtimes extra is not installed: pip install -e '.[runtimes]'")
pytest.importorskip("torchtitan", reason="the runtimes extra is not installed: pip install -e '.[runtimes]'")

from sapptk.config import PipelineConfig  # noqa: E402
from sapptk.formats.expressible import counts_from_layers  # noqa: E402
from sapptk.formats.torchtitan import AC_SETTINGS  # noqa: E402
from sapptk.plan import make_plan  # noqa: E402
from sapptk.profile import MODES, LayerGroup, ModeCost, Profile  # noqa: E402
from sapptk.schedules import build, registry  # noqa: E402

pytestmark = pytest.mark.slow

PROBE = Path(__file__).with_name("torchtitan_probe.py")
TORCHTITAN_0_3 = Path(sys.prefix) / "torchtitan-0.3.0"
BASE_0_3 = "torchtitan.models.llama3.config_registry:llama3_debugmodel"  # 6 decoder layers
LAYERS = 6
AC_0_3 = {"none": "None", "select": "SelectiveAC.Config", "full": "FullAC.Config"}


def profile(layers: int = LAYERS) -> Profile:
    body = LayerGroup("layer", "body", layers, 1.0, 10.0, {"none": ModeCost(2.0, 8.0), "select": ModeCost(2.1, 5.0),
                                                          "full": ModeCost(3.0, 1.0)})
    return Profile("tt", (LayerGroup("emb", "head", 1, 0.5, 20.0), body, LayerGroup("out", "tail", 1, 1.0, 20.0)))


def _cases() -> list[tuple[str, int, int, str, tuple[int, ...]]]:
    """(schedule, m, v, mode, layers per virtual stage): every schedule without slices at p = 2."""
    out = []
    modes = ("none", "select", "full")
    for name in registry.names():
        spec = registry.get(name)
        if spec.splits:
            continue
        v = 2 if spec.chunks != (1,) else 1
        for m in (4, 5):
            rng = random.Random(len(out))
            cuts = sorted(rng.sample(range(1, LAYERS), 2 * v - 1))  # uneven, no empty stage
            layers = tuple(b - a for a, b in zip([0, *cuts], [*cuts, LAYERS], strict=True))
            out.append((name, m, v, modes[len(out) % 3], layers))
    return out


CASES = _cases()


def _id(case) -> str:
    name, m, v, mode, _ = case
    return f"{name}-p2-m{m}-v{v}-{mode}"


def _plan(case):
    name, m, v, mode, layers = case
    cfg = PipelineConfig(2, m, v, name)
    counts = counts_from_layers(profile(), layers, lambda vs, pos: MODES.index(mode))
    return make_plan(profile(), cfg, counts, status="given")


def _probe(configs: list[Path], out: Path, cwd: Path, pythonpath: str | None) -> dict:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, str(PROBE), str(out), *map(str, configs)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """Per case id: what torchtitan 0.2.2 and 0.3.0 built from the export."""
    if not TORCHTITAN_0_3.is_dir():
        pytest.skip(f"torchtitan 0.3.0 is not installed beside 0.2.2: pip install --no-deps --target "
                    f"{TORCHTITAN_0_3} torchtitan==0.3.0")
    exports = tmp_path_factory.mktemp("exports")
    elsewhere = tmp_path_factory.mktemp("launch_dir")  # neither the export's folder nor the repository
    paths = {}
    for i, case in enumerate(CASES):
        folder = exports / f"case{i}"
        folder.mkdir()
        paths[_id(case)] = dict(_plan(case).export("torchtitan", folder / f"sapptk_case{i}.toml",
                                                   base_config=BASE_0_3).written)
    wrong = _plan(CASES[0])
    bad = profile(LAYERS + 2)
    wrong = make_plan(bad, wrong.config, counts_from_layers(bad, (2, 6), lambda vs, pos: 0), status="given")
    (exports / "wrong").mkdir()
    wrong_path = wrong.export("torchtitan", exports / "wrong" / "sapptk_wrong.toml",
                              base_config=BASE_0_3).written["python"]
    old = _probe([p["toml"] for p in paths.values()], exports / "0.2.2.json", elsewhere, None)
    new = _probe([p["python"] for p in paths.values()] + [wrong_path], exports / "0.3.0.json", elsewhere,
                 str(TORCHTITAN_0_3))
    out = {key: {"0.2.2": old[str(p["toml"].resolve())], "0.3.0": new[str(p["python"].resolve())], "paths": p}
           for key, p in paths.items()}
    out["wrong"] = new[str(wrong_path.resolve())]
    return out


def _expected_params(layers: tuple[int, ...]) -> list[list[str]]:
    out, start = [], 0
    for vs, n in enumerate(layers):
        names = [f"layers.{i}.{w}" for i in range(start, start + n) for w in ("bias", "weight")]
        names += ["tok_embeddings.weight"] if vs == 0 else []
        names += ["norm.bias", "norm.weight", "output.bias", "output.weight"] if vs == len(layers) - 1 else []
        out.append(sorted(names))
        start += n
    return out


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_torchtitan_0_2_2_builds_the_plan_from_the_toml(case, loaded):
    name, m, v, mode, layers = case
    got = loaded[_id(case)]["0.2.2"]
    assert "error" not in got, got.get("error")
    assert got["version"] == "0.2.2"
    plan = _plan(case)
    program = build(name, stages=2, micro_batches=m, chunks=v)
    params = _expected_params(layers)
    rows = [[cell for cell in row if cell] for row in csv.reader(io.StringIO(program.to_csv()))]
    export = plan.export("torchtitan").data
    for rank, built in enumerate(got["ranks"]):
        assert sorted(i for i, _ in built["stages"]) == [vs for vs, d in enumerate(program.placement) if d == rank]
        for vs, names in built["stages"]:
            assert names == params[vs]
        schedule = built["schedule"]
        assert schedule["micro_batches"] == m
        if export.csv is not None:
            assert schedule["class"] == "_PipelineScheduleRuntime"
            assert got["csv"] == str(loaded[_id(case)]["paths"]["csv"])
        else:
            assert schedule["class"].lower() == "schedule" + export.schedule.lower()
        if schedule["order"] is not None:
            assert schedule["order"] == rows[rank]
    assert {k: got["ac"][k] for k in AC_SETTINGS[mode]} == AC_SETTINGS[mode]


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_torchtitan_0_3_builds_what_0_2_2_builds(case, loaded):
    got = loaded[_id(case)]
    assert "error" not in got["0.3.0"], got["0.3.0"].get("error")
    assert got["0.3.0"]["version"] == "0.3.0" and "torchtitan-0.3.0" in got["0.3.0"]["path"]
    assert got["0.3.0"]["ranks"] == got["0.2.2"]["ranks"]
    for key in ("schedule", "csv", "micro_batch_size", "local_batch_size"):
        assert got["0.3.0"][key] == got["0.2.2"][key], key
    assert got["0.3.0"]["ac"] == {"class": AC_0_3[case[3]]}


def test_torchtitan_0_3_config_refuses_a_model_of_another_depth(loaded):
    assert "builds 6 layers: the sapptk plan places 8" in loaded["wrong"]["error"]
