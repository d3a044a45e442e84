"""cni.delegate.run: the IPAM exec without subprocess (posix_spawn and a poll loop) behaves like
subprocess.run(input=..., capture_output=True)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cni.delegate import run


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
