"""Frozen value classes for the per-call path, without `dataclasses`.

Every plugin call is a fresh process, and `dataclasses` costs it twice: importing it imports `inspect`
(with ast, dis, tokenize, linecache), and each decorated class compiles six generated methods (11
classes on a macvlan ADD). `valueclass` makes the same kind of class (keyword or positional __init__
with defaults, field(default_factory=...), __eq__, __hash__, __repr__, immutability, __match_args__) with
shared methods and nothing compiled, a fraction of the cost (figures: bundler/README.md).
Type checkers see it as a dataclass (PEP 681 dataclass_transform).

Only what the per-call classes use is supported: no inheritance between value classes, no ordering, no
kw_only, no InitVar/ClassVar. The rest of the code base (the IPAM, the device plugins) keeps using
`dataclasses`; `replace` here works on value classes only."""

from __future__ import annotations

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing would cost every call
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, dataclass_transform
else:

    def dataclass_transform(**_kw):
        return lambda f: f


class FrozenInstanceError(AttributeError):
    """Assigning to a field of a frozen value class instance."""


_MISSING = object()
_CLASSVAR = ("ClassVar", "typing.ClassVar")  # annotations are strings (from __future__ import annotations)


class _Field:
    __slots__ = ("compare", "default", "factory", "repr")

    def __init__(self, default: object, factory: Callable[[], object] | None, *, repr: bool = True,
                 compare: bool = True) -> None:
        self.default, self.factory, self.repr, self.compare = default, factory, repr, compare


def field(*, default: Any = _MISSING, default_factory: Callable[[], Any] | None = None, repr: bool = True,
          compare: bool = True) -> Any:
    """A field's default: a value, or a factory called for each new instance. repr=False keeps it out
    of repr() (secrets), compare=False out of ==, and of hash()."""
    if (default is _MISSING) == (default_factory is None):
        raise TypeError("field() takes exactly one of default and default_factory")
    return _Field(default, default_factory, repr=repr, compare=compare)


def _repr(self: Any) -> str:
    body = ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__valueclass_repr__)
    return f"{type(self).__qualname__}({body})"


def _eq(self: Any, other: Any) -> bool:
    if other.__class__ is not self.__class__:
        return NotImplemented  # type: ignore[no-any-return]
    return all(getattr(self, n) == getattr(other, n) for n in self.__valueclass_compare__)


def _hash(self: Any) -> int:
    return hash(tuple(getattr(self, n) for n in self.__valueclass_compare__))


def _frozen_setattr(self: Any, name: str, value: object) -> None:
    raise FrozenInstanceError(f"cannot assign to field {name!r}")


def _frozen_delattr(self: Any, name: str) -> None:
    raise FrozenInstanceError(f"cannot delete field {name!r}")


def _make_init(cls: type, names: list[str], defaults: dict[str, _Field]) -> None:
    """One generic __init__ per class (positional and keyword arguments, defaults, factories, and the
    TypeErrors a generated one raises). Nothing is compiled: building a class is one closure, where
    generating and compiling its source (as dataclasses does) cost every class, and a whereabouts call
    imports many (docs/benchmarks.md); an instance costs slightly more."""
    specs = tuple((n, defaults.get(n)) for n in names)
    count, qualname, setter = len(specs), f"{cls.__qualname__}.__init__", object.__setattr__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        given = len(args)
        if given > count:
            raise TypeError(f"{qualname}() takes {count + 1} positional arguments but {given + 1} were given")
        for i, (name, spec) in enumerate(specs):
            if i < given:
                if name in kwargs:
                    raise TypeError(f"{qualname}() got multiple values for argument {name!r}")
                value = args[i]
            elif name in kwargs:
                value = kwargs.pop(name)
            elif spec is None:
                raise TypeError(f"{qualname}() missing 1 required positional argument: {name!r}")
            elif spec.factory is not None:
                value = spec.factory()
            else:
                value = spec.default
            setter(self, name, value)
        if kwargs:
            raise TypeError(f"{qualname}() got an unexpected keyword argument {next(iter(kwargs))!r}")

    __init__.__qualname__ = qualname
    cls.__init__ = __init__  # type: ignore[misc]


@dataclass_transform(frozen_default=True, field_specifiers=(field,))
def valueclass[T](cls: type[T] | None = None, /, *, frozen: bool = True) -> Any:
    """Make `cls` (fields declared by annotation, as for a dataclass) a frozen value class;
    `@valueclass(frozen=False)` a mutable one (and, like a mutable dataclass, an unhashable one)."""
    if cls is None:
        return lambda c: _make(c, frozen)
    return _make(cls, frozen)


def _make[T](cls: type[T], frozen: bool) -> type[T]:
    annotations = cls.__dict__.get("__annotations__", {})  # noqa: RUF063 (inspect is what we avoid)
    names = [n for n, kind in annotations.items() if not str(kind).startswith(_CLASSVAR)]
    defaults: dict[str, _Field] = {}
    for n in names:
        if n in cls.__dict__:
            value = cls.__dict__[n]
            defaults[n] = value if isinstance(value, _Field) else _Field(value, None)
            if isinstance(value, _Field) and value.factory is None:
                setattr(cls, n, value.default)
            elif isinstance(value, _Field):
                delattr(cls, n)
        elif defaults:
            raise TypeError(f"{cls.__qualname__}: field {n!r} without a default follows one with a default")
    _make_init(cls, names, defaults)
    ns: Any = cls
    ns.__valueclass_fields__ = tuple(names)
    ns.__valueclass_repr__ = tuple(n for n in names if n not in defaults or defaults[n].repr)
    ns.__valueclass_compare__ = tuple(n for n in names if n not in defaults or defaults[n].compare)
    ns.__match_args__ = tuple(names)  # type: ignore[misc]
    ns.__repr__ = _repr
    ns.__eq__ = _eq
    if frozen:
        ns.__hash__ = _hash
        ns.__setattr__ = _frozen_setattr
        ns.__delattr__ = _frozen_delattr
    else:
        ns.__hash__ = None
    return cls


def replace[T](obj: T, **changes: Any) -> T:
    """A copy of `obj` (a value class instance) with some fields changed (dataclasses.replace)."""
    names: tuple[str, ...] = type(obj).__valueclass_fields__  # type: ignore[attr-defined]
    unknown = set(changes) - set(names)
    if unknown:
        raise TypeError(f"{type(obj).__qualname__} has no field {sorted(unknown)[0]!r}")
    return type(obj)(**{n: changes[n] if n in changes else getattr(obj, n) for n in names})


def fields(obj: object) -> tuple[str, ...]:
    """The field names of a value class (class or instance), in declaration order."""
    cls = obj if isinstance(obj, type) else type(obj)
    return tuple(cls.__valueclass_fields__)  # type: ignore[attr-defined]
