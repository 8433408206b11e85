"""Issue 27, the leftovers met on slime and Pai-Megatron-Patch scripts (fixtures written here,
reproducing the idioms; expected values from real bash, with stubs, or by hand):

- a guard on a cluster variable read through ``${X:-}`` (slime run-glm5.2-744B-A40B.sh:
  ``if [ -z "${BASE_DIR:-}" ]; then echo ...; exit 1; fi``; run-glm4.7-355B-A32B.sh:
  ``MASTER_ADDR=${MASTER_ADDR:-}`` then ``[ -z "${MASTER_ADDR}" ]``) is assumed to pass with a
  notice, as the same guard on ``$X`` is: the job sets the variable;
- ``unset X`` by the script itself leaves ``${X:-}`` empty (the job cannot set it back);
- the node's GPU count as scripts read it (Pai: ``python -c "import torch;
  print(torch.cuda.device_count())"``; slime: ``nvidia-smi -L | wc -l``) is ``--gpus-per-node``;
- the release of a Megatron-LM tree on the PYTHONPATH the launch exports (Pai's
  ``backends/megatron/Megatron-LM-YYMMDD``).
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from megatron_estimator.inputs.launch.script import load_launch_script

GUARDED = r"""#!/bin/bash
set -ex
MASTER_ADDR=${MASTER_ADDR:-}
if [ -z "${MASTER_ADDR}" ]; then
  echo "MASTER_ADDR is not set"
  exit 1
fi
if [ -z "${BASE_DIR:-}" ]; then
  echo "BASE_DIR is not set"
  exit 1
