"""The pytest plugin (megatron_estimator/pytest_plugin.py), run inside pytester sessions.

Expected estimates come from the library itself (the plugin must add no memory logic); the
budgets are chosen around them so that one case fits and the other does not, down to a byte.
"""

from __future__ import annotations

import configparser
import json
import os
from pathlib import Path

import pytest

from megatron_estimator import api
from megatron_estimator.core.problems import InvalidInput
from megatron_estimator.core.units import parse_bytes
from megatron_estimator.megatron.gpus import find_gpu
from megatron_estimator.model.overhead import Overheads
from megatron_estimator.report.text import render_text
from megatron_estimator.results.estimate import Verdict

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parent.parent
PLUGIN = "megatron_estimator.pytest_plugin"
GiB = 1 << 30

# A 2-layer GPT (Megatron pretrain_gpt.py flags); with pipeline parallelism 2 it has two stages.
SMALL = ["--num-layers", "2", "--hidden-size", "256", "--num-attention-heads", "4",
         "--seq-length", "512", "--max-position-embeddings", "512", "--micro-batch-size", "1",
         "--vocab-size", "32000", "--bf16"]
SMALL_PP2 = SMALL + ["--pipeline-model-parallel-size", "2"]
# A 1.3B GPT whose peak (about 57 GiB) fits an 80 GB H100 and not a 40 GB A100 or a 32 GB V100.
GPT_1B = ["--num-layers", "24", "--hidden-size", "2048", "--num-attention-heads", "16",
          "--seq-length", "2048", "--max-position-embeddings", "2048", "--micro-batch-size", "8",
          "--vocab-size", "50304", "--bf16"]


@pytest.fixture(autouse=True)
def _hermetic(monkeypatch):
    """No team settings from the developer's environment; the plugin only through ``-p``."""
    for name in list(os.environ):
        if name.startswith("MEGATRON_ESTIMATOR_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")   # an installed entry point would load it twice


@pytest.fixture(scope="module", autouse=True)
def _library_imported():
    """Import what the plugin uses once: pytester's in-process runs drop the modules imported
    inside them, and importing the library afresh in every run would dominate the test time."""
    try:
        import tomllib  # noqa: F401  (settings reads pyproject.toml with it)
    except ModuleNotFoundError:     # Python 3.10: settings uses tomli
        pass
    from megatron_estimator.settings import load_settings

    api.estimate(SMALL)
    api.estimate(str(REPO / "tests" / "fixtures" / "megatron-yaml-gpt.yaml"))
    load_settings({}, environ={})


def run(pytester, *args):
    # "-rN": no short test summary, whose length depends on the terminal and on CI=true
    # (pytest prints whole multi-line messages there on CI), so that what a test counts
    # in the output is the failure sections alone.
    return pytester.runpytest("-p", PLUGIN, "-rN", *args)


def output(result) -> str:
    return result.stdout.str() + result.stderr.str()


def failing_assert_fits(pytester, call_args: str) -> str:
    """The output of one generated test that calls ``megatron_memory.assert_fits(call_args)``
    and fails."""
    pytester.makepyfile(f"""
        def test_assert_fits(megatron_memory):
            megatron_memory.assert_fits({call_args})
    """)
    result = run(pytester)
    result.assert_outcomes(failed=1)
    return output(result)


def problem_line(p) -> str:
    return f"{p.location}: {p.message} [{p.code}]"


# ---------------------------------------------------------------------------------------
# Registration

def _declared_pytest11() -> list[str]:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    assert cfg.has_option("options.entry_points", "pytest11"), "setup.cfg declares no pytest11 entry point"
    return [line.strip() for line in cfg.get("options.entry_points", "pytest11").splitlines() if line.strip()]


def test_entry_point_is_declared_in_setup_cfg():
    # Named after the module, so that a conftest's pytest_plugins or a -p naming the module is
    # a no-op once the package is installed, instead of pluggy's "already registered" error.
    assert "megatron_estimator.pytest_plugin = megatron_estimator.pytest_plugin" in _declared_pytest11()


