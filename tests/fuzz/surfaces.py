"""Random hostile inputs per surface (issue 30), deterministic by seed, and an in-process runner.

    python tests/fuzz/generate.py --campaign 10000   # the big campaign (in-process, ~15 min)

Every generator takes a ``random.Random`` and returns one case: ``{"name", "argv", "files", "env"}``
for the command line (file names relative to a fresh folder) or ``{"name", "api", "args",
"kwargs"}`` for a Python API call.  ``run_case`` runs one in this process and returns what was
wrong with it (None when it ended cleanly: exit 0, 1 or 2 with located one-line errors, or
``InvalidInput`` from the API).
"""

from __future__ import annotations

import contextlib
import io
import os
import random
import time
from pathlib import Path

EST = ["--model", "llama3-8b", "--gpu", "h100"]
NASTY = ["1e20", "-1", "0", "9" * 5000, "1" * 40, "nan", "inf", "", "a\nb", "\x1b[31mred", "\u2028", "0x10",
         "1_000", "--", "=", "${X}", "$(echo hi)", "\u00e9", "[", "{", "*", "&a", "*a", "null", "~", "true",
         "${a}", "${oc.env:HOME}", "${mul:2,${x}}", "\x00", "\ud800", "'", '"', "\\", "- x", ": x", "!!python/object:os.system"]
KEYS = ["num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size", "vocab_size",
        "seq_length", "micro_batch_size", "global_batch_size", "tensor_model_parallel_size",
        "pipeline_model_parallel_size", "context_parallel_size", "expert_model_parallel_size", "num_experts",
        "normalization", "bf16", "fp16", "recompute_granularity", "sequence_parallel", "max_position_embeddings",
        "use_distributed_optimizer", "moe_router_topk", "kv_channels", "position_embedding_type"]
SEED = ("model:\n  num_layers: 2\n  hidden_size: 256\n  num_attention_heads: 4\n  vocab_size: 1024\n"
        "  max_position_embeddings: 512\nparallelism:\n  tensor_model_parallel_size: 1\n"
        "training:\n  micro_batch_size: 1\n  seq_length: 512\n  global_batch_size: 8\n")
MEGATRON_YAML = ("language_model:\n  num_layers: 2\n  hidden_size: 256\n  num_attention_heads: 4\n"
                 "  ffn_hidden_size: 1024\nmodel_parallel:\n  tensor_model_parallel_size: 1\n"
                 "micro_batch_size: 1\nglobal_batch_size: 8\nseq_length: 512\nmax_position_embeddings: 512\n")
HF = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1024, "max_position_embeddings": 512,
      "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "hidden_act": "silu"}
LOG_LINE = ("[Rank {r}] (after 10 iterations) memory (MB) | allocated: {a} | max allocated: {b} | "
            "reserved: {c} | max reserved: {d}\n")
LAUNCHERS = ["torchrun --nproc-per-node {n}", "torchrun --nnodes {n} --nproc_per_node 8", "srun -n {n}",
             "python -m torch.distributed.run --nproc_per_node={n}", "deepspeed --num_gpus {n}",
             "python -m torch.distributed.launch --nproc_per_node {n}", "ray job submit -- python",
             "sbatch --nodes {n}", "mpirun -np {n}", "accelerate launch --num_processes {n}", "eval torchrun", ""]
BASH = ["X={v}", "export WORLD_SIZE={v}", "ARGS=\"$ARGS --num-layers {v}\"", "f(){{ f \"$@\"; }}; f", "for i in {v}; do :; done",
        "while false; do :; done", "case {v} in *) X=1;; esac", "a=({v} {v}); ARGS=\"${{a[@]}}\"", "eval \"X={v}\"",
        "X=$(({v}+1))", "source {v}", ". ./other.sh", "X=${{Y:-{v}}}", "X=${{#ARGS}}", "[[ {v} == x ]] && X=1",
        "if [ -n \"{v}\" ]; then ARGS=\"$ARGS {v}\"; fi", "X=$'{v}'", "read -r X <<< \"{v}\"", "shift {v}",
        "set -- {v} {v}", "trap 'echo' EXIT", "exec > /dev/null", "cd {v}", "X=`echo {v}`", "(( X = {v} ))",
        "declare -A m=([k]={v}); X=${{m[k]}}", "printf -v X '%s' {v}", "X=${{ARGS//a/{v}}}"]
