"""The agent's framing protocol (cni.agent.proto) and the shim's decisions (cni.agent.client) against a
scripted fake agent: when it may run a request in-process (never executed by the agent) and when it
must answer code 11 instead (maybe executed)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cni import procs
from cni.agent import client, proto
from tests.agentutil import Claimed, fake_agent, listener, make_fifo, read_line
from tests.waits import until


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    r, w = os.pipe()
    yield r, w
    for fd in (r, w):
        with contextlib.suppress(OSError):  # a test closed it
            os.close(fd)


def test_frames_round_trip_across_partial_reads(pipe: tuple[int, int]) -> None:
    r, w = pipe
    data = proto.frame(proto.STDIN, b"x" * 70000) + proto.frame(proto.READY) + proto.frame(proto.ENV, b"A=1")

    def write() -> None:
        for i in range(0, len(data), 4093):  # split mid-header and mid-payload
            proto.write_all(w, data[i : i + 4093])
        os.close(w)

    t = threading.Thread(target=write)
    t.start()
    reader = proto.Reader(r)
    assert reader.read() == (proto.STDIN, b"x" * 70000)
    assert reader.read() == (proto.READY, b"")
    assert reader.read() == (proto.ENV, b"A=1")
    with pytest.raises(proto.Closed):
        reader.read()
    t.join()


@pytest.mark.parametrize("raw, error", [
    (b"\x00\x00\x00\x00", "bad frame length 0"),
    (b"\x7f\x00\x00\x00Q", "bad frame length"),
    (b"\x00\x00\x00\x01Z", "unknown frame kind"),
    (b"\x00\x00\x00\x05Qab", "closed mid-frame"),
])
def test_malformed_input_is_a_protocol_error(pipe: tuple[int, int], raw: bytes, error: str) -> None:
    r, w = pipe
    os.write(w, raw)
    os.close(w)
    with pytest.raises(proto.ProtocolError, match=error):
        proto.Reader(r).read()


def test_expect_rejects_other_kinds(pipe: tuple[int, int]) -> None:
    r, w = pipe
    proto.send(w, proto.ANSWER, b"0\0")
    with pytest.raises(proto.ProtocolError, match="expected"):
        proto.Reader(r).expect(proto.READY, proto.REFUSED)


def test_request_lines() -> None:
    line = proto.request_line(123, 7, 99, 5, -1)
    assert line.endswith(b"\n") and len(line) < proto.MAX_LINE
    assert proto.parse_line(line[:-1]) == (123, 7, 99, 5, -1)
    longest = proto.request_line(2**22, 2**20, 2**64 - 1, 2**20, 2**20)
    assert len(longest) <= proto.MAX_LINE  # always written whole (far below PIPE_BUF)
    for bad in (b"", b"pycni3 1 2 3 4", b"pycni2 1 2 3 4 5", b"pycni3 0 2 3 4 5", b"pycni3 1 2 3 4 -2",
                b"pycni3 1 2 0 4 5", b"pycni3 a 2 3 4 5", b"pycni3 1 2 3 4 5 6"):
        with pytest.raises(proto.ProtocolError, match="not a request line"):
            proto.parse_line(bad)


def test_env_keeps_undecodable_bytes_and_empty_values() -> None:
    env = {b"CNI_IFNAME": b"e\xffth", b"EMPTY": b"", b"CNI_ARGS": b"A=1;B=2"}
    decoded = proto.decode_env(proto.encode_env(env))
    assert decoded == {"CNI_IFNAME": os.fsdecode(b"e\xffth"), "EMPTY": "", "CNI_ARGS": "A=1;B=2"}
    assert proto.decode_env(b"") == {}
    with pytest.raises(proto.ProtocolError):
        proto.decode_env(b"NOEQUALS")


def test_fields() -> None:
    assert proto.split_fields(proto.fields(b"1", b"", b"c"), 3) == [b"1", b"", b"c"]
    with pytest.raises(ValueError):
        proto.fields(b"a\0b")
    with pytest.raises(proto.ProtocolError):
        proto.split_fields(b"a\0b", 3)
    with pytest.raises(ValueError):
        proto.frame(b"?")


# ---- the shim against a scripted agent ---------------------------------------------------------------


@pytest.fixture(autouse=True)
def patient(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shim waits for a scripted agent's word however loaded the machine (tests that are about the
    timeout set their own)."""
    monkeypatch.setenv(client.TIMEOUT_ENV, "120")


def call(path: Path) -> tuple[int, bytes]:
    return client.exchange(str(path), "macvlan", "source", "", b'{"cniVersion": "0.4.0"}')


def test_no_fifo_is_unreachable(tmp_path: Path) -> None:
    with pytest.raises(client.Unreachable, match="No such file"):
        call(tmp_path / "none.fifo")


def test_a_fifo_nobody_reads_is_unreachable_at_once(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "a.fifo")  # an agent that exited without removing it: nobody reads
    with pytest.raises(client.Unreachable, match="No such device"):
        call(tmp_path / "a.fifo")