@pytest.mark.parametrize("also_named", [False, True], ids=["entry-point", "entry-point-and-conftest"])
def test_installed_entry_point_loads_the_plugin(pytester, monkeypatch, also_named):
    """setup.cfg's pytest11 lines, as an installed distribution declares them, load the plugin
    without -p; naming the module as well (conftest pytest_plugins and -p) is harmless."""
    site = pytester.mkdir("site")
    dist = site / "megatron_estimator_entry_point_check-0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: megatron-estimator-entry-point-check\nVersion: 0\n")
    (dist / "entry_points.txt").write_text("[pytest11]\n" + "\n".join(_declared_pytest11()) + "\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD")
    if also_named:
        pytester.makeconftest(f"pytest_plugins = [{PLUGIN!r}]\n")
    pytester.makepyfile(f"""
        import pytest

        @pytest.mark.megatron_gpus("h100")
        def test_fits(megatron_memory):
            megatron_memory.assert_fits({SMALL!r})
    """)
    result = pytester.runpytest("--strict-markers", *(["-p", PLUGIN] if also_named else []))
    result.assert_outcomes(passed=1)


def test_marker_is_registered_for_strict_markers(pytester):
    pytester.makepyfile("""
        import pytest
        @pytest.mark.megatron_gpus("h100")
        def test_runs(megatron_gpu):
            assert megatron_gpu.name == "h100-sxm-80gb"
    """)
    result = run(pytester, "--strict-markers")
    result.assert_outcomes(passed=1)
    markers = run(pytester, "--markers")
    assert any(line.startswith("@pytest.mark.megatron_gpus(*names):") for line in markers.stdout.lines)


# ---------------------------------------------------------------------------------------
# assert_fits: a pass, a failure with the stage table, invalid input

def test_assert_fits_passes_at_the_peak_and_fails_one_byte_below(pytester):
    estimate = api.estimate(SMALL_PP2, world_size=2)
    peaks = [stage.device_peak_bytes for stage in estimate.stages]
    assert len(peaks) == 2 and peaks[0] < peaks[1]      # stage 1 holds the output layer and the loss
    over_budget = peaks[1] - 1                           # stage 0 fits, stage 1 is one byte over
    pytester.makepyfile(f"""
        FLAGS = {SMALL_PP2!r}

        def test_fits(megatron_memory):
            e = megatron_memory.assert_fits(FLAGS, world_size=2, budget={peaks[1]})
            assert [s.device_peak_bytes for s in e.stages] == {peaks!r}
            assert [s.fits for s in e.stages] == [True, True]

        def test_over(megatron_memory):
            megatron_memory.assert_fits(FLAGS, world_size=2, budget={over_budget})
    """)
    result = run(pytester)
    result.assert_outcomes(passed=1, failed=1)          # a failure of the test, not an error
    text = output(result)
    assert "AssertionError: OVER BUDGET: command line: stage 1 needs" in text
    assert f"budget={over_budget} argument" in text
    assert "pytest_plugin.py" not in text               # the plugin's frames are hidden
    # The text renderer's table and verdict for the same estimate, line by line.
    expected = render_text([Verdict("command line", estimate=api.estimate(
        SMALL_PP2, world_size=2, budget=over_budget))]).splitlines()
    table_start = next(i for i, line in enumerate(expected) if line.strip().startswith("stage  layers"))
    wanted = expected[table_start:table_start + 3] + [line for line in expected if "verdict:" in line]
    assert "OVER BUDGET on 1 of 2 stage(s)" in wanted[-1]
    shown = [line.removeprefix("E").strip() for line in result.stdout.lines if line.startswith("E ")]
    for line in wanted:
        assert line.strip() in shown, line


