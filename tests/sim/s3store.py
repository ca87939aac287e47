"""The simulated S3 store (``--store s3``): the real ``S3Storage`` against in-process moto, with
every HTTP request it makes a scheduling point that may meet a fault.

Where the seam is. Each actor's client is a real :class:`S3Storage` whose boto3 client has one
``before-send`` hook (:meth:`SimS3Store._send`): the last step before botocore would open a
socket. So every request is seen, including those inside multipart uploads (create, each part,
complete, abort), the read-back of a create-if-absent whose answer was lost, the attempt-id
check of a retried complete, the twin-upload aborts, and botocore's own retries (each retry is
a request of its own, and so a scheduling point of its own). The hook parks the actor
(``World.point``) and, once resumed, answers the request with moto's in-process stubber itself
(moto's own global stubber is switched off, so no request is ever applied twice or behind the
scheduler's back). Faults, as the local ``SimStore`` has them, but on the wire:

- ``fail`` / ``delete``: the connection is refused before the request is sent (not applied);
  botocore retries it, up to the storage's attempts;
- ``lost``: moto applies it, then the client sees a read timeout; botocore retries, and a
  ``PutObject`` with ``If-None-Match: *`` meets its own object (412): the real protocol case;
- ``late``: a read timeout now, and a copy of the request is queued for the scheduler to land
  later (``Shared.deferred``, as the local store's); botocore's retry goes first;
- ``dup``: applied and answered, and a copy lands again later;
- ``list`` (a paged listing that is no snapshot) is not modelled here: a listing is one request;
- kill and stall are the scheduler's, as for the local store.

botocore's retry delays (standard mode: a random jitter) are made deterministic, and its
``time.sleep`` is the simulation's (a scheduling point that advances the simulated clock).
``S3StagedFile`` uploads parts in a thread pool: here the pool runs each part at once, in
the actor's thread (as ``parallel`` is made sequential).

Time: moto stamps ``LastModified`` with ``moto.core.utils.utcnow``, which here reads the
world's clock (the store's time: no actor's skew), so listings, staging markers and the
sweep's and vacuum's ages run on simulated time.

The god's-eye view (``client(None)``: the invariants, the final pass) is an S3Storage with
the same hook and no actor: fault-free, and no scheduling point.

A mirror. After every request that changes an object (PutObject, DeleteObject, a completed
upload) the object is copied to (or removed from) a local folder, the lake's ``root``: the
invariants' checker reads files' identities and the views' files there, unchanged from the
local store, and Parquet data is read there too (``arrow_filesystem``). pyarrow's S3 client
talks HTTP to an endpoint and in-process moto has none; the mirror is byte for byte what the
bucket holds after each request, so the rows read are those of the bucket, but pyarrow's own
S3 requests are not exercised (nor scheduled, nor faulted: data reads are not scheduling
points with the local store either). See docs/design/simulation.md, "The S3 store".
"""

from __future__ import annotations

import builtins
import datetime
import os
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

from lakesink_reader.storage.s3 import S3Storage
from tests.sim.store import OP_FAULTS, READ_FAULTS, Deferred, seen_by_readers

if TYPE_CHECKING:
    import pyarrow.fs

    from tests.sim.run import Env
    from tests.sim.world import Actor, World

BUCKET = "sim-lake"
PREFIX = "lake"
OPTIONS: dict[str, Any] = {
    "key": "sim",
    "secret": "sim",
    "client_kwargs": {"region_name": "us-east-1"},
}

#: The local store's name for what each request does (``OP_FAULTS`` keys, so that the
#: scheduler's fault draws and buggify weigh on the same kinds of calls).
_OPS = {
    "PutObject": "put",  # "put_if_absent" with If-None-Match
    "DeleteObject": "delete",
    "CompleteMultipartUpload": "publish",
    "AbortMultipartUpload": "discard",
    "CreateMultipartUpload": "stage",
    "UploadPart": "write_part",
    "GetObject": "read",
    "HeadObject": "exists",
    "HeadBucket": "root_exists",
    "ListObjectsV2": "list",
    "ListMultipartUploads": "staged",
}
#: Requests that change an object: the mirror follows them.
_CHANGES = ("PutObject", "DeleteObject", "CompleteMultipartUpload")

_world: World | None = None
_started = False


def _now() -> datetime.datetime:
    """moto's clock: the world's (no skew: the store's own time), naive UTC as moto keeps it."""
    assert _world is not None
    return datetime.datetime.fromtimestamp(_world.now, datetime.UTC).replace(tzinfo=None)


