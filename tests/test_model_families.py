"""Model families: told from the entry script and the flags, shown in the report, and an
honest refusal (``unsupported-model``) for the families the estimator does not model; the flags
a custom entry script adds through ``extra_args_provider``, read from its source with ``ast``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import REPO, TINY_GPT, TREE_ENV, flags, megatron_tree

from megatron_estimator import api
from megatron_estimator.report.text import render_text, verdict_to_json

CLI = [sys.executable, "-m", "megatron_estimator"]
# A hybrid model needs its layer pattern (config/hybrid.py); Mamba heads 2 x 64 / 64 = 2, one group.
HYBRID = "--hybrid-layer-pattern M*M- --mamba-num-groups 1"
MLM_EXAMPLES = megatron_tree("examples")


def cli(args, env=None, cwd=None):
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MEGATRON_ESTIMATOR_") and k != "WORLD_SIZE"}
    environ["PYTHONPATH"] = str(REPO)
    environ.update(env or {})
    return subprocess.run(CLI + list(args), capture_output=True, text=True, env=environ, cwd=cwd or REPO, timeout=120)


def launch(argv, cwd, accept=()):
    """``run``'s path through the API: the launch read, then validated and estimated."""
    inp, problems, command = api.input_from_launch(argv, environ={"PWD": str(cwd)}, accept_flags=accept)
    return api.evaluate(inp, problems=problems, environ={})


def codes(verdict):
    return [p.code for p in verdict.problems]


# -- the family of each entry point --------------------------------------------------------

@pytest.mark.parametrize("script, family", [
    ("pretrain_gpt.py", "gpt"),
    ("/opt/megatron-lm/pretrain_gpt.py", "gpt"),
    ("pretrain_hybrid.py", "hybrid"),
    ("pretrain_mamba.py", "hybrid"),
    ("megatron/elastification/pretrain_hybrid_flex.py", "hybrid"),
    ("pretrain_bert.py", "bert"),
    ("examples/bert/pretrain_bert.py", "bert"),
    ("pretrain_t5.py", "t5"),
    ("examples/t5/pretrain_t5.py", "t5"),
    ("pretrain_vlm.py", "multimodal"),
    ("examples/multimodal/train.py", "multimodal"),
    ("pretrain_vision_classify.py", "vision"),
    ("pretrain_vision_dino.py", "vision"),
    ("pretrain_vision_inpaint.py", "vision"),
    ("examples/mimo/train.py", "mimo"),
    ("examples/mimo/pretrain_mimo.py", "mimo"),
    ("pretrain_retro.py", "retro"),
    ("pretrain_ict.py", "ict"),
])
def test_the_family_comes_from_the_entry_script(tmp_path, script, family):
    extra = HYBRID if family == "hybrid" else ""
    verdict = launch(["torchrun", "--nproc-per-node", "1", script] + flags(TINY_GPT, extra), tmp_path)
    assert verdict_to_json(verdict)["model"] == {
        "family": family, "family_source": verdict.family.source, "entry_script": script}
    if family in ("gpt", "hybrid"):
        assert verdict.estimate is not None, verdict.problems
        assert verdict.estimate is not None and "unsupported-model" not in codes(verdict)
    else:
        # Never a GPT estimate for a non-GPT model: one problem, the refusal.
        assert verdict.estimate is None
        assert codes(verdict) == ["unsupported-model"]
        assert verdict.problems[0].location == script


def test_a_module_entry_point_is_matched_by_its_path(tmp_path):
    verdict = launch(["torchrun", "--nproc-per-node", "1", "-m", "examples.mimo.train"] + flags(TINY_GPT), tmp_path)
    assert verdict.family.name == "mimo"
    assert codes(verdict) == ["unsupported-model"]


@pytest.mark.parametrize("extra, family, source", [
    ("", "gpt", "no entry script named: Megatron's flags describe a GPT decoder"),
    ("--hybrid-override-pattern M*M*", "hybrid", "--hybrid-override-pattern"),
    ("--hybrid-layer-pattern M*M*", "hybrid", "--hybrid-layer-pattern"),
])
def test_without_an_entry_script_the_flags_say(extra, family, source):
    inp, problems = api.input_from_flags(flags(TINY_GPT, extra))
    verdict = api.evaluate(inp, problems=problems, environ={})
    assert (verdict.family.name, verdict.family.source, verdict.family.entry_script) == (family, source, None)


