"""megatron_estimator.inputs.bash: the static shell reader on its own, through its visitor interface.

The expected values follow from bash's rules (bash(1): parameter expansion, word splitting,
arithmetic expansion, the environment of a simple command), worked out by hand for each script.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import os
import textwrap
from pathlib import Path

import pytest

from megatron_estimator.core.problems import ProblemCollector
from megatron_estimator.inputs.bash.commands import CommandVisitor, ExecutedCommand
from megatron_estimator.inputs.bash.reader import ShellReader
from megatron_estimator.inputs.bash.values import Origin

BASH = Path(__file__).resolve().parent.parent / "megatron_estimator" / "inputs" / "bash"


class Recorder(CommandVisitor):
    def __init__(self):
        self.commands: list[ExecutedCommand] = []
        self.notes: list[tuple[str, str]] = []

    def command(self, command: ExecutedCommand) -> None:
        self.commands.append(command)

    def note(self, origin: Origin, message: str) -> None:
        self.notes.append((str(origin), message))


def read(text: str, environ: dict | None = None, positional=None, display: str = "job.sh"):
    recorder = Recorder()
    problems = ProblemCollector()
    reader = ShellReader(display, "/work", recorder, problems)
    completed = reader.run_script(textwrap.dedent(text).lstrip("\n"), environ or {}, positional)
    return recorder, problems.problems, completed, reader


def test_the_bash_package_imports_only_itself_core_and_the_standard_library():
    allowed = ("megatron_estimator.inputs.bash", "megatron_estimator.core")
    modules = sorted(BASH.glob("*.py"))
    assert len(modules) >= 10
    for module in modules:
        tree = ast.parse(module.read_text(), str(module))
        for node in ast.walk(tree):          # deferred (function-level) imports too
            if isinstance(node, ast.ImportFrom):
                assert node.level == 0, f"{module.name}: relative import"
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                if name.startswith("megatron_estimator"):
                    assert name.startswith(allowed), f"{module.name} imports {name}"


def test_the_bash_package_says_nothing_of_launches():
    for module in sorted(BASH.glob("*.py")):
        text = module.read_text().lower()
        for word in ("launch", "torchrun", "srun", "pretrain", "megatron_estimator.inputs.launch", "sbatch"):
            assert word not in text, f"{module.name} mentions {word}"


def test_each_executed_command_is_reported_expanded_and_located():
    recorder, problems, completed, _ = read("""
        #!/bin/bash
        export NODES=2
        GPUS=${GPUS:-8}
        ARGS=(--name "a b")
        greet() { echo hi; }
        greet
        cd /tmp
        FOO=bar tool --n "$NODES" "${ARGS[@]}" x$((GPUS * 2)) $SPLIT
        """, environ={"SPLIT": "p q", "HOME": "/nowhere/u"})
    assert completed and problems == ()
    # greet, echo, cd, export and the assignments are the shell's own: one program runs
    assert len(recorder.commands) == 1
    cmd = recorder.commands[0]
    # "$NODES" -> 2; "${ARGS[@]}" -> two words, "a b" kept whole; $((8 * 2)) -> 16;
    # unquoted $SPLIT from the environment -> split on IFS into two words
    assert cmd.argv == ("tool", "--n", "2", "--name", "a b", "x16", "p", "q")
    assert cmd.resolved is True
    assert str(cmd.origin) == "job.sh:8"
    assert cmd.conditions == ()
    # every character keeps where it was written: the value 2 was typed on line 2, "a b" on line 4
    assert str(cmd.fields[1].segs[0].origins[0]) == "job.sh:8"
    assert str(cmd.fields[2].segs[0].origins[0]) == "job.sh:2"
    assert str(cmd.fields[4].segs[0].origins[0]) == "job.sh:4"
    # text from the environment is placed where it is used, and says which variable it came through
    assert str(cmd.fields[6].segs[0].origins[0]) == "job.sh:8" and cmd.fields[6].segs[0].via == "SPLIT"
    # the command's own environment: what the script exports, then VAR=x before the command
    assert cmd.exported() == (("NODES", "2"), ("FOO", "bar"))
    assert sorted(cmd.assignments) == ["FOO"]
    assert cmd.variables["GPUS"].exported is False
    # cd keeps PWD as the shell does (not a setting the script makes, so not in exported())
    pwd = cmd.variables["PWD"]
    assert "".join(seg.text for seg in pwd.value) == "/tmp" and pwd.origin is None


def test_unknown_values_branches_notes_and_problems_reach_the_caller():
    recorder, problems, completed, reader = read("""
        if [ -f /no/such/file ]; then
          first "$1"
        else
          second
        fi
        $RUNNER job
        eval "$MISSING"
        : "${REQUIRED:?give it}"
        exit 3
        never
        """)
    assert completed
    # [ -f ] cannot be decided statically: both branches run, each under that condition
    assert [c.argv[0] for c in recorder.commands] == ["first", "second", "$RUNNER"]
    first, second, runner = recorder.commands
    assert first.conditions == second.conditions == ("`[ -f /no/such/file ]` at job.sh:1",)
    # $1 with no arguments given: unknown, never guessed
    assert first.fields[1].causes[0].subject == "$1"
    # a program whose name cannot be known is still reported, marked unresolved
    assert runner.resolved is False and str(runner.origin) == "job.sh:6"
    assert recorder.notes == [("job.sh:7", "`eval` at job.sh:7 gets `$MISSING`: MISSING is not set in the "
                                           "script or the environment (bash would expand it to nothing)")]
    assert [(p.code, p.location) for p in problems] == [("unresolved-variable", "job.sh:8 REQUIRED")]
    # bash stops at exit: nothing after it runs
    assert reader.exit_note == "the script exits at job.sh:9"


def test_script_arguments_and_a_sh_c_string():
    recorder, problems, completed, reader = read('tool "$@" "$#"\n', positional=["-x", "y z"])
    assert recorder.commands[0].argv == ("tool", "-x", "y z", "2")
    nested = Recorder()
    origin = Origin("job.sh", 5)
    text = "A=1 inner $1 \"$#\"; exit 0; after"
    found = reader.run_string(text, [origin] * len(text), {"HOME": "/h"}, ["zero", "one"], nested)
    assert found == ()
    # the words after the string are $0 $1 ..., as with sh -c STRING NAME ARG: $1 is "one", $# is 1
    assert [c.argv for c in nested.commands] == [("inner", "one", "1")]
    assert nested.commands[0].exported() == (("A", "1"),)
    assert reader.exit_note is None          # an exit inside the string is not the script's


def test_a_syntax_error_stops_the_read_with_one_located_problem():
    recorder, problems, completed, _ = read("tool\nif true; then\n")
    assert completed is False
    assert len(problems) == 1 and problems[0].code == "shell-syntax-error"
    assert problems[0].location.startswith("job.sh:")


def stdin_text(command: ExecutedCommand) -> str:
    return "".join(seg.text for seg in command.stdin)


def test_a_here_document_reaches_the_caller_as_the_commands_standard_input():
    # bash(1), Here Documents: unquoted delimiter -> parameter, command and arithmetic expansion,
    # a backslash quotes only \ $ ` and newline ("\"" stays two characters); quoted -> as written;
    # <<- removes leading tabs from each line and the delimiter line.
    recorder, problems, completed, _ = read(
        "X=hello\n"
        "tool <<EOF\n"
        "a $X \\$X $((1 + 2)) \\\"q\\\"\n"
        "EOF\n"
        "tool <<'EOF'\n"
        "b $X\n"
        "EOF\n"
        "tool <<\\EOF\n"
        "c $X\n"
        "EOF\n"
        "tool <<-END\n"
        "\t\td $X\n"
        "\tEND\n"
        "plain\n")
    assert completed and problems == ()
    assert [c.argv for c in recorder.commands] == [("tool",)] * 4 + [("plain",)]
    first, quoted, escaped, tabs, plain = recorder.commands
    assert stdin_text(first) == 'a hello $X 3 \\"q\\"\n'
    assert stdin_text(quoted) == "b $X\n"
    assert stdin_text(escaped) == "c $X\n"
    assert stdin_text(tabs) == "d hello\n"
    assert plain.stdin is None
    # each character is where it was written: the body's on its own line, the value where it was set
    segs = first.stdin
    assert str(segs[0].origins[0]) == "job.sh:3" and segs[1].text == "hello" and str(segs[1].origins[0]) == "job.sh:1"
    assert [str(o) for o in quoted.stdin[0].origins] == ["job.sh:6"] * 5
    assert str(tabs.stdin[0].origins[0]) == "job.sh:12"


def test_here_document_expansion_agrees_with_bash(tmp_path):
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("bash is not installed")
    text = ("X='a  b'\nN=3\n"
            "cat <<EOF\n$X ${N} \"$X\" '$N' \\$N \\\\ $((N*2)) \\\"\nline2 \\\nEOF\n"
            "cat <<'EOF'\n$X \\$N\nEOF\n"
            "cat <<-EOF\n\t\t$N\tx\n\tEOF\n")
    path = tmp_path / "h.sh"
    path.write_text(text)
    expected = subprocess.run([bash, str(path)], env={"PATH": os.environ.get("PATH", "")}, check=True,
                              capture_output=True, text=True, timeout=60).stdout
    recorder, problems, completed, _ = read(text)
    assert completed and problems == ()
    assert "".join(stdin_text(c) for c in recorder.commands) == expected