def test_a_file_that_is_no_fifo_is_unreachable(tmp_path: Path) -> None:
    (tmp_path / "a.fifo").write_text("")
    with pytest.raises(client.Unreachable, match="not a FIFO"):
        call(tmp_path / "a.fifo")


def test_answer(tmp_path: Path) -> None:
    def script(c: Claimed) -> None:
        assert c.pid == os.getpid() and c.podns == -1  # no CNI_NETNS in this test's environment
        head = proto.split_fields(c.frames[0][1], 5)
        assert head[:3] == [proto.VERSION, b"source", b"macvlan"]
        assert c.frames[2] == (proto.STDIN, b'{"cniVersion": "0.4.0"}')
        c.send(proto.READY)
        c.send(proto.ANSWER, b'1\0{"code": 7}\n')

    t = fake_agent(tmp_path / "a.fifo", script)
    assert call(tmp_path / "a.fifo") == (1, b'{"code": 7}\n')
    t.join()


def time_up_after(event: threading.Event) -> Callable[[int, float], bool]:
    """The shim's wait for the agent's first word, as a clock the test controls: its time is up once
    `event` is set (never before), whatever the machine's load."""

    def readable(fd: int, timeout: float) -> bool:
        assert event.wait(60)
        return False

    return readable


@pytest.mark.parametrize("when", ["refused", "closed-before-ready", "refused-after-ready"])
def test_not_taken_means_run_in_process(tmp_path: Path, when: str, monkeypatch: pytest.MonkeyPatch) -> None:
    done = threading.Event()
    if when == "closed-before-ready":  # no word: the shim's time runs out once the agent closed its end
        monkeypatch.setattr(client, "readable", time_up_after(done))

    def script(c: Claimed) -> None:
        if when == "refused":
            c.send(proto.REFUSED, b"busy")
        elif when == "refused-after-ready":
            c.send(proto.READY)
            c.send(proto.REFUSED, b"cannot enter the caller's context")
        c.close()
        done.set()

    t = fake_agent(tmp_path / "a.fifo", script)
    said = {"refused": "agent refused: busy", "closed-before-ready": "no agent took the request in time",
            "refused-after-ready": "agent refused: cannot enter the caller's context"}
    with pytest.raises(client.Unreachable, match=said[when]):
        call(tmp_path / "a.fifo")
    t.join()


