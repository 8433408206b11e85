"""core/dataclass.py behaves as the standard ``dataclasses.dataclass``: each class below is
made twice, by the standard decorator and by the project's, and every observable behaviour is
compared between the two (the standard library is the reference, not this module's output)."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from megatron_estimator.core import dataclass as light

DECORATORS = {"standard": (dataclasses.dataclass, dataclasses.field),
              "light": (light.dataclass, light.field)}


def make_classes(kind: str) -> dict[str, type]:
    dataclass, field = DECORATORS[kind]

    @dataclass(frozen=True)
    class Point:
        x: int
        y: int = 0
        tags: tuple = ()
        note: str | None = field(default=None, compare=False)
        hidden: int = field(default=1, repr=False)
        cache: int = field(default=2, hash=False)

    @dataclass
    class Mutable:
        name: str
        items: list = field(default_factory=list)
        table: dict = field(default_factory=dict)

    @dataclass(frozen=True)
    class Single:
        value: float

    @dataclass(frozen=True)
    class Empty:
        pass

    @dataclass(frozen=True, eq=False)
    class Identity:
        a: int

    @dataclass(frozen=True)
    class OwnMethods:
        """Has its own hash and repr."""

        a: int
        b: list = field(default_factory=list)

        def __hash__(self) -> int:
            return hash(self.a)

        def __repr__(self) -> str:
            return "own"

    @dataclass(frozen=True)
    class OwnEq:
        a: int

        def __eq__(self, other):
            return isinstance(other, OwnEq) and other.a % 2 == self.a % 2

    @dataclass(frozen=True)
    class CachedHash:
        a: int

        def __hash__(self) -> int:
            cached = self.__dict__.get("_hash")
            if cached is None:
                cached = hash((self.a, "x"))
                object.__setattr__(self, "_hash", cached)
            return cached

    @dataclass
    class MutableEqFalse:
        a: int = 0
        b: int = 1

    @dataclass(frozen=True)
    class Nested:
        inner: Point
        others: tuple = ()

    @dataclass(order=True, frozen=True)          # an option left to the standard decorator
    class Ordered:
        a: int
        b: int = 0

    return {c.__name__: c for c in (Point, Mutable, Single, Empty, Identity, OwnMethods, OwnEq, CachedHash,
                                    MutableEqFalse, Nested, Ordered)}


STANDARD = make_classes("standard")
LIGHT = make_classes("light")


def both(name):
    return STANDARD[name], LIGHT[name]


CALLS = [
    ("Point", (1,), {}), ("Point", (1, 2), {}), ("Point", (), {"x": 3, "y": 4, "note": "n"}),
    ("Point", (1, 2, ("a",), "note", 5, 6), {}), ("Point", (1,), {"cache": 9}),
    ("Mutable", ("m",), {}), ("Mutable", (), {"name": "m", "items": [1, 2]}), ("Mutable", ("m", [1], {"k": 2}), {}),
    ("Single", (1.5,), {}), ("Single", (float("nan"),), {}), ("Empty", (), {}), ("Identity", (1,), {}),
    ("OwnMethods", (1,), {}), ("OwnMethods", (1, [2]), {}), ("OwnEq", (3,), {}), ("CachedHash", (4,), {}),
    ("MutableEqFalse", (), {}), ("MutableEqFalse", (5,), {"b": 6}), ("Ordered", (1, 2), {}),
]


@pytest.mark.parametrize("name,args,kwargs", CALLS)
def test_instances_behave_alike(name, args, kwargs):
    std_cls, light_cls = both(name)
    a, b = std_cls(*args, **kwargs), light_cls(*args, **kwargs)
    assert repr(a) == repr(b)
    assert vars(a) == vars(b) and list(vars(a)) == list(vars(b))
    a2, b2 = std_cls(*args, **kwargs), light_cls(*args, **kwargs)
    assert (a == a2) == (b == b2)
    assert (a != a2) == (b != b2)
    assert (a == 1) == (b == 1)
    assert b.__eq__(1) is NotImplemented or name == "OwnEq"
    hashable = std_cls.__hash__ is not None
    assert (light_cls.__hash__ is not None) == hashable
    if hashable and name != "Identity":
        assert hash(a) == hash(b)
    if name == "Identity":
        assert a != a2 and b != b2 and hash(b) == object.__hash__(b)
    assert dataclasses.astuple(a) == dataclasses.astuple(b)
    assert dataclasses.asdict(a) == dataclasses.asdict(b)
    assert [(f.name, f.type, f.default, f.default_factory, f.init, f.repr, f.hash, f.compare)
            for f in dataclasses.fields(a)] == \
        [(f.name, f.type, f.default, f.default_factory, f.init, f.repr, f.hash, f.compare)
         for f in dataclasses.fields(b)]
    assert dataclasses.is_dataclass(b) and dataclasses.is_dataclass(light_cls)
    assert repr(copy.deepcopy(b)) == repr(b)
    if name not in ("Identity", "Single"):
        assert copy.deepcopy(b) == b


def test_frozen_instances_refuse_assignment():
    for cls in both("Point"):
        p = cls(1)
        with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'x'"):
            p.x = 2
        with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'other'"):
            p.other = 2
        with pytest.raises(dataclasses.FrozenInstanceError, match="cannot delete field 'x'"):
            del p.x
    for cls in both("Mutable"):
        m = cls("m")
        m.name = "n"
        m.extra = 1
        assert m.name == "n"


def test_replace():
    for cls in both("Point"):
        p = cls(1, 2, note="n")
        q = dataclasses.replace(p, y=5)
        r = light.replace(p, y=5)
        assert q == r and repr(q) == repr(r) == f"{cls.__qualname__}(x=1, y=5, tags=(), note='n', cache=2)"
        with pytest.raises(TypeError):
            light.replace(p, z=1)
    m = LIGHT["Mutable"]("m", [1])
    assert light.replace(m, name="n").items is m.items


def test_defaults_factories_and_class_attributes():
    for cls in both("Mutable"):
        a, b = cls("a"), cls("b")
        assert a.items == [] and a.items is not b.items
        assert not hasattr(cls, "items")
    for cls in both("Point"):
        assert cls.y == 0 and cls.note is None and cls.hidden == 1
        assert cls.__match_args__ == ("x", "y", "tags", "note", "hidden", "cache")
    assert STANDARD["Point"].__doc__ == LIGHT["Point"].__doc__
    assert STANDARD["Mutable"].__doc__ == LIGHT["Mutable"].__doc__
    assert STANDARD["OwnMethods"].__doc__ == LIGHT["OwnMethods"].__doc__
    std, lit = both("OwnMethods")
    assert repr(lit(1)) == "own" and hash(lit(1)) == hash(1) == hash(std(1))
    assert LIGHT["Ordered"](1) < LIGHT["Ordered"](2)


def test_pattern_matching():
    for cls in both("Point"):
        match cls(1, 2):
            case cls(x, y):
                assert (x, y) == (1, 2)


@pytest.mark.parametrize("args,kwargs", [((), {}), ((1, 2, 3, 4, 5, 6, 7), {}), ((1,), {"x": 2}),
                                         ((1,), {"z": 2}), ((), {"y": 1})])
def test_bad_arguments_are_type_errors(args, kwargs):
    std_cls, light_cls = both("Point")
    with pytest.raises(TypeError) as std:
        std_cls(*args, **kwargs)
    with pytest.raises(TypeError) as lit:
        light_cls(*args, **kwargs)
    assert str(lit.value) == str(std.value)


def test_definition_errors_as_the_standard_decorator():
    for dataclass, field in DECORATORS.values():
        with pytest.raises(ValueError, match="mutable default"):
            @dataclass
            class A:
                a: list = []
        with pytest.raises(TypeError, match="non-default argument 'b' follows default argument"):
            @dataclass
            class B:
                a: int = 0
                b: int
        with pytest.raises(TypeError, match="Cannot overwrite attribute __setattr__"):
            @dataclass(frozen=True)
            class C:
                a: int

                def __setattr__(self, name, value):
                    pass
        with pytest.raises(ValueError, match="cannot specify both default and default_factory"):
            field(default=1, default_factory=list)


def test_project_classes_are_light():
    # The records the start-up paths create are this module's (no code compiled at import).
    from megatron_estimator.config.typed import EstimatorConfig
    from megatron_estimator.megatron.flags import FlagSpec
    from megatron_estimator.model.records import StageEstimate

    for cls in (EstimatorConfig, FlagSpec, StageEstimate):
        assert "__light_fields__" in cls.__dict__


def make_named_tuples(base):
    class Tensor(base):
        """A tensor."""

        name: str
        numel: int
        shared: bool = False
        note: str = ""

        @property
        def double(self) -> int:
            return 2 * self.numel

        def label(self) -> str:
            return f"{self.name}:{self.numel}"

    class Bare(base):
        a: int
        b: int

    return Tensor, Bare


def test_named_tuple_as_typing_named_tuple():
    import typing

    std, lit = make_named_tuples(typing.NamedTuple), make_named_tuples(light.NamedTuple)
    for s, t in zip(std, lit):
        assert t.__bases__ == s.__bases__ == (tuple,)
        assert t._fields == s._fields and t._field_defaults == s._field_defaults
        assert t.__doc__ == s.__doc__ and t.__name__ == s.__name__ and t.__qualname__ == s.__qualname__
        assert list(t.__annotations__) == list(s.__annotations__)
    s, t = std[0]("w", 3), lit[0]("w", 3)
    assert repr(s) == repr(t) and s == t and hash(s) == hash(t) and tuple(s) == tuple(t)
    assert t.double == 6 and t.label() == "w:3" and t._replace(numel=4).numel == 4 and t._asdict() == s._asdict()
    assert std[1](1, 2) == lit[1](1, 2) and repr(std[1](1, 2)) == repr(lit[1](1, 2))
    for base in (typing.NamedTuple, light.NamedTuple):
        with pytest.raises(TypeError, match="Non-default namedtuple field b cannot follow default field a"):
            class Bad(base):
                a: int = 0
                b: int
        with pytest.raises(AttributeError, match="Cannot overwrite NamedTuple attribute _replace"):
            class Worse(base):
                a: int

                def _replace(self):
                    pass


def test_hot_methods_behave_alike():
    # A method called HOT_CALLS times is replaced by compiled code: the same behaviour after.
    hot = make_classes("light")
    for name, args, kwargs in CALLS:
        cls = hot[name]
        for _ in range(light.HOT_CALLS + 1):
            a, b = cls(*args, **kwargs), cls(*args, **kwargs)
            _ = a == b
            if cls.__hash__ is not None:
                hash(a)
    assert "<string>" in hot["Point"].__init__.__code__.co_filename
    assert "<string>" in hot["Point"].__hash__.__code__.co_filename
    assert "<string>" in hot["Point"].__eq__.__code__.co_filename
    assert hot["OwnMethods"].__hash__(hot["OwnMethods"](1)) == hash(1)      # written in the class: kept
    for name, args, kwargs in CALLS:
        std_cls, hot_cls = STANDARD[name], hot[name]
        a, b = std_cls(*args, **kwargs), hot_cls(*args, **kwargs)
        assert repr(a) == repr(b) and vars(a) == vars(b) and list(vars(a)) == list(vars(b))
        assert (a == std_cls(*args, **kwargs)) == (b == hot_cls(*args, **kwargs))
        if std_cls.__hash__ is not None and name != "Identity":
            assert hash(a) == hash(b)
        assert b.__eq__(1) is NotImplemented or name == "OwnEq"
    m1, m2 = hot["Mutable"]("m"), hot["Mutable"]("m")
    assert m1.items == [] and m1.items is not m2.items
    for args, kwargs in [((), {}), ((1, 2, 3, 4, 5, 6, 7), {}), ((1,), {"x": 2}), ((1,), {"z": 2}), ((), {"y": 1})]:
        with pytest.raises(TypeError) as std:
            STANDARD["Point"](*args, **kwargs)
        with pytest.raises(TypeError) as lit:
            hot["Point"](*args, **kwargs)
        assert str(lit.value) == str(std.value)
