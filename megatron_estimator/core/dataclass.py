"""``dataclass``, ``field`` and ``replace`` with the standard library's semantics, built without
compiling code at import time (issue 14: start-up).

``dataclasses.dataclass`` writes each class's ``__init__``, ``__repr__``, ``__eq__``,
``__hash__``, ``__setattr__`` and ``__delattr__`` as source text and compiles it: about 0.6 ms
per class, and importing ``dataclasses`` pulls in ``inspect`` (for the ``__doc__`` signature).
With a hundred record classes that was most of the CLI's start-up.  Here the same methods are
closures over each class's field names, so defining a class costs almost nothing, and
``dataclasses`` is imported only when something asks for it: ``dataclasses.fields``,
``astuple``, ``asdict``, ``replace`` and ``is_dataclass`` work on these classes (their
``__dataclass_fields__`` are real ``dataclasses.Field`` objects, made on first access), and
assigning to a frozen instance raises ``dataclasses.FrozenInstanceError``.

What a class gets is what ``@dataclasses.dataclass`` (Python 3.10 to 3.13) gives it: the
``__init__`` (positional or keyword arguments, defaults, default factories), the ``repr`` of
the fields with ``repr=True`` (guarded against recursion), ``__eq__`` over the fields with
``compare=True`` (same class only, as tuples), the ``__hash__`` the standard table picks
(frozen with eq: the tuple of the compared fields; eq without frozen: unhashable; a
``__hash__`` written in the class is kept), frozen instances' assignment guard, ``__match_args__``
and, when the class has no docstring, ``Name(field: 'type' = default, ...)`` as ``__doc__``.
Methods written in the class body are kept, as the standard decorator keeps them.  Anything
else (``order``, ``unsafe_hash``, ``slots``, ``kw_only``, ``init=False`` fields, ``ClassVar``
or ``InitVar`` annotations, a base class with fields) goes to ``dataclasses.dataclass`` itself.
``tests/test_dataclass.py`` compares each behaviour with the standard decorator's.
"""

from __future__ import annotations

from _thread import get_ident
from operator import attrgetter, itemgetter

__all__ = ["dataclass", "field", "replace", "MISSING", "NamedTuple"]


class _Missing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


MISSING = _Missing()


class _Field:
    """What ``field()`` returns in a class body: the standard ``Field``'s options, until the
    class is decorated."""

    __slots__ = ("name", "type", "default", "default_factory", "init", "repr", "hash", "compare", "metadata",
                 "kw_only")

    def __init__(self, default, default_factory, init, repr, hash, compare, metadata, kw_only):
        self.name = None
        self.type = None
        self.default = default
        self.default_factory = default_factory
        self.init = init
        self.repr = repr
        self.hash = hash
        self.compare = compare
        self.metadata = metadata
        self.kw_only = kw_only


def field(*, default=MISSING, default_factory=MISSING, init=True, repr=True, hash=None, compare=True,
          metadata=None, kw_only=MISSING):
    """``dataclasses.field`` for classes made by this module's ``dataclass``."""
    if default is not MISSING and default_factory is not MISSING:
        raise ValueError("cannot specify both default and default_factory")
    return _Field(default, default_factory, init, repr, hash, compare, metadata, kw_only)


def dataclass(cls=None, /, *, init=True, repr=True, eq=True, order=False, unsafe_hash=False, frozen=False,
              match_args=True, kw_only=False, slots=False, weakref_slot=False):
    """``dataclasses.dataclass``, built without compiling code (see the module docstring)."""
    options = dict(init=init, repr=repr, eq=eq, order=order, unsafe_hash=unsafe_hash, frozen=frozen,
                   match_args=match_args, kw_only=kw_only, slots=slots, weakref_slot=weakref_slot)

    def wrap(cls):
        return _process(cls, options)

    return wrap if cls is None else wrap(cls)


_PLAIN_OPTIONS = dict(order=False, unsafe_hash=False, match_args=True, kw_only=False, slots=False,
                      weakref_slot=False)


