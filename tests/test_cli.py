"""The command line, run as users run it: a subprocess, exit codes, stdout/stderr, exec."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import LLAMA3_8B, REPO, TINY_GPT, flags

CLI = [sys.executable, "-m", "megatron_estimator"]


def run(args, env=None, cwd=None):
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MEGATRON_ESTIMATOR_") and k != "WORLD_SIZE"}
    environ["PYTHONPATH"] = str(REPO)
    environ.update(env or {})
    return subprocess.run(CLI + list(args), capture_output=True, text=True, env=environ, cwd=cwd or REPO, timeout=120)


def report_schema():
    return json.loads((REPO / "schemas" / "report.schema.json").read_text())


def validate_report(doc):
    import jsonschema

    jsonschema.validate(doc, report_schema())


def test_version():
    result = run(["--version"])
    from megatron_estimator import __version__

    assert result.returncode == 0
    assert result.stdout.strip() == f"megatron-estimator {__version__}"


def test_estimate_without_budget_reports_and_exits_0():
    result = run(["estimate", "--world-size", "8", "--"] + flags(LLAMA3_8B))
    assert result.returncode == 0, result.stderr
    assert "world size 8 (--world-size)" in result.stdout
    assert "budget: none given" in result.stdout
    assert "parameters: 8,030,261,248" in result.stdout


def test_estimate_fits_and_over_budget_exit_codes():
    args = ["estimate", "--world-size", "8", "--format", "json", "--"] + flags(LLAMA3_8B, "--tensor-model-parallel-size 8")
    doc = json.loads(run(args).stdout)
    peak = max(s["device_peak_bytes"] for s in doc["stages"])
    fits = run(args[:1] + ["--budget", f"{peak}B"] + args[1:])
    over = run(args[:1] + ["--budget", f"{peak - 1}B"] + args[1:])
    assert fits.returncode == 0 and json.loads(fits.stdout)["status"] == "fits"
    assert over.returncode == 1 and json.loads(over.stdout)["status"] == "over_budget"
    assert json.loads(over.stdout)["stages"][0]["fits"] is False


def test_json_report_follows_the_schema():
    result = run(["estimate", "--world-size", "16", "--budget", "80GiB", "--format", "json", "--"]
                 + flags(LLAMA3_8B, "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 4 --global-batch-size 32"))
    doc = json.loads(result.stdout)
    validate_report(doc)
    assert doc["budget_bytes"] == 80 * 2**30
    assert doc["parallelism"] == {"tp": 2, "pp": 4, "vpp": None, "cp": 1, "dp": 2, "ep": 1, "etp": 2, "edp": 2}
    assert [s["pipeline_rank"] for s in doc["stages"]] == [0, 1, 2, 3]
    assert [s["layers"] for s in doc["stages"]] == [8, 8, 8, 8]
    stage = doc["stages"][0]
    assert stage["allocated_peak_bytes"] == sum(stage["bytes"].values())
    assert stage["device_peak_bytes"] > stage["allocated_peak_bytes"]
    assert doc["peak_stage"] == max(doc["stages"], key=lambda s: s["device_peak_bytes"])["pipeline_rank"]


def test_invalid_input_is_exit_2_with_every_problem_and_no_traceback():
    result = run(["estimate", "--world-size", "12", "--"] + flags(
        TINY_GPT, "--tensor-model-paralel-size 4 --tensor-model-parallel-size 4 --pipeline-model-parallel-size 2"))
    assert result.returncode == 2
    assert "Traceback" not in result.stdout + result.stderr
    assert "--tensor-model-paralel-size: unknown flag; did you mean --tensor-model-parallel-size? [unknown-flag]" in result.stdout
    assert "tp(4) x pp(2) x cp(1) = 8 does not divide world size 12" in result.stdout


def test_invalid_input_as_json():
    result = run(["estimate", "--format", "json", "--", "--num-layers", "two"])
    doc = json.loads(result.stdout)
    validate_report(doc)
    assert result.returncode == 2
    assert doc["status"] == "invalid" and doc["stages"] == []
    assert doc["problems"][0]["code"] == "invalid-value"
    assert doc["problems"][0]["location"] == "--num-layers"


def test_world_size_from_environment_and_smallest_world():
    env_result = run(["estimate", "--"] + flags(TINY_GPT), env={"WORLD_SIZE": "4"})
    assert "world size 4 (WORLD_SIZE=4 in the environment)" in env_result.stdout
    smallest = run(["estimate", "--"] + flags(TINY_GPT, "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2"))
    assert "world size 4 (the smallest world the layout needs (data parallel 1))" in smallest.stdout


@pytest.mark.parametrize("budget, expected", [
    ("80GiB", 80 * 2**30), ("80GB", 80 * 10**9), ("81920MiB", 80 * 2**30), ("80", 80 * 2**30),
])
def test_budget_spellings(budget, expected):
    result = run(["estimate", "--budget", budget, "--format", "json", "--"] + flags(TINY_GPT))
    assert json.loads(result.stdout)["budget_bytes"] == expected


def test_bad_budget_is_exit_2():
    result = run(["estimate", "--budget", "eighty", "--"] + flags(TINY_GPT))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr + result.stdout
    assert "--budget" in result.stdout + result.stderr


def test_gpu_sets_the_budget():
    from megatron_estimator.megatron.gpus import lookup_gpu

    result = run(["estimate", "--gpu", "h100", "--format", "json", "--"] + flags(TINY_GPT))
    assert json.loads(result.stdout)["budget_bytes"] == lookup_gpu("h100").total_memory_bytes


def test_markdown_format():
    result = run(["estimate", "--budget", "80GiB", "--format", "markdown", "--"] + flags(TINY_GPT))
    assert result.returncode == 0
    assert result.stdout.startswith("### command line: fits")
    assert "| stage | layers | params |" in result.stdout


def test_usage_errors_are_exit_2():
    assert run(["estimate"]).returncode == 2
    assert run(["frobnicate"]).returncode == 2
    assert run([]).returncode == 2


# --- run: the prefix on a real launch --------------------------------------------------

DUMP = """\
import json, os, sys
with open(os.environ["DUMP_TO"], "w") as f:
    json.dump({"argv": sys.argv, "env": dict(os.environ)}, f)