FLAGS = ["--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--global-batch-size", "--micro-batch-size",
         "--seq-length", "--num-layers", "--hidden-size", "--context-parallel-size", "--expert-model-parallel-size",
         "--num-layers-per-virtual-pipeline-stage", "--vocab-size", "--ffn-hidden-size", "--num-attention-heads",
         "--num-experts", "--recompute-granularity", "--yaml-cfg", "--hf-config", "--bf16", "--fp8-format"]
SETTINGS = ["budget", "gpu", "format", "cuda-context", "nccl-buffers", "fragmentation", "routing-imbalance",
            "flash-attn", "stack", "megatron-version", "resume", "warn-only", "accept-flags"]
TREE_BRIDGE = ("model:\n  num_layers: 2\n  hidden_size: 256\n  ffn_hidden_size: 512\n  num_attention_heads: 4\n"
               "  vocab_size: 1024\n  seq_length: ${dataset.seq_length}\n  tensor_model_parallel_size: 1\n"
               "train:\n  micro_batch_size: 1\n  global_batch_size: 8\n  train_iters: 10\n"
               "dataset:\n  seq_length: 512\noptimizer:\n  use_distributed_optimizer: true\n")
NEMO_BASE = ("policy:\n  model_name: model\n  train_global_batch_size: 16\n  train_micro_batch_size: 2\n"
             "  max_total_sequence_length: 512\n  precision: bfloat16\n  megatron_cfg:\n    enabled: true\n"
             "    tensor_model_parallel_size: 1\nloss_fn:\n  reference_policy_kl_penalty: 0.01\n"
             "cluster:\n  num_nodes: 1\n  gpus_per_node: 4\n")
VERL = ("defaults:\n  - _self_\nactor_rollout_ref:\n  model:\n    path: model\n  actor:\n    strategy: megatron\n"
        "    ppo_micro_batch_size_per_gpu: 2\n    megatron:\n      tensor_model_parallel_size: 1\n"
        "data:\n  max_prompt_length: 256\n  max_response_length: 256\ntrainer:\n  nnodes: 1\n  n_gpus_per_node: 4\n")


