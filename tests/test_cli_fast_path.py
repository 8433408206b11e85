"""cli._fast_namespace reads plain estimate / run / check command lines without argparse
(issue 14: start-up); wherever it answers, argparse (build_parser, the reference) gives the same
namespace, and wherever argparse would refuse the command line, the fast path declines so that
argparse's own message is printed."""

from __future__ import annotations

import argparse
import random

import pytest

from megatron_estimator import cli


def parsed(argv):
    """argparse's namespace as a dict, or None when it refuses (exits)."""
    try:
        ns = cli.build_parser().parse_args(argv)
    except SystemExit:
        return None
    return dict(vars(ns))


def normalised(values: dict) -> dict:
    # Releases of argparse differ in whether a REMAINDER keeps its leading "--"; the commands
    # strip it (cli._strip_separator), so the comparison does too.
    values = dict(values)
    for dest in ("megatron_args", "launch"):
        if dest in values and values[dest][:1] == ["--"]:
            values[dest] = values[dest][1:]
    return values


def test_tables_are_build_parsers_options():
    parser = cli.build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for command, (options, extra_defaults, positional, remainder) in cli._FAST_COMMANDS.items():
        sub = subparsers.choices[command]
        seen = {}
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            if not action.option_strings:
                assert action.dest == positional
                assert action.nargs == (argparse.REMAINDER if remainder else "+")
                continue
            assert len(action.option_strings) == 1, action.option_strings
            kind = {argparse._StoreAction: "int" if action.type is int else "value",
                    argparse._StoreTrueAction: "flag", argparse._AppendAction: "append"}[type(action)]
            if kind == "value":
                assert action.type is None
            choices = tuple(action.choices) if action.choices is not None else None
            seen[action.option_strings[0]] = (action.dest, kind, choices)
            assert action.default == extra_defaults.get(action.dest), action.dest
        assert seen == options, command


PLAIN = [
    ["estimate", "--world-size", "64", "--budget", "80GiB", "--", "--num-layers", "80", "--bf16"],
    ["estimate", "--", "--num-layers", "2"],
    ["estimate"],
    ["estimate", "--model", "llama3-8b", "--world-size", "8"],
    ["estimate", "--hf-config", '{"model_type": "llama", "hidden_size": 64}', "--", "--seq-length", "8"],
    ["estimate", "--hf-config=deepseek-ai/DeepSeek-V3@main", "--world-size", "8", "--"],
    ["estimate", "--format=json", "--gpu", "h100", "--world-size=8", "--", "--seq-length", "4096"],
    ["estimate", "--budget", "1GiB", "--budget", "2GiB", "--"],
    ["estimate", "--world-size", " 8 ", "--"],
    ["estimate", "--budget", "", "--"],
    ["estimate", "--budget=", "--"],
    ["estimate", "--budget=-1", "--", "-5"],
    ["run", "--budget", "1GiB", "--", "torchrun", "--nproc-per-node", "8", "pretrain_gpt.py", "--num-layers", "2"],
    ["run", "--warn-only", "--accept-flags=--x,--y", "--accept-flags", "z", "--", "python", "train.py"],
    ["run", "--"],
    ["check", "examples/llama3-8b.yaml"],
    ["check", "--budget", "80GiB", "--skip-unknown", "a.yaml", "b.sh"],
    ["check", "--script-arg", "1", "--script-arg=2", "--resume", "no", "launch.sh"],
    ["check", "--format", "markdown", "--megatron-version", "0.16", "x.yaml"],
]

DECLINED = [
    ["estimate", "--help"], ["estimate", "-h"], ["--version"], ["plan", "--world-size", "8"], [],
    ["estimate", "--world", "8", "--"],                      # abbreviation: argparse refuses it
    ["estimate", "--world-size", "eight", "--"],
    ["estimate", "--world-size", "-8", "--"],
    ["estimate", "--format", "yaml", "--"],
    ["estimate", "--model", "a", "--hf-config", "b", "--"],
    ["estimate", "--budget"],
    ["estimate", "--budget=--", "--"],
    ["estimate", "--num-layers", "2"],
    ["estimate", "flags", "--", "--num-layers"],
    ["estimate", "--", "--", "--num-layers"],
    ["run", "torchrun", "train.py"],
    ["run", "--warn-only=yes", "--"],
    ["check"],
    ["check", "a.yaml", "--budget", "1GiB"],
    ["check", "-x.yaml"],
    ["check", "--skip-unknown=1", "a.yaml"],
]


@pytest.mark.parametrize("argv", PLAIN, ids=" ".join)
def test_plain_command_lines_read_as_argparse_does(argv):
    fast = cli._fast_namespace(argv)
    assert fast is not None
    reference = parsed(argv)
    assert reference is not None
    assert normalised(vars(fast)) == normalised(reference)


@pytest.mark.parametrize("argv", DECLINED, ids=lambda a: " ".join(a) or "(empty)")
def test_other_command_lines_go_to_argparse(argv):
    assert cli._fast_namespace(argv) is None


TOKENS = ["--budget", "--budget=80GiB", "80GiB", "--world-size", "8", "-8", "x", "--world-size=8", "--format",
          "json", "yaml", "--model", "--hf-config", "cfg.json", "--", "--num-layers", "-", "", "--warn-only",
          "--skip-unknown", "--accept-flags", "--accept-flags=--a", "--script-arg", "a.yaml", "--resume", "auto",
          "--resume=maybe", "-h", "--wor", "--gpu", "h100", "--flash-attn=none", "--megatron-version", "0.16"]


def test_random_command_lines(capsys):
    # Whatever the fast path answers for a random command line, argparse answers the same;
    # where argparse refuses one, the fast path has declined it.
    rng = random.Random(14)
    answered = 0
    for _ in range(500):
        command = rng.choice(["estimate", "run", "check"])
        argv = [command] + [rng.choice(TOKENS) for _ in range(rng.randint(0, 7))]
        fast = cli._fast_namespace(argv)
        reference = parsed(argv)
        if fast is None:
            continue
        answered += 1
        assert reference is not None, argv
        assert normalised(vars(fast)) == normalised(reference), argv
    capsys.readouterr()
    assert answered > 30