def test_invalid_flags_fail_the_test_listing_every_problem(pytester):
    bad = SMALL + ["--num-layerz", "3", "--hidden-size", "abc"]
    _, problems = api.load_input(bad)
    assert {p.code for p in problems} == {"unknown-flag", "invalid-value"}
    pytester.makepyfile(f"""
        FLAGS = {bad!r}

        def test_assert_fits(megatron_memory):
            megatron_memory.assert_fits(FLAGS, budget="80GiB")

        def test_estimate(megatron_memory):
            megatron_memory.estimate(FLAGS)
    """)
    result = run(pytester)
    result.assert_outcomes(failed=2)
    text = output(result)
    assert text.count("invalid Megatron configuration (command line): 2 problems") == 2
    for problem in problems:
        assert text.count(problem_line(problem)) == 2, problem_line(problem)
    assert "pytest_plugin.py" not in text


def test_megatron_rule_violations_fail_the_test_listing_every_problem(pytester):
    bad = SMALL + ["--num-attention-heads", "3", "--tensor-model-parallel-size", "2"]
    inp, problems = api.load_input(bad)
    verdict = api.evaluate(inp, world_size=4, world_size_source="world_size argument")
    assert not problems and verdict.estimate is None
    codes = {p.code for p in verdict.problems}
    assert {"heads-not-dividing-hidden", "heads-not-divisible-by-tp"} <= codes
    text = failing_assert_fits(pytester, f'{bad!r}, world_size=4, budget="80GiB"')
    for problem in verdict.problems:
        assert problem_line(problem) in text


def test_mapping_and_file_inputs_match_the_library(pytester):
    yaml_path = REPO / "tests" / "fixtures" / "megatron-yaml-gpt.yaml"
    from_file = api.estimate(str(yaml_path), world_size=8)
    mapping = {"num_layers": 2, "hidden_size": 256, "num_attention_heads": 4, "seq_length": 512,
               "max_position_embeddings": 512, "micro_batch_size": 1, "vocab_size": 32000, "--bf16": True}
    from_mapping = api.estimate(mapping)
    assert from_mapping.peak_stage.device_peak_bytes == api.estimate(SMALL).peak_stage.device_peak_bytes
    pytester.makepyfile(f"""
        def test_file(megatron_memory):
            e = megatron_memory.assert_fits({str(yaml_path)!r}, world_size=8, budget="80GiB")
            assert e.world_size == 8
            assert [s.device_peak_bytes for s in e.stages] == {[s.device_peak_bytes for s in from_file.stages]!r}

        def test_mapping(megatron_memory):
            e = megatron_memory.estimate({mapping!r})
            assert e.peak_stage.device_peak_bytes == {from_mapping.peak_stage.device_peak_bytes}
            assert e.fits is None and e.budget_bytes is None

        def test_bad_mapping_key(megatron_memory):
            megatron_memory.estimate({{"num_layers": 2, "hiden_size": 256}})
    """)
    result = run(pytester)
    result.assert_outcomes(passed=2, failed=1)
    assert "hiden_size: unknown Megatron setting 'hiden_size'; did you mean --hidden-size" in output(result)


def test_no_budget_configured(pytester):
    text = failing_assert_fits(pytester, repr(SMALL))
    assert "AssertionError: no GPU memory budget is configured for megatron_memory.assert_fits" in text
    assert "budget: none given (report only)" in text     # the report is still shown


def test_bad_budget_argument_and_bad_settings_fail_the_test(pytester, monkeypatch):
    with pytest.raises(InvalidInput) as bad_unit:
        parse_bytes("80G", location="budget argument")
    pytester.makepyfile(f"""
        def test_budget_argument(megatron_memory):
            megatron_memory.assert_fits({SMALL!r}, budget="80G")
    """)
    result = run(pytester)
    result.assert_outcomes(failed=1)
    assert problem_line(bad_unit.value.problems[0]) in output(result)

    pytester.makepyfile(f"""
        def test_budget_argument(megatron_memory):
            megatron_memory.assert_fits({SMALL!r}, budget=80 * 2**30)
    """)
    monkeypatch.setenv("MEGATRON_ESTIMATOR_BUDGET", "lots")
    result = run(pytester)
    result.assert_outcomes(failed=1)                     # a broken team setting is reported, not skipped
    text = output(result)
    assert "MEGATRON_ESTIMATOR_BUDGET: 'lots' is not a byte size" in text
    assert "[invalid-setting]" in text


