"""Continuing a writer from the lake (docs/guide/kafka.md, "Restart from the lake"): a new query,
started from the offsets the lake recorded for an old writer, commits its first batch with a
``Continuation`` naming that writer, and the log's rules (``lakesink_reader.format.v3.state``)
judge it against the old writer's offsets.

What is decided here: which ``Continuation`` a writer's first commit carries, and whether it
would be refused, before the query writes anything. Where the new query's starting offsets come
from (Spark's checkpoint) is the caller's.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from lakesink_reader.errors import CommitRefusedError
from lakesink_reader.format.v3.commits import Continuation, PendingCommit
from lakesink_reader.format.v3.state import TableState, check_append, offsets_check_kind


def continuation_of(
    state: TableState,
    writer: str,
    continue_writer: str | None,
    start_offsets: Callable[[], Any],
    where: str,
) -> Continuation | None:
    """The ``Continuation`` the first commit of ``writer`` carries when it continues the writer
    named ``continue_writer`` (an id or a tag); None when it continues no one, and once
    ``writer`` is in the log (a restart of the continuing query). ``start_offsets``: the
    offsets the new query started from (read only when needed). CommitRefusedError naming the
    lake's writers when ``continue_writer`` names none of them."""
    if not continue_writer or writer in state.writers:
        return None
    old = state.writer(continue_writer)
    if old is None:
        known = ", ".join(w.describe() for w in state.writers.values()) or "none"
        raise CommitRefusedError(
            f"continue_writer={continue_writer!r} is not a writer of the lake at {where} "
            f"(its writers: {known})"
        )
    start = start_offsets()
    return Continuation(
        old.id, old.last_batch, old.last_version, start, offsets_check_kind(old.offsets, start)
    )


def check_continuation(state: TableState, writer: str, continues: Continuation | None) -> None:
    """Refuse now (CommitRefusedError, as the commit would) a continuation the log's rules
    refuse: an overlap or a gap in the offsets, a writer already continued."""
    if continues is not None:
        check_append(
            state, PendingCommit.append(writer_id=writer, batch=0, run=uuid.uuid4().hex, continues=continues)
        )