def _standard(cls, options):
    """The class through ``dataclasses.dataclass`` itself (options this module leaves to it)."""
    import dataclasses

    for name, value in list(cls.__dict__.items()):
        if isinstance(value, _Field):
            setattr(cls, name, _standard_field(dataclasses, value))
    kwargs = {k: v for k, v in options.items() if k in ("init", "repr", "eq", "order", "unsafe_hash", "frozen")
              or v != _PLAIN_OPTIONS.get(k)}
    return dataclasses.dataclass(cls, **kwargs)


def _standard_field(dataclasses, f: _Field):
    kwargs = dict(init=f.init, repr=f.repr, hash=f.hash, compare=f.compare, metadata=f.metadata)
    if f.default is not MISSING:
        kwargs["default"] = f.default
    if f.default_factory is not MISSING:
        kwargs["default_factory"] = f.default_factory
    if f.kw_only is not MISSING:
        kwargs["kw_only"] = f.kw_only
    return dataclasses.field(**kwargs)


def _is_special(annotation) -> bool:
    """Whether an annotation is ``ClassVar``, ``InitVar`` or ``KW_ONLY`` (what the standard
    decorator treats apart), read as it reads a string annotation: the name it starts with."""
    text = annotation if isinstance(annotation, str) else repr(annotation)
    head = text.split("[", 1)[0].strip().rsplit(".", 1)[-1]
    return head in ("ClassVar", "InitVar", "KW_ONLY") or "_KW_ONLY" in text


def _process(cls, options):
    if (any(options[k] != v for k, v in _PLAIN_OPTIONS.items()) or cls.__bases__ != (object,)
            or "__slots__" in cls.__dict__ or (not options["frozen"] and "__setattr__" in cls.__dict__)):
        return _standard(cls, options)
    annotations = cls.__dict__.get("__annotations__", {})
    own = cls.__dict__
    fields = []
    seen_default = False
    for name, annotation in annotations.items():
        if (type(annotation) is not str or "ClassVar" in annotation or "InitVar" in annotation
                or "KW_ONLY" in annotation) and _is_special(annotation):
            return _standard(cls, options)
        default = own.get(name, MISSING)
        if default is MISSING:
            f = _Field(MISSING, MISSING, True, True, None, True, None, MISSING)
        elif type(default) is _Field:
            f = default
            if not f.init or f.kw_only is not MISSING and f.kw_only:
                return _standard(cls, options)
        elif type(default).__name__ == "Field" and type(default).__module__ == "dataclasses":
            return _standard(cls, options)
        else:
            f = _Field(default, MISSING, True, True, None, True, None, MISSING)
        f.name = name
        f.type = annotation
        if f.default is not MISSING and (isinstance(f.default, (list, dict, set))
                                         or f.default.__class__.__hash__ is None):
            raise ValueError(f"mutable default {type(f.default)} for field {f.name} is not allowed: "
                             "use default_factory")
        if f.default is MISSING and f.default_factory is MISSING:
            if seen_default:
                raise TypeError(f"non-default argument {f.name!r} follows default argument")
        else:
            seen_default = True
        fields.append(f)

    for f in fields:                     # class attributes as the standard decorator leaves them
        if type(own.get(f.name)) is _Field:
            if f.default is MISSING:
                delattr(cls, f.name)
            else:
                setattr(cls, f.name, f.default)

    names = tuple(f.name for f in fields)
    cls.__light_fields__ = tuple(fields)
    cls.__dataclass_fields__ = _LazyFields(cls)
    cls.__dataclass_params__ = _LazyParams(cls, options)
    qualname = cls.__qualname__
    frozen = options["frozen"]
    eq = options["eq"]

    def add(name, function):
        if name not in own:
            function.__qualname__ = f"{qualname}.{function.__name__}"
            setattr(cls, name, function)

    if options["init"]:
        add("__init__", _make_init(cls, fields, frozen))
    if options["repr"]:
        add("__repr__", _make_repr(tuple(f.name for f in fields if f.repr)))
    if eq:
        add("__eq__", _make_eq(cls, tuple(f.name for f in fields if f.compare)))
    if frozen:
        for name, function in (("__setattr__", _make_setattr(cls, frozenset(names))),
                               ("__delattr__", _make_delattr(cls, frozenset(names)))):
            if name in own:
                raise TypeError(f"Cannot overwrite attribute {name} in class {cls.__name__}")
            function.__qualname__ = f"{qualname}.{function.__name__}"
            setattr(cls, name, function)

    class_hash = own.get("__hash__", MISSING)
    explicit_hash = not (class_hash is MISSING or (class_hash is None and "__eq__" in own))
    if not explicit_hash and eq:
        if frozen:
            hashed = tuple(f.name for f in fields if (f.compare if f.hash is None else f.hash))
            function = _make_hash(cls, hashed)
            function.__qualname__ = f"{qualname}.__hash__"
            cls.__hash__ = function
        else:
            cls.__hash__ = None

    if "__match_args__" not in own:
        cls.__match_args__ = names
    if not getattr(cls, "__doc__"):
        cls.__doc__ = _LazyDoc(cls)
    return cls