fi
torchrun --nproc_per_node 2 pretrain_gpt.py --num-layers 2 --load ${BASE_DIR}/ckpt
"""


def test_guard_on_a_defaulted_cluster_variable_is_assumed_to_pass(tmp_path):
    path = tmp_path / "run.sh"
    path.write_text(GUARDED)
    launch, problems = load_launch_script(str(path), {"PATH": "/usr/bin:/bin"})
    assert problems == ()
    # what bash runs when the job sets both (MASTER_ADDR=a BASE_DIR=/nowhere/b): --load /nowhere/b/ckpt
    assert launch.megatron_argv[:2] == ("--num-layers", "2")
    assert launch.world_size == 2
    notices = " ".join(launch.notices)
    assert "MASTER_ADDR" in notices and "BASE_DIR" in notices and "assumes the job sets it" in notices


def test_a_set_variable_keeps_its_default_semantics(tmp_path):
    path = tmp_path / "run.sh"
    path.write_text(GUARDED)
    launch, problems = load_launch_script(str(path), {"PATH": "/usr/bin:/bin", "MASTER_ADDR": "a",
                                                      "BASE_DIR": "/nowhere/b"})
    assert problems == ()
    assert launch.megatron_argv == ("--num-layers", "2", "--load", "/nowhere/b/ckpt")
    assert not any("assumes the job sets it" in n for n in launch.notices)


def test_guard_that_real_bash_stops_on_after_the_script_unsets(tmp_path):
    # bash: `unset X` then `[ -z "${X:-}" ] && exit 1` stops even when the caller exported X
    path = tmp_path / "run.sh"
    path.write_text('unset X\n[ -z "${X:-}" ] && exit 1\ntorchrun --nproc_per_node 2 pretrain_gpt.py --num-layers 2\n')
    bash = shutil.which("bash")
    if bash is not None:
        ran = subprocess.run([bash, str(path)], env={"PATH": "/nowhere", "X": "1"}, capture_output=True)
        assert ran.returncode == 1
    launch, problems = load_launch_script(str(path), {"PATH": "/usr/bin:/bin", "X": "1"})
    assert launch is None and problems        # no launch is reached, as in bash


GPU_COUNT = r"""#!/bin/bash
GPUS_PER_NODE=`python -c "import torch; print(torch.cuda.device_count())"`
NUM_GPUS=$(nvidia-smi -L 2>/dev/null | wc -l | tr -d ' ')
torchrun --nproc_per_node $GPUS_PER_NODE --nnodes 2 pretrain_gpt.py --num-layers 2 --micro-batch-size $NUM_GPUS
"""


def test_the_nodes_gpu_count_is_gpus_per_node(tmp_path):
    path = tmp_path / "run.sh"
    path.write_text(GPU_COUNT)
    launch, problems = load_launch_script(str(path), {"PATH": "/usr/bin:/bin"}, gpus_per_node=4)
    assert problems == ()
    # 4 GPUs per node x --nnodes 2 = 8; both idioms print 4
    assert launch.world_size == 8
    assert launch.megatron_argv == ("--num-layers", "2", "--micro-batch-size", "4")
    notices = " ".join(launch.notices)
    assert notices.count("taken as 4 (--gpus-per-node)") == 2


def test_without_gpus_per_node_the_count_is_unknown_and_says_how_to_give_it(tmp_path):
    path = tmp_path / "run.sh"
    path.write_text(GPU_COUNT)
    launch, problems = load_launch_script(str(path), {"PATH": "/usr/bin:/bin"})
    assert launch is None or launch.world_size is None
    assert any("--gpus-per-node N" in p.message for p in problems)


def test_other_commands_are_not_taken_for_a_gpu_count(tmp_path):
    path = tmp_path / "run.sh"
    # counts NVLink references, not GPUs: stays unknown (it reaches no launch value here)
    path.write_text("L=$(nvidia-smi topo -m | grep -o NV | wc -l)\n"
                    "torchrun --nproc_per_node 2 pretrain_gpt.py --num-layers 2\n")
    launch, problems = load_launch_script(str(path), {"PATH": "/usr/bin:/bin"}, gpus_per_node=4)
    assert problems == () and launch.world_size == 2
    assert not any("--gpus-per-node" in n for n in launch.notices)


def test_release_of_the_tree_on_the_jobs_pythonpath(tmp_path):
    from megatron_estimator.api import input_from_file, launched_tree_release

    core = tmp_path / "backends" / "megatron" / "Megatron-LM-X" / "megatron" / "core"
    core.mkdir(parents=True)
    # package_info.py as Megatron-LM writes it (megatron/core/package_info.py: MAJOR, MINOR, PATCH)
    (core / "package_info.py").write_text("MAJOR = 0\nMINOR = 15\nPATCH = 3\nPRE_RELEASE = ''\n")
    examples = tmp_path / "examples" / "tiny"
    examples.mkdir(parents=True)
    (examples / "pretrain_gpt.py").write_text("print('stub')\n")
    path = examples / "run.sh"
    path.write_text('ROOT=$(cd "$(dirname "$0")/../.." && pwd)\n'
                    'export PYTHONPATH=${ROOT}/backends/megatron/Megatron-LM-X:$PYTHONPATH\n'
                    'cd "$(dirname "$0")"\n'
                    'torchrun --nproc_per_node 1 pretrain_gpt.py --num-layers 2 --hidden-size 64 '
                    '--num-attention-heads 4 --seq-length 128 --max-position-embeddings 128 '
                    '--micro-batch-size 1 --vocab-size 128\n')
    inp, _problems = input_from_file(str(path), environ={"PATH": "/usr/bin:/bin"})
    tree = launched_tree_release(inp)
    assert tree is not None and tree.version.startswith("0.15")
    assert "PYTHONPATH" in tree.source
    # the checking shell's own PYTHONPATH is not the job's: a tree only there is not taken
    os_path = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(core.parent.parent)}
    path.write_text('torchrun --nproc_per_node 1 pretrain_gpt.py --num-layers 2\n')
    inp, _problems = input_from_file(str(path), environ=os_path)
    assert launched_tree_release(inp) is None or os.environ.get("PYTHONPATH") is None


def test_framework_source_is_found_on_the_jobs_pythonpath_not_this_process(tmp_path, monkeypatch):
    from megatron_estimator.inputs.frameworks import framework_flags
    from megatron_estimator.inputs.frameworks.pai import FRAMEWORK as PAI

    tree = tmp_path / "patch"
    (tree / "megatron_patch").mkdir(parents=True)
    # an argument provider in Pai's shape (megatron_patch/arguments.py get_patch_args), written here
    (tree / "megatron_patch" / "arguments.py").write_text(
        "def get_patch_args(parser):\n"
        "    group = parser.add_argument_group(title='patch')\n"
        "    group.add_argument('--made-up-patch-flag', type=int, default=3)\n"
        "    return parser\n")
    monkeypatch.setenv("PYTHONPATH", str(tree))          # this process's: not the job's
    specs, origin = framework_flags(PAI, None, (), "main", "")
    assert origin.startswith("its flag table")
    specs, origin = framework_flags(PAI, None, (), "main", str(tree))
    assert origin.startswith("its source") and str(tree) in origin
    assert any("--made-up-patch-flag" in s.option_strings for s in specs)


def test_slime_detects_its_gpus_only_where_the_node_has_the_tool(tmp_path):
    # slime run-qwen3-4B.sh's idiom: nvidia-smi's count when it is installed, else 0, then 8
    path = tmp_path / "run.sh"
    path.write_text('if command -v nvidia-smi >/dev/null 2>&1; then\n'
                    '    DETECTED=$(nvidia-smi -L 2>/dev/null | wc -l | tr -d " ")\n'
                    'else\n    DETECTED=0\nfi\n'
                    'N=${NUM_GPUS:-${DETECTED}}\n'
                    'torchrun --nproc_per_node $N pretrain_gpt.py --num-layers 2\n')
    launch, problems = load_launch_script(str(path), {"PATH": "/usr/bin:/bin"}, gpus_per_node=4)
    assert problems == () and launch.world_size == 4        # bash on a 4-GPU node: 4
    launch, problems = load_launch_script(str(path), {"PATH": "/usr/bin:/bin"})
    assert launch is None or launch.world_size is None      # unknown node: 0 or the count