def test_bad_command_line_and_ini_values_are_usage_errors(pytester):
    pytester.makeini("[pytest]\nmegatron_gpu = h1000\n")
    pytester.makepyfile("def test_nothing():\n    pass\n")
    result = run(pytester, "--megatron-budget", "80G")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    text = output(result)
    assert "megatron-estimator: 2 problems:" in text
    assert "--megatron-budget: '80G': unknown unit 'G'" in text and "[invalid-budget]" in text
    assert "tox.ini megatron_gpu: unknown GPU 'h1000'; did you mean h100 (h100-sxm-80gb)?" in text
    assert "[unknown-gpu]" in text


# ---------------------------------------------------------------------------------------
# Where the budget comes from

H100 = find_gpu("h100").total_memory_bytes
A100_40 = find_gpu("a100-40gb").total_memory_bytes
H200 = find_gpu("h200").total_memory_bytes

# (id, sources given, expected budget bytes, expected source); each case drops the top source.
ALL = {"argument": "1GiB", "cli_budget": "2GiB", "cli_gpu": "h100", "ini_budget": "4GiB",
       "ini_gpu": "a100-40gb", "env_budget": "5GiB"}


def _without(*names, **extra):
    sources = {k: v for k, v in ALL.items() if k not in names}
    sources.update(extra)
    return sources


PRECEDENCE = [
    ("argument", ALL, GiB, "budget='1GiB' argument"),
    ("cli-budget", _without("argument"), 2 * GiB, "--megatron-budget 2GiB"),
    ("cli-gpu-over-ini-and-env", _without("argument", "cli_budget"), H100,
     "h100-sxm-80gb capacity (--megatron-gpu h100)"),
    ("ini-budget", _without("argument", "cli_budget", "cli_gpu"), 4 * GiB, "megatron_budget = 4GiB in tox.ini"),
    ("ini-gpu-over-env", _without("argument", "cli_budget", "cli_gpu", "ini_budget"), A100_40,
     "a100-sxm-40gb capacity (megatron_gpu = a100-40gb in tox.ini)"),
    ("settings-env-budget", {"env_budget": "5GiB", "file_budget": "6GiB"}, 5 * GiB, "MEGATRON_ESTIMATOR_BUDGET"),
    ("settings-env-gpu-over-file-budget", {"env_gpu": "h200", "file_budget": "6GiB"}, H200,
     "h200 capacity (cuda-reported; gpu from MEGATRON_ESTIMATOR_GPU)"),
    ("settings-file-budget", {"file_budget": "6GiB"}, 6 * GiB, "{pyproject}:3 [tool.megatron-estimator] budget"),
    ("none", {}, None, None),
]


@pytest.mark.parametrize("sources, expected_bytes, expected_source",
                         [case[1:] for case in PRECEDENCE], ids=[case[0] for case in PRECEDENCE])