def _tuple_getter(names):
    """A function returning the tuple of ``names``' values (``attrgetter`` where it already
    returns a tuple)."""
    if len(names) >= 2:
        return attrgetter(*names)
    if len(names) == 1:
        single = attrgetter(names[0])
        return lambda obj: (single(obj),)
    return lambda obj: ()


def _make_init(cls, fields, frozen):
    names = tuple(f.name for f in fields)
    count = len(names)
    known = frozenset(names)
    defaults = {f.name: f.default for f in fields if f.default is not MISSING}
    factories = {f.name: f.default_factory for f in fields if f.default_factory is not MISSING}
    required = sum(1 for f in fields if f.name not in defaults and f.name not in factories)
    qualname = cls.__qualname__

    def bind(args, kwargs):
        """The field values in order, from arguments that are not simply all positional."""
        given = len(args)
        if given > count:
            takes = (f"from {required + 1} to {count + 1} positional arguments" if required < count
                     else f"{count + 1} positional argument{'' if count == 0 else 's'}")
            raise TypeError(f"{qualname}.__init__() takes {takes} but {given + 1} were given")
        for key in kwargs:
            if key not in known:
                raise TypeError(f"{qualname}.__init__() got an unexpected keyword argument {key!r}")
            if key in names[:given]:
                raise TypeError(f"{qualname}.__init__() got multiple values for argument {key!r}")
        values = list(args)
        missing = []
        for name in names[given:]:
            if name in kwargs:
                values.append(kwargs[name])
            elif name in defaults:
                values.append(defaults[name])
            elif name in factories:
                values.append(factories[name]())
            else:
                missing.append(name)
        if missing:
            quoted = [repr(m) for m in missing]
            listed = quoted[0] if len(quoted) == 1 else (
                ", ".join(quoted[:-1]) + (", and " if len(quoted) > 2 else " and ") + quoted[-1])
            raise TypeError(f"{qualname}.__init__() missing {len(missing)} required positional argument"
                            f"{'s' if len(missing) > 1 else ''}: {listed}")
        return values

    by_keyword = itemgetter(*names) if count >= 2 else None
    calls = 0

    def __init__(self, *args, **kwargs):
        nonlocal calls
        calls += 1
        if calls == HOT_CALLS:
            _compile_hot(cls, "__init__", __init__, _init_source(fields, frozen),
                         {"__dataclass_defaults__": defaults, "__dataclass_factories__": factories})
        if kwargs or len(args) != count:
            if by_keyword is not None and not args and len(kwargs) == count and kwargs.keys() == known:
                args = by_keyword(kwargs)
            else:
                args = bind(args, kwargs)
        # object.__setattr__, as the standard decorator's code stores: self.__dict__ would make
        # the instance's attributes slower to read for the rest of its life (Python 3.11+).
        for name, value in zip(names, args):
            _object_setattr(self, name, value)

    return __init__


# A method called this many times is replaced by the standard decorator's own code for it,
# compiled then (as dataclasses writes it): classes made at start-up cost no compiling, the
# few an estimate or a search uses thousands of times run at the standard speed.
HOT_CALLS = 200