def test_a_hybrid_pattern_makes_a_hybrid_model_of_a_gpt_capable_script_but_not_of_pretrain_gpt(tmp_path):
    pattern = flags(TINY_GPT, "--hybrid-override-pattern M*M*")
    assert launch(["torchrun", "--nproc-per-node", "1", "train_rl.py"] + pattern, tmp_path).family.name == "hybrid"
    assert launch(["torchrun", "--nproc-per-node", "1", "my_train.py"] + pattern, tmp_path).family.name == "hybrid"
    assert launch(["torchrun", "--nproc-per-node", "1", "pretrain_gpt.py"] + pattern, tmp_path).family.name == "gpt"


def test_the_family_is_in_the_text_report_and_the_typed_config(tmp_path):
    verdict = launch(["torchrun", "--nproc-per-node", "1", "pretrain_gpt.py"] + flags(TINY_GPT), tmp_path)
    text = render_text([verdict])
    assert "  model family: gpt (the entry script pretrain_gpt.py, which builds a GPT decoder)\n" in text
    from megatron_estimator.report.text import render_markdown

    assert "Model family: gpt (the entry script pretrain_gpt.py, which builds a GPT decoder)." in render_markdown([verdict])
    from megatron_estimator.config.resolve import resolve_config
    from megatron_estimator.inputs.entry_script import model_family

    inp, _ = api.input_from_flags(flags(TINY_GPT, "--hybrid-override-pattern M*M* --mamba-num-groups 1"))
    config = resolve_config(inp.raw, world_size=1, environ={}, family=model_family(inp.raw))
    assert config.model.family == "hybrid"
    assert resolve_config(inp.raw, world_size=1, environ={}).model.family == "gpt"


# -- custom entry scripts: the family from their imports -----------------------------------

@pytest.mark.parametrize("imports, family", [
    ("from megatron.core.models.bert.bert_model import BertModel", "bert"),
    ("from megatron.core.models.T5 import T5Model", "t5"),
    ("from megatron.core.models.multimodal.llava_model import LLaVAModel\n"
     "from megatron.core.models.gpt import GPTModel", "multimodal"),
    ("import megatron.core.models.mimo", "mimo"),
    ("from megatron.core.models.gpt import GPTModel", "gpt"),
    ("from megatron.core.models.mamba import MambaModel", "hybrid"),
    ("import os", "gpt"),
])
def test_a_readable_custom_script_says_its_family_by_the_model_it_imports(tmp_path, imports, family):
    (tmp_path / "train_mine.py").write_text(imports + "\n")
    extra = HYBRID if family == "hybrid" else ""
    verdict = launch(["torchrun", "--nproc-per-node", "1", "train_mine.py"] + flags(TINY_GPT, extra), tmp_path)
    assert verdict.family.name == family
    if family in ("gpt", "hybrid"):
        assert verdict.estimate is not None, verdict.problems
    else:
        assert codes(verdict) == ["unsupported-model"]
        assert "imports megatron.core.models." in verdict.problems[0].message


# -- refusals of Megatron-LM's own launches ------------------------------------------------

BERT_LAUNCH = """\
#!/bin/bash
# BERT-Large on one node (the flags of Megatron-LM's examples/bert/train_bert_340m_distributed.sh)
ARGS=(
    --num-layers 24 --hidden-size 1024 --num-attention-heads 16 --seq-length 512
    --max-position-embeddings 512 --attention-backend auto
    --micro-batch-size 4 --global-batch-size 32 --train-iters 1000000 --fp16 --lr 0.0001
    --tensor-model-parallel-size 8 --pipeline-model-parallel-size 16
    --data-path /data/bert_text_document --vocab-file /data/bert-vocab.txt --split 949,50,1
)
torchrun --nproc_per_node 8 --nnodes 1 pretrain_bert.py "${ARGS[@]}"
"""

