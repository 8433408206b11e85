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
    assert registry.skip_reason(plain) == "launches nothing (no launcher, python or program in it)"
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


# ---- check --skip-unknown: decided by the entry program the launch runs ----------------------
# Each fixture reproduces an idiom of Megatron-LM's examples/ (main d98e8a64); what each program
# does is read from its source there: tools/run_text_generation_server.py serves generation,
# examples/inference/offline_inference.py runs inference, examples/post_training/modelopt/
# finetune.py calls megatron.training.pretrain.

_TINY = "--num-layers 2 --hidden-size 64 --num-attention-heads 4"


def _skip(tmp_path, monkeypatch, text, name="run.sh", files=()):
    monkeypatch.chdir(tmp_path)
    for rel, body in files:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(body)
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/bash\n" + text)
    return registry.skip_reason(path)


def test_a_text_generation_server_is_skipped_with_its_program_named(tmp_path, monkeypatch):
    # examples/mamba/run_text_gen_server_8b_gpt3.sh: Megatron's model flags, but the server trains nothing
    reason = _skip(tmp_path, monkeypatch, "DISTRIBUTED_ARGS='--nproc_per_node 1'\n"
                   f"torchrun $DISTRIBUTED_ARGS ../../tools/run_text_generation_server.py {_TINY}\n")
    assert reason == (f"starts no training: its launch at {tmp_path}/run.sh:3 runs ../../tools/"
                      "run_text_generation_server.py, a text generation server")


def test_an_inference_example_that_stops_before_its_launch_is_still_skipped(tmp_path, monkeypatch):
    # examples/inference/run_offline_inference.sh exits unless --checkpoint is given: no launch is
    # reached, and the module the script names is an inference example
    reason = _skip(tmp_path, monkeypatch, 'CHECKPOINT=""\nif [[ -z "$CHECKPOINT" ]]; then exit 1; fi\n'
                   f"torchrun --nproc-per-node 8 -m examples.inference.offline_inference {_TINY}\n")
    assert reason == "starts no training: it runs examples.inference.offline_inference, an inference example"


def test_a_modelopt_finetune_launch_through_a_sourced_launcher_is_checked(tmp_path, monkeypatch):
    # examples/post_training/modelopt/finetune.sh: no launcher word and no model flag in the file
    # itself; conf/arguments.sh sets LAUNCH_SCRIPT, and finetune.py trains (it calls pretrain())
    files = [("examples/post_training/modelopt/conf/arguments.sh", "LAUNCH_SCRIPT='torchrun --nproc_per_node 1'\n"),
             ("examples/post_training/modelopt/finetune.py", "from megatron.training import pretrain\n")]
    reason = _skip(tmp_path, monkeypatch, 'SCRIPT_DIR="$(dirname "$(readlink -f "$0")")"\n'
                   'source "${SCRIPT_DIR}/conf/arguments.sh"\n${LAUNCH_SCRIPT} ${SCRIPT_DIR}/finetune.py --finetune\n',
                   name="examples/post_training/modelopt/finetune.sh", files=files)
    assert reason is None


def test_a_training_launch_that_cannot_be_found_is_checked_not_passed_over(tmp_path, monkeypatch):
    # it exits before its launch here; check then reports why (no-launch-line), never a silent pass
    reason = _skip(tmp_path, monkeypatch, 'DATA=""\nif [[ -z "$DATA" ]]; then exit 1; fi\n'
                   f"torchrun --nproc_per_node 8 pretrain_gpt.py {_TINY}\n")
    assert reason is None


def test_a_custom_program_is_judged_by_what_it_imports_and_its_flags(tmp_path, monkeypatch):
    files = [("serve.py", "from megatron.core.inference.engines import StaticInferenceEngine\n"),
             ("my_train.py", "from megatron.core.inference import x\nfrom megatron.training import pretrain\n"
                             "pretrain(None, None, None)\n"),
             ("tool.py", "print('hi')\n")]
    serve = _skip(tmp_path, monkeypatch, f"torchrun serve.py {_TINY}\n", files=files)
    assert serve.startswith("starts no training") and "it imports megatron's inference package" in serve
    assert _skip(tmp_path, monkeypatch, f"torchrun my_train.py {_TINY}\n", name="b.sh") is None
    # an unknown program: a training launch only with a model's flags
    assert _skip(tmp_path, monkeypatch, f"python tool.py {_TINY}\n", name="c.sh") is None
    assert _skip(tmp_path, monkeypatch, "python tool.py --input x\n", name="d.sh") == (
        f"launches no Megatron training: its launch at {tmp_path}/d.sh:2 runs tool.py, not a Megatron-LM training "
        "entry script, with none of --num-layers, --hidden-size, --num-attention-heads or --yaml-cfg")