def test_budget_precedence(pytester, monkeypatch, sources, expected_bytes, expected_source):
    args = []
    if "cli_budget" in sources:
        args += ["--megatron-budget", sources["cli_budget"]]
    if "cli_gpu" in sources:
        args += ["--megatron-gpu", sources["cli_gpu"]]
    ini = [f"megatron_budget = {sources['ini_budget']}"] if "ini_budget" in sources else []
    ini += [f"megatron_gpu = {sources['ini_gpu']}"] if "ini_gpu" in sources else []
    if ini:
        pytester.makeini("[pytest]\n" + "\n".join(ini) + "\n")
    if "env_budget" in sources:
        monkeypatch.setenv("MEGATRON_ESTIMATOR_BUDGET", sources["env_budget"])
    if "env_gpu" in sources:
        monkeypatch.setenv("MEGATRON_ESTIMATOR_GPU", sources["env_gpu"])
    if "file_budget" in sources:
        pyproject = pytester.makepyprojecttoml(
            f'[tool.megatron-estimator]\n# the team budget\nbudget = "{sources["file_budget"]}"\n')
        expected_source = expected_source.format(pyproject=pyproject)
    argument = sources.get("argument")
    pytester.makepyfile(f"""
        def test_budget(megatron_memory):
            e = megatron_memory.estimate({SMALL!r}, budget={argument!r})
            assert (e.budget_bytes, e.budget_source) == ({expected_bytes!r}, {expected_source!r})
            assert [s.budget_bytes for s in e.stages] == [{expected_bytes!r}]
            b = megatron_memory.budget({argument!r})
            assert (b.bytes, b.source) == ({expected_bytes!r}, {expected_source!r})
    """)
    result = run(pytester, *args)
    result.assert_outcomes(passed=1)


def test_settings_overheads_apply(pytester, monkeypatch):
    monkeypatch.setenv("MEGATRON_ESTIMATOR_CUDA_CONTEXT", "1GiB")
    monkeypatch.setenv("MEGATRON_ESTIMATOR_FRAGMENTATION", "10%")
    expected = api.estimate(SMALL, overheads=Overheads(cuda_context_bytes=GiB, fragmentation=0.10))
    default = api.estimate(SMALL)
    assert expected.peak_stage.device_peak_bytes > default.peak_stage.device_peak_bytes + 512 * (1 << 20)
    pytester.makepyfile(f"""
        def test_overheads(megatron_memory):
            e = megatron_memory.estimate({SMALL!r})
            assert e.peak_stage.device_overhead.cuda_context == {GiB}
            assert e.peak_stage.device_peak_bytes == {expected.peak_stage.device_peak_bytes}
    """)
    run(pytester).assert_outcomes(passed=1)


# ---------------------------------------------------------------------------------------
# The megatron_gpus marker

def test_gpu_marker_parametrizes_with_each_gpu_capacity(pytester):
    names = ("h100", "a100-40gb", "v100-32gb")
    specs = {name: find_gpu(name) for name in names}
    peaks = {name: api.estimate(GPT_1B, overheads=Overheads(compute_capability=spec.compute_capability_value))
             .peak_stage.device_peak_bytes for name, spec in specs.items()}
    assert peaks["h100"] != peaks["v100-32gb"]              # the GPU's compute capability is applied
    assert peaks["h100"] <= specs["h100"].total_memory_bytes
    assert peaks["a100-40gb"] > specs["a100-40gb"].total_memory_bytes
    assert peaks["v100-32gb"] > specs["v100-32gb"].total_memory_bytes
    budgets = {name: spec.total_memory_bytes for name, spec in specs.items()}
    canonical = {name: spec.name for name, spec in specs.items()}
    pytester.makepyfile(f"""
        import pytest
        FLAGS = {GPT_1B!r}

        @pytest.mark.megatron_gpus{names!r}
        def test_fits(megatron_memory):
            megatron_memory.assert_fits(FLAGS)

        @pytest.mark.megatron_gpus{names!r}
        def test_budget(megatron_memory, megatron_gpu, request):
            name = request.node.callspec.id
            e = megatron_memory.estimate(FLAGS)
            assert megatron_gpu.name == {canonical!r}[name]
            assert e.budget_bytes == {budgets!r}[name]
            assert e.budget_source == megatron_gpu.name + " capacity (megatron_gpus marker)"
            assert e.peak_stage.device_peak_bytes == {peaks!r}[name]
    """)
    # The marker outweighs a budget on the command line.
    result = run(pytester, "-v", "--strict-markers", "--megatron-budget", "1GiB")
    result.assert_outcomes(passed=4, failed=2)
    result.stdout.fnmatch_lines_random([
        "*::test_fits[[]h100[]] PASSED*",
        "*::test_fits[[]a100-40gb[]] FAILED*",
        "*::test_fits[[]v100-32gb[]] FAILED*",
        "*::test_budget[[]h100[]] PASSED*",
        "*::test_budget[[]a100-40gb[]] PASSED*",
        "*::test_budget[[]v100-32gb[]] PASSED*",
    ])
    text = output(result)
    assert "OVER BUDGET: command line: stage 0 needs" in text
    assert "(a100-sxm-40gb capacity (megatron_gpus marker))" in text
    assert "(v100-32gb capacity (megatron_gpus marker))" in text


