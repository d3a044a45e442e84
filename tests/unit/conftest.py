"""Unit-test fixtures: a fake plugin registered with skel, log state restored after each test."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

from cni import log
from cni.registry import PLUGINS
from tests.unit.helpers import FAKE, FakePlugin


@pytest.fixture(autouse=True)
def _reset_log() -> Iterator[None]:
    saved = log._STATE.get()
    yield
    opened = log._STATE.get().file
    log._STATE.set(saved)
    if opened is not None and opened != saved.file:
        os.close(opened[1])


@pytest.fixture
def plugin(monkeypatch: pytest.MonkeyPatch) -> FakePlugin:
    fake = FakePlugin()
    mod = fake.module()
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    monkeypatch.setitem(PLUGINS, FAKE, mod.__name__)
    return fake
