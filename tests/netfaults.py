"""A fault-injecting loopback HTTP proxy between S3 clients and the moto test server.

This module owns :class:`FaultProxy` (a transparent HTTP/1.1 reverse proxy on 127.0.0.1), the
classification of each request into an S3 operation (:func:`operation`, :func:`bucket_and_key`),
and the fault :class:`Rule` s that make it lose answers, reset connections, answer 500/503/409,
add latency, ignore ``If-None-Match`` or list multipart uploads the way MinIO does.

Clients (boto3, s3fs/aiobotocore, pyarrow's AWS C++ SDK) point their endpoint at
:attr:`FaultProxy.endpoint_url`; everything they send is forwarded byte for byte except the
framing: chunked request bodies are de-chunked and sent on with a Content-Length (no SDK signs
Content-Length or Transfer-Encoding for such requests, so a SigV4 signature still verifies).
The Host header is forwarded unchanged: it is a signed header, and moto reads it only to choose
path-style addressing, which it does for any IP-address host.

Standard library only, so that it runs wherever the tests run.
"""

from __future__ import annotations

import contextlib
import enum
import http.client
import random
import re
import socket
import socketserver
import struct
import threading
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from dataclasses import dataclass, field
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, unquote_plus, urlsplit
from xml.sax.saxutils import escape as xml_escape

__all__ = ["Action", "FaultProxy", "Record", "Request", "Rule", "bucket_and_key", "operation"]

#: Headers that belong to one hop (RFC 9110 section 7.6.1): each side of the proxy has its own.
#: ``Expect`` is not among them: the proxy answers ``100 Continue`` itself and passes it on too
#: (http.client skips a 100 from the upstream), so nothing a client may have signed is dropped.
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade"}
)
BLOCK = 64 * 1024


class Action(enum.StrEnum):
    """What a firing :class:`Rule` does to the request."""

    LOSE_RESPONSE = "lose_response"  # forward, read the whole answer, then reset the client
    RESET = "reset"  # reset the client connection without forwarding
    ERROR_500 = "error_500"  # answer 500 InternalError without forwarding
    ERROR_503 = "error_503"  # answer 503 SlowDown without forwarding
    CONFLICT_409 = "conflict_409"  # answer 409 ConditionalRequestConflict without forwarding
    DELAY = "delay"  # sleep Rule.seconds, then forward
    STRIP_IF_NONE_MATCH = "strip_if_none_match"  # forward without If-None-Match
    MINIO_UPLOAD_LISTING = "minio_upload_listing"  # hide uploads unless prefix is an exact key
    HOLD = "hold"  # keep the request unapplied, reset the client; ``release_held`` applies it late


# S3 operations -------------------------------------------------------------------------------


def bucket_and_key(path: str) -> tuple[str | None, str | None]:
    """(bucket, key) of a path-style request path (no query); URL-decoded, None when absent."""
    bucket, _, key = path.lstrip("/").partition("/")
    return (unquote(bucket) or None), (unquote(key) or None)


def operation(method: str, path: str, query: str, headers: Any = None) -> str:
    """The S3 operation of a path-style request, e.g. "PutObject"; "Other" when not one we name.

    ``query`` is the raw query string; ``headers`` (anything with ``get``) tells a copy, which
    is "Other", from a PutObject/UploadPart.
    """
    bucket, key = bucket_and_key(path)
    params = parse_qs(query, keep_blank_values=True)
    method = method.upper()
    copy = headers is not None and headers.get("x-amz-copy-source") is not None
    if bucket is None:
        return "Other"  # ListBuckets and the moto-api
    if key is None:
        return _BUCKET_OPERATIONS.get((method, _subresource(params, _BUCKET_SUBRESOURCES)), "Other")
    found = _OBJECT_OPERATIONS.get((method, _subresource(params, _OBJECT_SUBRESOURCES)), "Other")
    return "Other" if copy and found in ("PutObject", "UploadPart") else found