@pytest.mark.parametrize("answer", [None, b"garbage", b"\x00\x00"])
def test_lost_after_ready_is_never_run_again(tmp_path: Path, answer: bytes | None) -> None:
    def script(c: Claimed) -> None:
        c.send(proto.READY)
        if answer is not None:
            os.write(c.pipe, proto.frame(proto.ANSWER, answer)[: 5 + len(answer) // 2])

    t = fake_agent(tmp_path / "a.fifo", script)
    with pytest.raises(client.Lost):
        call(tmp_path / "a.fifo")
    t.join()


def test_a_request_no_agent_took_in_time_is_withdrawn_and_can_never_be_taken(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The FIFO is read only after the shim gave up: the request line is there, but its answer pipe is
    gone from /proc/<pid>/fd (or is another pipe by then), so no agent can claim it and run it a second
    time after the caller ran it in-process."""
    from cni.agent import server

    monkeypatch.setenv(client.TIMEOUT_ENV, "0.2")
    fifo = make_fifo(tmp_path / "a.fifo")
    try:
        with pytest.raises(client.Unreachable, match="no agent took the request in time"):
            call(tmp_path / "a.fifo")
        line = read_line(fifo)
    finally:
        os.close(fifo)
    pid, w, inode, _, _ = proto.parse_line(line)
    assert not server.same_pipe(pid, w, inode)
    assert server.claim_request(line) is None


def test_a_request_claimed_while_the_shim_withdraws_is_answered_not_run_twice(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent claimed the request (opened the answer pipe) but said nothing before the shim's time was
    up: the shim withdraws its own end, and since the agent still holds one, waits for its word."""
    from cni.agent import server

    claimed = threading.Event()
    monkeypatch.setattr(client, "readable", time_up_after(claimed))

    def script(c: Claimed) -> None:
        claimed.set()  # the shim's time is up now, not before
        until(lambda: not server.same_pipe(c.pid, c.w, c.inode), "the shim withdrew its request")
        c.send(proto.READY)
        c.send(proto.ANSWER, b"0\0late but once\n")

    t = fake_agent(tmp_path / "a.fifo", script)
    assert call(tmp_path / "a.fifo") == (0, b"late but once\n")
    t.join()


def test_lost_error_speaks_the_config_version() -> None:
    import orjson

    obj = orjson.loads(client.lost_error(b'{"cniVersion": "0.3.1"}', "why"))
    assert obj == {"cniVersion": "0.3.1", "code": 11, "msg": obj["msg"], "details": "why"}
    assert "try again" in obj["msg"]
    assert orjson.loads(client.lost_error(b"not json", ""))["cniVersion"] == "1.1.0"
    assert orjson.loads(client.lost_error(b'{"cniVersion": "9.9.9"}', ""))["cniVersion"] == "1.1.0"


def test_switch_and_fifo_path() -> None:
    assert client.fifo_path({}) == client.DEFAULT_FIFO == "/run/pycni/agent.fifo"
    assert client.fifo_path({"PYCNI_AGENT_FIFO": "/x.fifo"}) == "/x.fifo"
    for off in ("off", "0", "false", "OFF"):
        assert client.fifo_path({"PYCNI_AGENT": off}) is None


def test_the_shim_waits_for_ready_as_long_as_pycni_agent_timeout_says() -> None:
    from cni.agent.client import READY_TIMEOUT, ready_timeout

    assert ready_timeout({}) == READY_TIMEOUT == 2.0
    assert ready_timeout({"PYCNI_AGENT_TIMEOUT": "30"}) == 30.0
    for bad in ("", "x", "0", "-1", "301", "nan"):
        assert ready_timeout({"PYCNI_AGENT_TIMEOUT": bad}) == READY_TIMEOUT, bad


def test_a_stopped_agent_is_not_waited_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stopped agent (SIGSTOP: its FIFO still takes request lines, up to the pipe's capacity) is given
    up at once, the agent's pid (from its lock file) named, however long PYCNI_AGENT_TIMEOUT would wait
    for READY."""
    fifo = tmp_path / "a.fifo"
    agent = listener(fifo)
    try:
        assert not procs.stopped(agent.pid)
        agent.send_signal(signal.SIGSTOP)
        until(lambda: procs.stopped(agent.pid), "the agent stopped (SIGSTOP)")
        monkeypatch.setenv(client.TIMEOUT_ENV, "300")
        with pytest.raises(client.Unreachable, match=f"the agent \\(pid {agent.pid}\\) is stopped"):
            call(fifo)
    finally:
        agent.send_signal(signal.SIGCONT)
        agent.kill()
        agent.wait()


def test_an_agent_in_another_pid_namespace_is_not_offered_the_call(tmp_path: Path) -> None:
    """The agent finds its callers by pid (/proc/<pid>): a shim in another pid namespace (its pid means
    another process there) runs the call in-process at once instead of waiting for a claim that
    cannot come."""
    fifo = make_fifo(tmp_path / "a.fifo")
    try:
        own = os.stat("/proc/self/ns/pid").st_ino
        (tmp_path / "a.fifo.lock").write_text(f"{os.getpid()} {own + 1}\n")
        with pytest.raises(client.Unreachable, match="in another pid namespace"):
            call(tmp_path / "a.fifo")
        (tmp_path / "a.fifo.lock").write_text(f"{os.getpid()} {own}\n")  # the same one: offered
        t = threading.Thread(target=lambda: Claimed(read_line(fifo)).send(proto.REFUSED, b"seen"))
        t.start()
        with pytest.raises(client.Unreachable, match="agent refused: seen"):
            call(tmp_path / "a.fifo")
        t.join()
    finally:
        os.close(fifo)


def test_the_agent_refuses_a_request_of_another_protocol_version(tmp_path: Path) -> None:
    """A shim of another version (an upgrade under way) is told so, and runs the call in-process."""
    from cni.agent import server

    agent = server.Agent(str(tmp_path / "run" / "a.fifo"), "b1", allowed_uids=(os.geteuid(),))
    agent.bind()
    serving = threading.Thread(target=agent.serve, args=(1.0,), daemon=True)
    serving.start()
    memfd = os.memfd_create("request")
    r, w = os.pipe()
    try:
        head = proto.fields(b"2", b"b1", b"macvlan", b"", b"18")
        frames = proto.frame(proto.REQUEST, head) + proto.frame(proto.ENV) + proto.frame(proto.STDIN)
        proto.write_all(memfd, frames)
        fd = os.open(agent.path, os.O_WRONLY | os.O_NONBLOCK)
        os.write(fd, proto.request_line(os.getpid(), w, os.fstat(w).st_ino, memfd, -1))
        os.close(fd)
        kind, payload = proto.Reader(r).read()
        assert kind == proto.REFUSED and payload.startswith(b"malformed request: protocol version b'2'")
    finally:
        for fd in (memfd, r, w):
            os.close(fd)
        agent.stop()
        serving.join(30)
    assert not serving.is_alive() and not os.path.exists(agent.path)


def test_requests_still_in_the_fifo_when_the_agent_stops_are_refused_at_once(tmp_path: Path) -> None:
    """The agent removes its FIFO when it stops; requests already written to it are refused (their shims
    run them in-process at once), not left to time out."""
    from cni.agent import server

    agent = server.Agent(str(tmp_path / "run" / "a.fifo"), "b1", allowed_uids=(os.geteuid(),))
    agent.bind()  # not serving: the request waits in the FIFO
    result: list[BaseException] = []

    def shim() -> None:
        try:
            call(Path(agent.path))
        except client.Unreachable as e:
            result.append(e)

    t = threading.Thread(target=shim)
    t.start()
    until(lambda: client.readable(agent.fifo, 0), "the shim wrote its request line")
    agent.close()
    t.join(30)
    assert [str(e) for e in result] == ["agent refused: the agent is stopping"]
    assert not os.path.exists(agent.path)
