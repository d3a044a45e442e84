"""The tests' one bounded wait (tests/waits.py `until`): it fails the test naming what never came, and
it is the only `until` (issue 45: two helpers with opposite contracts, one returning a bool a caller
could forget to assert)."""

from __future__ import annotations

import re
import threading

import pytest

from tests.nsutil import REPO
from tests.waits import until


def test_until_returns_once_true_and_fails_naming_what_never_came() -> None:
    flag = threading.Event()
    threading.Timer(0.05, flag.set).start()
    until(flag.is_set, "the flag set")
    with pytest.raises(AssertionError, match=r"^not within 0\.05 s: the flag cleared$"):
        until(lambda: not flag.is_set(), "the flag cleared", timeout=0.05)
    said: list[str] = []

    def what() -> str:  # computed only on failure (a log, say)
        said.append("log: nothing")
        return said[-1]

    until(flag.is_set, what)
    assert said == []
    with pytest.raises(AssertionError, match="log: nothing"):
        until(lambda: False, what, timeout=0.01)


def test_it_is_the_only_until() -> None:
    defined = [str(p.relative_to(REPO)) for p in (REPO / "tests").rglob("*.py")
               if re.search(r"^\s*def until\b", p.read_text(), re.MULTILINE)]
    assert defined == ["tests/waits.py"]
