"""A fault-injecting TCP proxy in front of a NameNode: loses the answer to chosen Hadoop RPC calls.

Hadoop RPC on a connection: a 7-byte preamble (``hrpc``, version, service class, auth
protocol), then frames of a 4-byte big-endian length and a payload. A request's payload is
three varint-delimited protobufs: ``RpcRequestHeaderProto``, ``RequestHeaderProto`` (field 1:
the method name, e.g. ``rename2``) and the request; a response's is its header and answer.

For a :class:`Rule` that fires, the proxy forwards the request, waits for the NameNode's answer
(so the call took effect), throws the answer away and closes both connections: the client sees
its connection drop with the call in flight, exactly a lost answer. ``Action.RESET`` drops the
connection without forwarding (the call never reached the NameNode). The DataNodes are reached
directly (the NameNode names them), so only NameNode calls pass here. Standard library only.
"""

from __future__ import annotations

import contextlib
import enum
import socket
import struct
import threading
from dataclasses import dataclass, field

__all__ = ["Action", "NameNodeProxy", "Rule", "method_of"]

PREAMBLE = 7


class Action(enum.StrEnum):
    LOSE_ANSWER = "lose_answer"  # forward, read the answer, drop it and the connection
    RESET = "reset"  # drop the connection without forwarding


@dataclass
class Rule:
    method: str  # e.g. "rename2", "create", "complete"
    action: Action = Action.LOSE_ANSWER
    times: int = 1  # how many calls it fires for
    fired: int = 0


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def method_of(payload: bytes) -> str | None:
    """The method name of a request frame's payload (None for the connection context etc.)."""
    try:
        size, pos = _varint(payload, 0)
        pos += size  # RpcRequestHeaderProto
        size, pos = _varint(payload, pos)
        header = payload[pos : pos + size]
        if not header or header[0] != 0x0A:  # field 1, length-delimited: methodName
            return None
        length, start = _varint(header, 1)
        return header[start : start + length].decode()
    except (IndexError, UnicodeDecodeError):
        return None


def _read_exactly(sock: socket.socket, n: int) -> bytes | None:
    chunks = bytearray()
    while len(chunks) < n:
        try:
            chunk = sock.recv(n - len(chunks))
        except OSError:
            return None
        if not chunk:
            return None
        chunks += chunk
    return bytes(chunks)


def _read_frame(sock: socket.socket) -> bytes | None:
    head = _read_exactly(sock, 4)
    if head is None:
        return None
    body = _read_exactly(sock, struct.unpack(">I", head)[0])
    return None if body is None else head + body


@dataclass
class _Link:
    client: socket.socket
    upstream: socket.socket
    swallow: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)

    def close(self) -> None:
        for sock in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()


class NameNodeProxy:
    """``hdfs://127.0.0.1:<port>`` that forwards to ``target_port`` and applies :attr:`rules`."""

    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self.rules: list[Rule] = []
        self.methods: list[str] = []  # every method seen, in order
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._server.getsockname()[1])
        self._links: list[_Link] = []
        self._stopped = False
        threading.Thread(target=self._accept, daemon=True, name="nn-proxy").start()

    @property
    def url(self) -> str:
        return f"hdfs://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._stopped = True
        with contextlib.suppress(OSError):
            self._server.close()
        for link in self._links:
            link.close()

    def __enter__(self) -> NameNodeProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._stopped:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            link = _Link(client, upstream)
            self._links.append(link)
            threading.Thread(target=self._requests, args=(link,), daemon=True).start()
            threading.Thread(target=self._answers, args=(link,), daemon=True).start()

    def _firing(self, method: str | None) -> Rule | None:
        with self._lock:
            if method is not None:
                self.methods.append(method)
            for rule in self.rules:
                if rule.method == method and rule.fired < rule.times:
                    rule.fired += 1
                    return rule
        return None

    def _requests(self, link: _Link) -> None:
        preamble = _read_exactly(link.client, PREAMBLE)
        if preamble is None:
            link.close()
            return
        link.upstream.sendall(preamble)
        while True:
            frame = _read_frame(link.client)
            if frame is None:
                link.close()
                return
            rule = self._firing(method_of(frame[4:]))
            if rule is not None and rule.action is Action.RESET:
                link.close()
                return
            if rule is not None:
                link.swallow.set()  # the answers thread drops the next answer, then the link
            try:
                link.upstream.sendall(frame)
            except OSError:
                link.close()
                return
            if rule is not None:
                link.done.wait(30)
                return

    def _answers(self, link: _Link) -> None:
        while True:
            frame = _read_frame(link.upstream)
            if frame is None:
                link.close()
                return
            if link.swallow.is_set():
                link.close()  # the call took effect; its answer is lost with the connection
                link.done.set()
                return
            try:
                link.client.sendall(frame)
            except OSError:
                link.close()
                return
