"""Shared settings: precedence, config file discovery, sources, problems (megatron_estimator/settings.py)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap

import pytest

from megatron_estimator.core.units import GiB, MiB
from megatron_estimator.megatron.gpus import gpu_names, lookup_gpu
from megatron_estimator.settings import (
    SETTINGS, default_settings, find_config_file, load_settings, settings_help, setting_keys,
)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def repo(tmp_path):
    """A repository root (it has .git, so the walk stops here) with a nested working directory."""
    (tmp_path / ".git").mkdir()
    deep = tmp_path / "jobs" / "llama"
    deep.mkdir(parents=True)
    return tmp_path


def write(path, text):
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return str(path)


def load(cli=None, environ=None, cwd=None):
    return load_settings(cli or {}, environ=environ or {}, cwd=cwd)


def codes(problems):
    return [(p.code, p.location) for p in problems]


# --- defaults ----------------------------------------------------------------------------

def test_defaults_when_nothing_is_given(repo):
    settings, problems = load(cwd=repo)
    assert problems == ()
    assert (settings.budget, settings.gpu, settings.format, settings.cuda_context, settings.nccl_buffers,
            settings.fragmentation, settings.routing_imbalance, settings.flash_attn, settings.warn_only) == (
        None, None, "text", 512 * MiB, 512 * MiB, 0.05, 0.0, None, False)
    assert {key: settings.source(key) for key in setting_keys()} == {key: "default" for key in setting_keys()}
    assert settings.config_file is None and settings.notes == ()
    assert settings == default_settings()


def test_the_defaults_live_in_one_table():
    assert [(s.key, s.default) for s in SETTINGS] == [
        ("budget", None), ("gpu", None), ("format", "text"), ("cuda-context", 512 * MiB),
        ("nccl-buffers", 512 * MiB), ("fragmentation", 0.05), ("routing-imbalance", 0.0), ("flash-attn", None),
        ("stack", None), ("megatron-version", None), ("resume", "auto"), ("warn-only", False), ("accept-flags", ())]
    assert [row[:3] for row in settings_help()] == [
        ("budget", "MEGATRON_ESTIMATOR_BUDGET", "none"),
        ("gpu", "MEGATRON_ESTIMATOR_GPU", "none"),
        ("format", "MEGATRON_ESTIMATOR_FORMAT", "text"),
        ("cuda-context", "MEGATRON_ESTIMATOR_CUDA_CONTEXT", "0.50 GiB"),
        ("nccl-buffers", "MEGATRON_ESTIMATOR_NCCL_BUFFERS", "0.50 GiB"),
        ("fragmentation", "MEGATRON_ESTIMATOR_FRAGMENTATION", "0.05 (5%)"),
        ("routing-imbalance", "MEGATRON_ESTIMATOR_ROUTING_IMBALANCE", "0 (0%)"),
        ("flash-attn", "MEGATRON_ESTIMATOR_FLASH_ATTN", ">= 2.4.1 (assumed)"),
        ("stack", "MEGATRON_ESTIMATOR_STACK", "not stated"),
        ("megatron-version", "MEGATRON_ESTIMATOR_MEGATRON_VERSION", "detected, else main"),
        ("resume", "MEGATRON_ESTIMATOR_RESUME", "auto"),
        ("warn-only", "MEGATRON_ESTIMATOR_WARN_ONLY", "false"),
        ("accept-flags", "MEGATRON_ESTIMATOR_ACCEPT_FLAGS", "none"),
    ]
    assert all(help_line for *_, help_line in settings_help())


# --- precedence: every key, every adjacent pair ------------------------------------------

# key -> (command line value, environment value, TOML literal, and the three parsed values)
LAYERS = {
    "budget": ("70GiB", "60GiB", '"50GiB"', (70 * GiB, 60 * GiB, 50 * GiB)),
    "gpu": ("h200", "b200", '"mi300x"', ("h200", "b200", "mi300x")),
    "format": ("json", "markdown", '"text"', ("json", "markdown", "text")),
    "cuda-context": ("700MiB", "600MiB", '"400MiB"', (700 * MiB, 600 * MiB, 400 * MiB)),
    "nccl-buffers": ("1GiB", "0.7GiB", "0.6", (GiB, round(0.7 * GiB), round(0.6 * GiB))),
    "fragmentation": ("0.2", "10%", "0.07", (0.2, 0.1, 0.07)),
    "routing-imbalance": ("0.5", "0.25", "0.1", (0.5, 0.25, 0.1)),
    "flash-attn": ("none", "2.3.6", '"2.7.4.post1"', ("none", "2.3.6", "2.7.4.post1")),
    "megatron-version": ("0.16.1", "0.18", '"main"', ("0.16.1", "0.18", "main")),
    "resume": ("yes", "no", '"auto"', ("yes", "no", "auto")),
    "warn-only": (True, "false", "true", (True, False, True)),
}


def _shown(key, value):
    return value.name if key == "gpu" else value


@pytest.mark.parametrize("key", LAYERS)
@pytest.mark.parametrize("pair", ["command line over environment", "environment over file", "file over default"])
def test_precedence(repo, key, pair):
    cli_value, env_value, toml_value, (from_cli, from_env, from_file) = LAYERS[key]
    env_var = "MEGATRON_ESTIMATOR_" + key.upper().replace("-", "_")
    path = write(repo / "pyproject.toml", f"""
        [project]
        name = "training"

        [tool.megatron-estimator]
        {key} = {toml_value}
    """)
    file_source = f"{path}:5 [tool.megatron-estimator] {key}"
    cwd = repo / "jobs" / "llama"
    if pair == "command line over environment":
        settings, problems = load({key: cli_value}, {env_var: env_value}, cwd)
        expected, source = from_cli, f"command line --{key}"
    elif pair == "environment over file":
        settings, problems = load({key: None}, {env_var: env_value}, cwd)
        expected, source = from_env, env_var
    else:
        settings, problems = load({}, {}, cwd)
        expected, source = from_file, file_source
    assert problems == ()
    assert _shown(key, settings.entry(key).value) == expected
    assert settings.source(key) == source
    assert getattr(settings, key.replace("-", "_")) == settings.entry(key).value


def test_command_line_wins_over_both_lower_sources_at_once(repo):
    write(repo / "megatron-estimator.toml", 'format = "markdown"\n')
    settings, problems = load({"format": "json"}, {"MEGATRON_ESTIMATOR_FORMAT": "text"}, repo)
    assert problems == ()
    assert (settings.format, settings.source("format")) == ("json", "command line --format")


def test_cli_dest_spelling_and_none_for_flags_not_given(repo):
    settings, problems = load({"cuda_context": "1GiB", "warn_only": None, "budget": None}, {}, repo)
    assert problems == ()
    assert (settings.cuda_context, settings.source("cuda-context")) == (GiB, "command line --cuda-context")
    assert settings.source("warn-only") == settings.source("budget") == "default"


def test_an_unknown_cli_key_is_a_programming_error(repo):
    with pytest.raises(KeyError, match="unknown setting 'budgte'"):
        load({"budgte": "80GiB"}, {}, repo)


def test_an_empty_environment_variable_counts_as_unset(repo):
    write(repo / "megatron-estimator.toml", 'budget = "50GiB"\n')
    settings, problems = load({}, {"MEGATRON_ESTIMATOR_BUDGET": "  "}, repo)
    assert problems == ()
    assert settings.budget == 50 * GiB


# --- config files ------------------------------------------------------------------------

def test_megatron_estimator_toml_keys_at_the_top_level(repo):
    path = write(repo / "megatron-estimator.toml", """
        # team defaults for the llama jobs
        gpu = "h100"
        fragmentation = "8%"
        warn-only = true
        cuda_context = 600   # GiB? no: a bare number is GiB, so this is 600 GiB
    """)
    settings, problems = load(cwd=repo / "jobs" / "llama")
    assert problems == ()
    assert settings.config_file == path
    assert settings.gpu is lookup_gpu("h100-sxm-80gb")
    assert settings.fragmentation == 0.08 and settings.warn_only is True
    assert settings.cuda_context == 600 * GiB
    assert settings.source("gpu") == f"{path}:2 gpu"
    assert settings.source("warn-only") == f"{path}:4 warn-only"
    assert settings.source("cuda-context") == f"{path}:5 cuda_context"


def test_pyproject_table_with_a_quoted_header(repo):
    path = write(repo / "pyproject.toml", """
        [tool.black]
        line-length = 100
        budget = "1GiB"

        [tool."megatron-estimator"]
        budget = "75GiB"
    """)
    settings, problems = load(cwd=repo)
    assert problems == ()
    assert (settings.budget, settings.source("budget")) == (75 * GiB, f"{path}:6 [tool.megatron-estimator] budget")


def test_pyproject_dotted_keys_under_tool(repo):
    path = write(repo / "pyproject.toml", """
        [tool]
        black.line-length = 100
        megatron-estimator.format = "json"
        megatron-estimator.gpu = "l40s"
    """)
    settings, problems = load(cwd=repo)
    assert problems == ()
    assert (settings.format, settings.source("format")) == ("json", f"{path}:3 [tool.megatron-estimator] format")
    assert (settings.gpu.name, settings.source("gpu")) == ("l40s", f"{path}:4 [tool.megatron-estimator] gpu")


def test_key_lines_skip_multi_line_strings(repo):
    path = write(repo / "pyproject.toml", '''
        [tool.megatron-estimator]
        format = """
        budget = "1GiB"
        """
        budget = "2GiB"
    ''')
    settings, problems = load(cwd=repo)
    assert codes(problems) == [("invalid-setting", f"{path}:2 [tool.megatron-estimator] format")]
    assert (settings.budget, settings.source("budget")) == (2 * GiB, f"{path}:5 [tool.megatron-estimator] budget")


def test_both_files_in_one_directory_the_dedicated_file_wins(repo):
    own = write(repo / "megatron-estimator.toml", 'budget = "60GiB"\n')
    pyproject = write(repo / "pyproject.toml", '[tool.megatron-estimator]\nbudget = "70GiB"\nformat = "json"\n')
    settings, problems = load(cwd=repo)
    assert problems == ()
    assert settings.config_file == own
    assert (settings.budget, settings.format) == (60 * GiB, "text")      # nothing merged from the pyproject
    assert settings.notes == (
        f"{pyproject} [tool.megatron-estimator] is ignored: {own} in the same directory takes precedence",)


def test_an_ignored_pyproject_beside_the_dedicated_file_is_not_checked(repo):
    own = write(repo / "megatron-estimator.toml", 'budget = "60GiB"\n')
    write(repo / "pyproject.toml", '[tool.megatron-estimator]\nbudget = "lots"\nbugdet = 1\n')
    settings, problems = load(cwd=repo)
    assert problems == ()
    assert settings.config_file == own and settings.budget == 60 * GiB
    assert len(settings.notes) == 1


def test_the_walk_goes_up_to_the_repository_root(repo):
    path = write(repo / "pyproject.toml", '[tool.megatron-estimator]\ngpu = "b200"\n')
    settings, problems = load(cwd=repo / "jobs" / "llama")
    assert problems == ()
    assert settings.config_file == path and settings.gpu.name == "b200"


def test_the_nearest_file_wins_and_files_further_up_are_not_merged(repo):
    write(repo / "pyproject.toml", '[tool.megatron-estimator]\ngpu = "b200"\nformat = "json"\n')
    nearer = write(repo / "jobs" / "megatron-estimator.toml", 'gpu = "h200"\n')
    settings, problems = load(cwd=repo / "jobs" / "llama")
    assert problems == ()
    assert settings.config_file == nearer
    assert (settings.gpu.name, settings.format, settings.source("format")) == ("h200", "text", "default")


def test_a_pyproject_without_the_table_does_not_stop_the_walk(repo):
    root_config = write(repo / "megatron-estimator.toml", 'format = "markdown"\n')
    write(repo / "jobs" / "pyproject.toml", """
        [project]
        name = "jobs"
        dependencies = ["megatron-estimator>=0.1"]
    """)
    write(repo / "jobs" / "llama" / "pyproject.toml", '[project]\nname = "llama"\n')
    settings, problems = load(cwd=repo / "jobs" / "llama")
    assert problems == ()
    assert settings.config_file == root_config and settings.format == "markdown"


def test_the_walk_stops_at_the_first_directory_with_git(tmp_path):
    write(tmp_path / "megatron-estimator.toml", 'format = "json"\n')     # outside the repository
    project = tmp_path / "project"
    (project / ".git").mkdir(parents=True)
    (project / "src").mkdir()
    settings, problems = load(cwd=project / "src")
    assert problems == ()
    assert settings.config_file is None and settings.format == "text"
    assert find_config_file(str(tmp_path / "project" / "src")) is None


def test_a_git_file_also_marks_the_repository_root(tmp_path):
    write(tmp_path / "megatron-estimator.toml", 'format = "json"\n')
    worktree = tmp_path / "worktree"
    worktree.mkdir()
    write(worktree / ".git", "gitdir: /elsewhere/.git/worktrees/wt\n")
    settings, _ = load(cwd=worktree)
    assert settings.config_file is None


def test_the_walk_reaches_the_filesystem_root_without_a_repository(tmp_path):
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    write(tmp_path / "megatron-estimator.toml", 'format = "json"\n')
    settings, problems = load(cwd=deep)
    assert problems == () and settings.format == "json"


# --- problems ----------------------------------------------------------------------------

def test_bad_values_are_reported_where_they_came_from_all_at_once(repo):
    path = write(repo / "pyproject.toml", """
        [tool.megatron-estimator]
        budget = "80 gigs"
        fragmentation = 5
        format = "jsno"
        gpu = 3
    """)
    settings, problems = load(
        {"warn_only": "maybe", "cuda_context": "-1GiB"},
        {"MEGATRON_ESTIMATOR_BUDGET": "0GiB", "MEGATRON_ESTIMATOR_GPU": "h1000"},
        repo,
    )
    table = f"{path}:{{}} [tool.megatron-estimator] {{}}"
    assert [(p.code, p.location, p.message) for p in problems] == [
        ("invalid-setting", "command line --warn-only", "must be true or false (or 1/0, yes/no, on/off), not 'maybe'"),
        ("invalid-setting", "command line --cuda-context", "a byte size cannot be negative ('-1GiB')"),
        ("invalid-setting", "MEGATRON_ESTIMATOR_BUDGET", "must be more than 0 bytes"),
        ("invalid-setting", "MEGATRON_ESTIMATOR_GPU",
         "unknown GPU 'h1000'; did you mean h100 (h100-sxm-80gb)? (known GPUs: " + ", ".join(gpu_names()) + ")"),
        ("invalid-setting", table.format(2, "budget"),
         "'80 gigs': unknown unit 'gigs' (units: B, KB, MB, GB, TB (powers of 10) or KiB, MiB, GiB, TiB "
         "(powers of 2); a number without a unit is GiB)"),
        ("invalid-setting", table.format(3, "fragmentation"),
         "must be at most 1 (100%), not int 5; write 0.05 or 5% for five percent"),
        ("invalid-setting", table.format(4, "format"),
         "must be one of text, json, markdown, not 'jsno'; did you mean json?"),
        ("invalid-setting", table.format(5, "gpu"), "must name a GPU, such as h100, not int 3"),
    ]
    # a bad value gives way to the next source (or the default), so the settings stay usable
    assert (settings.warn_only, settings.cuda_context, settings.budget, settings.gpu) == (False, 512 * MiB, None, None)
    assert (settings.format, settings.fragmentation) == ("text", 0.05)


def test_a_bad_higher_value_falls_back_to_the_next_source(repo):
    write(repo / "megatron-estimator.toml", 'budget = "50GiB"\n')
    settings, problems = load({"budget": "lots"}, {}, repo)
    assert codes(problems) == [("invalid-setting", "command line --budget")]
    assert settings.budget == 50 * GiB


def test_an_overridden_bad_value_in_the_team_file_is_still_reported(repo):
    path = write(repo / "megatron-estimator.toml", 'budget = "80G"\n')
    settings, problems = load({"budget": "70GiB"}, {}, repo)
    assert codes(problems) == [("invalid-setting", f"{path}:1 budget")]
    assert settings.budget == 70 * GiB


def test_unknown_keys_in_the_file_with_did_you_mean(repo):
    path = write(repo / "pyproject.toml", """
        [tool.megatron-estimator]
        bugdet = "80GiB"
        nccl-buffer = "600MiB"
        colour = "red"
    """)
    settings, problems = load(cwd=repo)
    assert [(p.code, p.location, p.message.split(" (settings:")[0]) for p in problems] == [
        ("unknown-setting", f"{path}:2 [tool.megatron-estimator] bugdet", "'bugdet' is not a setting; did you mean budget?"),
        ("unknown-setting", f"{path}:3 [tool.megatron-estimator] nccl-buffer",
         "'nccl-buffer' is not a setting; did you mean nccl-buffers?"),
        ("unknown-setting", f"{path}:4 [tool.megatron-estimator] colour", "'colour' is not a setting"),
    ]
    assert problems[0].message.endswith(
        "(settings: budget, gpu, format, cuda-context, nccl-buffers, fragmentation, routing-imbalance, flash-attn, stack, megatron-version, resume, warn-only, accept-flags)")


def test_unknown_environment_variables_in_our_namespace(repo):
    settings, problems = load({}, {"MEGATRON_ESTIMATOR_BUGDET": "80GiB", "MEGATRON_LM_HOME": "/opt",
                                   "MEGATRON_ESTIMATOR_DEBUG": "1"}, repo)   # the CLI's traceback switch
    assert codes(problems) == [("unknown-setting", "MEGATRON_ESTIMATOR_BUGDET")]
    assert "did you mean MEGATRON_ESTIMATOR_BUDGET?" in problems[0].message


def test_both_spellings_of_one_key_in_a_file(repo):
    path = write(repo / "megatron-estimator.toml", 'cuda-context = "1GiB"\ncuda_context = "2GiB"\n')
    settings, problems = load(cwd=repo)
    assert [(p.code, p.location, p.message) for p in problems] == [
        ("duplicate-setting", f"{path}:2 cuda_context",
         f"cuda_context and cuda-context are the same setting ({path}:1 cuda-context); keep one")]
    assert settings.cuda_context == GiB


def test_broken_toml_is_reported_at_its_line(repo):
    path = write(repo / "megatron-estimator.toml", 'budget = "80GiB"\nformat = json\n')
    settings, problems = load(cwd=repo)
    assert [(p.code, p.location) for p in problems] == [("toml-syntax", f"{path}:2")]
    assert problems[0].message == "Invalid value (column 10)"
    assert settings.config_file == path and settings.budget is None


def test_a_broken_pyproject_that_configures_us_is_reported(repo):
    path = write(repo / "pyproject.toml", '[tool.megatron-estimator\nbudget = "80GiB"\n')
    _, problems = load(cwd=repo)
    assert [(p.code, p.location) for p in problems] == [("toml-syntax", f"{path}:1")]


def test_a_broken_pyproject_that_does_not_mention_us_is_left_alone(repo):
    write(repo / "pyproject.toml", "[project\nname = 'x'\n")
    settings, problems = load(cwd=repo)
    assert problems == () and settings.config_file is None


def test_a_broken_file_stops_the_walk(repo):
    write(repo / "megatron-estimator.toml", 'format = "json"\n')
    broken = write(repo / "jobs" / "megatron-estimator.toml", "format = \n")
    settings, problems = load(cwd=repo / "jobs" / "llama")
    assert codes(problems) == [("toml-syntax", f"{broken}:1")]
    assert settings.config_file == broken and settings.format == "text"


def test_a_tool_entry_that_is_not_a_table(repo):
    path = write(repo / "pyproject.toml", '[tool]\nmegatron-estimator = "80GiB"\n')
    _, problems = load(cwd=repo)
    assert [(p.code, p.location, p.message) for p in problems] == [
        ("invalid-setting", path, "[tool.megatron-estimator] must be a table of settings, not '80GiB'")]


# --- budget and gpu ----------------------------------------------------------------------

def test_a_gpu_alone_sets_the_budget_to_its_capacity(repo):
    settings, problems = load({"gpu": "h100"}, {}, repo)
    assert problems == ()
    assert settings.budget == 85_020_639_232 == settings.gpu.total_memory_bytes
    assert settings.entry("budget").origin == "gpu"
    assert settings.source("budget") == "h100-sxm-80gb capacity (cuda-reported; gpu from command line --gpu)"


def test_a_budget_from_the_same_or_a_higher_source_beats_the_gpu(repo):
    settings, _ = load({"gpu": "h200", "budget": "120GiB"}, {}, repo)
    assert (settings.budget, settings.source("budget")) == (120 * GiB, "command line --budget")
    assert settings.notes == ("budget 120.00 GiB from command line --budget is used instead of the h200 "
                              "capacity 139.80 GiB (command line --gpu)",)
    path = write(repo / "megatron-estimator.toml", 'gpu = "h200"\n')
    settings, _ = load({}, {"MEGATRON_ESTIMATOR_BUDGET": "100GiB"}, repo)
    assert (settings.budget, settings.source("budget")) == (100 * GiB, "MEGATRON_ESTIMATOR_BUDGET")
    assert settings.source("gpu") == f"{path}:1 gpu"


def test_a_gpu_from_a_higher_source_replaces_a_lower_budget(repo):
    path = write(repo / "megatron-estimator.toml", 'budget = "70GiB"\n')
    settings, problems = load({"gpu": "mi300x"}, {}, repo)
    assert problems == ()
    assert settings.budget == 206_141_652_992
    assert settings.notes == (f"the mi300x capacity from command line --gpu replaces budget 70.00 GiB from "
                              f"{path}:1 budget",)


# --- the result --------------------------------------------------------------------------

def test_settings_are_frozen_and_report_their_sources(repo):
    settings, _ = load({"budget": "80GiB", "fragmentation": "7%"}, {"MEGATRON_ESTIMATOR_WARN_ONLY": "yes"}, repo)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.budget = 1
    with pytest.raises(TypeError):
        settings.entries["budget"] = None
    assert settings.rows() == (
        ("budget", "80.00 GiB", "command line --budget"),
        ("gpu", "none", "default"),
        ("format", "text", "default"),
        ("cuda-context", "0.50 GiB", "default"),
        ("nccl-buffers", "0.50 GiB", "default"),
        ("fragmentation", "0.07 (7%)", "command line --fragmentation"),
        ("routing-imbalance", "0 (0%)", "default"),
        ("flash-attn", ">= 2.4.1 (assumed)", "default"),
        ("stack", "not stated", "default"),
        ("megatron-version", "detected, else main", "default"),
        ("resume", "auto", "default"),
        ("warn-only", "true", "MEGATRON_ESTIMATOR_WARN_ONLY"),
        ("accept-flags", "none", "default"),
    )


def test_format_is_case_insensitive_and_bools_take_common_spellings(repo):
    settings, problems = load({"format": "JSON"}, {"MEGATRON_ESTIMATOR_WARN_ONLY": "On"}, repo)
    assert problems == ()
    assert (settings.format, settings.warn_only) == ("json", True)


# --- cost --------------------------------------------------------------------------------

def test_importing_and_loading_stay_cheap(tmp_path):
    """No TOML parser, difflib, yaml or jsonschema unless a config file asks for them."""
    (tmp_path / ".git").mkdir()
    script = textwrap.dedent(f"""
        import sys
        heavy = {{"tomllib", "tomli", "difflib", "yaml", "jsonschema", "pathlib", "fractions", "decimal"}}
        heavy -= set(sys.modules)            # whatever the interpreter loads at start-up is not ours
        import megatron_estimator.settings as settings
        print(sorted(heavy & set(sys.modules)))
        settings.load_settings({{"budget": "80GiB", "gpu": "h100"}}, environ={{}}, cwd={str(tmp_path)!r})
        print(sorted(heavy & set(sys.modules)))
    """)
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == ["[]", "[]"]