def _compile_hot(cls, name, closure, source, namespace):
    """Replace ``cls``'s ``name`` (still ``closure``) by the function ``source`` defines."""
    if cls.__dict__.get(name) is not closure:
        return
    scope = dict(namespace, __dataclass_hash__=hash, __dataclass_not_implemented__=NotImplemented,
                 __dataclass_object_setattr__=_object_setattr)
    exec(source, scope)
    function = scope[name]
    function.__qualname__ = f"{cls.__qualname__}.{name}"
    type.__setattr__(cls, name, function)


def _init_source(fields, frozen: bool) -> str:
    """``__init__`` as the standard decorator writes it: ``object.__setattr__`` stores for a
    frozen class, attribute assignments for another."""
    params, body = ["__dataclass_self__"], []
    for f in fields:
        value = f.name
        if f.default is not MISSING:
            params.append(f"{f.name}=__dataclass_defaults__[{f.name!r}]")
        elif f.default_factory is not MISSING:
            params.append(f"{f.name}=__dataclass_has_factory__")
            value = f"__dataclass_factories__[{f.name!r}]() if {f.name} is __dataclass_has_factory__ else {f.name}"
        else:
            params.append(f.name)
        if frozen:
            body.append(f"    __dataclass_object_setattr__(__dataclass_self__, {f.name!r}, {value})")
        else:
            body.append(f"    __dataclass_self__.{f.name} = {value}")
    return ("__dataclass_has_factory__ = object()\n"
            f"def __init__({', '.join(params)}):\n" + "\n".join(body or ["    pass"]) + "\n")


_object_setattr = object.__setattr__
_repr_running: set = set()


def _make_repr(names):
    getter = _tuple_getter(names)
    labels = tuple(f"{name}=" for name in names)

    def __repr__(self):
        key = (id(self), get_ident())
        if key in _repr_running:
            return "..."
        _repr_running.add(key)
        try:
            inner = ", ".join([label + repr(value) for label, value in zip(labels, getter(self))])
        finally:
            _repr_running.discard(key)
        return f"{self.__class__.__qualname__}({inner})"

    return __repr__


def _fields_tuple(obj: str, names) -> str:
    return "(" + "".join(f"{obj}.{name}," for name in names) + ")"


def _eq_source(names) -> str:
    return ("def __eq__(self, other):\n"
            "    if other.__class__ is self.__class__:\n"
            f"        return {_fields_tuple('self', names)} == {_fields_tuple('other', names)}\n"
            "    return __dataclass_not_implemented__\n")


def _make_eq(cls, names):
    getter = _tuple_getter(names)
    calls = 0

    def __eq__(self, other):
        nonlocal calls
        calls += 1
        if calls == HOT_CALLS:       # the source written only now: most classes never get here
            _compile_hot(cls, "__eq__", __eq__, _eq_source(names), {})
        if other.__class__ is self.__class__:
            return getter(self) == getter(other)
        return NotImplemented

    return __eq__


def _make_hash(cls, names):
    getter = _tuple_getter(names)
    calls = 0

    def __hash__(self):
        nonlocal calls
        calls += 1
        if calls == HOT_CALLS:
            _compile_hot(cls, "__hash__", __hash__,
                         f"def __hash__(self):\n    return __dataclass_hash__({_fields_tuple('self', names)})\n", {})
        return hash(getter(self))

    return __hash__


def _frozen_error(message):
    from dataclasses import FrozenInstanceError

    return FrozenInstanceError(message)


def _make_setattr(cls, names):
    def __setattr__(self, name, value):
        if type(self) is cls or name in names:
            raise _frozen_error(f"cannot assign to field {name!r}")
        super(cls, self).__setattr__(name, value)

    return __setattr__


def _make_delattr(cls, names):
    def __delattr__(self, name):
        if type(self) is cls or name in names:
            raise _frozen_error(f"cannot delete field {name!r}")
        super(cls, self).__delattr__(name)

    return __delattr__


class _LazyFields:
    """``__dataclass_fields__``: the standard ``Field`` objects, made (and stored on the class)
    on first access."""

    def __init__(self, cls):
        self.cls = cls

    def __get__(self, obj, owner):
        import dataclasses

        owner = self.cls
        fields = {}
        for light in owner.__dict__["__light_fields__"]:
            f = _standard_field(dataclasses, light)
            f.name = light.name
            f.type = light.type
            f._field_type = dataclasses._FIELD
            fields[light.name] = f
        type.__setattr__(owner, "__dataclass_fields__", fields)
        return fields