def _value(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.5:
        return rng.choice(NASTY)
    if roll < 0.8:
        return str(rng.choice([rng.randint(-3, 70), rng.randint(0, 1 << 64), 10 ** rng.randint(1, 60)]))
    return "".join(chr(rng.randint(0, 0x2FF)) for _ in range(rng.randint(0, 12)))


def _mutate_text(text: str, rng: random.Random) -> str:
    """Line-level and character-level damage: replace a value, duplicate, nest, cut, insert junk."""
    lines = text.splitlines(keepends=True)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(9)
        i = rng.randrange(len(lines)) if lines else 0
        if op == 0 and lines:            # replace a value
            head = lines[i].split(":", 1)[0] if ":" in lines[i] else lines[i].rstrip("\n")
            lines[i] = f"{head}: {_value(rng)}\n"
        elif op == 1 and lines:          # duplicate a line many times
            lines[i:i] = [lines[i]] * rng.choice([2, 50, 5000])
        elif op == 2:                    # a new key anywhere
            lines.insert(i, f"{'  ' * rng.randint(0, 3)}{rng.choice(KEYS)}: {_value(rng)}\n")
        elif op == 3 and lines:          # cut
            lines = lines[:i]
        elif op == 4:                    # deep nesting
            depth = rng.choice([50, 1000, 20000])
            lines.insert(i, "x: " + rng.choice(["[", "{a: "]) * depth + "\n")
        elif op == 5 and lines:          # random bytes in a line
            line = lines[i]
            cut = rng.randrange(len(line) + 1)
            lines[i] = line[:cut] + "".join(chr(rng.randint(0, 0x7F)) for _ in range(rng.randint(1, 5))) + line[cut:]
        elif op == 6:                    # anchors and aliases
            lines.insert(i, rng.choice(["a: &a [1, *a]\n", "b: &b {x: *b}\n", "<<: *nope\n", "c: *c\n",
                                        "d: &d [1,2]\ne: [*d,*d,*d,*d,*d,*d,*d,*d]\n", "<<: [1, 2]\n"]))
        elif op == 7:                    # indentation damage
            lines = [(" " * rng.randint(0, 3) if rng.random() < 0.2 else "") + ln for ln in lines]
        else:                            # interpolations
            lines.insert(i, f"{rng.choice(KEYS)}: " + rng.choice(["${a}", "${" * 500 + "x" + "}" * 500, "${oc.env:PATH}",
                                                                  "${mul:${x},2}", "${.}", "${..x}", "${oc.decode:1}"]) + "\n")
    return "".join(lines)


def _cli(name, argv, files=None, env=None) -> dict:
    return {"name": name, "argv": argv, "files": files or {}, "env": env or {}}


def gen_seed_yaml(rng, n):
    return _cli(f"seedyaml-{n}", ["check", "c.yaml"], {"c.yaml": _mutate_text(SEED, rng)})


def gen_megatron_yaml(rng, n):
    text = _mutate_text(MEGATRON_YAML, rng)
    if rng.random() < 0.5:
        return _cli(f"yamlcfg-{n}", ["estimate", *EST, "--", "--yaml-cfg", "c.yaml"], {"c.yaml": text})
    return _cli(f"megyaml-{n}", ["check", "c.yaml"], {"c.yaml": text})


def gen_shell(rng, n):
    body = [rng.choice(BASH).format(v=_value(rng).replace("\n", " ")) for _ in range(rng.randint(1, 6))]
    launcher = rng.choice(LAUNCHERS).format(n=rng.choice(["8", "0", "-1", "9" * 40, "$N", "${N:-8}", "x"]))
    flags = " ".join(f"{rng.choice(FLAGS)} {_value(rng).replace(chr(10), ' ')!r}" for _ in range(rng.randint(0, 4)))
    script = "#!/bin/bash\n" + "\n".join(body) + f"\n{launcher} pretrain_gpt.py --num-layers 2 {flags} $ARGS\n"
    if rng.random() < 0.3:
        script = _mutate_text(script, rng)
    files = {"train.sh": script, "other.sh": "source ./train.sh\n"}
    if rng.random() < 0.3:
        return _cli(f"shell-run-{n}", ["run", "--gpu", "h100", "--", "bash", "train.sh"], files)
    return _cli(f"shell-{n}", ["check", "train.sh"], files)


def gen_hf(rng, n):
    import json
    cfg = dict(HF)
    for _ in range(rng.randint(1, 4)):
        key = rng.choice(list(HF) + ["num_experts", "head_dim", "rope_scaling", "text_config", "torch_dtype"])
        cfg[key] = rng.choice([_value(rng), None, [], {}, True, -1, 10 ** 30, 1.5, {"type": _value(rng)}])
    text = json.dumps(cfg)
    if rng.random() < 0.3:
        cut = rng.randrange(len(text))
        text = text[:cut] + rng.choice(["", "[" * 10000, "\x00", "9" * 6000, "}"]) + text[cut:]
    argv = ["check", "config.json"] if rng.random() < 0.5 else ["estimate", "--gpu", "h100", "--hf-config", "config.json"]
    return _cli(f"hf-{n}", argv, {"config.json": text})


def gen_log(rng, n):
    lines = []
    for _ in range(rng.randint(1, 8)):
        fig = [rng.choice([str(rng.randint(0, 90000)), _value(rng).replace("\n", " ")]) for _ in range(5)]
        lines.append(LOG_LINE.format(r=fig[0], a=fig[1], b=fig[2], c=fig[3], d=fig[4]))
    if rng.random() < 0.5:
        lines.insert(0, "using world size: {} , data-parallel size: {}\n".format(_value(rng), _value(rng)))
    if rng.random() < 0.3:
        lines.insert(0, "------------------------ arguments ------------------------\n  num_layers ...... "
                     f"{_value(rng)}\n  hidden_size ..... {_value(rng)}\n-------------------- end of arguments ---\n")
    return _cli(f"log-{n}", ["compare", "train.log"], {"train.log": _mutate_text("".join(lines), rng)})


def gen_flags(rng, n):
    argv = ["estimate", *EST, "--"]
    for _ in range(rng.randint(1, 6)):
        argv += [rng.choice(FLAGS), _value(rng)]
    return _cli(f"flags-{n}", argv)


def gen_settings(rng, n):
    lines = [f"{rng.choice(SETTINGS)} = " + rng.choice([f'"{_value(rng)}"', _value(rng).replace("\n", " "), "[]", "{}",
                                                         "true", "1e400"]) for _ in range(rng.randint(1, 5))]
    env = {f"MEGATRON_ESTIMATOR_{rng.choice(SETTINGS).upper().replace('-', '_')}": _value(rng).replace("\x00", "").replace("\ud800", "\udcff")
           for _ in range(rng.randint(0, 3))}
    files = {"megatron-estimator.toml": "\n".join(lines) + "\n"}
    if rng.random() < 0.3:
        files = {"pyproject.toml": "[tool.megatron-estimator]\n" + files["megatron-estimator.toml"]}
    return _cli(f"settings-{n}", ["estimate", *EST, "--", "--seq-length", "128"], files, env)


def gen_plan(rng, n):
    argv = ["plan", "--model", "llama3-8b", "--gpu", "h100", "--world-size", rng.choice(["8", "64", _value(rng)]),
            "--global-batch-size", rng.choice(["64", _value(rng)])]
    if rng.random() < 0.3:
        argv += ["--top", rng.choice(["1", "0", "-5", "1000000", _value(rng)])]
    if rng.random() < 0.5:
        argv += ["--", rng.choice(FLAGS), _value(rng)]
    return _cli(f"plan-{n}", argv)


def gen_tree(rng, n):
    import json
    kind = rng.randrange(3)
    files = {"model/config.json": json.dumps(HF)}
    overrides = [f"{rng.choice(['policy.', 'actor_rollout_ref.actor.', 'model.', 'train.', '+', '~', ''])}"
                 f"{rng.choice(KEYS + ['defaults', 'a.b.c', ''])}={_value(rng).replace(chr(10), ' ')}"
                 for _ in range(rng.randint(0, 3))]
    if kind == 0:
        files["c.yaml"] = _mutate_text(TREE_BRIDGE, rng)
        name, api = "bridge", "bridge"
    elif kind == 1:
        chain = rng.choice([1, 3, 40])
        width = rng.choice([1, 2, 8])
        for i in range(chain):
            parents = ", ".join([f"b{i + 1}.yaml"] * width)
            files[f"b{i}.yaml"] = f"defaults: [{parents}]\npolicy:\n  x{i}: {i}\n"
        files[f"b{chain}.yaml"] = NEMO_BASE
        files["c.yaml"] = "defaults: " + rng.choice(["b0.yaml", "c.yaml", "[c.yaml, c.yaml]", "/nowhere/x.yaml",
                                                     _value(rng).replace("\n", " ")]) + "\n" + _mutate_text(
            NEMO_BASE.replace("policy:\n", "policy:\n  self: ${policy.self}\n", 1) if rng.random() < 0.3 else NEMO_BASE, rng)
        name, api = "nemorl", "nemo_rl"
    else:
        files["c.yaml"] = _mutate_text(VERL, rng)
        name, api = "verl", "verl"
    if rng.random() < 0.5:
        return {"name": f"tree-{name}-{n}", "api": "tree", "args": [api, "c.yaml", overrides], "kwargs": {},
                "files": files}
    return _cli(f"tree-{name}-{n}", ["check", "c.yaml"], files)


API_FUNCS = ["estimate", "load_input", "input_from_flags", "input_from_file", "input_from_mapping", "input_from_log",
             "input_from_model", "input_from_launch", "plan", "compare_log", "budget_bytes", "lookup_gpu",
             "flash_attn_version", "search_space", "planned_layouts", "megatron_release_label",
             "not_a_training_input", "plan_input", "world_size_for", "choose_megatron_release"]
WRONG = [None, b"x", 3, -1, 1.5, float("nan"), 10 ** 40, "", "\x00", "nope", [], {}, [None], ["--num-layers"],
         {"num_layers": "x"}, {"model": None}, object(), ("--tp",), True, "c.yaml", "config.json", "/nowhere/x",
         {"model": {"num_layers": -1}}, ["--num-layers", "9" * 5000]]


def _wrong_arguments(function, rng) -> dict:
    """Every required parameter and some optional ones, each given a wrong value (by name: the
    call itself is well-formed, so only the values are wrong)."""
    import inspect

    kwargs = {}
    for name, param in inspect.signature(function).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if name == "self":
            continue
        if param.default is param.empty or rng.random() < 0.3:
            kwargs[name] = rng.choice(WRONG)
    return kwargs


def gen_api(rng, n):
    from megatron_estimator import api

    func = rng.choice(API_FUNCS)
    args, kwargs = [], _wrong_arguments(getattr(api, func), rng)
    return {"name": f"api-{func}-{n}", "api": func, "args": args, "kwargs": kwargs,
            "files": {"c.yaml": _mutate_text(SEED, rng), "config.json": "{}"}}


def gen_plugin(rng, n):
    from megatron_estimator.pytest_plugin import MegatronMemory

    method = rng.choice(["verdict", "estimate", "assert_fits", "budget", "megatron_release"])
    return {"name": f"plugin-{method}-{n}", "api": "plugin", "args": [method, []],
            "kwargs": _wrong_arguments(getattr(MegatronMemory, method), rng),
            "files": {"c.yaml": SEED}}


SURFACES = {"seedyaml": gen_seed_yaml, "megyaml": gen_megatron_yaml, "shell": gen_shell, "hf": gen_hf,
            "log": gen_log, "flags": gen_flags, "settings": gen_settings, "plan": gen_plan, "tree": gen_tree,
            "api": gen_api, "plugin": gen_plugin}


def cases(count: int, seed: int = 30) -> list[dict]:
    """``count`` cases, spread evenly over the surfaces, the same for the same seed."""
    rng = random.Random(seed)
    names = list(SURFACES)
    return [SURFACES[names[n % len(names)]](rng, n) for n in range(count)]


# -- the in-process runner -------------------------------------------------------------------

class _Launched(Exception):
    pass


def _check_output(out: str) -> str | None:
    if "internal error" in out or "Traceback" in out:
        return "internal error: " + out[-300:]
    if any(ch < " " and ch not in "\n" for ch in out):
        return "raw control character in output: " + repr(out[-300:])
    for line in out.splitlines():
        if line.lstrip().startswith("error: "):
            location = line.split("error: ", 1)[1].split(": ", 1)
            if len(location) != 2 or not location[0].strip():
                return "unlocated error line: " + repr(line)
    return None


def _call_api(case: dict):
    from megatron_estimator import api
    from megatron_estimator.core.problems import InvalidInput

    try:
        if case["api"] == "tree":
            kind, path, overrides = case["args"]
            from megatron_estimator.inputs.trees import bridge, nemo_rl, verl
            if kind == "bridge":
                bridge.load_bridge_yaml(path, Path(path).read_text("utf-8", "surrogateescape"),
                                        [tuple(o.split("=", 1)) for o in overrides if "=" in o])
            elif kind == "nemo_rl":
                nemo_rl.read_nemo_rl(path, overrides)
            else:
                verl.read_verl(path, overrides)
        elif case["api"] == "plugin":
            return _call_plugin(*case["args"], **case["kwargs"])
        else:
            getattr(api, case["api"])(*case["args"], **case["kwargs"])
    except InvalidInput as error:
        for problem in error.problems:
            if not str(problem.location).strip():
                return f"InvalidInput problem without a location: {problem!r}"
    except Exception as error:  # noqa: BLE001 - the point: anything else is a failure
        import traceback
        return f"{type(error).__name__}: {error!s:.200} at {traceback.extract_tb(error.__traceback__)[-1]}"
    return None


def _call_plugin(method, args, **kwargs):
    """The fixture's methods (with a stand-in pytest config): only pytest's own outcomes may escape."""
    import types

    import pytest

    from megatron_estimator.core.problems import InvalidInput
    from megatron_estimator.pytest_plugin import MegatronMemory

    config = types.SimpleNamespace(stash={}, rootpath=Path.cwd())
    memory = MegatronMemory(config)
    try:
        getattr(memory, method)(*args, **kwargs)
    except (pytest.fail.Exception, AssertionError, InvalidInput):
        return None
    except Exception as error:  # noqa: BLE001
        return f"{type(error).__name__}: {error!s:.200}"
    return None


def run_case(case: dict, folder: Path, time_limit: float = 10.0) -> tuple[str | None, float]:
    """(what went wrong or None, seconds) for one case, run in this process inside ``folder``."""
    from megatron_estimator import cli
    from megatron_estimator.inputs.launch import execute

    for name, text in case.get("files", {}).items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(text.encode("utf-8", "surrogatepass"))
    saved_env = dict(os.environ)
    saved_cwd = os.getcwd()
    saved_exec = execute.exec_launch
    out, err = io.StringIO(), io.StringIO()
    start = time.perf_counter()
    problem = None
    try:
        os.chdir(folder)
        for key in [k for k in os.environ if k.startswith("MEGATRON_ESTIMATOR_")]:
            del os.environ[key]
        os.environ.update(case.get("env", {}))

        def stub(command):     # never launch: record that the estimator decided to
            raise _Launched()
        execute.exec_launch = stub
        if "api" in case:
            problem = _call_api(case)
        else:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    code = cli.main(case["argv"])
                except SystemExit as exit_:
                    code = exit_.code
                except _Launched:
                    code = 0
                except Exception as error:  # noqa: BLE001
                    code, problem = None, f"{type(error).__name__}: {error!s:.200}"
            if problem is None and code not in (0, 1, 2):
                problem = f"exit code {code!r}"
            problem = problem or _check_output(out.getvalue() + err.getvalue())
    finally:
        execute.exec_launch = saved_exec
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    seconds = time.perf_counter() - start
    if problem is None and seconds > time_limit:
        problem = f"took {seconds:.1f} s"
    return problem, seconds