T5_LAUNCH = """\
#!/bin/bash
# T5-220M (the flags of Megatron-LM's examples/t5/train_t5_220m_distributed.sh)
T5_ARGS="--encoder-num-layers 12 --decoder-num-layers 12 --hidden-size 768 --num-attention-heads 12
    --kv-channels 64 --ffn-hidden-size 3072 --encoder-seq-length 512 --decoder-seq-length 128
    --max-position-embeddings 512 --micro-batch-size 64 --global-batch-size 512 --bf16
    --vocab-extra-ids 100 --tokenizer-type BertWordPieceCase --vocab-file /data/vocab.txt"
torchrun --nproc_per_node 8 pretrain_t5.py $T5_ARGS --distributed-backend nccl
"""

# examples/multimodal/train.py's launch (pretrain_mistral_clip.sh): Megatron flags and the
# script's own (--freeze-LM, --language-model-type, ... from multimodal_args.py).
MULTIMODAL_FLAGS = (
    "--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --seq-length 576 --decoder-seq-length 1024 "
    "--max-position-embeddings 4096 --ffn-hidden-size 14336 --micro-batch-size 1 --global-batch-size 256 "
    "--tokenizer-type MultimodalTokenizer --tokenizer-model mistralai/Mistral-7B-Instruct-v0.3 "
    "--tokenizer-prompt-format mistral --prompt-path manual_prompts.json --bf16 --freeze-LM --freeze-ViT "
    "--patch-dim 14 --img-h 336 --img-w 336 --language-model-type=mistral_7b --disable-vision-class-token "
    "--tensor-model-parallel-size 4"
)
MIMO_FLAGS = (
    "--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --max-position-embeddings 4096 "
    "--encoder-seq-length 4096 --position-embedding-type rope --micro-batch-size 1 --global-batch-size 8 "
    "--tokenizer-type HuggingFaceTokenizer --tokenizer-model llava-hf/llava-1.5-7b-hf "
    "--dataloader-type external --dataset-provider llava_vlm --model-provider llava_vlm --total-seq-length 2048"
)


@pytest.mark.parametrize("name, text, family, needs", [
    ("bert.sh", BERT_LAUNCH, "bert", "a binary (sentence-order) head, a pooler"),
    ("t5.sh", T5_LAUNCH, "t5", "cross-attention over the encoder output"),
])
def test_bert_and_t5_launch_scripts_are_refused_as_such(tmp_path, name, text, family, needs):
    script = tmp_path / name
    script.write_text(text)
    result = cli(["check", "--format", "json", str(script)], cwd=tmp_path)
    assert result.returncode == 2, result.stdout
    doc = json.loads(result.stdout)
    from test_cli import validate_report

    validate_report(doc)
    assert doc["model"]["family"] == family
    assert [p["code"] for p in doc["problems"]] == ["unsupported-model"]
    message = doc["problems"][0]["message"]
    assert needs in message
    assert "the estimator models GPT decoders (pretrain_gpt.py) and hybrid Mamba models" in message
    assert doc["problems"][0]["location"] == f"{script}:{text.count(chr(10))}"   # the launch's line


@pytest.mark.skipif(MLM_EXAMPLES is None, reason=f"set {TREE_ENV} to a Megatron-LM checkout (its examples/ are not ours to commit)")
@pytest.mark.parametrize("name, family", [("examples/bert/train_bert_340m_distributed.sh", "bert"),
                                          ("examples/t5/train_t5_220m_distributed.sh", "t5")])
def test_megatron_lms_own_bert_and_t5_examples(name, family):
    result = cli(["check", "--format", "json"] + [f"--script-arg=/x{i}" for i in range(4)] + [str(MLM_EXAMPLES / name)])
    assert result.returncode == 2
    doc = json.loads(result.stdout)
    assert doc["model"]["family"] == family
    assert [p["code"] for p in doc["problems"]] == ["unsupported-model"]