def _start(world: World) -> None:
    """Start moto once in this process (its stubber off: the hook applies requests itself)."""
    global _world, _started
    _world = world
    if _started:
        return
    _started = True
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ[name] = "sim"
    os.environ["AWS_DEFAULT_REGION"] = "us-east-1"
    import botocore.retries.standard as standard
    import moto.core.utils
    import moto.s3.models
    from moto import mock_aws
    from moto.core.models import botocore_stubber

    mock_aws().start()
    botocore_stubber.enabled = False
    moto.core.utils.utcnow = _now  # type: ignore[assignment]
    moto.s3.models.utcnow = _now  # type: ignore[attr-defined]

    def delay_amount(self: Any, context: Any) -> float:  # no jitter: half the cap, deterministic
        return float(min(self._base ** (context.attempt_number - 1), self._max_backoff)) / 2

    standard.ExponentialBackoff.delay_amount = delay_amount  # type: ignore[method-assign]

    # The Spark view lists absolute paths (s3://sim-lake/lake/...); the checker looks them up
    # as local files: in the mirror.
    import tests.sim.invariants as invariants

    original = invariants.spark_view_files

    def spark_view_files(root: str) -> tuple[int | None, int | None, list[str]]:
        latest, version, paths = original(root)
        where = f"/{PREFIX}/"
        return (
            latest,
            version,
            [os.path.join(root, p[len(where) :]) if p.startswith(where) else p for p in paths],
        )

    invariants.spark_view_files = spark_view_files  # type: ignore[assignment]


def _backend() -> Any:
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    return s3_backends[DEFAULT_ACCOUNT_ID]["aws"]


class _Inline:
    """A ThreadPoolExecutor stand-in that runs each task at once, in the caller's thread."""

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        future: Future[Any] = Future()
        try:
            future.set_result(fn(*args))
        except Exception as exc:  # noqa: BLE001 - handed to the caller through the future
            future.set_exception(exc)
        return future

    def shutdown(self, wait: bool = True) -> None:
        pass


def _snapshot(request: Any) -> Any:
    """A copy of a prepared request that can be sent again later (its body read out)."""
    from botocore.awsrequest import AWSPreparedRequest

    body = request.body
    if hasattr(body, "read"):  # a stream (botocore's aws-chunked wrapper): read, then rewound
        data = body.read()
        body.seek(0)
        body = data
    return AWSPreparedRequest(request.method, request.url, request.headers.copy(), body, False)


class S3Shared:
    """What every actor's S3 client shares: the bucket (moto's), the mirror, the pending
    requests. Takes the place of ``store.Shared`` in ``Env`` (same attributes the run reads)."""

    def __init__(self, world: World, root: str) -> None:
        import random

        # What is set up once a process (moto, botocore's first client) draws uuids too: from a
        # generator of its own, so that a seed replays the same first in a process or later.
        ids, world.ids = world.ids, random.Random(0)
        try:
            self._setup(world, root)
        finally:
            world.ids = ids

    def _setup(self, world: World, root: str) -> None:
        _start(world)
        from moto.moto_api._internal import mock_random

        _backend().reset()
        mock_random.seed(world.seed)  # upload ids, request ids: from the seed
        self.world = world
        self.root = root  # the mirror
        # Each mirrored object's LastModified as a listing reports it (whole seconds): the
        # store's clock, which the checker's retention rule reads (``Shared.times``'s part).
        self.times: dict[str, float] = {}
        self.url = f"s3://{BUCKET}/{PREFIX}"
        self.deferred: list[Deferred] = []
        self.dirty = False
        self.faults: frozenset[str] = frozenset()
        self.clients: dict[int, SimS3Store] = {}  # by actor (identity: two may share a name)
        self.raw = self.client(None)
        self.raw.client.create_bucket(Bucket=BUCKET)

    def client(self, actor: Actor | None) -> SimS3Store:
        key = id(actor) if actor is not None else 0
        if key not in self.clients:
            self.clients[key] = SimS3Store(self, actor)
        return self.clients[key]

    def apply(self, event_name: str, request: Any) -> Any:
        """Answer ``request`` with moto (it applies it), and follow a change in the mirror."""
        from moto.core.models import botocore_stubber

        botocore_stubber.enabled = True
        try:
            response = botocore_stubber(event_name, request)
        finally:
            botocore_stubber.enabled = False
        if response is None:
            raise RuntimeError(f"moto does not answer {request.method} {request.url}")
        operation = event_name.rsplit(".", 1)[-1]
        if operation in _CHANGES and response.status_code < 300:
            self._mirror(_name_of(request.url))
        return response

    def _mirror(self, name: str) -> None:
        path = os.path.join(self.root, name)
        found = _backend().get_object(BUCKET, f"{PREFIX}/{name}")
        if found is None:
            self.times.pop(name, None)
            if os.path.lexists(path):
                os.remove(path)
            base = name.rsplit("/", 1)[-1]
            self.dirty = self.dirty or seen_by_readers(name) or not base.startswith((".", "_"))
            return
        self.times[name] = float(int(found.last_modified.replace(tzinfo=datetime.UTC).timestamp()))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        temp = f"{path}.mirror"
        with open(temp, "wb") as f:
            f.write(found.value)
        os.replace(temp, path)  # a new inode: the checker's cache sees a changed file
        self.dirty = self.dirty or seen_by_readers(name)


