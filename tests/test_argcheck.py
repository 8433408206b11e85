"""Wrong argument types at the Python fronts (issue 30): every public function of the API and
every method of the ``megatron_memory`` fixture turns them into ``InvalidInput`` with one
problem located at the parameter's name (core/argcheck.py), never a TypeError or
AttributeError from deep inside."""

from __future__ import annotations

import inspect
import types
import typing
from pathlib import Path

import pytest

from megatron_estimator import api
from megatron_estimator.core.argcheck import checked
from megatron_estimator.core.problems import InvalidInput
from megatron_estimator.pytest_plugin import MegatronMemory

API = ["estimate", "evaluate", "load_input", "input_from_flags", "input_from_model", "input_from_launch",
       "input_from_mapping", "input_from_file", "input_from_log", "with_options", "plan", "plan_input",
       "planned_layouts", "compare_log", "budget_bytes", "lookup_gpu", "flash_attn_version",
       "not_a_training_input", "megatron_release_label", "world_size_for", "choose_megatron_release",
       "verdict_of", "suggest_changes"]
FIXTURE = ["budget", "verdict", "megatron_release", "estimate", "assert_fits"]
# Parameters that take any value on purpose: the input itself (a path, flags or a mapping, told
# apart by the body), and estimate's world_size and budget, whose values are checked with the
# configuration's problems, all at once (test_api.py).
ANY = {("estimate", "world_size"), ("estimate", "budget")}


def _fixture() -> MegatronMemory:
    return MegatronMemory(types.SimpleNamespace(stash={}, rootpath=Path.cwd()))


def _parameters(function, skip_self=False):
    hints = typing.get_type_hints(inspect.unwrap(function))
    for name, param in inspect.signature(function).parameters.items():
        if name == "self" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        yield name, hints.get(name, typing.Any)


CASES = [(f"api.{f}", name) for f in API for name, hint in _parameters(getattr(api, f))
         if (f, name) not in ANY and (hint is not typing.Any or name in ("overheads",))]
CASES += [(f"fixture.{m}", name) for m in FIXTURE for name, hint in _parameters(getattr(MegatronMemory, m))
          if hint is not typing.Any]


def _call(target: str, **kwargs):
    where, name = target.split(".")
    function = getattr(api, name) if where == "api" else getattr(_fixture(), name)
    return function(**kwargs)