@pytest.mark.skipif(MLM_EXAMPLES is None, reason=f"set {TREE_ENV} to a Megatron-LM checkout (its examples/ are not ours to commit)")
def test_megatron_lms_own_mamba_example_is_a_hybrid_model():
    result = cli(["check", "--format", "json", "--script-arg=/ckpt", "--script-arg=/tb", "--script-arg=/tok",
                  "--script-arg=/data", str(MLM_EXAMPLES / "examples/mamba/train.sh")])
    doc = json.loads(result.stdout)
    assert doc["model"]["family"] == "hybrid"
    assert doc["model"]["entry_script"].endswith("pretrain_hybrid.py") or doc["model"]["entry_script"].endswith(
        "pretrain_mamba.py")
    assert "unsupported-model" not in [p["code"] for p in doc["problems"]]


@pytest.mark.parametrize("script, text, family, own", [
    ("examples/multimodal/train.py", MULTIMODAL_FLAGS, "multimodal",
     "--tokenizer-prompt-format, --prompt-path, --freeze-LM, --freeze-ViT, --language-model-type, "
     "--disable-vision-class-token"),
    ("examples/mimo/train.py", MIMO_FLAGS, "mimo", "--dataset-provider, --model-provider, --total-seq-length"),
])
def test_multimodal_and_mimo_launches_get_one_refusal_not_a_wall_of_unknown_flags(tmp_path, script, text, family, own):
    verdict = launch(["torchrun", "--nproc-per-node", "8", script] + flags(text), tmp_path)
    assert verdict.family.name == family
    assert codes(verdict) == ["unsupported-model"]
    message = verdict.problems[0].message
    assert f"flags unknown to Megatron ({own}) are presumably {script}'s own" in message
    assert "did you mean" not in message


def test_a_refused_family_still_lists_real_errors_of_megatrons_own_flags(tmp_path):
    verdict = launch(["torchrun", "--nproc-per-node", "8", "pretrain_bert.py"]
                     + flags(TINY_GPT, "--num-layers abc --bf17"), tmp_path)
    assert codes(verdict) == ["unsupported-model", "invalid-value", "unknown-flag"]
    assert verdict.problems[1].location == "--num-layers"
    assert "did you mean --bf16" in verdict.problems[2].message


def test_run_warn_only_still_launches_a_refused_family(tmp_path):
    out = tmp_path / "dump.json"
    script = tmp_path / "pretrain_bert.py"
    script.write_text("import json, os, sys\njson.dump({'argv': sys.argv}, open(os.environ['DUMP_TO'], 'w'))\n")
    command = [sys.executable, str(script)] + flags(TINY_GPT, "--bert-no-binary-head")
    refused = cli(["run", "--budget", "80GiB", "--"] + command, env={"DUMP_TO": str(out)})
    assert refused.returncode == 2
    assert "[unsupported-model]" in refused.stderr
    assert not out.exists()
    result = cli(["run", "--budget", "80GiB", "--warn-only", "--"] + command, env={"DUMP_TO": str(out)})
    assert result.returncode == 0, result.stderr
    assert "[unsupported-model]" in result.stderr
    assert "--warn-only: launching anyway" in result.stderr
    assert json.loads(out.read_text())["argv"] == [str(script)] + command[2:]


# -- a custom entry script's own flags -------------------------------------------------------

CUSTOM_SCRIPT = '''\
import argparse

from megatron.training import pretrain
from my_args import add_vision_args


def add_my_args(parser):
    group = parser.add_argument_group(title="my model")
    group.add_argument("--model-provider", type=str, default="mock", choices=["mock", "llava_vlm"])
    group.add_argument("--image-size", type=int, default=224)
    group.add_argument("--freeze-lm", action="store_true")
    group.add_argument("--crop", type=int, nargs=2, default=[224, 224])
    group.add_argument("--use-packing", action=argparse.BooleanOptionalAction, default=False)
    parser = add_vision_args(parser)
    return parser


if __name__ == "__main__":
    pretrain(None, None, None, None, extra_args_provider=add_my_args if True else None)
'''