"""


@pytest.fixture
def dump_script(tmp_path):
    script = tmp_path / "pretrain_gpt.py"
    script.write_text(DUMP)
    return script


def test_run_execs_the_unchanged_command_when_it_fits(tmp_path, dump_script):
    out = tmp_path / "dump.json"
    command = [sys.executable, str(dump_script)] + flags(TINY_GPT, "--data-path '${DATA_PATH}/x' --save /nowhere --save-interval 100")
    env = {"DUMP_TO": str(out), "SOME_VAR": "kept as is"}
    result = run(["run", "--budget", "80GiB", "--"] + command, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    dumped = json.loads(out.read_text())
    assert dumped["argv"] == [str(dump_script)] + command[2:]
    expected_env = {k: v for k, v in os.environ.items() if not k.startswith("MEGATRON_ESTIMATOR_") and k != "WORLD_SIZE"}
    expected_env.update({"PYTHONPATH": str(REPO)}, **env)
    assert dumped["env"] == expected_env


def test_run_refuses_over_budget_without_launching(tmp_path, dump_script):
    out = tmp_path / "dump.json"
    command = [sys.executable, str(dump_script)] + flags(TINY_GPT)
    result = run(["run", "--budget", "0.001", "--"] + command, env={"DUMP_TO": str(out)})
    assert result.returncode == 1
    assert result.stdout == ""
    assert "OVER BUDGET" in result.stderr
    assert not out.exists()


def test_run_warn_only_launches_anyway(tmp_path, dump_script):
    out = tmp_path / "dump.json"
    command = [sys.executable, str(dump_script)] + flags(TINY_GPT)
    result = run(["run", "--budget", "0.001", "--warn-only", "--"] + command, env={"DUMP_TO": str(out)})
    assert result.returncode == 0
    assert "OVER BUDGET" in result.stderr
    assert json.loads(out.read_text())["argv"][1:] == command[2:]


def test_run_refuses_invalid_flags(tmp_path, dump_script):
    out = tmp_path / "dump.json"
    command = [sys.executable, str(dump_script)] + flags(TINY_GPT, "--num-layer 3")
    result = run(["run", "--budget", "80GiB", "--"] + command, env={"DUMP_TO": str(out)})
    assert result.returncode == 2
    assert "--num-layer: unknown flag; did you mean --num-layers" in result.stderr
    assert not out.exists()


def test_run_reads_the_world_size_from_torchrun():
    command = ["torchrun", "--nproc-per-node", "8", "--nnodes", "2", "pretrain_gpt.py"] + flags(
        LLAMA3_8B, "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 3")
    result = run(["run", "--budget", "80GiB", "--format", "json", "--"] + command)
    # 16 GPUs do not tile tp 2 x pp 3: refused before launching, with the launcher named.
    assert result.returncode == 2
    doc = json.loads(result.stderr)
    assert "tp(2) x pp(3) x cp(1) = 6 does not divide world size 16" in doc["problems"][0]["message"]
    assert "torchrun" in doc["problems"][0]["message"]


# --- check -----------------------------------------------------------------------------

def test_check_every_file_and_worst_exit_code(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("model:\n  num_layers: [\n")
    result = run(["check", "--budget", "80GiB", str(REPO / "examples" / "llama3-8b.yaml"), str(broken),
                  str(REPO / "examples" / "llama3_8b_pretrain.sh")])
    assert result.returncode == 2
    assert "examples/llama3-8b.yaml:" in result.stdout
    assert f"{broken}:" in result.stdout and "yaml-syntax" in result.stdout
    assert result.stdout.count("verdict: FITS") == 2


def test_check_names_the_top_level_keys_a_flat_yaml_lacks(tmp_path):
    flat = tmp_path / "flat.yaml"
    flat.write_text("num_layers: 32\nhidden_size: 4096\n")
    result = run(["check", str(flat)])
    assert result.returncode == 2
    assert result.stdout.splitlines() == [
        f"{flat}:",
        "  invalid input, 1 problem:",
        f"  error: {flat}: not a seed-format YAML (sections model:, parallelism:, training:, precision: holding "
        "mostly the seed format's keys), a Megatron --yaml-cfg "
        "YAML (top-level language_model: or model_parallel:), a Megatron-Bridge ConfigContainer YAML (model:, "
        "train:, optimizer:... sections), a launch script or a HuggingFace config.json "
        "(model_type or architectures) [unknown-format]",
    ]
    assert "Traceback" not in result.stderr


def test_check_json_wraps_several_results():
    result = run(["check", "--format", "json", str(REPO / "examples" / "llama3-8b.yaml"),
                  str(REPO / "examples" / "llama3-70b-tight.yaml")])
    doc = json.loads(result.stdout)
    validate_report(doc)
    assert [r["world_size"] for r in doc["results"]] == [8, 64]


def test_yaml_cfg_replaces_the_command_line():
    result = run(["estimate", "--world-size", "8", "--format", "json", "--",
                  "--yaml-cfg", "tests/fixtures/megatron-yaml-gpt.yaml", "--num-layers", "99"])
    doc = json.loads(result.stdout)
    assert result.returncode == 0, result.stdout
    assert sum(s["layers"] for s in doc["stages"]) == 24          # the YAML's, not --num-layers 99
    assert [s["layers"] for s in doc["stages"]] == [5, 19]
    notes = [a["text"] for a in doc["assumptions"]]
    assert any("replaces the command line: Megatron ignores --num-layers" in n for n in notes)


def test_bad_setting_from_the_environment_is_exit_2_naming_it():
    result = run(["estimate", "--"] + flags(TINY_GPT), env={"MEGATRON_ESTIMATOR_BUDGET": "lots"})
    assert result.returncode == 2
    assert "MEGATRON_ESTIMATOR_BUDGET" in result.stdout and "[invalid-setting]" in result.stdout


def test_flash_attn_option_changes_the_attention_kernel_on_a100():
    # The gpt3 resume tests of Megatron-LM's CI: deterministic, Transformer Engine, auto attention.
    base = ["estimate", "--gpu", "a100-80gb", "--world-size", "8", "--format", "json"]
    megatron = ["--"] + flags(TINY_GPT, "--deterministic-mode --attention-softmax-in-fp32")
    assumed = json.loads(run(base + megatron).stdout)
    without = run(base + ["--flash-attn", "none"] + megatron)
    from_env = run(base + megatron, env={"MEGATRON_ESTIMATOR_FLASH_ATTN": "2.3.6"})
    assert without.returncode == from_env.returncode == 0, without.stderr
    without, from_env = json.loads(without.stdout), json.loads(from_env.stdout)
    kernel = {a["key"]: a["text"] for a in without["assumptions"]}["attention_backend"]
    assert kernel.startswith("attention kernel: unfused")
    assert "--attention-backend auto" in kernel and "deterministic mode" in kernel
    # Per layer (TINY_GPT: b 2, a 4, s 32, dropout 0.1): unfused keeps 5 b a s^2 bytes (bf16 softmax
    # output, 1-byte dropout mask, bf16 dropped-out probabilities) where flash kept an fp32
    # log-sum-exp of 4 b a s; the fused masked softmax leaves no fp32 copy; four layers, one microbatch.
    b, a, s = 2, 4, 32
    assert (without["stages"][0]["bytes"]["activations"] - assumed["stages"][0]["bytes"]["activations"]
            == 4 * (5 * b * a * s * s - 4 * b * a * s))
    assert from_env["stages"] == without["stages"]


def test_a_bad_flash_attn_value_is_a_usage_problem():
    result = run(["estimate", "--flash-attn", "recent", "--world-size", "1", "--"] + flags(TINY_GPT))
    assert result.returncode == 2
    assert "command line --flash-attn: must be a flash-attn version such as 2.7.4, or none, not 'recent'" \
        in result.stdout + result.stderr
    assert "Traceback" not in result.stderr


def test_run_says_when_the_launcher_cannot_be_run(tmp_path):
    command = ["no-such-torchrun-here", "--nproc-per-node", "1", "pretrain_gpt.py"] + flags(TINY_GPT)
    result = run(["run", "--budget", "80GiB", "--world-size", "1", "--"] + command)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == "megatron-estimator run: error: cannot launch 'no-such-torchrun-here': not found on PATH\n"
    script = tmp_path / "launch"
    script.write_text("#!/bin/sh\n")                     # not executable
    result = run(["run", "--budget", "80GiB", "--world-size", "1", "--", str(script), "pretrain_gpt.py"]
                 + flags(TINY_GPT))
    assert result.returncode == 2
    assert result.stderr == f"megatron-estimator run: error: cannot launch {str(script)!r}: Permission denied\n"


def test_absurd_sizes_are_range_problems_not_crashes():
    result = run(["estimate", "--world-size", "1", "--"] + flags(
        TINY_GPT, "--num-layers 99999999999999999999999 --num-experts 100000 --ffn-hidden-size 100000000000000000000"))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr
    lines = [line.strip() for line in result.stdout.splitlines() if line.strip().startswith("error:")]
    assert lines == [
        "error: --ffn-hidden-size: 100000000000000000000 is out of range: must be <= 9007199254740992 "
        "(at most 2^53, the largest integer a float holds exactly) [out-of-range]",
        "error: --num-experts: 100000 is out of range: must be <= 16384 (the estimator builds every expert's "
        "weights; more than 16384 experts is no model anyone trains) [out-of-range]",
        "error: --num-layers: 99999999999999999999999 is out of range: must be <= 16384 (the estimator builds "
        "every layer of the model; more than 16384 layers is no model anyone trains) [out-of-range]",
    ]


def test_check_never_guesses_a_scripts_world_size(tmp_path):
    path = tmp_path / "train.sh"
    path.write_text("#!/bin/bash\nexport CUDA_DEVICE_MAX_CONNECTIONS=1\n"
                    "torchrun --nproc_per_node=gpu pretrain_gpt.py " + TINY_GPT + "\n")
    result = run(["check", "--budget", "80GiB", str(path)])
    assert result.returncode == 2
    assert (f"error: {path}:3: the world size is not known (torchrun --nproc_per_node gpu ({path}:3): one process "
            "per GPU of the machine it runs on, which the environment does not say (no CUDA_VISIBLE_DEVICES or "
            "SLURM_GPUS_ON_NODE)); pass --world-size [unknown-world-size]") in result.stdout
    given = run(["check", "--budget", "80GiB", "--world-size", "8", "--format", "json", str(path)])
    assert given.returncode == 0, given.stdout
    assert json.loads(given.stdout)["world_size"] == 8
    zero = run(["check", "--budget", "80GiB", "--world-size", "0", str(path)])
    assert zero.returncode == 2
    assert "error: --world-size: --world-size must be a positive integer, not 0 [invalid-world-size]" in zero.stdout


def test_a_bad_setting_is_reported_with_the_configurations_problems():
    result = run(["estimate", "--budget", "eighty", "--world-size", "2", "--"] + flags(TINY_GPT, "--global-batch-size 3"))
    assert result.returncode == 2
    codes = [line.rsplit("[", 1)[-1].rstrip("]") for line in result.stdout.splitlines() if "error:" in line]
    assert codes == ["invalid-setting", "global-batch-not-divisible"]


def test_check_takes_the_scripts_arguments_and_the_world_size(tmp_path):
    path = tmp_path / "train.sh"
    # tp 2 without a named GPU: Hopper is assumed, where Megatron asserts CUDA_DEVICE_MAX_CONNECTIONS=1
    # (megatron/training/arguments.py validate_args), so the launch line sets it
    path.write_text("CUDA_DEVICE_MAX_CONNECTIONS=1 torchrun --nproc_per_node 8 --nnodes $1 pretrain_gpt.py " + TINY_GPT
                    + ' "${@:2}"\n')
    unknown = run(["check", str(path)])
    assert unknown.returncode == 2
    assert f"error: {path}:1 $1: $1 is the script's argument 1, which was not given" in unknown.stdout
    given = run(["check", "--format", "json", "--script-arg", "2", "--script-arg=--tensor-model-parallel-size",
                 "--script-arg", "2", str(path)])
    assert given.returncode == 0, given.stdout
    doc = json.loads(given.stdout)
    assert (doc["world_size"], doc["parallelism"]["tp"]) == (16, 2)
    assert "$@ passes on the arguments the script is run with" in run(["check", "--world-size", "4", str(path)]).stdout
    path.write_text("torchrun --nproc_per_node 8 --nnodes $1 pretrain_gpt.py " + TINY_GPT + "\n")
    override = run(["check", "--format", "json", "--world-size", "4", str(path)])
    assert override.returncode == 0, override.stdout
    assert json.loads(override.stdout)["world_size"] == 4


def test_fractions_take_percent_on_the_command_line_as_in_files():
    result = run(["estimate", "--fragmentation", "8%", "--routing-imbalance", "25%", "--format", "json",
                  "--world-size", "1", "--"] + flags(TINY_GPT))
    assert result.returncode == 0, result.stdout
    texts = [a["text"] for a in json.loads(result.stdout)["assumptions"]]
    assert "allocator fragmentation 8% of allocated memory" in texts
    bad = run(["estimate", "--fragmentation", "abc", "--world-size", "1", "--"] + flags(TINY_GPT))
    assert bad.returncode == 2
    assert "command line --fragmentation: must be a fraction such as 0.05 or 5%, not 'abc' [invalid-setting]" in bad.stdout


def test_a_scripts_missing_device_connections_is_located_at_its_launch(tmp_path):
    path = tmp_path / "train.sh"
    path.write_text("#!/bin/bash\ntorchrun --nproc_per_node 8 pretrain_gpt.py " + TINY_GPT
                    + " --tensor-model-parallel-size 2\n")
    result = run(["check", "--gpu", "h100", str(path)], env={"CUDA_DEVICE_MAX_CONNECTIONS": "8"})
    assert result.returncode == 2
    assert (f"error: {path}:2 CUDA_DEVICE_MAX_CONNECTIONS: tensor or context parallelism on this GPU (compute "
            "capability 9) needs CUDA_DEVICE_MAX_CONNECTIONS=1 in the environment; Megatron stops otherwise "
            "(it is 8) [cuda-device-max-connections]") in result.stdout
    path.write_text("#!/bin/bash\nexport CUDA_DEVICE_MAX_CONNECTIONS=1\ntorchrun --nproc_per_node 8 pretrain_gpt.py "
                    + TINY_GPT + " --tensor-model-parallel-size 2\n")
    assert run(["check", "--gpu", "h100", str(path)]).returncode == 0


_NOTICE_SCRIPT = """\
#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=8
export CUDA_DEVICE_MAX_CONNECTIONS=1
srun python pretrain_gpt.py --num-layers 24 --hidden-size 2048 --num-attention-heads 16 \\
  --seq-length 2048 --max-position-embeddings 2048 \\
  --micro-batch-size 2 --global-batch-size 64 \\
  --tensor-model-parallel-size 2 --pipeline-model-parallel-size 3 \\
  --lr 1e-4 --train-iters 100 --bf16 --mock-data --tokenizer-type NullTokenizer --vocab-size 32000 \\
  --tensorboard-dir $TB_DIR
