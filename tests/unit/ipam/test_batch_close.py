"""The agent stopping (ipam.batch.settle_all with close): a window under way ends at once, so what was
answered is written inside the stop's budget; settling without close leaves the windows as they are."""

from __future__ import annotations

import threading

from ipam import batch
from ipam.batch import Combiner


def test_close_ends_a_window_waiting_for_arrivals() -> None:
    comb = Combiner(defer=60.0, idle=60.0)
    waiting, got = threading.Event(), []

    def window() -> None:
        waiting.set()
        got.append(comb.more(10, 600.0))  # no arrival will come: only close() can end this

    t = threading.Thread(target=window, daemon=True)
    t.start()
    assert waiting.wait(30)
    comb.close()
    t.join(60)
    assert not t.is_alive() and got == [[]]
    assert comb.more(10, 600.0) == []  # closed: no other window opens


def test_lull_is_the_idle_given_else_the_default() -> None:
    assert Combiner(defer=1.0, idle=7.0).lull() == 7.0
    assert Combiner(defer=1.0).lull() == batch.IDLE


def test_the_agents_combiners_take_its_idle() -> None:
    batch.share(True, defer=1.0, idle=9.0)
    try:
        assert batch.combiner(("t", "pool")).lull() == 9.0
    finally:
        batch.share(False)