MY_ARGS = '''\
def add_vision_args(parser):
    vision = parser.add_argument_group("vision")
    vision.add_argument("--vision-layers", "--vit-layers", dest="vision_layers", type=int)
    return parser
'''


@pytest.fixture
def custom_script(tmp_path):
    (tmp_path / "train_custom.py").write_text(CUSTOM_SCRIPT)
    (tmp_path / "my_args.py").write_text(MY_ARGS)
    return tmp_path


OWN_FLAGS = ("--model-provider llava_vlm --image-size 336 --freeze-lm --crop 336 336 --no-use-packing "
             "--vit-layers 24")


def test_read_script_flags_follows_the_provider_and_its_groups(custom_script):
    from megatron_estimator.inputs.script_flags import read_script_flags

    found = read_script_flags(str(custom_script / "train_custom.py"))
    specs = {s.flag: s for s in found.specs}
    assert found.providers == ("add_my_args",)
    assert [Path(f).name for f in found.files] == ["train_custom.py", "my_args.py"]
    assert list(specs) == ["--model-provider", "--image-size", "--freeze-lm", "--crop", "--use-packing",
                           "--vision-layers"]
    assert (specs["--model-provider"].type, specs["--model-provider"].choices) == ("str", ("mock", "llava_vlm"))
    assert (specs["--crop"].type, specs["--crop"].nargs, specs["--crop"].default) == ("int", 2, [224, 224])
    assert specs["--freeze-lm"].action == "store_true"
    assert specs["--use-packing"].aliases == ("--no-use-packing",)
    assert (specs["--vision-layers"].aliases, specs["--vision-layers"].dest) == (("--vit-layers",), "vision_layers")


def test_a_readable_custom_scripts_flags_are_accepted_with_their_arity(custom_script):
    verdict = launch(["torchrun", "--nproc-per-node", "1", "train_custom.py"] + flags(TINY_GPT, OWN_FLAGS),
                     custom_script)
    assert verdict.problems == ()
    assert verdict.family.name == "gpt"
    assert verdict.estimate is not None
    # --crop takes exactly two values: a third is a stray argument, as argparse says.
    verdict = launch(["torchrun", "--nproc-per-node", "1", "train_custom.py"]
                     + flags(TINY_GPT, "--crop 336 336 337"), custom_script)
    assert [(p.code, p.location) for p in verdict.problems] == [("unexpected-argument", "--crop")]


def test_typos_in_a_custom_scripts_flags_are_caught_with_a_suggestion(custom_script):
    verdict = launch(["torchrun", "--nproc-per-node", "1", "train_custom.py"]
                     + flags(TINY_GPT, "--image-sise 336 --model-provider llava --freeze-lm=1 --vit-layers x"),
                     custom_script)
    assert [(p.code, p.location, p.message) for p in verdict.problems] == [
        ("unknown-flag", "--image-sise", "unknown flag; did you mean --image-size?"),
        ("invalid-choice", "--model-provider",
         "invalid choice 'llava'; choose from mock, llava_vlm (did you mean llava_vlm?)"),
        ("ignored-explicit-value", "--freeze-lm",
         "this flag takes no value; Megatron rejects '=1' (write --freeze-lm alone)"),
        ("invalid-value", "--vit-layers", "invalid value 'x': expected an integer"),
    ]


def test_an_unreadable_entry_scripts_unknown_flags_are_one_grouped_problem(tmp_path):
    verdict = launch(["torchrun", "--nproc-per-node", "1", "train_missing.py"]
                     + flags(TINY_GPT, "--model-provider llava_vlm --image-size 336 --num-layer 3 --freeze-lm"),
                     tmp_path)
    assert [(p.code, p.location) for p in verdict.problems] == [("unknown-flag", "--model-provider")]
    assert verdict.problems[0].message == (
        "4 flags unknown to Megatron: --model-provider, --image-size, --num-layer (did you mean --num-layers?), "
        f"--freeze-lm; they may belong to the entry script train_missing.py, which could not be read (no such file "
        f"under {os.getcwd()}, {tmp_path}); to accept such flags, set accept-flags (--accept-flags=--a,--b, "
        "MEGATRON_ESTIMATOR_ACCEPT_FLAGS, or accept-flags = [\"--a\", \"--b\"] in [tool.megatron-estimator])")