def _required(target: str) -> dict:
    """The required parameters, each a value of the right shape that reads nothing: the
    checker refuses the wrong one before the body runs, so these are never used."""
    where, name = target.split(".")
    function = getattr(api, name) if where == "api" else getattr(MegatronMemory, name)
    filler = {"inp": None, "flags": [], "argv": [], "settings": {}, "path": "x.yaml", "config": [], "model": None,
              "world_size": 8, "global_batch_size": 8, "value": 1, "name": "h100", "text": "0.16",
              "problems": [], "options": [], "request": None, "refused": None}
    return {n: filler[n] for n, p in inspect.signature(function).parameters.items()
            if n != "self" and p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


# Values no parameter of the fronts takes: bytes (paths are str or os.PathLike) and a plain
# object (no annotation names ``object``); each parameter's own hint is not consulted.
@pytest.mark.parametrize("wrong", [b"config.yaml", object()], ids=["bytes", "object"])
@pytest.mark.parametrize("target, parameter", CASES, ids=[f"{t}-{p}" for t, p in CASES])
def test_a_wrong_type_is_invalid_input_at_the_parameter(target, parameter, wrong):
    kwargs = _required(target)
    kwargs[parameter] = wrong
    with pytest.raises(InvalidInput) as raised:
        _call(target, **kwargs)
    locations = [p.location for p in raised.value.problems]
    assert parameter in locations
    [problem] = [p for p in raised.value.problems if p.location == parameter]
    assert problem.code == "wrong-argument-type" and type(wrong).__name__ in problem.message


def test_every_public_function_of_the_api_is_checked():
    # the public names of api.__all__ that are functions taking arguments: each is covered above
    functions = {name for name in api.__all__ if inspect.isfunction(getattr(api, name))}
    # exec_launch and overheads_from_settings take any value (a launch command, a Settings or
    # None); seed_options takes no argument
    unchecked = {"exec_launch", "overheads_from_settings", "seed_options"}
    assert functions - unchecked <= set(API), functions - unchecked - set(API)
    assert all(hasattr(getattr(api, name), "__wrapped__") for name in API)       # @checked or checked(...)
    assert all(hasattr(getattr(MegatronMemory, name), "__wrapped__") for name in FIXTURE)


@pytest.mark.parametrize("call, location, words", [
    # the element at fault is named: item 1 of the flags is None
    (lambda: api.input_from_flags(["--num-layers", None]), "argv", "item 1 is NoneType"),
    # a mapping's value of the wrong type: environ's values are str
    (lambda: api.estimate(["--num-layers", "2"], environ={"WORLD_SIZE": 8}), "environ", "value of 'WORLD_SIZE' is int"),
    # a str is a sequence of str to Python, not a list of flags
    (lambda: api.plan_input("llama3-8b", extra_flags="--seq-length 128"), "extra_flags", "is str"),
    # True is an int to Python, never a count here
    (lambda: api.plan("llama3-8b", world_size=True, global_batch_size=8), "world_size", "is bool"),
    (lambda: api.compare_log(None), "path", "is NoneType"),
    (lambda: _fixture().verdict([], world_size="8"), "world_size", "is str"),
    (lambda: _fixture().budget(environ={"MEGATRON_ESTIMATOR_BUDGET": None}), "environ", "is NoneType"),
    (lambda: _fixture().megatron_release(16), "megatron_version", "is int"),
])
def test_the_problem_names_the_parameter_and_what_is_wrong(call, location, words):
    with pytest.raises(InvalidInput) as raised:
        call()
    [problem] = raised.value.problems
    assert problem.location == location and words in problem.message, problem


def test_every_wrong_argument_is_reported_at_once():
    with pytest.raises(InvalidInput) as raised:
        api.plan(3, world_size="8", global_batch_size=None, top=1.5, environ=[])
    assert [p.location for p in raised.value.problems] == ["world_size", "global_batch_size", "top", "environ"]


def test_wrong_values_of_the_right_type_are_located_too():
    # a release that is no Megatron version, a missing model, an empty path: located problems
    with pytest.raises(InvalidInput) as raised:
        api.input_from_flags(["--num-layers", "2"], release="nope")
    assert [p.location for p in raised.value.problems] == ["release"]
    with pytest.raises(InvalidInput) as raised:
        api.input_from_model(["--num-layers", "2"])
    assert [p.location for p in raised.value.problems] == ["model"]
    _, problems = api.input_from_file("")
    assert [(p.code, p.location) for p in problems] == [("bad-path", '""')]
    # an empty location= falls back to the parameter's own default
    with pytest.raises(InvalidInput) as raised:
        api.lookup_gpu("nope", location="")
    assert [p.location for p in raised.value.problems] == ["--gpu"]
    with pytest.raises(InvalidInput) as raised:
        api.budget_bytes([None], location=" ")
    assert [p.location for p in raised.value.problems] == ["budget"]


def test_the_checker_reads_the_annotations():
    @checked
    def f(a: int, b: "list[str] | None" = None, c: dict[str, int] = None, d: tuple[int, str] = (1, "x")):  # noqa: RUF013
        return a

    assert f(1, ["x"], {"k": 1}, (2, "y")) == 1
    for kwargs, location, words in (({"a": 1.0}, "a", "is float"), ({"a": 1, "b": "x"}, "b", "is str"),
                                    ({"a": 1, "c": {"k": "1"}}, "c", "value of 'k' is str"),
                                    ({"a": 1, "d": (1,)}, "d", "has 1 items, not 2"),
                                    ({"a": 1, "d": (1, 2)}, "d", "item 1 is int")):
        with pytest.raises(InvalidInput) as raised:
            f(**kwargs)
        [problem] = raised.value.problems
        assert problem.location == location and words in problem.message
    with pytest.raises(InvalidInput) as raised:
        f(1, 2, 3, 4, 5)          # a call that binds no signature is located at the function
    assert raised.value.problems[0].code == "wrong-arguments"