class _LazyParams:
    """``__dataclass_params__``: the standard record of the decorator's options, on first access."""

    def __init__(self, cls, options):
        self.cls = cls
        self.options = options

    def __get__(self, obj, owner):
        from dataclasses import _DataclassParams

        owner = self.cls
        o = self.options
        try:
            params = _DataclassParams(o["init"], o["repr"], o["eq"], o["order"], o["unsafe_hash"], o["frozen"],
                                      o["match_args"], o["kw_only"], o["slots"], o["weakref_slot"])
        except TypeError:       # Python 3.10 and 3.11 record six options
            params = _DataclassParams(o["init"], o["repr"], o["eq"], o["order"], o["unsafe_hash"], o["frozen"])
        type.__setattr__(owner, "__dataclass_params__", params)
        return params


class _LazyDoc:
    """A class's ``__doc__`` when it has no docstring: its name and ``__init__`` signature, as
    the standard decorator writes it (``Name(a: 'int', b: 'str' = 'x')``), made on first access."""

    def __init__(self, cls):
        self.cls = cls

    def __get__(self, obj, owner):
        owner = self.cls
        parts = []
        for f in owner.__dict__["__light_fields__"]:
            text = f"{f.name}: {f.type!r}" if isinstance(f.type, str) else f"{f.name}: {_annotation(f.type)}"
            if f.default is not MISSING:
                text += f" = {f.default!r}"
            elif f.default_factory is not MISSING:
                text += " = <factory>"
            parts.append(text)
        doc = f"{owner.__name__}({', '.join(parts)})"
        type.__setattr__(owner, "__doc__", doc)
        return doc


def _annotation(annotation) -> str:
    if isinstance(annotation, type):
        if annotation.__module__ == "builtins":
            return annotation.__qualname__
        return f"{annotation.__module__}.{annotation.__qualname__}"
    return repr(annotation).replace("typing.", "")


def replace(obj, /, **changes):
    """``dataclasses.replace``: ``obj``'s class made from ``obj``'s fields with ``changes``."""
    light = obj.__class__.__dict__.get("__light_fields__")
    if light is None:
        import dataclasses

        return dataclasses.replace(obj, **changes)
    for f in light:
        if f.name not in changes:
            changes[f.name] = getattr(obj, f.name)
    return obj.__class__(**changes)


_NAMED_TUPLE_PROHIBITED = frozenset({"__new__", "__init__", "__slots__", "__getnewargs__", "_fields", "_field_defaults",
                                     "_make", "_replace", "_asdict", "_source"})
_NAMED_TUPLE_SPECIAL = frozenset({"__module__", "__name__", "__annotations__"})


class _NamedTupleMeta(type):
    """``typing.NamedTuple``'s class syntax, without importing ``typing``: the class is
    ``collections.namedtuple`` of the annotated fields (the trailing ones with defaults), with
    the class body's methods and attributes; its ``__annotations__`` are kept as written (the
    strings of ``from __future__ import annotations``, where typing makes ForwardRefs)."""

    def __new__(mcls, typename, bases, ns):
        if not bases:           # the NamedTuple base itself
            return super().__new__(mcls, typename, bases, ns)
        from collections import namedtuple

        types = ns.get("__annotations__", {})
        default_names = []
        for name in types:
            if name in ns:
                default_names.append(name)
            elif default_names:
                raise TypeError(f"Non-default namedtuple field {name} cannot follow default field"
                                f"{'s' if len(default_names) > 1 else ''} {', '.join(default_names)}")
        made = namedtuple(typename, list(types), defaults=[ns[n] for n in default_names], module=ns["__module__"])
        made.__annotations__ = made.__new__.__annotations__ = dict(types)
        for key in ns:
            if key in _NAMED_TUPLE_PROHIBITED:
                raise AttributeError("Cannot overwrite NamedTuple attribute " + key)
            if key not in _NAMED_TUPLE_SPECIAL and key not in made._fields:
                setattr(made, key, ns[key])
        return made


NamedTuple = type.__new__(_NamedTupleMeta, "NamedTuple", (), {"__module__": __name__})