def test_the_accept_flags_setting_accepts_an_unreadable_scripts_flags(tmp_path):
    argv = ["torchrun", "--nproc-per-node", "1", "train_missing.py"] + flags(
        TINY_GPT, "--model-provider llava_vlm --image-size 336 --freeze-lm --micro-batch-size 1")
    verdict = launch(argv, tmp_path, accept=("--model-provider", "--image-size", "--freeze-lm"))
    assert verdict.problems == ()
    assert verdict.estimate.model.micro_batch_size == 1       # the values after them are theirs, not orphans
    # From the command line and the environment:
    for args, env in ((["--accept-flags=--model-provider,--image-size", "--accept-flags=--freeze-lm"], {}),
                      ([], {"MEGATRON_ESTIMATOR_ACCEPT_FLAGS": "--model-provider --image-size,--freeze-lm"})):
        script = tmp_path / "launch.sh"
        script.write_text("torchrun --nproc-per-node 1 train_missing.py " + " ".join(argv[4:]) + "\n")
        result = cli(["check", *args, str(script)], env=env, cwd=tmp_path)
        assert result.returncode == 0, result.stdout
        assert "model family: gpt (a custom entry script (train_missing.py)" in result.stdout


def test_a_verdict_on_settings_alone_has_no_model(tmp_path):
    result = cli(["check", "--format", "json", "--budget", "eighty", str(tmp_path / "absent.yaml")], cwd=tmp_path)
    doc = json.loads(result.stdout)
    from test_cli import validate_report

    validate_report(doc)
    assert [r["model"] for r in doc["results"]] == [None, None]


def test_the_accept_flags_setting_is_checked():
    from megatron_estimator.settings import load_settings

    settings, problems = load_settings({"accept-flags": ["--a,--b", "--a"]}, environ={})
    assert settings.accept_flags == ("--a", "--b") and problems == ()
    _, problems = load_settings({}, environ={"MEGATRON_ESTIMATOR_ACCEPT_FLAGS": "--a=1"})
    assert [(p.code, p.location) for p in problems] == [("invalid-setting", "MEGATRON_ESTIMATOR_ACCEPT_FLAGS")]


def test_megatrons_own_gpt_script_keeps_per_flag_errors(tmp_path):
    for text in (None, "this is not python(\n"):
        if text is not None:
            (tmp_path / "pretrain_gpt.py").write_text(text)
        verdict = launch(["torchrun", "--nproc-per-node", "1", "pretrain_gpt.py"]
                         + flags(TINY_GPT, "--num-layer 3 --hiden-size 8"), tmp_path)
        assert [(p.code, p.location) for p in verdict.problems] == [("unknown-flag", "--num-layer"),
                                                                     ("unknown-flag", "--hiden-size")]
        assert "did you mean --num-layers" in verdict.problems[0].message
    # A modified copy that adds a flag through a provider not on this machine: its own flag is
    # accepted, the rest are still errors of their own (pretrain_gpt.py adds no others).
    (tmp_path / "pretrain_gpt.py").write_text(textwrap.dedent('''\
        from megatron.post_training.arguments import add_modelopt_args

        def add_mine(parser):
            parser.add_argument("--my-flag", type=int)
            return add_modelopt_args(parser)

        parse_and_validate_args(extra_args_provider=add_mine)
    '''))
    verdict = launch(["torchrun", "--nproc-per-node", "1", "pretrain_gpt.py"]
                     + flags(TINY_GPT, "--my-flag 3 --hiden-size 8"), tmp_path)
    assert [(p.code, p.location) for p in verdict.problems] == [("unknown-flag", "--hiden-size")]
    assert verdict.family.name == "gpt"


def test_a_custom_script_that_is_not_python_is_unreadable(tmp_path):
    (tmp_path / "train_broken.py").write_text("def f(:\n")
    verdict = launch(["torchrun", "--nproc-per-node", "1", "train_broken.py"] + flags(TINY_GPT, "--foo 1"), tmp_path)
    assert codes(verdict) == ["unknown-flag"]
    assert "could not be read (not valid Python (line 1))" in verdict.problems[0].message