def test_gpu_marker_on_a_class_leaves_tests_without_the_fixture_alone(pytester):
    pytester.makepyfile("""
        import pytest

        @pytest.mark.megatron_gpus("h200", "mi300x")
        class TestGpus:
            def test_plain(self):
                pass

            def test_gpu(self, megatron_gpu):
                assert megatron_gpu.name in ("h200", "mi300x")

        def test_unmarked(megatron_gpu, megatron_memory):
            assert megatron_gpu is None
    """)
    result = run(pytester, "-v")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines_random(["*::TestGpus::test_plain PASSED*", "*::TestGpus::test_gpu[[]h200[]] PASSED*",
                                        "*::TestGpus::test_gpu[[]mi300x[]] PASSED*", "*::test_unmarked PASSED*"])


@pytest.mark.parametrize("marker, message", [
    ('megatron_gpus("h100", "h1000", "a100")',
     ["unknown GPU 'h1000'; did you mean h100 (h100-sxm-80gb)?", "[unknown-gpu]",
      "'a100' names GPUs of different memory sizes; say which: a100-sxm-40gb", "[ambiguous-gpu]"]),
    ("megatron_gpus()", ["give GPU names as arguments"]),
])
def test_bad_gpu_marker_is_a_collection_error(pytester, marker, message):
    pytester.makepyfile(f"""
        import pytest

        @pytest.mark.{marker}
        def test_gpus(megatron_memory):
            pass
    """)
    result = run(pytester)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.assert_outcomes(errors=1)
    text = output(result)
    assert "@pytest.mark.megatron_gpus on test_bad_gpu_marker_is_a_collection_error.py::test_gpus" in text
    for part in message:
        assert part in text


def test_gpu_marker_on_a_test_without_the_fixture_is_an_error(pytester):
    pytester.makepyfile("""
        import pytest

        @pytest.mark.megatron_gpus("h100")
        def test_no_fixture():
            pass
    """)
    result = run(pytester)
    result.assert_outcomes(errors=1)
    assert "uses neither the megatron_memory nor the megatron_gpu fixture" in output(result)


# ---------------------------------------------------------------------------------------
# Start-up cost: nothing of megatron_estimator's is imported unless a test uses the plugin

CONFTEST_RECORDING_MODULES = """
    import json, sys

    def pytest_sessionfinish(session):
        loaded = sorted(m for m in sys.modules if m == "megatron_estimator" or m.startswith("megatron_estimator."))
        with open("modules.json", "w") as f:
            json.dump(loaded, f)
"""


@pytest.mark.parametrize("uses_fixture", [False, True], ids=["unused", "used"])
def test_megatron_estimator_is_imported_only_when_used(pytester, monkeypatch, uses_fixture):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    pytester.makeconftest(CONFTEST_RECORDING_MODULES)
    body = "megatron_memory.estimate(%r)" % (SMALL,) if uses_fixture else "assert 1 + 1 == 2"
    fixture = "megatron_memory" if uses_fixture else ""
    pytester.makepyfile(f"""
        def test_something({fixture}):
            {body}
    """)
    result = pytester.runpytest_subprocess("-p", PLUGIN)
    result.assert_outcomes(passed=1)
    loaded = set(json.loads((pytester.path / "modules.json").read_text()))
    if uses_fixture:
        assert {"megatron_estimator.api", "megatron_estimator.settings", "megatron_estimator.model.stage"} <= loaded
    else:
        assert loaded == {"megatron_estimator", "megatron_estimator.pytest_plugin"}


