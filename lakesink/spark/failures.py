"""A lakesink refusal during a run, raised as itself.

What lakesink refuses while a query runs (a continuation whose offsets Spark knew only when it
planned the first batch, a commit the log refuses) is raised in a Python worker of the driver,
and reaches the user inside Spark's wrapping: ``[STREAM_FAILED] Query [id = ...] terminated
with exception: [PYTHON_DATA_SOURCE_ERROR] ... Traceback (most recent call last): ...``, with
lakesink's one line twenty lines down. The queries that ``start()`` returns for lakesink writes
(``lakesink.spark.guard``) raise, from ``awaitTermination`` and ``processAllAvailable``, that
lakesink error itself: its type one a caller can catch, and its message the first thing a
traceback shows after the caller's own frames. Spark's exception (the whole story, the Python
worker's traceback included) stays where pyspark keeps it, ``query.exception()``: chained as a
cause it would be printed first, a hundred lines above lakesink's.
"""

from __future__ import annotations

import functools
import re
from typing import Any, TypeVar

from lakesink_reader import errors
from lakesink_reader.redact import redacted

#: A lakesink error as a Python traceback's last line names it, inside Spark's text.
_ERROR_LINE = re.compile(r"lakesink_reader\.errors\.(\w+): (.+)")

_Query = TypeVar("_Query")


def lakesink_error(failure: BaseException) -> errors.LakeSinkError | None:
    """The innermost lakesink error that Spark's ``failure`` reports, made again (its message
    is the traceback's line: the first line of lakesink's message); None when there is none."""
    found: errors.LakeSinkError | None = None
    for match in _ERROR_LINE.finditer(str(failure)):
        kind = getattr(errors, match.group(1), None)
        if isinstance(kind, type) and issubclass(kind, errors.LakeSinkError):
            found = kind(redacted(match.group(2).strip()))
    return found


def raising_lakesink_errors(query: _Query) -> _Query:
    """``query`` (a StreamingQuery, classic or Connect), whose waits raise lakesink's error when
    lakesink ended it. Its class becomes a subclass of its own, so ``isinstance`` checks and
    every other method are as they were."""
    query.__class__ = _raising_class(type(query))  # type: ignore[arg-type]
    return query


@functools.cache  # one subclass per StreamingQuery class (classic, Connect): two at most
def _raising_class(base: Any) -> type:
    def awaitTermination(self: Any, timeout: int | None = None) -> bool | None:
        try:
            return base.awaitTermination(self, timeout)  # type: ignore[no-any-return]
        except Exception as failure:
            _reraise(failure)
            raise

    def processAllAvailable(self: Any) -> None:
        try:
            base.processAllAvailable(self)
        except Exception as failure:
            _reraise(failure)
            raise

    return type(
        base.__name__,
        (base,),
        {
            "awaitTermination": functools.wraps(base.awaitTermination)(awaitTermination),
            "processAllAvailable": functools.wraps(base.processAllAvailable)(processAllAvailable),
            "__module__": base.__module__,
            "__doc__": base.__doc__,
        },
    )


def _reraise(failure: Exception) -> None:
    error = lakesink_error(failure)
    if error is not None:
        error.add_note("(Spark's whole report of the failure, the Python trace included: query.exception())")
        raise error from None
