"""``sapptk estimate`` and ``sapptk balance --model`` (docs/estimation.md)."""

from __future__ import annotations

import pytest

from sapptk.cli import main
from sapptk.models import Parallel, estimate_profile
from sapptk.profile import load_profile

ESTIMATE = ["estimate", "--model", "llama3.1-70b", "--tp", "8", "--seq-length", "8192", "--micro-batch-size", "1",
            "--gpu", "h100"]


def test_estimate_prints_the_group_table(capsys):
    assert main(ESTIMATE) == 0
    out = capsys.readouterr().out
    assert "llama3.1-70b tp8 s8192 b1 h100: 70,553,706,496 parameters" in out
    lines = out.splitlines()
    assert lines[1].split()[:5] == ["group", "kind", "count", "forward_ms", "params_mb"]
    assert [line.split()[0] for line in lines[2:5]] == ["embedding", "layers", "output"]
    assert lines[3].split()[2] == "80"


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_estimate_writes_the_profile(tmp_path, capsys, suffix):
    out = tmp_path / f"profile{suffix}"
    assert main([*ESTIMATE, "--out", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    written = load_profile(out)
    assert written == estimate_profile("llama3.1-70b", Parallel(tp=8, seq_length=8192), "h100")
    assert written.provenance["hardware"]["name"] == "h100"


def test_estimate_reads_a_config_json(tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text('{"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,'
                      ' "num_attention_heads": 4, "vocab_size": 1000, "unused": {"a": 1}}', encoding="utf-8")
    assert main(["estimate", "--model", str(config), "--efficiency", "0.5", "--gpu", "a100"]) == 0
    assert "a100 312 TFLOPS x 0.5" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "fragments"),
    [
        (["--model", "llama9"], ["not bundled", "llama3.1-70b"]),
        (["--model", "llama2-70b", "--tp", "16"], ["'tp' = 16", "key/value heads"]),
        (["--model", "llama2-70b", "--gpu", "tpu"], ["tpu", "h100"]),
        (["--model", "llama2-70b", "--seq-length", "0"], ["seq_length", "0"]),
        (["--model", "llama2-70b", "--out", "p.txt"], ["--out", ".yaml"]),
    ],
)
def test_estimate_bad_input(capsys, argv, fragments):
    assert main(["estimate", *argv]) == 2
    err = capsys.readouterr().err
    for fragment in fragments:
        assert fragment in err


def test_balance_needs_one_source(capsys):
    assert main(["balance", "-p", "2", "-m", "4"]) == 2
    assert "expected a PROFILE or --model" in capsys.readouterr().err
    assert main(["balance", "demo", "--model", "llama2-7b", "-p", "2", "-m", "4"]) == 2
    assert "expected one" in capsys.readouterr().err


@pytest.mark.slow
def test_balance_on_a_model_card(capsys):
    argv = ["balance", "--model", "llama2-7b", "--tp", "2", "--seq-length", "4096", "-p", "4", "-m", "8",
            "--time-limit", "5"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "profile llama2-7b tp2 s4096 b1 h100 (32 body layers)" in out
    assert "budget 80000 MB" in out