def test_an_unknown_flag_does_not_hide_megatrons_own_checks(pytester):
    bad = SMALL + ["--bogus-flag", "--global-batch-size", "7"]
    text = failing_assert_fits(pytester, f'{bad!r}, world_size=2, budget="80GiB"')
    assert "invalid Megatron configuration (command line): 2 problems" in text
    assert "--bogus-flag: unknown flag" in text
    assert "[global-batch-not-divisible]" in text


# -- the Megatron release ------------------------------------------------------------------------

# LLaMA-3-8B under NullTokenizer: Megatron through 0.17 adds an end-of-document token
# (128256 + 1, padded to 128384 rows), from 0.18 not (128256 rows);
# megatron/core/tokenizers/text/libraries/null_tokenizer.py, commit c9dfe34798.
LLAMA3_8B = ("--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 "
             "--group-query-attention --num-query-groups 8 --seq-length 8192 --max-position-embeddings 8192 "
             "--micro-batch-size 1 --global-batch-size 64 --swiglu --normalization RMSNorm "
             "--untie-embeddings-and-output-weights --disable-bias-linear --position-embedding-type rope --bf16 "
             "--tokenizer-type NullTokenizer --vocab-size 128256").split()
PARAMS_0_16 = 8_031_309_824
PARAMS_MAIN = 8_030_261_248


def _release_test(pytester, expected_params, expected_version, expected_source, call=""):
    pytester.makepyfile(f"""
        FLAGS = {LLAMA3_8B!r}

        def test_release(megatron_memory):
            estimate = megatron_memory.estimate(FLAGS, world_size=8{call})
            assert estimate.total_parameters == {expected_params}
            chosen = megatron_memory.megatron_release({call.lstrip(', ').split('=')[-1] or 'None'})
            assert (chosen.version, chosen.source) == ({expected_version!r}, {expected_source!r})
    """)


@pytest.mark.parametrize("case, args, ini, env, call, params, version, source", [
    ("default-main", [], None, None, "", PARAMS_MAIN, "main",
     "default: the newest supported release (none was detected or given)"),
    ("command-line", ["--megatron-version", "0.16"], None, None, "", PARAMS_0_16, "0.16.1", "--megatron-version"),
    ("ini", [], "0.16.1", None, "", PARAMS_0_16, "0.16.1", "megatron_version = 0.16.1 in tox.ini"),
    ("environment", [], None, "0.16", "", PARAMS_0_16, "0.16.1", "MEGATRON_ESTIMATOR_MEGATRON_VERSION"),
    ("ini-over-environment", [], "0.18", "0.16", "", PARAMS_MAIN, "0.18.0",
     "megatron_version = 0.18 in tox.ini"),
    ("command-line-over-ini", ["--megatron-version", "main"], "0.16", "0.16", "", PARAMS_MAIN, "main",
     "--megatron-version"),
    ("argument-over-command-line", ["--megatron-version", "main"], "0.18", None, ", megatron_version='0.16'",
     PARAMS_0_16, "0.16.1", "megatron_version='0.16' argument"),
])
def test_megatron_release_precedence(pytester, monkeypatch, case, args, ini, env, call, params, version, source):
    if ini is not None:
        pytester.makeini(f"[pytest]\nmegatron_version = {ini}\n")
    if env is not None:
        monkeypatch.setenv("MEGATRON_ESTIMATOR_MEGATRON_VERSION", env)
    _release_test(pytester, params, version, source, call)
    run(pytester, *args).assert_outcomes(passed=1)