_BUCKET_SUBRESOURCES = ("list-type", "uploads", "delete")
_OBJECT_SUBRESOURCES = ("uploads", "uploadId")
_BUCKET_OPERATIONS = {
    ("HEAD", ""): "HeadBucket",
    ("PUT", ""): "CreateBucket",
    ("GET", "list-type"): "ListObjectsV2",
    ("GET", "uploads"): "ListMultipartUploads",
    ("POST", "delete"): "DeleteObjects",
}
_OBJECT_OPERATIONS = {
    ("PUT", ""): "PutObject",
    ("GET", ""): "GetObject",
    ("HEAD", ""): "HeadObject",
    ("DELETE", ""): "DeleteObject",
    ("POST", "uploads"): "CreateMultipartUpload",
    ("PUT", "uploadId"): "UploadPart",
    ("POST", "uploadId"): "CompleteMultipartUpload",
    ("DELETE", "uploadId"): "AbortMultipartUpload",
    ("GET", "uploadId"): "ListParts",
}


#: Query parameters of the operations named above; any other one (?acl, ?tagging, ?versioning,
#: ...) is a sub-resource, i.e. some other operation.
_PLAIN_PARAMETERS = frozenset(
    {"prefix", "delimiter", "encoding-type", "max-keys", "continuation-token", "start-after"}
    | {"fetch-owner", "key-marker", "upload-id-marker", "max-uploads", "max-parts", "part-number-marker"}
    | {"partNumber", "versionId", "x-id"}
)


def _subresource(params: dict[str, list[str]], known: Iterable[str]) -> str:
    """The first of ``known`` in the query; "" when there is none, "?" for another sub-resource."""
    for name in known:
        if name in params:
            return name
    others = (name for name in params if name not in _PLAIN_PARAMETERS and not name.startswith("response-"))
    return "?" if any(others) else ""


@dataclass(frozen=True)
class Request:
    """What the rules see of one request."""

    operation: str
    method: str
    bucket: str | None
    key: str | None
    query: str
    headers: Message

    @classmethod
    def parse(cls, method: str, target: str, headers: Message) -> Request:
        # Not urlsplit(): a request target is never a URL with a netloc, even if it starts "//".
        path, _, query = target.partition("?")
        bucket, key = bucket_and_key(path)
        return cls(operation(method, path, query, headers), method.upper(), bucket, key, query, headers)


# Rules ---------------------------------------------------------------------------------------