"""


def test_an_invalid_script_still_shows_what_it_assumed_about_unknown_values(tmp_path):
    # tp 2 x pp 3 does not divide 16 processes: refused; the unset $TB_DIR (logging only) is a
    # notice with its file:line, in the text report and the JSON one, as for a valid input
    path = tmp_path / "train.sh"
    path.write_text(_NOTICE_SCRIPT)
    notice = (f"{path}:10 TB_DIR: TB_DIR is not set in the script or the environment (bash would expand it "
              f"to nothing); --tensorboard-dir at {path}:10 gets `$TB_DIR` from it (logging: it changes "
              "neither validation nor memory); the check goes on without it")
    result = run(["check", str(path), "--budget", "80GiB"])
    assert result.returncode == 2
    lines = result.stdout.splitlines()
    assert lines[1:] == [
        "  invalid input, 1 problem:",
        f"  error: {path}:8 --tensor-model-parallel-size: tp(2) x pp(3) x cp(1) = 6 does not divide world "
        f"size 16 (srun with SLURM_NTASKS=16 from #SBATCH --nodes=2 ({path}:2) --ntasks-per-node=8 "
        f"({path}:3)); the data-parallel size would be 16/6 = 2.66667 [world-size-not-divisible]",
        "  notices (what the check assumed about the rest):",
        f"  - {notice}"]
    doc = json.loads(run(["check", str(path), "--budget", "80GiB", "--format", "json"]).stdout)
    validate_report(doc)
    assert doc["status"] == "invalid" and doc["notices"] == [notice]
    markdown = run(["check", str(path), "--budget", "80GiB", "--format", "markdown"]).stdout
    assert f"Notices:\n- {notice}\n" in markdown


@pytest.mark.parametrize("bad", [0, -4])
def test_every_front_refuses_a_bad_world_size_the_same_way(bad):
    # One check (api.world_size_for) for every front: estimate, check and plan on the command
    # line, api.estimate, api.plan: each reports invalid-world-size where the size was given.
    import megatron_estimator as me
    from megatron_estimator import api

    yaml = str(REPO / "examples" / "llama3-8b.yaml")
    for args in (["estimate", "--world-size", str(bad), "--", *flags(TINY_GPT)],
                 ["check", "--world-size", str(bad), yaml],
                 ["plan", "--world-size", str(bad), "--budget", "80GiB", "--global-batch-size", "8", "--",
                  *flags(TINY_GPT)]):
        result = run(args)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert f"--world-size must be a positive integer, not {bad} [invalid-world-size]" in result.stdout, args
    with pytest.raises(me.InvalidInput) as raised:
        me.estimate(flags(TINY_GPT), world_size=bad)
    assert [(p.code, p.location) for p in raised.value.problems] == [("invalid-world-size", "world_size")]
    with pytest.raises(me.InvalidInput) as raised:
        api.plan(flags(TINY_GPT), world_size=bad, global_batch_size=8, budget="80GiB", environ={})
    assert [(p.code, p.location) for p in raised.value.problems] == [("invalid-world-size", "--world-size")]
