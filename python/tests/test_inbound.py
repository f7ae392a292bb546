"""What a connection sends before its message ends (SPEC §10.5). libzmq holds the frames of a
message until its last one comes, however many there are: a peer that never sends the last
frame would make the broker hold all it sends. The broker compares, per TCP connection, what
libzmq took off the wire with what came out as whole messages, and cuts a connection that
holds more than 4 x max-message that way on its ROUTER, or more than 1 MiB on its event socket
(where a subscriber sends only its subscriptions).

These tests speak ZeroMQ's wire protocol (ZMTP 3.0) on a plain TCP socket, as such a peer
would: libzmq itself never hands on a message before its last frame, so no ZeroMQ socket can
send one that never ends."""

from __future__ import annotations

import socket
import struct
import time
from typing import Callable, List

import zmq

from conftest import Broker, wait_until
from test_coordinator import RawWorker, uid
from test_flood import rss_mb
from test_limits import answer

MIB = 1 << 20


def zmtp_connect(port: int, socket_type: str) -> socket.socket:
    """A TCP connection through ZMTP's NULL handshake, as a ZeroMQ socket of that type."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\0") + b"\x00"
              + b"\0" * 31)
    greeting = b""
    while len(greeting) < 64:  # the broker's, before anything else is said
        got = s.recv(64 - len(greeting))
        assert got, "the broker closed the connection in the handshake"
        greeting += got
    name, value = b"Socket-Type", socket_type.encode()
    ready = b"\x05READY" + bytes([len(name)]) + name + struct.pack(">I", len(value)) + value
    s.sendall(b"\x04" + bytes([len(ready)]) + ready)
    return s


def frame(data: bytes, more: bool) -> bytes:
    """One ZMTP frame, in its long form."""
    return bytes([0x02 | (0x01 if more else 0)]) + struct.pack(">Q", len(data)) + data


def never_ending(port: int, socket_type: str, chunk: int, total: int, per_second: int,
                 sample: Callable[[], None]) -> int:
    """Sends frames of `chunk` bytes, each with more to come, at most `per_second` bytes a
    second, until `total` bytes are sent; when the broker cuts the connection, connects again
    and goes on. Returns how many times it was cut."""
    data = frame(b"x" * chunk, more=True)
    sent = cuts = 0
    started = time.monotonic()
    while sent < total:
        s = zmtp_connect(port, socket_type)
        try:
            while sent < total:
                s.sendall(data)
                sent += len(data)
                sample()
                ahead = sent / per_second - (time.monotonic() - started)
                if ahead > 0:
                    time.sleep(ahead)
        except (BrokenPipeError, ConnectionResetError):
            cuts += 1
        finally:
            s.close()
    return cuts


def counters(op: RawWorker, n: List[int]) -> dict:
    n[0] += 1
    return answer(op, n[0], verb="status")["counters"]


def test_a_message_that_never_ends_is_cut_and_the_broker_holds_what_it_bounds(closing) -> None:
    b = Broker()
    try:
        op = RawWorker(b.router, "coordinator", id=uid("op"))
        closing(op)
        asked = [0]
        assert counters(op, asked)["hoarding_cut"] == 0
        before = rss_mb(b.proc.pid)
        peak = [before]

        def sample() -> None:
            peak[0] = max(peak[0], rss_mb(b.proc.pid))

        # 384 MiB at 64 MiB/s, in frames of 256 KiB that never end a message: without the
        # bound the broker holds all of it; with it, 4 MiB per connection plus what came
        # before the next sweep (every 100 ms).
        cuts = never_ending(b.router_port, "DEALER", 256 * 1024, 384 * MIB, 64 * MIB, sample)
        grew = peak[0] - before
        print(f"\na message that never ends, 384 MiB sent: cut {cuts} times, broker RSS "
              f"{before:.1f} MiB before, +{grew:.1f} MiB at the peak")
        assert cuts >= 1
        assert grew < 128, (before, peak[0])
        # Every cut is counted and logged, and a session of a peer that plays by the rules
        # goes on through it all.
        assert wait_until(lambda: counters(op, asked)["hoarding_cut"] >= cuts, 10)
        assert any("bytes that make no whole message" in line for line in b.lines), b.lines[-5:]
        op.send("HEARTBEAT")
        op.expect("HEARTBEAT")
    finally:
        b.stop()


def test_a_long_message_sent_slowly_is_served_whole(closing) -> None:
    """A whole message as long as the rules let it be (3 frames of max-message) that takes a
    few seconds to come, many sweeps, is not cut: the broker reads it and answers it."""
    b = Broker(["--max-message", str(MIB)])
    try:
        op = RawWorker(b.router, "coordinator", id=uid("op"))
        closing(op)
        s = zmtp_connect(b.router_port, "DEALER")
        try:
            message = b"".join(frame(b"y" * MIB, more=i < 2) for i in range(3))
            for i in range(0, len(message), 64 * 1024):  # about 2.4 s
                s.sendall(message[i:i + 64 * 1024])
                time.sleep(0.05)
            # The broker refuses it (it is no rlbus message): an ERROR comes back, so the
            # connection is open and the message was read whole.
            heard = b""
            deadline = time.monotonic() + 30
            while b"RL" not in heard:
                assert time.monotonic() < deadline, heard
                got = s.recv(65536)
                assert got, "the broker cut the connection"
                heard += got
        finally:
            s.close()
        assert counters(op, [0])["hoarding_cut"] == 0
    finally:
        b.stop()


def test_the_event_socket_cuts_a_subscription_that_never_ends(closing) -> None:
    b = Broker()
    ctx = zmq.Context()
    try:
        op = RawWorker(b.router, "coordinator", id=uid("op"))
        closing(op)
        events_port = int(b.events.rsplit(":", 1)[1])
        # Frames of 1 KiB (a subscription may be no longer) that never end one: cut past
        # 1 MiB, long before 64 MiB are sent.
        asked = [0]
        cuts = never_ending(events_port, "SUB", 1024, 64 * MIB, 16 * MIB, lambda: None)
        assert cuts >= 1
        assert wait_until(lambda: counters(op, asked)["hoarding_cut"] >= cuts, 10), cuts
        # A subscriber that plays by the rules hears the broker's events.
        sub = ctx.socket(zmq.SUB)
        sub.linger = 0
        sub.subscribe(b"coordinator.joined")
        sub.connect(b.events)
        heard = []

        def joined() -> bool:
            closing(RawWorker(b.router, "coordinator", id=uid("late")))
            if sub.poll(500):
                heard.append(sub.recv_multipart())
            return bool(heard)
        assert wait_until(joined, 15)
        sub.close()
    finally:
        ctx.term()
        b.stop()
