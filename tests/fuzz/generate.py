"""Hostile inputs for every surface (issue 30), generated (deterministic: no stored blobs).

    python tests/fuzz/generate.py            # the seeds tests/test_fuzz.py runs, as JSON
    python tests/fuzz/generate.py --count N  # N random flag mutations more, as JSON
    python tests/fuzz/generate.py --campaign N [--seed S]  # N random cases over every surface
                                             # (tests/fuzz/surfaces.py), run in this process

Each case is ``{"name", "argv", "files": {NAME: TEXT}}``: the command line (file names in it
are relative to a fresh folder holding ``files``).  tests/test_fuzz.py runs every seed in a
subprocess under a 1 GiB address-space limit and checks the exit code (0, 1 or 2), that no
``internal error`` is printed and that every error line is located and on one line.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
EST = ["--model", "llama3-8b", "--gpu", "h100"]

NASTY_VALUES = ["1e20", "-1", "0", "9" * 5000, "1" * 40, "nan", "inf", "", "a\nb", "\x1b[31mred", "\u2028",
                "0x10", "1_000", "--", "=", "${X}", "$(rm -rf /)", "\udcff" [0:0] + "\u00e9", "[", "{", "*"]
FLAGS = ["--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--global-batch-size", "--micro-batch-size",
         "--seq-length", "--num-layers", "--hidden-size", "--context-parallel-size", "--expert-model-parallel-size",
         "--num-layers-per-virtual-pipeline-stage", "--vocab-size", "--ffn-hidden-size"]


def _yaml_cases() -> list[dict]:
    laughs = "a: &a [x,x,x,x,x,x,x,x,x,x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(9))
    texts = {
        "deep-flow": "language_model:\n  x: " + "[" * 3000 + "]" * 3000 + "\n",
        "deep-block": "language_model:\n" + "".join(" " * (2 * i + 2) + f"k{i}:\n" for i in range(200)),
        "self-alias": "language_model: &x\n  num_layers: *x\n",
        "self-alias-seq": "model: &x [1, *x]\nparallelism: {tp: 1}\n",
        "laughs": "language_model:\n  hidden_size: 8\n" + laughs,
        "big-int": "language_model:\n  num_layers: " + "9" * 5000 + "\n",
        "control-char": "language_model:\n  num_layers: 2\x07\n",
        "newline-key": "language_model:\n  \"num\\nlayers\": 2\n",
        "escape-value": "language_model:\n  normalization: \"\\e[31mRMSNorm\"\n",
        "tabs": "model:\n\thidden_size: 1\n",
        "merge-bad": "language_model:\n  <<: 3\n",
        "flat-large": "language_model:\n  x: [" + ",".join(["1"] * 250_000) + "]\n",
    }
    cases = []
    for name, text in texts.items():
        cases.append({"name": f"yaml-check-{name}", "argv": ["check", "c.yaml"], "files": {"c.yaml": text}})
        cases.append({"name": f"yaml-cfg-{name}", "argv": ["estimate", *EST, "--", "--seq-length", "128",
                                                           "--yaml-cfg", "c.yaml"], "files": {"c.yaml": text}})
    return cases


def _hf_cases() -> list[dict]:
    texts = {
        "big-int": '{"model_type": "llama", "hidden_size": ' + "9" * 5000 + "}",
        "deep": '{"model_type": "llama", "x": ' + "[" * 5000 + "]" * 5000 + "}",
        "bad-type": '{"model_type": "llama", "hidden_size": "\\u001b[31m"}',
        "not-object": "[1, 2]",
        "huge-float": '{"model_type": "llama", "hidden_size": 1e400, "num_hidden_layers": 1e308}',
        "negative": '{"model_type": "llama", "hidden_size": -4096, "num_attention_heads": 0}',
    }
    cases = []
    for name, text in texts.items():
        cases.append({"name": f"hf-{name}", "argv": ["estimate", "--gpu", "h100", "--hf-config", "config.json"],
                      "files": {"config.json": text}})
        cases.append({"name": f"hf-check-{name}", "argv": ["check", "config.json"], "files": {"config.json": text}})
    return cases


def _shell_cases() -> list[dict]:
    tail = "torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 2 $ARGS\n"
    texts = {
        "fork-bomb-args": 'g(){ g "$@" "$@"; }\ng a\n',
        "call-tree": "".join(f"f{i}(){{ f{i + 1}; f{i + 1}; }}\n" for i in range(22)) + "f22(){ :; }\nf0\n",
        "value-doubling": "X=ab\nfor ((i=0;i<100;i++)); do X=\"$X$X\"; done\n",
        "array-doubling": "a=(x)\nfor ((i=0;i<100;i++)); do a=(\"${a[@]}\" \"${a[@]}\"); done\n",
        "endless-loop": "while true; do :; done\n",
        "growing-args": "".join(f'ARGS="$ARGS --opt{i} {i}"\n' for i in range(3000)),
        "huge-nproc": "torchrun --nproc-per-node " + "9" * 40 + " pretrain_gpt.py\n",
        "deep-subshell": "(" * 500 + "true" + ")" * 500 + "\n",
        "deep-cmdsub": "X=" + "$(" * 200 + "echo 1" + ")" * 200 + "\n",
        "escape-name": "torchrun --nproc-per-node 8 $'pre\\x1b[31mtrain.py'\n",
    }
    return [{"name": f"shell-{name}", "argv": ["check", "train.sh"], "files": {"train.sh": "#!/bin/bash\n" + text + tail}}
            for name, text in texts.items()]


def _log_cases() -> list[dict]:
    rank = "[Rank " + "9" * 5000 + "] (after 10 iterations) memory (MB) | allocated: 1 | max allocated: 2 | " \
           "reserved: 3 | max reserved: 4\n"
    texts = {"huge-rank": rank, "huge-prefix": "[default" + "9" * 5000 + "]:x\n" + rank,
             "huge-figure": "[Rank 0] memory (MB) | allocated: " + "9" * 400 + " | max allocated: 2 | reserved: 3 | "
                            "max reserved: 4\n",
             "binary": "\x00\xff\x1b" * 1000}
    return [{"name": f"log-{name}", "argv": ["compare", "train.log"], "files": {"train.log": text}}
            for name, text in texts.items()]


def _planner_cases() -> list[dict]:
    base = ["plan", "--model", "llama3-8b", "--gpu", "h100"]
    return [
        {"name": "plan-gbs-1e20-after", "argv": base + ["--world-size", "8", "--", "--seq-length", "128",
                                                        "--global-batch-size", "1e20"], "files": {}},
        {"name": "plan-world-1e30", "argv": base + ["--world-size", "1" + "0" * 30, "--global-batch-size", "64"],
         "files": {}},
        {"name": "plan-world-prime", "argv": base + ["--world-size", "16777213", "--global-batch-size", "64", "--",
                                                     "--seq-length", "128"], "files": {}},
        {"name": "plan-top-huge", "argv": base + ["--world-size", "8", "--global-batch-size", "64", "--top", "1000000"],
         "files": {}},
        {"name": "plan-tp-40-digits", "argv": base + ["--world-size", "8", "--global-batch-size", "64", "--",
                                                      "--tensor-model-parallel-size", "9" * 40], "files": {}},
        {"name": "estimate-world-huge", "argv": ["estimate", *EST, "--world-size", "9" * 40], "files": {}},
    ]


def _settings_cases() -> list[dict]:
    texts = {"deep": "budget = " + "[" * 3000 + "]" * 3000 + "\n", "big-int": "budget = " + "9" * 5000 + "\n",
             "accept-many": "accept-flags = \"" + " ".join(f"--f{i}" for i in range(40_000)) + "\"\n",
             "escape": "gpu = \"h100\\u001b[31m\"\n"}
    return [{"name": f"settings-{name}", "argv": ["estimate", *EST, "--", "--seq-length", "128"],
             "files": {"megatron-estimator.toml": text}} for name, text in texts.items()]


def _campaign_cases() -> list[dict]:
    """The smallest reproducer of each class the campaigns (surfaces.py) found and fixed."""
    bridge = ("model:\n  num_layers: 2\n  hidden_size: 256\n  num_attention_heads: 4\n  seq_length: 512\n"
              "  tensor_model_parallel_size: 1\ntrain:\n  micro_batch_size: 1\n  global_batch_size: 8\n")
    nemo = ("policy:\n  model_name: model\n  train_global_batch_size: 16\n  train_micro_batch_size: 2\n"
            "  megatron_cfg:\n    enabled: true\n    tensor_model_parallel_size: 1\ncluster:\n  num_nodes: 1\n"
            "  gpus_per_node: 4\n")
    fan = {f"b{i}.yaml": f"defaults: [{', '.join([f'b{i + 1}.yaml'] * 8)}]\npolicy:\n  x{i}: {i}\n" for i in range(4)}
    big = "".join("torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 2\n" for _ in range(5000))
    log = ("------------------------ arguments ------------------------\n"
           + "".join(f"  bad line {i}\n" for i in range(10_000)))
    yaml_cfg = ["estimate", *EST, "--", "--seq-length", "128", "--micro-batch-size", "1", "--yaml-cfg"]
    return [
        # a --yaml-cfg path that is empty, holds ": ", is too long or is not UTF-8: one located problem
        {"name": "path-yaml-cfg-empty", "argv": yaml_cfg + [""], "files": {}},
        {"name": "path-yaml-cfg-colon", "argv": yaml_cfg + [": x"], "files": {}},
        {"name": "path-yaml-cfg-long", "argv": yaml_cfg + ["x" * 300], "files": {}},
        {"name": "path-yaml-cfg-not-utf8", "argv": yaml_cfg + ["\udcff.yaml"], "files": {}},
        {"name": "path-check-long", "argv": ["check", "x" * 5000], "files": {}},
        # a script sourcing itself re-parsed its 300 KB on each of 16 levels (19 s)
        {"name": "shell-self-source", "argv": ["check", "train.sh"],
         "files": {"train.sh": "#!/bin/bash\n. ./train.sh\n" + big}},
        # OmegaConf's errors while building or merging a tree, and defaults fanned out 8^4 ways
        {"name": "tree-bridge-bad-interpolation", "argv": ["check", "c.yaml"],
         "files": {"c.yaml": bridge + "  kv_channels: " + "${" * 500 + "x" + "}" * 500 + "\n"}},
        {"name": "tree-nemorl-defaults-interpolation", "argv": ["check", "c.yaml"],
         "files": {"c.yaml": "defaults: ${a}\n" + nemo}},
        {"name": "tree-nemorl-defaults-fan", "argv": ["check", "c.yaml"],
         "files": {**fan, "b4.yaml": nemo, "c.yaml": "defaults: b0.yaml\n" + nemo}},
        # 10,000 bad lines each a problem: the collector was quadratic (11 s)
        {"name": "log-many-problems", "argv": ["compare", "train.log"], "files": {"train.log": log}},
    ]


def seeds() -> list[dict]:
    return (_yaml_cases() + _hf_cases() + _shell_cases() + _log_cases() + _planner_cases() + _settings_cases()
            + _campaign_cases())


def mutations(count: int, rng: random.Random) -> list[dict]:
    """Random Megatron command lines: flags with hostile values, in any order."""
    cases = []
    for n in range(count):
        argv = ["estimate", *EST, "--"]
        for _ in range(rng.randint(1, 6)):
            argv += [rng.choice(FLAGS), rng.choice(NASTY_VALUES + [str(rng.randint(-3, 1 << 40))])]
        cases.append({"name": f"flags-{n}", "argv": argv, "files": {}})
    return cases


class _Hung(BaseException):
    """Raised by the alarm in a case that runs too long (BaseException: no handler swallows it)."""


def campaign(count: int, seed: int = 30, hang_after: int = 30) -> int:
    """Run ``count`` cases of tests/fuzz/surfaces.py in this process; print the failures, the
    count per surface and the slowest cases; exit 1 when any case failed."""
    import signal
    import tempfile
    from collections import Counter

    sys.path.insert(0, str(HERE))
    sys.path.insert(0, str(HERE.parent.parent))
    import surfaces

    def alarm(_signum, _frame):
        raise _Hung()

    signal.signal(signal.SIGALRM, alarm)
    tried, failed, slow = Counter(), [], []
    for case in surfaces.cases(count, seed):
        surface = case["name"].split("-")[0]
        tried[surface] += 1
        with tempfile.TemporaryDirectory() as folder:
            signal.alarm(hang_after)
            try:
                problem, seconds = surfaces.run_case(case, Path(folder))
            except _Hung:
                problem, seconds = f"hung over {hang_after} s", float(hang_after)
            finally:
                signal.alarm(0)
        slow.append((seconds, case["name"]))
        if problem:
            failed.append((case["name"], problem))
            print(f"FAIL {case['name']}: {problem}", file=sys.stderr, flush=True)
    print(json.dumps({"seed": seed, "tried": dict(tried), "total": sum(tried.values()), "failed": len(failed),
                      "slowest": sorted(slow, reverse=True)[:5]}, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "--campaign":
        sys.exit(campaign(int(sys.argv[2]), int(sys.argv[4]) if sys.argv[3:4] == ["--seed"] else 30))
    if len(sys.argv) == 3 and sys.argv[1] == "--count":
        json.dump(mutations(int(sys.argv[2]), random.Random(30)), sys.stdout)
    else:
        json.dump(seeds(), sys.stdout)