def _name_of(url: str) -> str:
    """The lake-relative name of a request's key (virtual-hosted or path-style URL)."""
    parsed = urlparse(url)
    path = unquote(parsed.path).lstrip("/")
    if not (parsed.hostname or "").startswith(f"{BUCKET}."):
        path = path.partition("/")[2]  # path-style: /bucket/key
    return path[len(PREFIX) + 1 :] if path.startswith(f"{PREFIX}/") else path


class SimS3Store(S3Storage):
    """One actor's real S3Storage (``actor`` None: the scheduler's own, fault-free)."""

    def __init__(self, shared: S3Shared, actor: Actor | None) -> None:
        super().__init__(shared.url, OPTIONS)
        self.shared = shared
        self.actor = actor
        self.root = shared.root
        self._pool = _Inline()  # type: ignore[assignment]
        self._hooked: set[int] = set()

    def __repr__(self) -> str:
        return f"SimS3Store(actor={self.actor.name if self.actor else None})"

    def _hook(self, client: Any) -> Any:
        if id(client) not in self._hooked:
            client.meta.events.register_first("before-send.s3", self._send)
            self._hooked.add(id(client))
        return client

    @property
    def client(self) -> Any:
        return self._hook(S3Storage.client.fget(self))  # type: ignore[attr-defined]

    @property
    def opening_client(self) -> Any:
        return self._hook(S3Storage.opening_client.fget(self))  # type: ignore[attr-defined]

    def _acting(self) -> Actor | None:
        """As ``SimStore._acting``: a thread of this actor's process calls as this actor."""
        world, actor = self.shared.world, self.actor
        current = world.current
        if actor is not None and current is not None and current.parent is actor:
            return current
        return actor

    def _send(self, event_name: str, request: Any, **_: Any) -> Any:
        from botocore.exceptions import EndpointConnectionError, ReadTimeoutError

        shared, world, actor = self.shared, self.shared.world, self._acting()
        if actor is None:
            return shared.apply(event_name, request)
        operation = event_name.rsplit(".", 1)[-1]
        op = _OPS.get(operation, operation)
        if operation == "PutObject" and request.headers.get("If-None-Match") is not None:
            op = "put_if_absent"
        name = _name_of(request.url)
        fault = world.point(actor, op, name)  # raises Killed for a killed actor
        if fault not in OP_FAULTS.get(op, READ_FAULTS) or fault not in shared.faults or fault == "list":
            fault = None
        if fault in ("fail", "delete"):
            raise EndpointConnectionError(endpoint_url=request.url)
        if fault == "late":
            copy = _snapshot(request)
            shared.deferred.append(Deferred(actor.name, op, name, lambda: shared.apply(event_name, copy)))
            raise ReadTimeoutError(endpoint_url=request.url)
        if fault == "dup":
            copy = _snapshot(request)
            shared.deferred.append(Deferred(actor.name, op, name, lambda: shared.apply(event_name, copy)))
        response = shared.apply(event_name, request)
        if fault == "lost":
            raise ReadTimeoutError(endpoint_url=request.url)
        return response

    def arrow_filesystem(self) -> tuple[pyarrow.fs.FileSystem, str]:
        """The mirror (see the module's docstring: in-process moto has no endpoint for pyarrow)."""
        import pyarrow.fs

        return pyarrow.fs.LocalFileSystem(), self.root


def attach(env: Env) -> None:
    """Put ``env`` on the S3 store: its shared state and its clients."""
    shared = S3Shared(env.world, env.root)
    env.shared = shared  # type: ignore[assignment]
    env.client = shared.client  # type: ignore[method-assign,assignment]


def leftovers(env: Env) -> builtins.list[str]:
    """What the local checker cannot see on S3: open multipart uploads and staging markers."""
    shared: S3Shared = env.shared  # type: ignore[assignment]
    raw = shared.raw
    found = [
        f"open upload {u['Key']}" for u in raw.client.list_multipart_uploads(Bucket=BUCKET).get("Uploads", ())
    ]
    found += [f"staging marker {f.name}" for f in raw.list("_lakesink/staging")]
    return sorted(found)
