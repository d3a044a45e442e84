"""The agent's framing protocol (cni.agent.proto) and the shim's decisions (cni.agent.client) against a
scripted fake agent: when it may run a request in-process (never executed by the agent) and when it
must answer code 11 instead (maybe executed)."""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from cni.agent import client, proto
from tests.agentutil import fake_agent, listener
from tests.unit.helpers import until


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    yield a, b
    a.close()
    b.close()


def test_frames_round_trip_across_partial_reads(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    data = proto.frame(proto.STDIN, b"x" * 70000) + proto.frame(proto.GO) + proto.frame(proto.ENV, b"A=1")
    for i in range(0, len(data), 4093):  # split mid-header and mid-payload
        a.sendall(data[i : i + 4093])
    a.close()
    r = proto.Reader(b)
    assert r.read() == (proto.STDIN, b"x" * 70000)
    assert r.read() == (proto.GO, b"")
    assert r.read() == (proto.ENV, b"A=1")
    with pytest.raises(proto.Closed):
        r.read()


def test_file_descriptors_travel_with_the_request(pair: tuple[socket.socket, socket.socket],
                                                  tmp_path: Path) -> None:
    a, b = pair
    (tmp_path / "f").write_text("hello")
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    try:
        proto.send(a, proto.REQUEST, b"head", (fd, fd, fd))
    finally:
        os.close(fd)
    r = proto.Reader(b)
    assert r.read() == (proto.REQUEST, b"head")
    assert len(r.fds) == 3 and len(set(r.fds)) == 3
    assert os.pread(r.fds[0], 5, 0) == b"hello"
    r.close_fds()
    assert r.fds == []


@pytest.mark.parametrize("raw, error", [
    (b"\x00\x00\x00\x00", "bad frame length 0"),
    (b"\x7f\x00\x00\x00Q", "bad frame length"),
    (b"\x00\x00\x00\x01Z", "unknown frame kind"),
    (b"\x00\x00\x00\x05Qab", "closed mid-frame"),
])
def test_malformed_input_is_a_protocol_error(pair: tuple[socket.socket, socket.socket], raw: bytes,
                                             error: str) -> None:
    a, b = pair
    a.sendall(raw)
    a.close()
    with pytest.raises(proto.ProtocolError, match=error):
        proto.Reader(b).read()


def test_expect_rejects_other_kinds(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    proto.send(a, proto.ANSWER, b"0\0")
    with pytest.raises(proto.ProtocolError, match="expected"):
        proto.Reader(b).expect(proto.READY, proto.REFUSED)


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


def call(path: Path) -> tuple[int, bytes]:
    return client.exchange(str(path), "macvlan", "source", "", b'{"cniVersion": "0.4.0"}')


def test_no_socket_is_unreachable(tmp_path: Path) -> None:
    with pytest.raises(client.Unreachable):
        call(tmp_path / "none.sock")


def test_stale_socket_is_unreachable(tmp_path: Path) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(tmp_path / "a.sock"))
    s.close()  # the file stays, nobody listens: ECONNREFUSED
    with pytest.raises(client.Unreachable, match="refused"):
        call(tmp_path / "a.sock")


def test_answer(tmp_path: Path) -> None:
    def script(conn: socket.socket, r: proto.Reader) -> None:
        proto.send(conn, proto.READY)
        r.expect(proto.GO)
        assert len(r.fds) == 3  # netns, stderr, cwd: with GO
        proto.send(conn, proto.ANSWER, b"1\0{\"code\": 7}\n")

    t = fake_agent(tmp_path / "a.sock", script)
    assert call(tmp_path / "a.sock") == (1, b'{"code": 7}\n')
    t.join()


@pytest.mark.parametrize("when", ["refused", "closed-before-ready", "refused-after-go"])
def test_not_taken_means_run_in_process(tmp_path: Path, when: str) -> None:
    def script(conn: socket.socket, r: proto.Reader) -> None:
        if when == "refused":
            proto.send(conn, proto.REFUSED, b"busy")
        elif when == "refused-after-go":
            proto.send(conn, proto.READY)
            r.expect(proto.GO)
            proto.send(conn, proto.REFUSED, b"no GO in time")

    t = fake_agent(tmp_path / "a.sock", script)
    with pytest.raises(client.Unreachable):
        call(tmp_path / "a.sock")
    t.join()


@pytest.mark.parametrize("answer", [None, b"garbage", b"\x00\x00"])
def test_lost_after_go_is_never_run_again(tmp_path: Path, answer: bytes | None) -> None:
    def script(conn: socket.socket, r: proto.Reader) -> None:
        proto.send(conn, proto.READY)
        r.expect(proto.GO)
        if answer is not None:
            conn.sendall(proto.frame(proto.ANSWER, answer)[: 5 + len(answer) // 2])

    t = fake_agent(tmp_path / "a.sock", script)
    with pytest.raises(client.Lost):
        call(tmp_path / "a.sock")
    t.join()


def test_lost_error_speaks_the_config_version() -> None:
    import orjson

    obj = orjson.loads(client.lost_error(b'{"cniVersion": "0.3.1"}', "why"))
    assert obj == {"cniVersion": "0.3.1", "code": 11, "msg": obj["msg"], "details": "why"}
    assert "try again" in obj["msg"]
    assert orjson.loads(client.lost_error(b"not json", ""))["cniVersion"] == "1.1.0"
    assert orjson.loads(client.lost_error(b'{"cniVersion": "9.9.9"}', ""))["cniVersion"] == "1.1.0"


def test_switch_and_socket_path() -> None:
    assert client.socket_path({}) == client.DEFAULT_SOCKET
    assert client.socket_path({"PYCNI_AGENT_SOCKET": "/x.sock"}) == "/x.sock"
    for off in ("off", "0", "false", "OFF"):
        assert client.socket_path({"PYCNI_AGENT": off}) is None


def test_the_shim_waits_for_ready_as_long_as_pycni_agent_timeout_says() -> None:
    from cni.agent.client import READY_TIMEOUT, ready_timeout

    assert ready_timeout({}) == READY_TIMEOUT == 2.0
    assert ready_timeout({"PYCNI_AGENT_TIMEOUT": "30"}) == 30.0
    for bad in ("", "x", "0", "-1", "301", "nan"):
        assert ready_timeout({"PYCNI_AGENT_TIMEOUT": bad}) == READY_TIMEOUT, bad


def test_a_stopped_agent_is_not_waited_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection to a stopped agent (SIGSTOP: the kernel still queues connections in its backlog)
    is given up at once, the agent's pid named, however long PYCNI_AGENT_TIMEOUT would wait for READY."""
    sock = tmp_path / "a.sock"
    agent = listener(sock)
    try:
        assert not proto.stopped(agent.pid)
        agent.send_signal(signal.SIGSTOP)
        assert until(lambda: proto.stopped(agent.pid))
        monkeypatch.setenv(client.TIMEOUT_ENV, "300")
        with pytest.raises(client.Unreachable, match=f"the agent \\(pid {agent.pid}\\) is stopped"):
            call(sock)
    finally:
        agent.send_signal(signal.SIGCONT)
        agent.kill()
        agent.wait()
