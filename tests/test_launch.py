"""megatron_estimator.inputs.launch (command, walk, execute): launchers, wrappers, world sizes, problems, and exec."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import textwrap

import pytest

from megatron_estimator.core.problems import Problem
from megatron_estimator.inputs.launch.command import LaunchCommand, unknown_world_size_problem
from megatron_estimator.inputs.launch.walk import parse_launch_command

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse(command: str, env: dict | None = None) -> tuple[LaunchCommand, tuple[Problem, ...]]:
    return parse_launch_command(shlex.split(command), {} if env is None else env)


def ok(command: str, env: dict | None = None) -> LaunchCommand:
    result, problems = parse(command, env)
    assert problems == ()
    return result


# ---- torchrun and its module spellings -------------------------------------------------

@pytest.mark.parametrize("command, size, source", [
    ("torchrun --nproc-per-node 8 --nnodes 2 pretrain_gpt.py --num-layers 2",
     16, "torchrun --nproc-per-node 8 x --nnodes 2"),
    ("torchrun --nproc_per_node=8 --nnodes=2 pretrain_gpt.py --num-layers 2",
     16, "torchrun --nproc_per_node 8 x --nnodes 2"),
    ("torchrun --nnodes 2:4 --nproc-per-node 8 pretrain_gpt.py --num-layers 2",
     16, "torchrun --nproc-per-node 8 x --nnodes 2:4 (minimum 2)"),
    ("torchrun --standalone --nproc-per-node 4 pretrain_gpt.py --num-layers 2",
     4, "torchrun --nproc-per-node 4 x default --nnodes 1"),
    ("torchrun pretrain_gpt.py --num-layers 2",
     1, "torchrun default --nproc-per-node 1 x default --nnodes 1"),
    ("torchrun --nproc_per 4 pretrain_gpt.py --num-layers 2",        # argparse prefix of one option
     4, "torchrun --nproc_per 4 x default --nnodes 1"),
    ("torchrun --nnode 3 --nproc-per-node=2 pretrain_gpt.py --num-layers 2",
     6, "torchrun --nproc-per-node 2 x --nnode 3"),
])
def test_torchrun_spellings(command, size, source):
    result = ok(command)
    assert result.launcher == "torchrun"
    assert result.script == "pretrain_gpt.py"
    assert result.script_index == shlex.split(command).index("pretrain_gpt.py")
    assert result.megatron_argv == ("--num-layers", "2")
    assert (result.world_size, result.world_size_source) == (size, source)


def test_torchrun_options_taking_values_are_never_the_script():
    # every value here ends in .py or looks like a program; none of them is the script
    command = ("torchrun --rdzv-id job.py --rdzv-backend c10d --rdzv-endpoint host:29500 --rdzv_conf a=1 "
               "--max-restarts 3 --monitor-interval 5 --start-method spawn --role trainer.py "
               "--log-dir python --redirects 3 -t 3 -r3 --local-ranks-filter 0 --node-rank 1 "
               "--master-addr torchrun --master-port 29500 --local-addr x.py --event-log-handler null "
               "--numa-binding node --signals-to-handle SIGTERM --shutdown-timeout 30 "
               "--duplicate-stdout-filters a,b --duplicate-stderr-filters c --logs-specs spec "
               "--virtual-local-rank --nproc-per-node 2 pretrain_gpt.py --seq-length 8")
    result = ok(command)
    assert result.script == "pretrain_gpt.py"
    assert result.megatron_argv == ("--seq-length", "8")
    assert result.world_size == 2


def test_torchrun_environment_fallback_pet_variables():
    # torch/distributed/argparse_util.py: an absent option falls back to PET_<NAME>
    result = ok("torchrun pretrain_gpt.py", {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "4", "WORLD_SIZE": "99"})
    assert result.world_size == 8
    assert result.world_size_source == ("torchrun PET_NPROC_PER_NODE=4 in the environment x "
                                        "PET_NNODES=2 in the environment")
    # the command's own option wins over the environment
    assert ok("torchrun --nnodes 3 pretrain_gpt.py", {"PET_NNODES": "2"}).world_size == 3


def test_torchrun_nproc_gpu_needs_the_environment():
    result, problems = parse("torchrun --nproc-per-node gpu --nnodes 2 pretrain_gpt.py")
    assert problems == ()
    assert result.world_size is None
    assert result.world_size_source == (
        "torchrun --nproc-per-node gpu: one process per GPU of the machine it runs on, which the environment "
        "does not say (no CUDA_VISIBLE_DEVICES or SLURM_GPUS_ON_NODE)")
    visible = ok("torchrun --nproc-per-node gpu --nnodes 2 pretrain_gpt.py", {"CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    assert visible.world_size == 8
    assert visible.world_size_source == ("torchrun --nproc-per-node gpu (CUDA_VISIBLE_DEVICES=0,1,2,3 in the "
                                         "environment: 4 GPUs) x --nnodes 2")
    slurm = ok("torchrun --nproc-per-node auto pretrain_gpt.py", {"SLURM_GPUS_ON_NODE": "8"})
    assert slurm.world_size == 8


def test_torchrun_module_and_no_python():
    module = ok("torchrun --nproc-per-node 2 -m megatron.training.pretrain --num-layers 2")
    assert (module.script, module.script_is_module, module.megatron_argv) == (
        "megatron.training.pretrain", True, ("--num-layers", "2"))
    direct = ok("torchrun --nproc-per-node 2 --no-python /opt/venv/bin/pretrain_gpt.py --num-layers 2")
    assert direct.script == "/opt/venv/bin/pretrain_gpt.py"
    through_python = ok("torchrun --no_python --nproc-per-node 2 python3 -u pretrain_gpt.py --num-layers 2")
    assert (through_python.launcher, through_python.script, through_python.world_size) == ("torchrun", "pretrain_gpt.py", 2)
    assert through_python.launchers == ("torchrun", "python")


@pytest.mark.parametrize("command, launcher, chain", [
    ("python -m torch.distributed.run --nproc_per_node 4 --nnodes 2 pretrain_gpt.py --x 1",
     "torch.distributed.run", ("python", "torch.distributed.run")),
    ("python3 -m torch.distributed.launch --use_env --nproc_per_node=4 --nnodes=2 pretrain_gpt.py --x 1",
     "torch.distributed.launch", ("python", "torch.distributed.launch")),
    ("python3.11 -u -mtorch.distributed.run --nproc-per-node 4 --nnodes 2 pretrain_gpt.py --x 1",
     "torch.distributed.run", ("python", "torch.distributed.run")),
    ("/usr/bin/python3 /usr/local/bin/torchrun --nproc-per-node 4 --nnodes 2 pretrain_gpt.py --x 1",
     "torchrun", ("python", "torchrun")),
    ("ft_launcher --ft-cfg-path ft.yaml --max-restarts=3 --nproc-per-node 4 --nnodes 2 pretrain_gpt.py --x 1",
     "ft_launcher", ("ft_launcher",)),
])
def test_torch_distributed_module_forms(command, launcher, chain):
    result = ok(command)
    assert (result.launcher, result.launchers, result.script) == (launcher, chain, "pretrain_gpt.py")
    assert result.megatron_argv == ("--x", "1")
    assert result.world_size == 8


def test_torch_distributed_launch_use_env_is_a_switch_only_there():
    _, problems = parse("torchrun --use-env --nproc-per-node 2 pretrain_gpt.py")
    assert problems == (Problem("invalid-launcher-option", "--use-env", "torchrun has no option --use-env"),)


# ---- srun --------------------------------------------------------------------------------

@pytest.mark.parametrize("command, size, source", [
    ("srun -N 2 --ntasks-per-node 8 python pretrain_gpt.py --a 1", 16, "srun -N 2 --ntasks-per-node 8"),
    ("srun -N2 --ntasks-per-node=8 python pretrain_gpt.py --a 1", 16, "srun -N 2 --ntasks-per-node 8"),
    ("srun --nodes=2-4 --ntasks-per-node=8 python pretrain_gpt.py --a 1", 16,
     "srun --nodes 2-4 (minimum 2) --ntasks-per-node 8"),
    ("srun -n 64 python pretrain_gpt.py --a 1", 64, "srun -n 64"),
    ("srun --ntasks=64 -N 8 python pretrain_gpt.py --a 1", 64, "srun --ntasks 64"),
    ("srun -lN2 --ntasks-per-node 4 --gpus-per-node h100:4 -J train.py --container-image python:3 "
     "--container-mounts /a:/a python pretrain_gpt.py --a 1", 8, "srun -N 2 --ntasks-per-node 4"),
    ("srun --ntasks-per-node 8 python pretrain_gpt.py --a 1", 8,
     "srun on 1 node (no node count given) --ntasks-per-node 8"),
    ("srun -N 2 python pretrain_gpt.py --a 1", 2,
     "srun -N 2 with 1 task per node (no --ntasks-per-node given)"),
    ("srun python pretrain_gpt.py --a 1", 1,
     "srun with no task or node count, outside a Slurm allocation: 1 task"),
])
def test_srun_spellings(command, size, source):
    result = ok(command)
    assert (result.launcher, result.script, result.megatron_argv) == ("srun", "pretrain_gpt.py", ("--a", "1"))
    assert result.launchers == ("srun", "python")
    assert (result.world_size, result.world_size_source) == (size, source)


@pytest.mark.parametrize("env, size, source", [
    ({"SLURM_NTASKS": "64", "SLURM_NNODES": "8"}, 64, "srun with SLURM_NTASKS=64 in the environment"),
    ({"SLURM_NNODES": "2", "SLURM_NTASKS_PER_NODE": "8(x2)"}, 16,
     "srun with SLURM_NNODES=2 in the environment and SLURM_NTASKS_PER_NODE=8(x2) in the environment"),
    ({"SLURM_JOB_NUM_NODES": "4", "SLURM_NTASKS_PER_NODE": "8"}, 32,
     "srun with SLURM_JOB_NUM_NODES=4 in the environment and SLURM_NTASKS_PER_NODE=8 in the environment"),
    ({"SLURM_TASKS_PER_NODE": "8(x2),4"}, 20, "srun with SLURM_TASKS_PER_NODE=8(x2),4 in the environment"),
    ({"SLURM_NNODES": "3"}, 3, "srun with SLURM_NNODES=3 in the environment: 1 task per node"),
])
def test_srun_reads_the_allocation_from_the_environment(env, size, source):
    result = ok("srun python pretrain_gpt.py", env)
    assert (result.world_size, result.world_size_source) == (size, source)


def test_srun_command_counts_win_over_the_allocation():
    env = {"SLURM_NTASKS": "64", "SLURM_NNODES": "8", "SLURM_NTASKS_PER_NODE": "8"}
    assert ok("srun -N 2 --ntasks-per-node 4 python pretrain_gpt.py", env).world_size == 8
    mixed = ok("srun -N 2 python pretrain_gpt.py", env)
    assert (mixed.world_size, mixed.world_size_source) == (
        16, "srun -N 2 with SLURM_NTASKS_PER_NODE=8 in the environment")


def test_srun_around_torchrun_counts_torchrun_processes():
    result = ok("srun --ntasks-per-node=1 torchrun --nnodes 2 --nproc-per-node 8 pretrain_gpt.py --a 1",
                {"SLURM_NNODES": "2"})
    assert result.launcher == "torchrun"
    assert result.launchers == ("srun", "torchrun")
    assert (result.world_size, result.world_size_source) == (16, "torchrun --nproc-per-node 8 x --nnodes 2")


def test_srun_export_sets_launch_environment():
    result = ok("srun --export=ALL,NVTE_FLASH_ATTN=0 -n 2 python pretrain_gpt.py")
    assert result.environment == (("NVTE_FLASH_ATTN", "0"),)


# ---- mpirun / mpiexec ----------------------------------------------------------------------

@pytest.mark.parametrize("command, env, size, source", [
    ("mpirun -np 16 python pretrain_gpt.py --a 1", {}, 16, "mpirun -np 16"),
    ("mpiexec -n 8 python pretrain_gpt.py --a 1", {}, 8, "mpiexec -n 8"),
    ("mpirun --np 4 python pretrain_gpt.py --a 1", {}, 4, "mpirun --np 4"),
    ("mpirun -N 8 python pretrain_gpt.py --a 1", {"SLURM_NNODES": "2"}, 16,
     "mpirun -N 8 with SLURM_NNODES=2 in the environment"),
    ("mpirun --npernode 4 -H a,b python pretrain_gpt.py --a 1", {}, 8, "mpirun --npernode 4 x 2 hosts of -H a,b"),
    ("mpirun -H a:4,b:4 python pretrain_gpt.py --a 1", {}, 8, "mpirun -H a:4,b:4: one process per slot"),
    ("mpirun --map-by ppr:8:node -H n1,n2 python pretrain_gpt.py --a 1", {}, 16,
     "mpirun --map-by ppr:8:node x 2 hosts of -H n1,n2"),
    ("mpirun python pretrain_gpt.py --a 1", {"SLURM_NTASKS": "32"}, 32,
     "mpirun with SLURM_NTASKS=32 in the environment"),
])
def test_mpirun_spellings(command, env, size, source):
    result = ok(command, env)
    assert (result.script, result.megatron_argv) == ("pretrain_gpt.py", ("--a", "1"))
    assert (result.world_size, result.world_size_source) == (size, source)


def test_mpirun_two_valued_options_and_exports():
    result = ok("mpirun --mca btl ^openib -x NVTE_FUSED_ATTN=0 -x PATH -genv NCCL_DEBUG INFO "
                "--bind-to none --allow-run-as-root -np 4 python pretrain_gpt.py --a 1")
    assert result.script == "pretrain_gpt.py"
    assert result.environment == (("NVTE_FUSED_ATTN", "0"), ("NCCL_DEBUG", "INFO"))
    assert result.world_size == 4


def test_mpirun_without_counts_is_unknown():
    result = ok("mpiexec -ppn 8 -f hosts.txt python pretrain_gpt.py")
    assert result.world_size is None
    assert result.world_size_source == ("mpiexec -ppn 8 per node, but the number of nodes (a host file or "
                                        "the allocation) is not in the command")


# ---- plain python, direct scripts, the environment ----------------------------------------

def test_plain_python_is_one_process_unless_world_size_is_set():
    result = ok("python pretrain_gpt.py --num-layers 2")
    assert (result.launcher, result.launchers, result.world_size, result.world_size_source) == (
        "python", ("python",), 1, "plain python: 1 process")
    # megatron/training/arguments.py reads WORLD_SIZE
    env = ok("python pretrain_gpt.py", {"WORLD_SIZE": "16"})
    assert (env.world_size, env.world_size_source) == (16, "WORLD_SIZE=16 in the environment")


@pytest.mark.parametrize("command", [
    "python -u pretrain_gpt.py --a 1",
    "python3 -W ignore -X faulthandler pretrain_gpt.py --a 1",
    "python3 -uBWignore -Xdev pretrain_gpt.py --a 1",
    "python3.10 -O --check-hash-based-pycs never pretrain_gpt.py --a 1",
])
def test_python_options_before_the_script(command):
    result = ok(command)
    assert (result.script, result.megatron_argv) == ("pretrain_gpt.py", ("--a", "1"))


def test_python_module_and_direct_script():
    module = ok("python -m megatron.training.pretrain_gpt --a 1")
    assert (module.script, module.script_is_module, module.script_index, module.megatron_argv) == (
        "megatron.training.pretrain_gpt", True, 2, ("--a", "1"))
    direct = ok("./pretrain_gpt.py --a 1")
    assert (direct.launcher, direct.script, direct.world_size, direct.world_size_source) == (
        "script", "./pretrain_gpt.py", 1, "the script run directly: 1 process")


def test_invalid_world_size_environment():
    result, problems = parse("python pretrain_gpt.py", {"WORLD_SIZE": "lots"})
    assert result.world_size is None
    assert problems == (Problem("invalid-launch-environment", "WORLD_SIZE", "WORLD_SIZE='lots' is not a positive integer"),)


# ---- wrappers ------------------------------------------------------------------------------

@pytest.mark.parametrize("command, chain", [
    ("numactl --cpunodebind=0 --membind 0 python pretrain_gpt.py --a 1", ("numactl", "python")),
    ("numactl -N0 -m 0 -C 0-7 --localalloc python pretrain_gpt.py --a 1", ("numactl", "python")),
    ("nsys profile -t cuda,nvtx -o prof.py --force-overwrite true --capture-range=cudaProfilerApi "
     "--stats=false python pretrain_gpt.py --a 1", ("nsys profile", "python")),
    ("taskset -c 0-7 python pretrain_gpt.py --a 1", ("taskset", "python")),
    ("taskset 0xff python pretrain_gpt.py --a 1", ("taskset", "python")),
    ("nohup python pretrain_gpt.py --a 1", ("nohup", "python")),
    ("time -p python pretrain_gpt.py --a 1", ("time", "python")),
    ("/usr/bin/time -v -o t.py python pretrain_gpt.py --a 1", ("time", "python")),
    ("timeout -k 10 1h python pretrain_gpt.py --a 1", ("timeout", "python")),
    ("stdbuf -oL -e L python pretrain_gpt.py --a 1", ("stdbuf", "python")),
    ("nice -n 5 python pretrain_gpt.py --a 1", ("nice", "python")),
    ("uv run --no-sync --with numpy --python 3.11 python pretrain_gpt.py --a 1", ("uv run", "python")),
    ("uv run --frozen pretrain_gpt.py --a 1", ("uv run", "python")),
    ("singularity exec --nv -B /data:/data image.sif python pretrain_gpt.py --a 1",
     ("singularity exec", "python")),
    ("exec python pretrain_gpt.py --a 1", ("exec", "python")),
])
def test_wrappers_resolve_to_the_script(command, chain):
    result = ok(command)
    assert (result.script, result.megatron_argv, result.launchers) == ("pretrain_gpt.py", ("--a", "1"), chain)
    assert result.world_size == 1


def test_wrappers_around_torchrun():
    result = ok("env NCCL_DEBUG=INFO numactl --interleave=all nsys profile -o out torchrun "
                "--nproc-per-node 8 pretrain_gpt.py --a 1")
    assert result.launchers == ("env", "numactl", "nsys profile", "torchrun")
    assert (result.launcher, result.world_size) == ("torchrun", 8)
    assert result.environment == (("NCCL_DEBUG", "INFO"),)
    uv = ok("uv run --no-sync python -m torch.distributed.run --nproc_per_node 2 pretrain_gpt.py --a 1")
    assert (uv.launchers, uv.world_size) == (("uv run", "python", "torch.distributed.run"), 2)


def test_env_assignments_count_as_launch_environment():
    result = ok("env WORLD_SIZE=16 NVTE_FLASH_ATTN=0 python pretrain_gpt.py --a 1", {"WORLD_SIZE": "2"})
    assert (result.world_size, result.world_size_source) == (16, "WORLD_SIZE=16 set by env on the command")
    assert result.environment == (("WORLD_SIZE", "16"), ("NVTE_FLASH_ATTN", "0"))
    assert result.argv[:3] == ("env", "WORLD_SIZE=16", "NVTE_FLASH_ATTN=0")
    cleared = ok("env -i PATH=/bin python pretrain_gpt.py", {"WORLD_SIZE": "8"})
    assert (cleared.world_size, cleared.launchers) == (1, ("env -i", "python"))
    unset = ok("env -u WORLD_SIZE python pretrain_gpt.py", {"WORLD_SIZE": "8"})
    assert unset.world_size == 1
    pet = ok("env PET_NPROC_PER_NODE=4 torchrun pretrain_gpt.py")
    assert pet.world_size_source == "torchrun PET_NPROC_PER_NODE=4 set by env on the command x default --nnodes 1"


def test_shell_c_strings_are_read_as_shell():
    result = ok("bash -c 'torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 2'")
    assert result.argv == ("bash", "-c", "torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 2")
    assert result.tokens == ("bash", "-c", "torchrun", "--nproc-per-node", "8", "pretrain_gpt.py", "--num-layers", "2")
    assert (result.script_index, result.megatron_argv, result.world_size) == (5, ("--num-layers", "2"), 8)
    assert result.launchers == ("sh -c", "torchrun")


def test_shell_c_with_positional_parameters_and_assignments():
    command = ["sh", "-c", 'cd /work && NVTE_FLASH_ATTN=0 exec python pretrain_gpt.py "$@" --hidden-size $H',
               "sh", "--num-layers", "2"]
    result, problems = parse_launch_command(command, {"H": "64"})
    assert problems == ()
    assert result.script == "pretrain_gpt.py"
    assert result.megatron_argv == ("--num-layers", "2", "--hidden-size", "64")
    assert result.environment == (("NVTE_FLASH_ATTN", "0"),)


def test_srun_around_shell_c_uses_the_allocation_for_torchrun_variables():
    result = ok("srun -N 2 --ntasks-per-node 1 bash -lc 'torchrun --nnodes $SLURM_NNODES "
                "--nproc-per-node 8 pretrain_gpt.py --a 1'", {"SLURM_NNODES": "2"})
    assert (result.world_size, result.world_size_source) == (16, "torchrun --nproc-per-node 8 x --nnodes 2")
    assert result.launchers == ("srun", "sh -c", "torchrun")


# ---- unknown launchers and problems --------------------------------------------------------

def test_unknown_launcher_finds_the_script_but_not_the_world_size():
    result, problems = parse("deepspeed --num_gpus 8 pretrain_gpt.py --a 1")
    assert problems == ()
    assert (result.launcher, result.script, result.megatron_argv, result.world_size) == (
        "deepspeed", "pretrain_gpt.py", ("--a", "1"), None)
    assert result.world_size_source == ("deepspeed is not a launcher this tool knows, so how many processes "
                                        "it starts is unknown")
    assert unknown_world_size_problem(result) == Problem(
        "unknown-world-size", "<command>",
        "the world size is not known (deepspeed is not a launcher this tool knows, so how many processes it "
        "starts is unknown); pass --world-size")


@pytest.mark.parametrize("command, message", [
    ("torchrun --nproc-per-node 8", "torchrun is not given a training script (the command was: torchrun --nproc-per-node 8)"),
    ("bash train.sh", "bash runs the shell script train.sh; read that file as a launch script (the command was: bash train.sh)"),
    ("python -c 'print(1)'", "python -c runs a command string, not a training script (the command was: python -c print(1))"),
    ("make train", "make is not python, torchrun or a launcher this tool knows, and no *.py script follows it "
                   "(the command was: make train)"),
    ("srun -N 2", "srun is not given a program (the command was: srun -N 2)"),
    ("sh -c 'cd /x && echo hi'", "sh -c starts no program, only shell builtins (the command was: sh -c cd /x && echo hi)"),
    ("bash -c 'make -j 8 && ./run.sh'", "bash -c runs make, ./run.sh, and none of it starts a training script "
                                        "(the command was: bash -c make -j 8 && ./run.sh)"),
])
def test_no_training_script(command, message):
    result, problems = parse(command)
    assert result.script is None and result.world_size is None
    assert problems == (Problem("no-training-script", "<command>", message),)


@pytest.mark.parametrize("command, location, message", [
    ("torchrun --nnodes abc pretrain_gpt.py", "--nnodes",
     "torchrun --nnodes 'abc' is not a node count or a MIN:MAX range with 0 < MIN <= MAX"),
    ("torchrun --nnodes 4:2 pretrain_gpt.py", "--nnodes",
     "torchrun --nnodes '4:2' is not a node count or a MIN:MAX range with 0 < MIN <= MAX"),
    ("torchrun --nproc-per-node 0 pretrain_gpt.py", "--nproc-per-node",
     "torchrun --nproc-per-node '0' must be a positive number of processes"),
    ("torchrun --nproc_per_node many pretrain_gpt.py", "--nproc_per_node",
     "torchrun --nproc-per-node 'many' is not a number nor one of gpu, auto, cpu, xpu"),
    ("torchrun --nproc 8 pretrain_gpt.py", "--nproc",
     "torchrun --nproc is ambiguous: it could be --nproc-per-node, --nproc_per_node"),
    ("torchrun --bogus 3 pretrain_gpt.py", "--bogus", "torchrun has no option --bogus"),
    ("torchrun --nproc 8 --nnodes 1 pretrain_gpt.py", "--nproc",
     "torchrun --nproc is ambiguous: it could be --nproc-per-node, --nproc_per_node"),
    ("torchrun --standalone=1 pretrain_gpt.py", "--standalone",
     "torchrun --standalone is a switch and takes no value (got '1')"),
    ("srun -N abc python pretrain_gpt.py", "-N", "srun -N 'abc' is not a positive count or a MIN-MAX range"),
    ("srun --ntasks-per-node 0 python pretrain_gpt.py", "--ntasks-per-node",
     "srun --ntasks-per-node '0' is not a positive count"),
    ("mpirun -np x python pretrain_gpt.py", "-np", "mpirun -np 'x' is not a positive count"),
])
def test_invalid_launcher_options(command, location, message):
    result, problems = parse(command)
    assert result.script == "pretrain_gpt.py"
    assert result.world_size is None
    assert problems == (Problem("invalid-launcher-option", location, message),)


def test_locations_pass_through_to_problems_and_sentences():
    argv = ["torchrun", "--nproc_per_node", "8", "--nnodes", "zero", "pretrain_gpt.py", "--num-layers", "2"]
    locations = [f"train.sh:{n}" for n in (20, 21, 21, 22, 22, 20, 30, 30)]
    result, problems = parse_launch_command(argv, {}, locations=locations)
    assert problems[0].location == "train.sh:22 --nnodes"
    assert result.megatron_locations == ("train.sh:30", "train.sh:30")
    good, _ = parse_launch_command(argv[:4] + ["2"] + argv[5:], {}, locations=locations)
    assert good.world_size_source == "torchrun --nproc_per_node 8 (train.sh:21) x --nnodes 2 (train.sh:22)"
    assert good.world_size_tokens == (3, 4, 1, 2)


def test_env_origins_name_where_a_variable_was_set():
    result = ok("srun python pretrain_gpt.py", {"SLURM_NTASKS": "16"})
    assert result.world_size_source == "srun with SLURM_NTASKS=16 in the environment"
    named, _ = parse_launch_command(["srun", "python", "pretrain_gpt.py"], {"SLURM_NTASKS": "16"},
                                    env_origins={"SLURM_NTASKS": "from #SBATCH --ntasks=16 (job.sh:2)"})
    assert named.world_size_source == "srun with SLURM_NTASKS=16 from #SBATCH --ntasks=16 (job.sh:2)"


def test_world_size_precedence_for_a_launch():
    # api.world_size_for is where every front resolves the world size: --world-size over
    # the launcher's nproc-per-node x nnodes (8 x 2 = 16), naming what the launch says.
    from megatron_estimator.api import input_from_launch, world_size_for
    from megatron_estimator.core.sourced import Sourced

    inp, _, _ = input_from_launch("torchrun --nproc-per-node 8 --nnodes 2 pretrain_gpt.py".split(), environ={})
    assert world_size_for(inp) == (Sourced(16, "torchrun --nproc-per-node 8 x --nnodes 2"), ())
    given = "--world-size {} given to the estimator"
    assert world_size_for(inp, 16, given.format(16), say_launch=True) == (Sourced(16, given.format(16)), ())
    assert world_size_for(inp, 32, given.format(32), say_launch=True) == (Sourced(
        32, "--world-size 32 given to the estimator (the launch command itself says 16: "
            "torchrun --nproc-per-node 8 x --nnodes 2)"), ())
    unknown, _, _ = input_from_launch("mpirun python pretrain_gpt.py".split(), environ={})
    assert world_size_for(unknown, 4, given.format(4), say_launch=True) == (Sourced(4, given.format(4)), ())
    assert world_size_for(unknown)[0] is None


def test_world_size_from_the_environment_comes_after_the_given_one():
    from megatron_estimator.api import world_size_for
    from megatron_estimator.core.sourced import Sourced

    assert world_size_for(None, environ={"WORLD_SIZE": "24"}) == (Sourced(24, "WORLD_SIZE=24 in the environment"), ())
    assert world_size_for(None, 8, environ={"WORLD_SIZE": "24"}) == (Sourced(8, "--world-size"), ())
    [problem] = world_size_for(None, environ={"WORLD_SIZE": "two"})[1]
    assert (problem.code, problem.location) == ("invalid-world-size", "WORLD_SIZE")


def test_default_environment_is_the_process_environment(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "24")
    result, _ = parse_launch_command(["python", "pretrain_gpt.py"])
    assert result.world_size == 24


def test_argv_is_kept_untouched():
    argv = ["env", "A=1", "bash", "-c", "python pretrain_gpt.py --x 1", "extra"]
    result, _ = parse_launch_command(argv, {})
    assert result.argv == tuple(argv)


# ---- exec ----------------------------------------------------------------------------------

def test_exec_launch_keeps_argv_and_environment(tmp_path):
    # The launched program is a shell script, so that nothing but exec stands between the
    # environment the estimator was started with and the one the program sees (a Python child
    # would coerce a C locale itself).  The estimator runs in a C locale: its interpreter adds
    # LC_CTYPE=C.UTF-8 to os.environ (PEP 538), which the job must not inherit.
    dump = tmp_path / "dump"
    launcher = tmp_path / "launch"
    launcher.write_text(f'#!/bin/sh\nenv -0 > {dump}.env\nprintf "%s\\0" "$@" > {dump}.argv\n')
    launcher.chmod(0o755)
    argv = [str(launcher), "pretrain_gpt.py", "--num-layers", "2", "--name", "a b", "--empty", ""]
    runner = tmp_path / "runner.py"
    runner.write_text(textwrap.dedent(f"""\
        import os, sys
        sys.path.insert(0, {REPO!r})
        from megatron_estimator.inputs.launch.walk import parse_launch_command
        from megatron_estimator.inputs.launch.execute import exec_launch
        command, problems = parse_launch_command({argv!r}, dict(os.environ))
        assert not problems, problems
        exec_launch(command)
        raise SystemExit("exec_launch returned")
        """))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "NVTE_FLASH_ATTN": "0", "ODD": "x=y z", "WORLD_SIZE": "1"}
    completed = subprocess.run([sys.executable, str(runner)], env=env, capture_output=True, text=True, timeout=60)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout == "" and completed.stderr == ""
    assert (tmp_path / "dump.argv").read_bytes().split(b"\0")[:-1] == [a.encode() for a in argv[1:]]
    seen = dict(entry.split("=", 1) for entry in (tmp_path / "dump.env").read_text().split("\0") if entry)
    seen.pop("PWD", None)         # set by the shell itself
    seen.pop("SHLVL", None)
    seen.pop("_", None)
    assert seen == env


def test_exec_launch_raises_when_the_command_cannot_run(tmp_path):
    from megatron_estimator.inputs.launch.execute import exec_launch

    command, problems = parse_launch_command([str(tmp_path / "no-such-torchrun"), "pretrain_gpt.py"], {})
    with pytest.raises(FileNotFoundError):
        exec_launch(command)
