"""cni.delegate.run: the IPAM exec without subprocess (posix_spawn and a poll loop) behaves like
subprocess.run(input=..., capture_output=True)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from cni.delegate import Bound, Killed, run
from tests.waits import until

DAY = 86400
ENV = {"PATH": os.defpath}


def script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "plugin"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def test_stdin_stdout_stderr_exit_code_and_env(tmp_path: Path) -> None:
    binary = script(tmp_path, 'cat; echo "to stderr $CNI_COMMAND" >&2; exit 3\n')
    rc, out, err = run(binary, b'{"cniVersion":"1.0.0"}', {"CNI_COMMAND": "ADD", "PATH": os.defpath})
    assert (rc, out, err) == (3, b'{"cniVersion":"1.0.0"}', b"to stderr ADD\n")


def test_large_streams_both_ways_do_not_deadlock(tmp_path: Path) -> None:
    """More than a pipe buffer in, out and on stderr at once."""
    binary = script(tmp_path, "tee /dev/stderr\n")
    data = os.urandom(3 * 2**20)
    rc, out, err = run(binary, data, {"PATH": os.defpath})
    assert rc == 0 and out == data and err == data


def test_a_child_that_does_not_read_its_stdin(tmp_path: Path) -> None:
    binary = script(tmp_path, "echo done\n")
    assert run(binary, b"x" * 2**20, {"PATH": os.defpath}) == (0, b"done\n", b"")


def test_empty_stdin_and_signals_reset_for_the_child(tmp_path: Path) -> None:
    """Python ignores SIGPIPE; the exec'd plugin gets the default back (as with subprocess)."""
    binary = script(tmp_path, "grep SigIgn /proc/self/status\n")
    rc, out, _ = run(binary, b"", {"PATH": os.defpath})
    ignored = int(out.split()[1], 16)
    assert rc == 0 and not ignored & (1 << (13 - 1))  # SIGPIPE


def test_killed_child_and_missing_binary(tmp_path: Path) -> None:
    binary = script(tmp_path, "kill -9 $$\n")
    assert run(binary, b"", {"PATH": os.defpath})[0] == -9 == subprocess.run([binary], check=False).returncode
    with pytest.raises(OSError) as info:
        run(str(tmp_path / "absent"), b"{}", {})
    assert info.value.errno == errno.ENOENT


def test_no_descriptor_leaks(tmp_path: Path) -> None:
    binary = script(tmp_path, "cat\n")
    before = set(os.listdir("/proc/self/fd"))
    for _ in range(20):
        run(binary, b"abc", {"PATH": os.defpath})
    with pytest.raises(OSError):
        run(str(tmp_path / "absent"), b"{}", {})
    assert set(os.listdir("/proc/self/fd")) == before


def test_only_stdio_reaches_the_child(tmp_path: Path) -> None:
    """An inheritable descriptor of ours (say, one received over the agent's socket) is not passed on."""
    binary = script(tmp_path, "ls /proc/self/fd\n")
    r, w = os.pipe()
    os.set_inheritable(w, True)
    try:
        rc, out, _ = run(binary, b"", {"PATH": os.defpath})
    finally:
        os.close(r)
        os.close(w)
    assert rc == 0 and sorted(int(x) for x in out.split()) == [0, 1, 2, 3]  # 3: ls's own listing


def test_runtime_env_drops_what_the_bootloader_added() -> None:
    from cni.delegate import runtime_env

    home = "/opt/cni/bin/pycni"
    frozen = {"PATH": "/bin", "_PYI_ARCHIVE_FILE": f"{home}/pycni", "_PYI_PARENT_PROCESS_LEVEL": "1",
              "_PYI_APPLICATION_HOME_DIR": f"{home}/_internal",
              "LD_LIBRARY_PATH": f"{home}/_internal:/opt/rt/lib", "LD_LIBRARY_PATH_ORIG": "/opt/rt/lib"}
    assert runtime_env(frozen) == {"PATH": "/bin", "LD_LIBRARY_PATH": "/opt/rt/lib"}
    no_orig = {k: v for k, v in frozen.items() if k != "LD_LIBRARY_PATH_ORIG"}
    assert runtime_env(no_orig) == {"PATH": "/bin"}
    source = {"PATH": "/bin", "LD_LIBRARY_PATH": "/opt/rt/lib"}  # not frozen: untouched
    assert runtime_env(source) == source and runtime_env(source) is not source


