"""megatron_estimator.inputs.registry: every file kind has one reader, chosen by kind for every front."""

from __future__ import annotations

import typing
from pathlib import Path

from megatron_estimator.api import input_from_file
from megatron_estimator.inputs import registry
from megatron_estimator.inputs.detect import Format
from megatron_estimator.inputs.rawargs import RawArgs, RawSetting

REPO = Path(__file__).resolve().parent.parent


def test_every_detected_kind_but_unknown_has_a_reader():
    kinds = set(typing.get_args(Format))
    assert set(registry.READERS) == kinds - {"unknown"}
    assert all(registry.READERS[k].kind == k for k in registry.READERS)


def test_a_seed_yaml_is_read_by_its_reader():
    # examples/llama3-8b.yaml: Llama 3 8B, 32 layers of hidden size 4096 (its published configuration)
    loaded = registry.read_file(REPO / "examples/llama3-8b.yaml", registry.ReadOptions({}))
    assert loaded.flags is None
    assert loaded.raw.value("num_layers") == 32
    assert loaded.raw.value("hidden_size") == 4096
    assert loaded.raw.value("tensor_model_parallel_size") == 2


def test_a_launch_script_gives_its_flags_to_parse(tmp_path):
    path = tmp_path / "train.sh"
    path.write_text("#!/bin/bash\nexport NVTE_FLASH_ATTN=0\n"
                    "torchrun --nproc-per-node 4 --nnodes 2 pretrain_gpt.py --num-layers 2 --hidden-size 64\n")
    loaded = registry.read_file(path, registry.ReadOptions({"PWD": str(tmp_path)}))
    assert loaded.problems == ()
    assert loaded.flags == ("--num-layers", "2", "--hidden-size", "64")
    assert loaded.flag_locations == (f"{path}:3",) * 4
    assert loaded.world_size == 8                   # 2 nodes x 4 processes per node
    assert loaded.environment == {"NVTE_FLASH_ATTN": "0"}
    assert loaded.job_environment is True and loaded.launch_location == f"{path}:3"


def test_an_unknown_file_and_a_bare_directory_are_one_problem_each(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("hello\n")
    [problem] = registry.read_file(text, registry.ReadOptions({})).problems
    assert problem.code == "unknown-format" and problem.location == str(text)
    [problem] = registry.read_file(tmp_path, registry.ReadOptions({})).problems
    assert (problem.code, problem.message) == ("unknown-format",
                                               "is a directory without a HuggingFace config.json; name a file")


def test_a_new_reader_is_one_registration(monkeypatch, tmp_path):
    path = tmp_path / "a.yaml"
    path.write_text("model:\n  num_layers: 3\n")

    def read(p, options):
        return registry.FileInput(RawArgs({"num_layers": RawSetting("num_layers", 5, f"{p}:1")}, source=str(p)))

    monkeypatch.setitem(registry.READERS, "seed-yaml", registry.FileFormat("seed-yaml", read))
    inp, problems = input_from_file(path, environ={})
    assert problems == () and inp.raw.value("num_layers") == 5


def test_skip_unknown_asks_the_reader_of_the_kind(tmp_path):
    plain = tmp_path / "backup.sh"
    plain.write_text("#!/bin/bash\n# pretrain_gpt.py is not run here\nrsync -a /data /backup\n")
    training = tmp_path / "train.sh"
    training.write_text("#!/bin/bash\npython pretrain_gpt.py --num-layers 2\n")
    yaml = tmp_path / "c.yaml"
    yaml.write_text("model:\n  num_layers: 2\n")
    assert registry.skip_reason(plain) == ("launches no Megatron training (no pretrain*.py, --num-layers, "
                                           "--hidden-size, --num-attention-heads or --yaml-cfg in it)")
    assert registry.skip_reason(training) is None
    assert registry.skip_reason(yaml) is None
    assert registry.skip_reason(tmp_path / "absent.sh") is None       # reported by check, never skipped
    other = tmp_path / "x.txt"
    other.write_text("hello\n")
    assert registry.skip_reason(other).startswith("not a seed-format YAML")


def test_a_variable_the_script_unsets_is_not_in_the_jobs_environment(tmp_path, monkeypatch):
    # Megatron-LM examples/megatron_fsdp/train_llama3_8b_fsdp_h100_fp8.sh unsets
    # CUDA_DEVICE_MAX_CONNECTIONS before its FSDP launch; Megatron (arguments.py validate_args,
    # main d98e8a64) refuses FSDP only when the job's environment has it at "1", so a calling
    # shell's CUDA_DEVICE_MAX_CONNECTIONS=1 must not reach the check.
    from megatron_estimator.api import evaluate

    monkeypatch.chdir(tmp_path)
    body = ("torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 4 --hidden-size 64 --num-attention-heads 4 "
            "--seq-length 32 --max-position-embeddings 32 --micro-batch-size 2 --vocab-size 1000 --bf16 "
            "--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params --no-gradient-accumulation-fusion\n")
    env = {"PATH": "/usr/bin:/bin", "CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    codes = {}
    for name, prelude in (("kept.sh", ""), ("unset.sh", "unset CUDA_DEVICE_MAX_CONNECTIONS\n")):
        (tmp_path / name).write_text("#!/bin/bash\n" + prelude + body)
        loaded = registry.read_file(tmp_path / name, registry.ReadOptions(env))
        inp, problems = input_from_file(tmp_path / name, environ=env)
        verdict = evaluate(inp, world_size=8, environ=env, problems=problems)
        codes[name] = ({p.code for p in verdict.problems}, loaded.environment)
    assert "fsdp-cuda-device-max-connections" in codes["kept.sh"][0] and codes["kept.sh"][1] == {}
    assert "fsdp-cuda-device-max-connections" not in codes["unset.sh"][0]
    assert codes["unset.sh"][1] == {"CUDA_DEVICE_MAX_CONNECTIONS": None}
