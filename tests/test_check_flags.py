"""``check FILE... -- FLAGS``: Megatron flags after '--' are laid over every file's settings."""

from __future__ import annotations

from conftest import REPO

from megatron_estimator.cli import main

PYTHIA = REPO / "tests" / "fixtures" / "hf" / "pythia-160m" / "config.json"


def test_a_hf_config_json_is_checked_with_the_flags_after_the_separator(capsys, monkeypatch):
    monkeypatch.chdir(PYTHIA.parent)
    # without the training settings, a config.json is an architecture only: invalid
    assert main(["check", "--world-size", "8", "--gpu", "h100", str(PYTHIA)]) == 2
    out = capsys.readouterr().out
    assert "error: --micro-batch-size: --micro-batch-size is required [missing-required]" in out
    code = main(["check", "--world-size", "8", "--gpu", "h100", str(PYTHIA), "--", "--seq-length", "2048",
                 "--micro-batch-size", "1", "--global-batch-size", "64", "--bf16", "--tensor-model-parallel-size", "4"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "  world size 8 (--world-size); tp 4 | pp 1 | vpp - | cp 1 | dp 2 | ep 1 | etp 4 | edp 2\n" in out
    # GPT-NeoX 160m: 12 layers, hidden 768, 12 heads (config.json), ffn 4 x 768
    assert "  model: 12 layers, hidden 768, ffn 3072, 12 heads\n" in out


def test_flags_after_the_separator_override_a_launch_scripts_own(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".git").mkdir()
    script = tmp_path / "train.sh"
    script.write_text(
        "export CUDA_DEVICE_MAX_CONNECTIONS=1\n"
        "torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 4 --hidden-size 1024 --num-attention-heads 16 "
        "--seq-length 2048 --max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 8 --bf16 "
        "--tokenizer-type NullTokenizer --tensor-model-parallel-size 3\n")
    assert main(["check", str(script)]) == 2
    out = capsys.readouterr().out
    assert "--tensor-model-parallel-size" in out and "[missing-required]" not in out
    code = main(["check", "--gpu", "h100", str(script), "--", "--vocab-size", "32000",
                 "--tensor-model-parallel-size", "2"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "tp 2 | pp 1 | vpp - | cp 1 | dp 4" in out
