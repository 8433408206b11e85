"""pytest plugin: assert in a test that a Megatron-LM configuration fits in GPU memory.

Installing megatron-estimator registers this plugin (the ``pytest11`` entry point, named
after this module); without installing, enable it with ``-p megatron_estimator.pytest_plugin``
or ``pytest_plugins = ["megatron_estimator.pytest_plugin"]`` in the root conftest.py, which
stay harmless once it is installed.  The plugin gives::

    def test_pretrain_config_fits(megatron_memory):
        megatron_memory.assert_fits("configs/pretrain.yaml", world_size=64)

    @pytest.mark.megatron_gpus("h100", "a100-80gb")     # one test case per GPU: [h100], [a100-80gb]
    def test_fits_on_our_gpus(megatron_memory):
        megatron_memory.assert_fits(["--num-layers", "32", "--hidden-size", "4096", ...])

``megatron_memory.estimate(config, world_size=None, budget=None)`` returns the
``megatron_estimator.results.estimate.Estimate``; ``megatron_memory.assert_fits(...)`` also fails the
test (an ``AssertionError`` from the call) when a stage is over budget or no budget is
configured, with the per-stage table and the verdict in the message.  ``config`` is anything
``megatron_estimator.api.estimate`` reads: a list of Megatron flags, a path to a seed-format
YAML, a Megatron ``--yaml-cfg`` YAML, a launch script or a HuggingFace config.json, or a
mapping of Megatron dests (``num_layers``) or flags (``--num-layers``) to values (relative
paths are read from the current directory, as the library reads them).  Invalid input fails
the test with every problem listed, each with its code.  ``world_size`` overrides the world
size the input implies (a launch script's, a seed YAML's ``world_size``); without either it is
the smallest world the layout needs.  ``environ=`` (keyword) replaces ``os.environ`` as the
job's environment.  ``megatron_memory.verdict(...)`` returns the ``Verdict`` (estimate or
problems) without failing; ``megatron_memory.budget(budget=None)`` returns the ``Budget``
(bytes, source, gpu) a call would use.  The ``megatron_gpu`` fixture is the case's
``GpuSpec`` under the marker, None elsewhere.

Where the budget comes from, the first that gives one wins:

1. the ``budget=`` argument of the call: bytes as an int, or text (``80GiB``, ``80GB``,
   ``81920MiB``; in text a bare number is GiB);
2. the GPU of the test case, for tests marked ``@pytest.mark.megatron_gpus(...)``: its
   capacity as CUDA reports it (``megatron_estimator.megatron.gpus``);
3. ``--megatron-budget SIZE`` on the pytest command line;
4. ``--megatron-gpu NAME`` on the pytest command line (that GPU's capacity);
5. the ``megatron_budget`` ini option (``pytest.ini``, ``[tool.pytest.ini_options]`` in
   pyproject.toml, ``[tool:pytest]`` in setup.cfg, ``tox.ini``);
6. the ``megatron_gpu`` ini option;
7. the project's megatron-estimator settings, read as the CLI reads them
   (``megatron_estimator.settings.load_settings`` from pytest's rootdir):
   ``MEGATRON_ESTIMATOR_BUDGET`` / ``MEGATRON_ESTIMATOR_GPU`` in the environment, then
   ``budget`` / ``gpu`` in ``megatron-estimator.toml`` or ``[tool.megatron-estimator]`` of
   pyproject.toml (a GPU outweighs a budget from a lower source, as on the CLI);
8. none: ``estimate`` reports without a budget and ``assert_fits`` fails saying that no
   budget is configured.

The Megatron-LM release a call checks against (its flags and release-dependent rules), the
first that names one wins: the call's ``megatron_version=`` argument; ``--megatron-version``
on the pytest command line; the ``megatron/core/package_info.py`` of a Megatron-LM tree on
the job's ``PYTHONPATH`` (``environ=``, else ``os.environ``); the ``megatron_version`` ini
option; the ``megatron-version`` setting (``MEGATRON_ESTIMATOR_MEGATRON_VERSION``, then a
config file); a NeMo container tag (``nvcr.io/nvidia/nemo:YY.MM``) in a launch script given as
``config``; else ``main`` (the installed megatron-core is not consulted).
``megatron_memory.megatron_release(megatron_version=None, config=None, environ=None)`` returns that ``ChosenRelease``; each call passes its release to the reading and the check
(``TrainingInput.release``), and its ``Verdict`` names it.

Within one place a budget outweighs a GPU; a GPU named in a higher place outweighs a budget in
a lower one, as in ``megatron_estimator.settings``.  The GPU in force (the first named, in the
same order) also sets the compute capability the overhead estimate assumes.  The other
settings (``cuda-context``, ``nccl-buffers``, ``fragmentation``, ``routing-imbalance``,
``flash-attn``, ``resume``) come
from the project settings as they do for the CLI; ``format`` and ``warn-only`` do not apply.
A bad ``--megatron-budget`` / ``--megatron-gpu`` / ``--megatron-version`` or ini value stops pytest with a usage
error; a bad marker GPU name is a collection error of that test.

Disable the installed plugin with ``-p no:megatron_estimator.pytest_plugin``.  Start-up cost: this module
imports only pytest (and os and typing, which pytest has imported already); the rest of
megatron_estimator is imported when a test uses the fixture or the marker, or when one of the
options is set.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, NamedTuple

import pytest

MARKER = "megatron_gpus"
BUDGET_OPTION = "--megatron-budget"
GPU_OPTION = "--megatron-gpu"
BUDGET_INI = "megatron_budget"
GPU_INI = "megatron_gpu"
VERSION_OPTION = "--megatron-version"
VERSION_INI = "megatron_version"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("megatron-estimator", "Megatron-LM memory budget (megatron-estimator)")
    group.addoption(BUDGET_OPTION, dest="megatron_budget", metavar="SIZE", default=None,
                    help="GPU memory per device for megatron_memory.assert_fits: 80GiB, 80GB, "
                         "81920MiB, or a number of GiB")
    group.addoption(GPU_OPTION, dest="megatron_gpu", metavar="NAME", default=None,
                    help="take the budget for megatron_memory from a known GPU (h100, a100-80gb, "
                         "h200, b200, mi300x, ...)")
    group.addoption(VERSION_OPTION, dest="megatron_version", metavar="X.Y[.Z]", default=None,
                    help="the Megatron-LM release megatron_memory checks against (0.14 to 0.19, or "
                         "main); default: detected from a launched tree, else the settings, else main")
    parser.addini(VERSION_INI, "Megatron-LM release megatron_memory checks against (e.g. 0.16)", default="")
    parser.addini(BUDGET_INI, "GPU memory per device for megatron_memory (e.g. 80GiB)", default="")
    parser.addini(GPU_INI, "GPU whose capacity is the budget for megatron_memory (e.g. h100)", default="")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(*names): run the test once per GPU (catalog names such as h100, a100-80gb, "
        "mi300x); megatron_memory uses that GPU's capacity as the budget",
    )
    if config.option.help or config.option.version:
        return
    config.stash[_RUN_SOURCES] = _run_sources(config)
    config.stash[_RUN_RELEASE] = _run_release(config)


# ---------------------------------------------------------------------------------------
# Budget sources given for the whole run (command line and ini), checked once at start-up.

class BudgetSource(NamedTuple):      # a NamedTuple: cheaper to define at import than a dataclass
    """One place that may give the budget: bytes or a GPU (its capacity), and how to name it."""
    where: str                  # "--megatron-budget 80GiB", "megatron_gpu = h100 in pytest.ini", ...
    bytes: int | None = None
    gpu: Any = None             # megatron_estimator.megatron.gpus.GpuSpec


class Budget(NamedTuple):
    """The budget a call uses: ``bytes`` (None: none configured), where it came from, the GPU in force."""
    bytes: int | None
    source: str | None
    gpu: Any = None             # megatron_estimator.megatron.gpus.GpuSpec, or None


_RUN_SOURCES = pytest.StashKey[tuple]()
_RUN_RELEASE = pytest.StashKey[tuple]()


def _ini_file(config: pytest.Config) -> str:
    return config.inipath.name if config.inipath is not None else "the ini options"


def _run_sources(config: pytest.Config) -> tuple[BudgetSource, ...]:
    """The command-line and ini sources, in precedence order; a bad value is a usage error."""
    ini = _ini_file(config)
    given = [   # (value, is a GPU, location for problems, how a report names it)
        (config.getoption("megatron_budget"), False, BUDGET_OPTION, f"{BUDGET_OPTION} {{}}"),
        (config.getoption("megatron_gpu"), True, GPU_OPTION, f"{GPU_OPTION} {{}}"),
        (config.getini(BUDGET_INI), False, f"{ini} {BUDGET_INI}", f"{BUDGET_INI} = {{}} in {ini}"),
        (config.getini(GPU_INI), True, f"{ini} {GPU_INI}", f"{GPU_INI} = {{}} in {ini}"),
    ]
    given = [(str(value).strip(), is_gpu, location, shown) for value, is_gpu, location, shown in given
             if value is not None and str(value).strip()]
    if not given:
        return ()
    from megatron_estimator.core.problems import InvalidInput

    sources, problems = [], []
    for value, is_gpu, location, shown in given:
        try:
            make = _gpu_source if is_gpu else _bytes_source
            sources.append(make(value, location, shown.format(value)))
        except InvalidInput as error:
            problems.extend(error.problems)
    if problems:
        raise pytest.UsageError(_problem_text("megatron-estimator", problems))
    return tuple(sources)


def _run_release(config: pytest.Config) -> tuple:
    """``(option, ini)``: each a ``(version, source)`` or None; a bad version is a usage error."""
    ini = _ini_file(config)
    given = [(config.getoption("megatron_version"), VERSION_OPTION, VERSION_OPTION),
             (config.getini(VERSION_INI), f"{ini} {VERSION_INI}", f"{VERSION_INI} = {{}} in {ini}")]
    found, problems = [], []
    for value, location, shown in given:
        value = "" if value is None else str(value).strip()
        if not value:
            found.append(None)
            continue
        from megatron_estimator.api import megatron_release_label

        try:
            megatron_release_label(value)
        except ValueError as error:
            from megatron_estimator.core.problems import Problem

            problems.append(Problem("unknown-megatron-version", location, str(error)))
            continue
        found.append((value, shown.format(value)))
    if problems:
        raise pytest.UsageError(_problem_text("megatron-estimator", problems))
    return tuple(found)


def _bytes_source(value: Any, location: str, shown: str) -> BudgetSource:
    """``value`` as a budget (int bytes or text); raises InvalidInput naming ``location``."""
    from megatron_estimator.api import budget_bytes

    return BudgetSource(shown, bytes=budget_bytes(value, location))


def _gpu_source(name: str, location: str, shown: str) -> BudgetSource:
    """The GPU ``name`` means as a budget source; raises InvalidInput naming ``location``."""
    from megatron_estimator.api import lookup_gpu

    return BudgetSource(shown, gpu=lookup_gpu(name, location=location))


# ---------------------------------------------------------------------------------------
# The marker: one test case per GPU.

def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker(MARKER)
    if marker is None:
        return
    names = list(marker.args[0]) if len(marker.args) == 1 and isinstance(marker.args[0], (list, tuple)) \
        else list(marker.args)
    where = f"@pytest.mark.{MARKER} on {metafunc.definition.nodeid}"
    if not names or marker.kwargs:
        pytest.fail(f"{where}: give GPU names as arguments, e.g. @pytest.mark.{MARKER}(\"h100\", "
                    f"\"a100-80gb\")", pytrace=False)
    if "megatron_gpu" not in metafunc.fixturenames:
        if not any(m.name == MARKER for m in metafunc.definition.own_markers):
            return      # a class or module marker: tests there that use no GPU are left alone
        pytest.fail(f"{where}: the test uses neither the megatron_memory nor the megatron_gpu "
                    f"fixture, so the GPUs would change nothing", pytrace=False)
    from megatron_estimator.api import lookup_gpu
    from megatron_estimator.core.problems import InvalidInput

    problems = []
    for name in names:
        if not isinstance(name, str):
            problems.append(f"{name!r} is not a GPU name")
            continue
        try:
            lookup_gpu(name, location=MARKER)
        except InvalidInput as error:
            problems.extend(f"{p.message} [{p.code}]" for p in error.problems)
    if problems:
        pytest.fail(f"{where}:\n" + "\n".join(f"  {p}" for p in problems), pytrace=False)
    metafunc.parametrize("megatron_gpu", names, ids=names, indirect=True)


@pytest.fixture
def megatron_gpu(request: pytest.FixtureRequest):
    """The GPU of this test case (a ``megatron_estimator.megatron.gpus.GpuSpec``) under the
    ``megatron_gpus`` marker; None for tests without it."""
    name = getattr(request, "param", None)
    if name is None:
        return None
    from megatron_estimator.api import lookup_gpu

    return lookup_gpu(name, location=MARKER)


# ---------------------------------------------------------------------------------------
# The fixture.

@pytest.fixture
def megatron_memory(request: pytest.FixtureRequest, megatron_gpu) -> "MegatronMemory":
    """Estimate Megatron-LM memory per pipeline stage and assert that it fits the budget."""
    marker_source = None
    if megatron_gpu is not None:
        marker_source = BudgetSource(f"{MARKER} marker", gpu=megatron_gpu)
    return MegatronMemory(request.config, marker_source)


def _checked(method):
    """``core/argcheck.checked`` on a fixture method, imported at its first call (start-up
    imports only pytest): a wrong argument type is ``InvalidInput`` naming the parameter."""
    import functools

    real = []

    @functools.wraps(method)
    def call(*args, **kwargs):
        __tracebackhide__ = True
        if not real:
            from megatron_estimator.core.argcheck import checked

            real.append(checked(method))
        return real[0](*args, **kwargs)
    return call


class MegatronMemory:
    """What the ``megatron_memory`` fixture gives a test; see the module docstring."""

    def __init__(self, config: pytest.Config, marker_source: BudgetSource | None = None):
        self._config = config
        self._marker_source = marker_source

    def __repr__(self) -> str:
        gpu = f" for {self._marker_source.gpu.name}" if self._marker_source is not None else ""
        return f"<megatron_memory fixture{gpu}>"

    @_checked
    def budget(self, budget: int | str | None = None, *, environ: Mapping[str, str] | None = None) -> Budget:
        """The budget a call with this ``budget`` argument would use, and where it comes from."""
        __tracebackhide__ = True
        resolved, _settings, problems = self._resolve(budget, environ)
        if problems:
            pytest.fail(_problem_text("megatron-estimator settings", problems), pytrace=False)
        return resolved

    @_checked
    def verdict(self, config: Any, world_size: int | None = None, budget: int | str | None = None, *,
                environ: Mapping[str, str] | None = None, suggest: bool = False,
                megatron_version: str | None = None):
        """The ``megatron_estimator.results.estimate.Verdict`` for ``config``; never fails the test.
        With ``suggest``, a refusal carries the nearest changes that fit (``Verdict.suggestions``).
        ``megatron_version`` names the Megatron-LM release to check against (see the module
        docstring for where it comes from otherwise)."""
        resolved, settings, problems = self._resolve(budget, environ)
        chosen, release_problems = self._release(megatron_version, environ, settings, config)
        return self._verdict(config, world_size, resolved, settings,
                             tuple(problems) + release_problems, environ, suggest, chosen)

    def _verdict(self, config, world_size, resolved, settings, problems, environ, suggest, release):
        from megatron_estimator.api import Request, Sourced, load_input, overheads_from_settings, verdict_of

        inp, input_problems = load_input(config, environ=environ, release=release)
        # verdict_of reports the input's problems with whatever validation finds in the rest.
        return verdict_of(Request(
            inp, problems=tuple(problems) + tuple(input_problems),
            world_size=Sourced(world_size, "world_size argument") if world_size is not None else None,
            budget=Sourced(resolved.bytes, resolved.source) if resolved.bytes is not None or resolved.source else None,
            overheads=overheads_from_settings(settings, resolved.gpu), environ=environ, suggest=suggest))

    @_checked
    def megatron_release(self, megatron_version: str | None = None, config: Any = None, *,
                         environ: Mapping[str, str] | None = None):
        """The Megatron-LM release (a ``ChosenRelease``: ``version``, ``source``, ``warning``) a
        call with these arguments checks against; a bad version fails the test."""
        __tracebackhide__ = True
        _resolved, settings, problems = self._resolve(None, environ)
        chosen, release_problems = self._release(megatron_version, environ, settings, config)
        if problems or release_problems:
            pytest.fail(_problem_text("megatron-estimator settings", tuple(problems) + release_problems),
                        pytrace=False)
        return chosen

    @_checked
    def estimate(self, config: Any, world_size: int | None = None, budget: int | str | None = None, *,
                 environ: Mapping[str, str] | None = None, megatron_version: str | None = None):
        """The ``megatron_estimator.results.estimate.Estimate``; invalid input fails the test, listing every problem."""
        __tracebackhide__ = True
        verdict = self.verdict(config, world_size, budget, environ=environ, megatron_version=megatron_version)
        if verdict.estimate is None:
            pytest.fail(_invalid_text(verdict), pytrace=False)
        return verdict.estimate

    @_checked
    def assert_fits(self, config: Any, world_size: int | None = None, budget: int | str | None = None, *,
                    environ: Mapping[str, str] | None = None, megatron_version: str | None = None):
        """Fail the test unless every pipeline stage fits the budget; returns the Estimate."""
        __tracebackhide__ = True
        resolved, settings, problems = self._resolve(budget, environ)
        chosen, release_problems = self._release(megatron_version, environ, settings, config)
        verdict = self._verdict(config, world_size, resolved, settings,
                                tuple(problems) + release_problems, environ, True, chosen)
        return self._judge(verdict)

    def _judge(self, verdict):
        __tracebackhide__ = True
        from megatron_estimator.report.text import gib, render_text

        estimate = verdict.estimate
        if estimate is None:
            raise AssertionError(_invalid_text(verdict))
        if estimate.fits is None:
            raise AssertionError(
                "no GPU memory budget is configured for megatron_memory.assert_fits: pass budget=, "
                f"use @pytest.mark.{MARKER}(...), {BUDGET_OPTION} / {GPU_OPTION}, the {BUDGET_INI} / "
                f"{GPU_INI} ini option, or MEGATRON_ESTIMATOR_BUDGET / MEGATRON_ESTIMATOR_GPU\n\n"
                + render_text([verdict]))
        if not estimate.fits:
            peak = estimate.peak_stage
            raise AssertionError(
                f"OVER BUDGET: {verdict.source}: stage {peak.pipeline_rank} needs "
                f"{gib(peak.device_peak_bytes)} GiB per GPU of the {gib(estimate.budget_bytes)} GiB budget "
                f"({estimate.budget_source})\n\n" + render_text([verdict]))
        return estimate

    # -- release and budget resolution ----------------------------------------------------

    def _release(self, megatron_version, environ, settings, config=None):
        """(ChosenRelease, problems): the call's Megatron release, first match wins."""
        from megatron_estimator.api import choose_megatron_release
        from megatron_estimator.core.problems import Problem

        option, ini = self._config.stash.get(_RUN_RELEASE, (None, None))
        given, given_source = None, None
        if megatron_version is not None:
            given, given_source = str(megatron_version), f"megatron_version={megatron_version!r} argument"
        elif option is not None:
            given, given_source = option
        entry = settings.entry("megatron-version")
        setting = ini if ini is not None else ((entry.value, entry.source) if entry.given else None)
        try:
            launch = [os.fspath(config)] if isinstance(config, (str, os.PathLike)) else ()
            return choose_megatron_release(given, os.environ if environ is None else environ, launch=launch,
                                           setting=setting, given_source=given_source or "--megatron-version"), ()
        except ValueError as error:
            where = given_source or "megatron version"
            return choose_megatron_release(None, {}), (
                Problem("unknown-megatron-version", where, str(error)),)


    def _resolve(self, budget, environ):
        """(Budget, Settings, problems): the call's budget against every configured source."""
        from megatron_estimator.core.problems import InvalidInput
        from megatron_estimator.settings import load_settings

        settings, problems = load_settings({}, environ=os.environ if environ is None else environ,
                                           cwd=str(self._config.rootpath))
        problems = list(problems)
        sources: list[BudgetSource] = []
        if budget is not None:
            try:
                sources.append(_bytes_source(budget, "budget argument", f"budget={budget!r} argument"))
            except InvalidInput as error:
                problems.extend(error.problems)
        if self._marker_source is not None:
            sources.append(self._marker_source)
        sources.extend(self._config.stash.get(_RUN_SOURCES, ()))
        entry = settings.entry("budget")   # settings already put its gpu's capacity here
        if entry.given:
            sources.append(BudgetSource(entry.source, bytes=entry.value, gpu=settings.gpu))
        return _choose(sources), settings, tuple(problems)


def _choose(sources: list[BudgetSource]) -> Budget:
    gpu = next((s.gpu for s in sources if s.gpu is not None), None)
    for source in sources:
        if source.bytes is not None:
            return Budget(source.bytes, source.where, gpu)
        if source.gpu is not None:
            spec = source.gpu
            return Budget(spec.total_memory_bytes, f"{spec.name} capacity ({source.where})", gpu)
    return Budget(None, None, None)


def _problem_text(what: str, problems) -> str:
    count = len(problems)
    lines = [f"{what}: {count} problem{'s' if count != 1 else ''}:"]
    lines += [f"  {p.location}: {p.message} [{p.code}]" for p in problems]
    return "\n".join(lines)


def _invalid_text(verdict) -> str:
    from megatron_estimator.report.text import render_text

    count = len(verdict.problems)
    return (f"invalid Megatron configuration ({verdict.source}): {count} problem{'s' if count != 1 else ''}\n\n"
            + render_text([verdict]))