def test_closed_stdio_falls_back_to_subprocess_without_leaking(tmp_path: Path) -> None:
    """With fd 0 closed, os.pipe() hands out 0: run() must not dup2 over its own pipes."""
    binary = script(tmp_path, "cat; echo err >&2\n")
    code = ("import os, sys; from cni.delegate import run; os.close(0);"
            f"before = sorted(os.listdir('/proc/self/fd')); r = run({binary!r}, b'in', {{}});"
            "after = sorted(os.listdir('/proc/self/fd')); print(r == (0, b'in', b'err\\n'), before == after)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=str(Path(__file__).resolve().parents[2]))
    assert out.stdout.split() == ["True", "True"], out.stderr


# ---- bounded by the caller (the agent: cni.delegate.Bound) --------------------------------------------


@pytest.fixture
def caller() -> Iterator[list[int]]:
    """[r, w]: a pipe standing for a shim's answer pipe (the agent watches w; r is the shim's end)."""
    fds = list(os.pipe())
    yield fds
    for fd in fds:
        if fd >= 0:
            os.close(fd)


def running(pid: str) -> bool:
    """Whether `pid` runs (a zombie has exited: the killed grandchild waits for init to reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def reaped(pid: str) -> bool:
    try:
        os.waitpid(int(pid), os.WNOHANG)
    except ChildProcessError:
        return True
    return False


def test_a_bounded_run_answers_as_an_unbounded_one(tmp_path: Path, caller: list[int]) -> None:
    binary = script(tmp_path, 'cat; echo "to stderr" >&2; exit 3\n')
    before = set(os.listdir("/proc/self/fd"))
    bound = Bound(caller[1], 60)
    for _ in range(5):
        assert run(binary, b"in", ENV, bound) == (3, b"in", b"to stderr\n")
    closes = script(tmp_path, "cat; exec >&- 2>&-; sleep 0.2\n")  # its output ends before it does
    assert run(closes, b"x", ENV, bound) == (0, b"x", b"")
    assert not bound.gone and set(os.listdir("/proc/self/fd")) == before


def test_a_bounded_child_dies_with_its_process_group_when_its_caller_goes_away(
        tmp_path: Path, caller: list[int]) -> None:
    """Issue 45: an IPAM that would sleep for a day in a child of its own. Once the caller's end of the
    answer pipe closes (the runtime killed the shim), the IPAM and its child are killed, the IPAM is
    reaped, and the call fails with code 11; nothing else is started for that caller."""
    marks = tmp_path / "marks"
    binary = script(tmp_path, f'sleep {DAY} &\necho "$$ $!" > {marks}.tmp\nmv {marks}.tmp {marks}\nwait\n')
    bound = Bound(caller[1], 3600)

    def shim_killed() -> None:
        until(marks.exists, "the IPAM started")
        os.close(caller[0])
        caller[0] = -1

    killer = threading.Thread(target=shim_killed)
    killer.start()
    with pytest.raises(Killed) as info:
        run(binary, b"{}", ENV, bound)
    killer.join()
    assert info.value.code == 11 and info.value.msg == f"{Path(binary).name} killed: the caller went away " \
        "(the runtime gave up on the call)"
    assert bound.gone
    ipam, child = marks.read_text().split()
    assert reaped(ipam)
    until(lambda: not running(child), "the IPAM's child killed with it")
    touched = tmp_path / "touched"
    with pytest.raises(Killed) as info:
        run(script(tmp_path, f"touch {touched}\n"), b"", ENV, bound)
    assert info.value.msg.endswith("not started: the caller went away (the runtime gave up on the call)")
    assert not touched.exists()


@pytest.mark.parametrize("body", [f"exec sleep {DAY}\n", f"exec >&- 2>&-\nexec sleep {DAY}\n"],
                         ids=["silent", "output closed"])
def test_a_bounded_child_is_killed_at_its_limit(tmp_path: Path, caller: list[int], body: str) -> None:
    """The documented limit (the agent's --ipam-timeout): also for a child that closed its output and
    runs on (its exit is what is waited for then)."""
    bound = Bound(caller[1], 0.2)
    before = set(os.listdir("/proc/self/fd"))
    with pytest.raises(Killed) as info:
        run(script(tmp_path, body), b"{}", ENV, bound)
    assert info.value.code == 11 and info.value.msg == "plugin killed: no answer within 0.2 s"
    assert not bound.gone and set(os.listdir("/proc/self/fd")) == before