def test_release_detected_from_a_megatron_tree_on_the_jobs_pythonpath(pytester, tmp_path):
    tree = tmp_path / "Megatron-LM"
    (tree / "megatron" / "core").mkdir(parents=True)
    (tree / "megatron" / "core" / "package_info.py").write_text("MAJOR = 0\nMINOR = 16\nPATCH = 1\nPRE_RELEASE = ''\n")
    env = {"PYTHONPATH": str(tree)}
    pytester.makepyfile(f"""
        def test_tree(megatron_memory):
            estimate = megatron_memory.estimate({LLAMA3_8B!r}, world_size=8, environ={env!r})
            assert estimate.total_parameters == {PARAMS_0_16}
            chosen = megatron_memory.megatron_release(environ={env!r})
            assert chosen.source == {str(tree / "megatron" / "core" / "package_info.py")!r}
    """)
    run(pytester).assert_outcomes(passed=1)
    # A release asked for (the ini option) wins over the tree detected.
    pytester.makeini("[pytest]\nmegatron_version = main\n")
    pytester.makepyfile(f"""
        def test_tree(megatron_memory):
            chosen = megatron_memory.megatron_release(environ={env!r})
            assert chosen.version == "main"
    """)
    run(pytester).assert_outcomes(passed=1)


def test_flag_of_a_later_release_is_refused_under_an_earlier_one(pytester):
    # --no-pad-vocab-size first appears in 0.18 (megatron/training/arguments.py).
    pytester.makepyfile(f"""
        FLAGS = {LLAMA3_8B!r} + ["--no-pad-vocab-size"]

        def test_flag(megatron_memory):
            verdict = megatron_memory.verdict(FLAGS, world_size=8)
            assert [p.code for p in verdict.problems] == ["unknown-flag"], verdict.problems
            assert "needs Megatron 0.18.0 or later" in verdict.problems[0].message
            assert megatron_memory.verdict(FLAGS, world_size=8, megatron_version="main").estimate is not None
    """)
    run(pytester, "--megatron-version", "0.16.1").assert_outcomes(passed=1)


def test_fixture_verdict_names_the_calls_release(pytester):
    pytester.makepyfile(f"""
        def test_named(megatron_memory):
            assert megatron_memory.verdict({LLAMA3_8B!r}, world_size=8).megatron.version == "0.16.1"
            assert megatron_memory.verdict({LLAMA3_8B!r}, world_size=8, megatron_version="0.18").megatron.version \\
                == "0.18.0"
    """)
    run(pytester, "--megatron-version", "0.16").assert_outcomes(passed=1)


def test_bad_megatron_version_option_and_ini_are_usage_errors(pytester):
    pytester.makeini("[pytest]\nmegatron_version = 0.9\n")
    pytester.makepyfile("def test_nothing():\n    pass\n")
    result = run(pytester, "--megatron-version", "nine")
    text = output(result)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "megatron-estimator: 2 problems:" in text
    assert "--megatron-version: 'nine' is not a Megatron version (supported: 0.14.0" in text
    assert ("tox.ini megatron_version: Megatron 0.9 is not a supported release: it is older than 0.14.0, the oldest "
            "the estimator supports (supported: 0.14.0") in text


def test_release_from_the_nemo_container_of_a_launch_script(pytester):
    # nvcr.io/nvidia/nemo:26.04 holds Megatron 0.17.0 (../shared/notes/megatron-versions.md),
    # whose NullTokenizer still adds the end-of-document token.
    script = pytester.path / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH --nodes=1\n#SBATCH --ntasks-per-node=8\n"
                      "#SBATCH --container-image=nvcr.io/nvidia/nemo:26.04\n"
                      "srun python pretrain_gpt.py " + " ".join(LLAMA3_8B) + "\n")
    pytester.makepyfile(f"""
        def test_script(megatron_memory):
            assert megatron_memory.estimate("job.sh").total_parameters == {PARAMS_0_16}
            chosen = megatron_memory.megatron_release(config="job.sh")
            assert (chosen.version, chosen.source) == ("0.17.0", "NeMo container nvcr.io/nvidia/nemo:26.04 at job.sh:4")
            assert megatron_memory.estimate("job.sh", megatron_version="main").total_parameters == {PARAMS_MAIN}
    """)
    run(pytester).assert_outcomes(passed=1)
