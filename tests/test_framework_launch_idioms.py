"""Launch idioms of the frameworks people train Megatron through (issue 27), each checked
against what bash itself makes of the same snippet: a stub program on PATH records its argv.

The snippets are written here; they reproduce idioms seen in public repositories:
THUDM/slime scripts/run-*.sh (``ray job submit --runtime-env-json ... -- python3 train.py``,
``source "${SCRIPT_DIR}/models/X.sh"`` through the ``BASH_SOURCE`` idiom) and
alibaba/Pai-Megatron-Patch examples/*/run_mcore_*.sh (``run_cmd="torchrun ..."; eval ${run_cmd}``
with a ``$(date)`` log path, unset optional variables, positional arguments).
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from megatron_estimator.inputs.launch.script import load_launch_script
from megatron_estimator.inputs.launch.walk import parse_launch_command

_STUB = """#!/bin/sh
printf '%s\\0' "$(basename "$0")" "$@" >> "$STUB_LOG"
printf '\\n' >> "$STUB_LOG"
"""


def _bash_runs(tmp_path, script, args=()) -> list[tuple[str, ...]]:
    """Run ``script`` with real bash, the launch programs stubbed; each run's argv."""
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("bash is not installed")
    stubs = tmp_path / "bin"
    stubs.mkdir(exist_ok=True)
    for program in ("torchrun", "python3", "ray", "date"):
        (stubs / program).write_text(_STUB if program != "date" else "#!/bin/sh\necho 2026.01.01\n")
        (stubs / program).chmod(0o755)
    log = tmp_path / "log"
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "HOME": str(tmp_path), "STUB_LOG": str(log)}
    subprocess.run([bash, str(script), *args], cwd=tmp_path, env=env, check=True, timeout=60,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return [tuple(record.split("\0")) for record in log.read_text().split("\0\n") if record]


def _argv_from(argv, program):
    start = next(i for i, t in enumerate(argv) if os.path.basename(t) == program)
    return tuple(argv[start:])


def test_ray_job_submit_is_a_launch_with_its_runtime_env():
    command, problems = parse_launch_command(
        ["ray", "job", "submit", "--address=http://127.0.0.1:8265",
         "--runtime-env-json", '{"env_vars": {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "NCCL_NVLS_ENABLE": "0"}}',
         "--no-wait", "--", "python3", "train.py", "--num-layers", "2"], {})
    assert problems == ()
    assert command.script == "train.py"
    assert command.megatron_argv == ("--num-layers", "2")
    assert dict(command.environment) == {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "NCCL_NVLS_ENABLE": "0"}
    # ray starts one driver; the processes it then starts are the framework's: not ray's count
    assert command.world_size is None and "ray job submit" in command.world_size_source
    # a torchrun entrypoint decides the world size itself: 2 nodes x 4 processes
    command, _ = parse_launch_command(["ray", "job", "submit", "--", "torchrun", "--nnodes", "2",
                                       "--nproc-per-node", "4", "pretrain_gpt.py"], {})
    assert command.world_size == 8


def test_ray_job_submit_bad_json_is_one_problem():
    _command, problems = parse_launch_command(
        ["ray", "job", "submit", "--runtime-env-json={", "--", "python3", "train.py"], {})
    assert [p.code for p in problems] == ["invalid-launcher-option"]
    assert "--runtime-env-json" in problems[0].location


SLIME_LIKE = r"""#!/bin/bash
set -ex
export PYTHONUNBUFFERED=1
SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)"
source "${SCRIPT_DIR}/models/tiny.sh"
PERF_ARGS=(
   --tensor-model-parallel-size 2
   # --micro-batch-size 1
   --sequence-parallel
)
RUNTIME_ENV_JSON="{
  \"env_vars\": {
    \"CUDA_DEVICE_MAX_CONNECTIONS\": \"1\"
  }
}"
ray job submit --address="http://127.0.0.1:8265" \
   --runtime-env-json="${RUNTIME_ENV_JSON}" \
   -- python3 train.py \
   ${MODEL_ARGS[@]} \
   "${PERF_ARGS[@]}"
"""

SLIME_MODEL = """MODEL_ARGS=(
   --num-layers 2
   --hidden-size 64
)
"""


def test_slime_idioms_read_as_bash_runs_them(tmp_path, monkeypatch):
    scripts = tmp_path / "scripts"
    (scripts / "models").mkdir(parents=True)
    (scripts / "models" / "tiny.sh").write_text(SLIME_MODEL)
    path = scripts / "run-tiny.sh"
    path.write_text(SLIME_LIKE)
    runs = _bash_runs(tmp_path, path)
    # check runs from elsewhere: the source resolves next to the script, not the caller's cwd
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    launch, problems = load_launch_script(str(path), {"PATH": "/usr/bin:/bin"})
    assert problems == ()
    assert _argv_from(launch.command.argv, "ray") == runs[-1]
    assert launch.megatron_argv == ("--num-layers", "2", "--hidden-size", "64",
                                    "--tensor-model-parallel-size", "2", "--sequence-parallel")
    assert launch.command.launcher == "ray job submit"
    assert dict(launch.command.environment)["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"


PAI_LIKE = r"""#!/bin/bash
set -e
ENV=$1
MODEL_SIZE=$2
BATCH_SIZE=${3:-1}
if [ $ENV = dsw ]; then
    NNODES=1
    GPUS_PER_NODE=2
elif [ $ENV = dlc ]; then
    NNODES=${WORLD_SIZE}
    GPUS_PER_NODE=${KUBERNETES_CONTAINER_RESOURCE_GPU}
fi
if [ $MODEL_SIZE = tiny ]; then
    NUM_LAYERS=2
fi
current_time=$(date "+%Y.%m.%d")
DISTRIBUTED_ARGS="--nproc_per_node $GPUS_PER_NODE --nnodes $NNODES"
megatron_options="  \
        --num-layers ${NUM_LAYERS} \
        --micro-batch-size ${BATCH_SIZE} \
        --tensorboard-dir /nowhere/tb_${current_time} \
        "
run_cmd="torchrun $DISTRIBUTED_ARGS pretrain_gpt.py
 ${megatron_options} ${sp_options} ${vp_options}"
echo ${run_cmd}
eval ${run_cmd}
"""


@pytest.mark.parametrize("args, environ", [
    (("dsw", "tiny"), {}),
    (("dsw", "tiny", "4"), {}),
    (("dlc", "tiny"), {"WORLD_SIZE": "2", "KUBERNETES_CONTAINER_RESOURCE_GPU": "8"}),
])
def test_pai_eval_of_a_built_command(tmp_path, args, environ):
    path = tmp_path / "run_mcore_tiny.sh"
    path.write_text(PAI_LIKE)
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("bash is not installed")
    runs = _bash_runs(tmp_path, path, args) if not environ else None
    launch, problems = load_launch_script(str(path), {"PATH": "/usr/bin:/bin", **environ}, script_args=args)
    assert problems == ()
    argv = launch.megatron_argv
    # $(date) stays unknown in the log path only: everything else is what bash ran
    assert argv[:4] == ("--num-layers", "2", "--micro-batch-size", args[2] if len(args) > 2 else "1")
    assert argv[4] == "--tensorboard-dir" and len(argv) == 6
    if runs is not None:
        ran = _argv_from(runs[-1], "torchrun")
        cut = ran.index("pretrain_gpt.py") + 1
        assert _argv_from(launch.command.argv, "torchrun")[:cut] == ran[:cut]
        assert argv[:-1] == ran[cut:-1]          # the unset optional variables gave no word
        assert ran[-1] == "/nowhere/tb_2026.01.01"
    # dsw: 2 processes x 1 node; dlc (Pai's convention): WORLD_SIZE nodes x GPUs per node = 2 x 8
    assert launch.world_size == (16 if environ else 2)
    notices = " ".join(launch.notices)
    assert "date" in notices and "sp_options" in notices and "vp_options" in notices


def test_eval_still_refuses_an_unknown_launch_value(tmp_path):
    # the unknown is a launcher count: it matters, so it is a problem, not a notice
    path = tmp_path / "run.sh"
    path.write_text('N=$(nproc)\nrun_cmd="torchrun --nproc_per_node $N pretrain_gpt.py --num-layers 2"\neval ${run_cmd}\n')
    launch, problems = load_launch_script(str(path), {"PATH": "/usr/bin:/bin"})
    assert launch is not None and launch.megatron_argv == ("--num-layers", "2")
    assert launch.world_size is None
    assert any("nproc" in p.message for p in problems)