def test_a_launch_scripts_entry_script_is_found_beside_it(custom_script, tmp_path_factory):
    launch_file = custom_script / "launch.sh"
    launch_file.write_text("torchrun --nproc-per-node 1 train_custom.py " + TINY_GPT + " " + OWN_FLAGS + "\n")
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    result = cli(["check", "--format", "json", str(launch_file)], cwd=elsewhere)
    assert result.returncode == 0, result.stdout
    doc = json.loads(result.stdout)
    from test_cli import validate_report

    validate_report(doc)
    assert doc["model"] == {"family": "gpt", "entry_script": "train_custom.py",
                            "family_source": "a custom entry script (train_custom.py); taken as building a GPT decoder"}


def test_the_script_reader_is_imported_only_when_a_custom_script_is_read(custom_script):
    code = textwrap.dedent(f"""
        import sys
        from megatron_estimator import api
        argv = ["torchrun", "--nproc-per-node", "1", "pretrain_gpt.py"] + {flags(TINY_GPT)!r}
        inp, problems, _ = api.input_from_launch(argv, environ={{"PWD": {str(custom_script)!r}}})
        api.evaluate(inp, problems=problems, environ={{}})
        before = "megatron_estimator.inputs.script_flags" in sys.modules
        argv[3] = "train_custom.py"
        inp, problems, _ = api.input_from_launch(argv, environ={{"PWD": {str(custom_script)!r}}})
        print(before, "megatron_estimator.inputs.script_flags" in sys.modules)
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert result.stdout.split() == ["False", "True"], result.stderr


def test_a_script_read_only_in_part_groups_the_flags_left_unknown(tmp_path):
    (tmp_path / "train_part.py").write_text(textwrap.dedent('''\
        from megatron.training import pretrain
        from megatron_extras.args import add_extra_args

        def add_my_args(parser):
            parser.add_argument("--image-size", type=int)
            parser = add_extra_args(parser)
            return parser

        pretrain(None, None, None, None, extra_args_provider=add_my_args)
    '''))
    verdict = launch(["torchrun", "--nproc-per-node", "1", "train_part.py"]
                     + flags(TINY_GPT, "--image-size 336 --image-sise 2 --extra-thing 1"), tmp_path)
    assert [(p.code, p.location) for p in verdict.problems] == [("unknown-flag", "--image-sise")]
    assert verdict.problems[0].message.startswith(
        "2 flags unknown to Megatron: --image-sise (did you mean --image-size?), --extra-thing; they may belong to "
        "the entry script train_part.py, which could not be read (only in part: add_my_args hands the parser to "
        "add_extra_args, whose source was not found); ")
    # A provider that is not a function the reader can find:
    (tmp_path / "train_var.py").write_text("provider = make()\npretrain(extra_args_provider=provider)\n")
    verdict = launch(["torchrun", "--nproc-per-node", "1", "train_var.py"] + flags(TINY_GPT, "--extra-thing 1"),
                     tmp_path)
    assert "(only in part: its extra_args_provider provider was not found)" in verdict.problems[0].message


def test_megatron_lms_own_scripts_that_add_flags_are_read(tmp_path):
    """pretrain_vlm.py's add_vlm_extra_args and examples/multimodal/train.py's provider imported from
    multimodal_args.py beside it, as Megatron-LM writes them (main d98e8a64), in scripts of our own."""
    (tmp_path / "pretrain_vlm.py").write_text(textwrap.dedent('''\
        def add_vlm_extra_args(parser):
            group = parser.add_argument_group(title='vision language model specific arguments')
            group.add_argument('--freeze-LM', action='store_true', default=False)
            group.add_argument('--dataloader-seq-length', type=int, default=None)
            return parser

        if __name__ == "__main__":
            args = parse_and_validate_args(extra_args_provider=add_vlm_extra_args,
                                           args_defaults={'tokenizer_type': 'GPT2BPETokenizer'})
    '''))
    multimodal = tmp_path / "examples" / "multimodal"
    multimodal.mkdir(parents=True)
    (multimodal / "train.py").write_text("from multimodal_args import add_multimodal_extra_args\n"
                                         "args = parse_and_validate_args(extra_args_provider=add_multimodal_extra_args)\n")
    (multimodal / "multimodal_args.py").write_text(textwrap.dedent('''\
        def add_multimodal_extra_args(parser):
            group = parser.add_argument_group(title='multimodal arguments')
            group.add_argument('--language-model-type', type=str, required=True)
            group.add_argument("--use-tiling", action="store_true", default=False)
            return parser
    '''))
    vlm = launch(["torchrun", "--nproc-per-node", "1", "pretrain_vlm.py"]
                 + flags(TINY_GPT, "--freeze-LM --dataloader-seq-length 64 --freez-LM"), tmp_path)
    assert [(p.code, p.location, p.message) for p in vlm.problems] == [
        ("unsupported-model", "pretrain_vlm.py", vlm.problems[0].message),
        ("unknown-flag", "--freez-LM", "unknown flag; did you mean --freeze-LM?")]
    llava = launch(["torchrun", "--nproc-per-node", "1", "examples/multimodal/train.py"]
                   + flags(TINY_GPT, "--language-model-type=mistral_7b --use-tiling"), tmp_path)
    assert codes(llava) == ["unsupported-model"]
    assert "presumably" not in llava.problems[0].message


def test_plan_refuses_a_family_it_does_not_model(tmp_path):
    script = tmp_path / "bert.sh"
    script.write_text(BERT_LAUNCH)
    with pytest.raises(api.InvalidInput) as refused:
        api.plan(str(script), world_size=8, global_batch_size=32, budget="80GiB", environ={"PWD": str(tmp_path)})
    assert [p.code for p in refused.value.problems] == ["unsupported-model"]


def test_run_execs_a_custom_script_whose_flags_it_read(tmp_path):
    script = tmp_path / "train_dump.py"
    script.write_text(textwrap.dedent('''\
        import json, os, sys

        def add_args(parser):
            group = parser.add_argument_group("mine")
            group.add_argument("--image-size", type=int)
            group.add_argument("--freeze-vit", action="store_true")
            return parser

        if __name__ == "__main__":
            if False:
                pretrain(extra_args_provider=add_args)
            json.dump({"argv": sys.argv}, open(os.environ["DUMP_TO"], "w"))
    '''))
    out = tmp_path / "dump.json"
    command = [sys.executable, "train_dump.py"] + flags(TINY_GPT, "--image-size 336 --freeze-vit")
    result = cli(["run", "--budget", "80GiB", "--"] + command, env={"DUMP_TO": str(out)}, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(out.read_text())["argv"] == command[1:]
    typo = cli(["run", "--budget", "80GiB", "--"] + command + ["--freeze-vitt"], env={"DUMP_TO": str(out)},
               cwd=tmp_path)
    assert typo.returncode == 2
    assert "--freeze-vitt: unknown flag; did you mean --freeze-vit? [unknown-flag]" in typo.stderr


def test_a_lambda_provider_and_a_partial_are_followed(tmp_path):
    from megatron_estimator.inputs.script_flags import read_script_flags

    script = tmp_path / "train_lambda.py"
    script.write_text(textwrap.dedent('''\
        import functools

        def add_a(parser, prefix):
            parser.add_argument("--a-" + prefix)
            parser.add_argument("--a-count", action="count")
            return parser

        def add_b(parser):
            parser.add_argument("--b", nargs="+", type=float)
            return parser

        initialize_megatron(extra_args_provider=lambda parser: add_b(parser))
        parse_args(functools.partial(add_a, prefix="x"))
    '''))
    found = read_script_flags(str(script))
    assert [(s.flag, s.action, s.nargs, s.type) for s in found.specs] == [
        ("--b", "store", "+", "float"), ("--a-count", "store_true", None, None)]
    assert found.providers == ("lambda", "add_a")
    assert found.incomplete == "1 add_argument call computes its option strings"
