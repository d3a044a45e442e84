"""cni.stopsignal: the stop the installer's and the reconciler's main loops wait for. Each case runs in
a child process of its own (signal handlers and the wake-up descriptor are the process')."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator

import pytest

from tests.logtee import PYTHONPATH
from tests.nsutil import REPO
from tests.unit.helpers import reaped

BOUND = 60  # seconds: only ever reached when the wait does not wake


@pytest.fixture
def child() -> Iterator[Callable[[str], subprocess.Popen[str]]]:
    """Start a child running `code`; killed at the end if it still runs (a wait that never woke)."""
    with reaped() as procs:

        def start(code: str) -> subprocess.Popen[str]:
            p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, text=True,
                                 env={**os.environ, "PYTHONPATH": PYTHONPATH},
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            procs.append(p)
            return p

        yield start


def test_a_signal_another_thread_took_wakes_the_main_threads_wait_at_once(
    child: Callable[[str], subprocess.Popen[str]],
) -> None:
    """The kernel may hand SIGTERM to any thread (the reconciler runs a metrics server's): the main
    thread's wait wakes all the same, not when its interval ends. (A threading.Event's wait does not:
    only the main thread's own signals interrupt it.)"""
    p = child("""
        import signal, threading, time
        from cni.stopsignal import StopSignal
        stop = StopSignal().install()
        def kill_me():  # once the main thread is (most likely) in its wait; either way it must wake
            time.sleep(0.5)
            signal.pthread_kill(threading.get_ident(), signal.SIGTERM)  # to this thread, not the main one

        t = threading.Thread(target=kill_me)
        start = time.monotonic()
        t.start()
        print(stop.wait(600), round(time.monotonic() - start), flush=True)
    """)
    out, err = p.communicate(timeout=BOUND)
    assert p.returncode == 0, err
    assert out.split()[0] == "True", out


def test_other_signals_wake_the_wait_which_goes_on_and_sigterm_ends_it(
    child: Callable[[str], subprocess.Popen[str]],
) -> None:
    """A storm of a signal with a handler of its own (each writes the wake-up descriptor) neither ends
    nor blocks the wait; SIGTERM afterwards ends it."""
    p = child("""
        import signal, sys, threading
        from cni.stopsignal import StopSignal
        stop = StopSignal().install()
        signal.signal(signal.SIGUSR1, lambda *_: None)

        def check():  # asked once the storm was sent, before SIGTERM
            sys.stdin.readline()
            print("set" if stop.is_set() else "not set", flush=True)

        threading.Thread(target=check, daemon=True).start()
        print("ready", flush=True)
        while not stop.wait(0.001):
            pass
        print("stopped", flush=True)
    """)
    assert p.stdout is not None and p.stdin is not None
    assert p.stdout.readline().strip() == "ready"
    for _ in range(4000):
        os.kill(p.pid, signal.SIGUSR1)
    p.stdin.write("check\n")
    p.stdin.flush()
    assert p.stdout.readline().strip() == "not set"
    os.kill(p.pid, signal.SIGTERM)
    out, err = p.communicate(timeout=BOUND)
    assert (p.returncode, out.strip()) == (0, "stopped"), err


def test_set_and_timeout_in_this_process() -> None:
    from cni.stopsignal import StopSignal

    stop = StopSignal()  # not installed: no handler of this test process changes
    assert stop.wait(0.01) is False and not stop.is_set()
    stop.set()
    assert stop.is_set() and stop.wait(0) is True and stop.wait(10) is True