@dataclass(eq=False)
class Rule:
    """Do ``action`` to the requests this rule matches, when it fires.

    Matching (all given fields must match): ``operation`` (a name or a set of names), ``key``
    (a regex searched in the URL-decoded key), ``header`` (present, case-insensitive) and
    ``method``. Firing (all given conditions must hold, counted over matching requests): skip
    the first ``after`` matches, then fire on every ``every``-th one, at most ``times`` times,
    each with ``probability`` (drawn from ``random.Random(seed)``, so runs repeat).

    The proxy tries its rules in order and the first that fires wins; a rule that matched
    but did not fire lets the next ones try. So a blanket ``DELAY`` (no match fields) goes last,
    or it would shadow every rule after it.
    """

    action: Action
    operation: str | set[str] | frozenset[str] | None = None
    key: str | None = None
    header: str | None = None
    method: str | None = None
    times: int | None = None
    every: int | None = None
    probability: float | None = None
    seed: int = 0
    after: int = 0
    seconds: float = 0.0  # for DELAY
    matched: int = field(default=0, init=False)
    fired: int = field(default=0, init=False)
    _rng: random.Random = field(init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self.action = Action(self.action)

    def matches(self, request: Request) -> bool:
        ops = {self.operation} if isinstance(self.operation, str) else self.operation
        key_matches = request.key is not None and re.search(self.key or "", request.key) is not None
        return (
            (ops is None or request.operation in ops)
            and (self.method is None or request.method == self.method.upper())
            and (self.key is None or key_matches)
            and (self.header is None or request.headers.get(self.header) is not None)
        )

    def fire(self, request: Request) -> bool:
        """Count ``request`` if it matches and say whether the rule fires for it."""
        if not self.matches(request):
            return False
        with self._lock:
            self.matched += 1
            eligible = self.matched - self.after
            fires = (
                eligible > 0
                and (self.every is None or eligible % self.every == 0)
                and (self.times is None or self.fired < self.times)
                and (self.probability is None or self._rng.random() < self.probability)
            )
            self.fired += fires
            return fires


@dataclass(frozen=True)
class Record:
    """One request the proxy saw: its status code, or "lost"/"reset" when the client got none."""

    operation: str
    method: str
    bucket: str | None
    key: str | None
    status: int | str
    action: Action | None


# The proxy -----------------------------------------------------------------------------------

_ERRORS = {
    Action.ERROR_500: (500, "InternalError", "We encountered an internal error. Please try again."),
    Action.ERROR_503: (503, "SlowDown", "Please reduce your request rate."),
    # What AWS answers a conditional write that races another write to the same key.
    Action.CONFLICT_409: (409, "ConditionalRequestConflict", "A conflicting operation occurred."),
}


class FaultProxy:
    """A loopback reverse proxy to ``upstream`` (an ``http://host:port`` URL) that injects faults.

    Use as ``with FaultProxy(url) as proxy:`` or ``start()`` / ``stop()``; point clients at
    :attr:`endpoint_url`. Rules are added with :meth:`add_rule`; every request is recorded in
    :attr:`log`.
    """

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"upstream must be an http://host:port URL, got {upstream!r}")
        self.upstream = (parts.hostname, parts.port or 80)
        self._rules: list[Rule] = []
        self._log: list[Record] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        #: HOLD's requests, oldest first: (method, path, headers, body)
        self._held: list[tuple[str, str, list[tuple[str, str]], bytes]] = []

    # Lifecycle

    def start(self) -> FaultProxy:
        if self._server is not None:
            raise RuntimeError("the proxy is already running")
        self._stopping.clear()
        self._server = _Server(self)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="FaultProxy", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening and cut every client connection (a request in a DELAY ends at once)."""
        server, self._server = self._server, None
        if server is None:
            return
        self._stopping.set()
        server.shutdown()
        server.server_close()
        server.close_clients()
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def endpoint_url(self) -> str:
        if self._server is None:
            raise RuntimeError("the proxy is not running")
        return f"http://127.0.0.1:{self._server.server_port}"

    # Rules and observation

    def add_rule(self, rule: Rule) -> Rule:
        with self._lock:
            self._rules.append(rule)
        return rule

    def clear_rules(self) -> None:
        with self._lock:
            self._rules.clear()

    def rule_for(self, request: Request) -> Rule | None:
        """The first rule that fires for ``request`` (counting it in the rules it matches)."""
        with self._lock:
            rules = list(self._rules)
        return next((rule for rule in rules if rule.fire(request)), None)

    @property
    def log(self) -> list[Record]:
        """A snapshot of the requests seen so far, oldest first."""
        with self._lock:
            return list(self._log)

    def clear_log(self) -> None:
        with self._lock:
            self._log.clear()

    def record(self, request: Request, status: int | str, rule: Rule | None) -> None:
        action = rule.action if rule else None
        entry = Record(request.operation, request.method, request.bucket, request.key, status, action)
        with self._lock:
            self._log.append(entry)

    def fired(self, action: Action | None = None) -> int:
        """How many requests a rule fired on (only ``action`` rules, when given)."""
        return sum(1 for r in self.log if r.action is not None and (action is None or r.action == action))

    def requests(self, operation: str) -> int:
        """How many ``operation`` requests clients sent (faulted ones included)."""
        return sum(1 for r in self.log if r.operation == operation)

    def hold(self, method: str, path: str, headers: list[tuple[str, str]], body: bytes) -> None:
        with self._lock:
            self._held.append((method, path, headers, body))

    def release_held(self) -> list[tuple[str, int]]:
        """Apply the first held request of each path upstream, late (a request a queue held
        while its client gave up); the others are dropped. Each path with its status."""
        with self._lock:
            held, self._held = self._held, []
        done: list[tuple[str, int]] = []
        for method, path, headers, body in held:
            if any(p == path for p, _ in done):
                continue
            upstream = http.client.HTTPConnection(*self.upstream, timeout=60)
            try:
                upstream.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
                for name, value in headers:
                    upstream.putheader(name, value)
                upstream.endheaders(body)
                response = upstream.getresponse()
                response.read()
                done.append((path, response.status))
            finally:
                upstream.close()
        return done

    def sleep(self, seconds: float) -> bool:
        """Sleep, but wake up when the proxy stops; False if it did."""
        return not self._stopping.wait(seconds)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, proxy: FaultProxy) -> None:
        self.proxy = proxy
        self._clients: set[socket.socket] = set()
        self._clients_lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind would resolve a host name (socket.getfqdn), which can stall.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = "127.0.0.1", int(self.server_address[1])

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._clients_lock:
            self._clients.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._clients_lock:
            self._clients.discard(request)
        super().shutdown_request(request)

    def close_clients(self) -> None:
        # shutdown() (not close()) wakes a handler blocked reading the next request; the
        # handler thread then closes its own socket.
        with self._clients_lock:
            clients = list(self._clients)
        for sock in clients:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


class _Aborted(Exception):
    """The client connection is gone (or was reset on purpose): stop serving it."""


class _UpstreamFailed(Exception):
    """The upstream could not be reached or gave no valid answer: the client gets a 502."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive towards clients
    server: _Server
    upstream: http.client.HTTPConnection | None = None
    _expect_continue = False  # set by handle_expect_100 for the current request

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the proxy's own log is FaultProxy.log

    def handle_expect_100(self) -> bool:
        # Decide after matching the rules: a request answered with an error never gets its
        # 100 Continue, like at a real server, so a client that waits does not send its body.
        self._expect_continue = True
        return True

    def handle(self) -> None:
        # A client that goes away mid-request is routine here, not an error to print.
        with contextlib.suppress(OSError, _Aborted):
            super().handle()

    def finish(self) -> None:
        if self.upstream is not None:
            self.upstream.close()
        super().finish()

    def _handle(self) -> None:
        proxy = self.server.proxy
        request = Request.parse(self.command, self.path, self.headers)
        rule = proxy.rule_for(request)
        action = rule.action if rule else None
        expects, self._expect_continue = self._expect_continue, False
        # Each outcome is recorded before the client can see it, so that a test that has its
        # answer finds the request in the log.
        try:
            if action in _ERRORS:
                if expects:
                    self.close_connection = True  # its body will not come: the stream is unusable
                else:
                    self._read_body()
                proxy.record(request, _ERRORS[action][0], rule)
                self._send_error(*_ERRORS[action])
                return
            if expects:
                self.send_response_only(100)
                self.end_headers()
            body = self._read_body()
            if action is Action.RESET:
                proxy.record(request, "reset", rule)
                self._reset()
                return
            if action is Action.HOLD:
                dropped = HOP_BY_HOP | {"content-length"}
                kept = [(n, v) for n, v in self.headers.items() if n.lower() not in dropped]
                proxy.hold(self.command, self.path, [*kept, ("Content-Length", str(len(body)))], body)
                proxy.record(request, "held", rule)
                self._reset()
                return
            if rule is not None and action is Action.DELAY and not proxy.sleep(rule.seconds):
                raise _Aborted("the proxy stopped")
            skip = {"if-none-match"} if action is Action.STRIP_IF_NONE_MATCH else set()
            try:
                response = self._forward(body, skip)
            except _UpstreamFailed as exc:
                proxy.record(request, 502, rule)
                self._send_error(502, "BadGateway", str(exc))
                return
            if action is Action.LOSE_RESPONSE:
                response.read()  # the server has applied the request and answered in full
                proxy.record(request, "lost", rule)
                self._reset()
                return
            proxy.record(request, response.status, rule)
            if action is Action.MINIO_UPLOAD_LISTING and request.operation == "ListMultipartUploads":
                self._send_minio_listing(response, request)
            else:
                self._relay(response)
        except _Aborted:
            self.close_connection = True
        except (OSError, http.client.HTTPException):
            # The upstream broke off mid-answer: neither connection can carry on.
            self._drop_upstream()
            self.close_connection = True

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = do_OPTIONS = _handle

    # Request side

    def _read_body(self) -> bytes:
        try:
            if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                return self._read_chunked()
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
        except (OSError, ValueError) as exc:
            raise _Aborted from exc
        if len(body) != length:
            raise _Aborted("the client closed the connection mid-body")
        return body

    def _read_chunked(self) -> bytes:
        chunks = []
        while True:
            line = self.rfile.readline(1024)
            if not line:
                raise _Aborted("the client closed the connection mid-body")
            size = int(line.split(b";", 1)[0].strip(), 16)
            if size == 0:
                break
            chunks.append(self.rfile.read(size))
            self.rfile.readline(1024)
        # Trailers (an HTTP-level checksum, say) end at an empty line; they are dropped, as
        # there is no way to send them with a Content-Length body.
        while self.rfile.readline(8192) not in (b"\r\n", b"\n", b""):
            pass
        return b"".join(chunks)

    def _forward(self, body: bytes, skip: set[str]) -> http.client.HTTPResponse:
        """Send the request upstream, without the ``skip`` headers; its response, unread."""
        dropped = HOP_BY_HOP | skip | {"content-length"}
        headers = [(name, value) for name, value in self.headers.items() if name.lower() not in dropped]
        if body or "Content-Length" in self.headers:
            headers.append(("Content-Length", str(len(body))))
        # One retry, only on a kept-alive connection the upstream may have closed meanwhile
        # (the request cannot have been applied: it was not read).
        for attempt in range(2):
            reused = self.upstream is not None and self.upstream.sock is not None
            if self.upstream is None:
                self.upstream = http.client.HTTPConnection(*self.server.proxy.upstream, timeout=60)
            try:
                # skip_host: the client's Host goes upstream unchanged (it is signed).
                self.upstream.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                for name, value in headers:
                    self.upstream.putheader(name, value)
                self.upstream.endheaders(body)
                return self.upstream.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                self.upstream.close()
                stale = isinstance(exc, (BrokenPipeError, ConnectionResetError))  # RemoteDisconnected too
                if not (reused and stale and attempt == 0):
                    raise _UpstreamFailed(f"upstream {self.server.proxy.upstream}: {exc!r}") from exc
        raise AssertionError("unreachable")

    # Response side

    def _relay(self, response: http.client.HTTPResponse) -> None:
        """Stream ``response`` to the client; chunked when the upstream framed it so."""
        headers = _end_to_end(response.getheaders())
        bodiless = self.command == "HEAD" or response.status in (204, 304) or response.status < 200
        sized = response.getheader("Content-Length") is not None and not response.chunked
        if not bodiless and not sized:
            headers.append(("Transfer-Encoding", "chunked"))
        try:
            self._send_head(response.status, response.reason, headers)
            while not bodiless and (block := response.read1(BLOCK)):
                self.wfile.write(block if sized else b"%x\r\n%s\r\n" % (len(block), block))
            if not bodiless and not sized:
                self.wfile.write(b"0\r\n\r\n")
            response.read()  # b"": marks the response done, so the upstream connection is reusable
        except OSError as exc:
            self._drop_upstream()  # a half-read response leaves it unusable
            raise _Aborted from exc

    def _send_minio_listing(self, response: http.client.HTTPResponse, request: Request) -> None:
        body = response.read()
        if response.status == 200:
            body = _minio_uploads(body, parse_qs(request.query, keep_blank_values=True))
        headers = [(n, v) for n, v in _end_to_end(response.getheaders()) if n.lower() != "content-length"]
        self._send_whole(response.status, response.reason, headers, body)

    def _send_error(self, status: int, code: str, message: str) -> None:
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{code}</Code><Message>{xml_escape(message)}</Message>"
            "<RequestId>netfaults</RequestId></Error>"
        ).encode()
        headers = [("Content-Type", "application/xml"), ("x-amz-request-id", "netfaults")]
        if self.close_connection:
            headers.append(("Connection", "close"))
        self._send_whole(status, http.client.responses.get(status, ""), headers, body)

    def _send_whole(self, status: int, reason: str, headers: list[tuple[str, str]], body: bytes) -> None:
        headers = [*headers, ("Content-Length", str(len(body)))]
        try:
            self._send_head(status, reason, headers)
            if self.command != "HEAD":
                self.wfile.write(body)
        except OSError as exc:
            raise _Aborted from exc

    def _send_head(self, status: int, reason: str, headers: list[tuple[str, str]]) -> None:
        # send_response() would add a second Server and Date: the upstream's are relayed.
        self.send_response_only(status, reason)
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()

    def _drop_upstream(self) -> None:
        if self.upstream is not None:
            self.upstream.close()

    def _reset(self) -> None:
        """Close the client connection with a TCP RST: no byte of an answer, no orderly FIN."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.rfile.close()  # the makefile() holds a reference that would defer the close
            self.connection.close()


def _end_to_end(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(name, value) for name, value in headers if name.lower() not in HOP_BY_HOP]


def _minio_uploads(body: bytes, params: dict[str, list[str]]) -> bytes:
    """A ListMultipartUploads answer as MinIO gives it: uploads only for an exact-key prefix."""
    prefix = params.get("prefix", [""])[0]
    decode = unquote_plus if params.get("encoding-type") == ["url"] else str
    keys = {
        decode(key.text or "")
        for upload in ET.fromstring(body).iter()
        if upload.tag.rpartition("}")[2] == "Upload"
        for key in upload
        if key.tag.rpartition("}")[2] == "Key"
    }
    if prefix and prefix in keys:
        return body
    return re.sub(rb"\s*<Upload>.*?</Upload>", b"", body, flags=re.DOTALL)
