"""cni.types.valueclass: the dataclass stand-in of the per-call path behaves like a frozen dataclass."""

from __future__ import annotations

import copy
from dataclasses import FrozenInstanceError as DataclassFrozen
from dataclasses import dataclass
from dataclasses import field as dc_field

import pytest

from cni.types.valueclass import FrozenInstanceError, field, fields, replace, valueclass


@valueclass
class Point:
    x: int
    y: int = 0
    tags: tuple[str, ...] = ()
    extra: dict[str, int] = field(default_factory=dict)


@valueclass
class Pair:
    a: int
    b: str = ""


@dataclass(frozen=True)
class DcPoint:
    x: int
    y: int = 0
    tags: tuple[str, ...] = ()
    extra: dict[str, int] = dc_field(default_factory=dict)


def test_init_positional_keyword_and_defaults_like_a_dataclass() -> None:
    for cls in (Point, DcPoint):
        p = cls(1, tags=("a",))
        assert (p.x, p.y, p.tags, p.extra) == (1, 0, ("a",), {})
        assert cls(1, 2).y == 2
        with pytest.raises(TypeError):
            cls()  # type: ignore[call-arg]
        with pytest.raises(TypeError):
            cls(1, nope=2)  # type: ignore[call-arg]


def test_factory_gives_each_instance_its_own_value() -> None:
    a, b = Point(1), Point(2)
    a.extra["k"] = 1
    assert b.extra == {}
    assert "extra" not in Point.__dict__  # the factory is no class attribute


def test_equality_hash_and_repr() -> None:
    assert Point(1, 2) == Point(1, 2)
    assert Point(1, 2) != Point(1, 3)
    assert Point(1) != DcPoint(1)
    assert hash(Pair(1, "a")) == hash(Pair(1, "a"))
    assert len({Pair(1), Pair(1), Pair(2)}) == 2
    for unhashable in (Point(1), DcPoint(1)):  # a dict field: neither can be hashed
        with pytest.raises(TypeError, match="unhashable"):
            hash(unhashable)
    assert repr(Point(1, tags=("a",))) == "Point(x=1, y=0, tags=('a',), extra={})"
    assert repr(DcPoint(1, tags=("a",))) == repr(Point(1, tags=("a",))).replace("Point", "DcPoint")


def test_frozen() -> None:
    p = Point(1)
    with pytest.raises(FrozenInstanceError):
        p.x = 2  # type: ignore[misc]
    with pytest.raises(FrozenInstanceError):
        del p.x  # type: ignore[misc]
    with pytest.raises(AttributeError):  # what code catching dataclasses' error catches
        p.y = 3  # type: ignore[misc]
    assert issubclass(DataclassFrozen, AttributeError)


def test_replace_fields_copy_and_match() -> None:
    p = Point(1, 2, extra={"a": 1})
    q = replace(p, y=5)
    assert (q.x, q.y, q.extra) == (1, 5, {"a": 1}) and p.y == 2
    with pytest.raises(TypeError, match="no field 'z'"):
        replace(p, z=1)
    assert fields(Point) == fields(p) == ("x", "y", "tags", "extra")
    assert copy.deepcopy(p) == p
    match p:
        case Point(1, y):
            assert y == 2
        case _:
            pytest.fail("positional match")


def test_a_field_without_default_after_one_with_is_refused() -> None:
    with pytest.raises(TypeError, match="without a default"):
        @valueclass
        class Bad:
            a: int = 0
            b: int  # type: ignore[misc]



@valueclass
class Secretive:
    user: str
    password: str = field(default="", repr=False)
    clock: object = field(default=None, compare=False)


@valueclass(frozen=False)
class Counter:
    seen: set[int] = field(default_factory=set)
    n: int = 0


def test_repr_false_and_compare_false_like_dataclass_fields() -> None:
    s = Secretive("u", "hunter2", clock=1)
    assert "hunter2" not in repr(s) and repr(s) == "Secretive(user='u', clock=1)"
    assert s == Secretive("u", "hunter2", clock=2)  # clock is not compared
    assert hash(s) == hash(Secretive("u", "hunter2", clock=2))
    assert s != Secretive("u", "other")


def test_a_mutable_value_class_can_change_and_is_unhashable() -> None:
    c = Counter()
    c.n += 1
    c.seen.add(3)
    assert c == Counter({3}, 1) and Counter().seen == set()
    with pytest.raises(TypeError, match="unhashable"):
        hash(c)


def test_class_variables_are_no_fields() -> None:
    import typing
    from typing import Any, ClassVar

    @valueclass
    class WithClassVars:
        kind: ClassVar[str] = "k"
        other: typing.ClassVar[int] = 1
        value: Any = None
        spelled: typing.Any = None

    assert fields(WithClassVars) == ("value", "spelled")
    assert WithClassVars(1, 2).kind == "k"
