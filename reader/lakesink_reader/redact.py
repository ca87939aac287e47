"""Lake URLs as messages show them: never a credential (docs/FORMAT.md, "Trust").

A lake URL may carry secrets -- user info (``s3://key:secret@bucket/x``, ``hdfs://user:pw@nn/x``)
or a pre-signed URL's query (``X-Amz-Signature=``, ``X-Amz-Security-Token=``, Azure's ``sig=``).
Every message that shows a URL, or text that may hold one, passes it through :func:`redacted`:
the reader, the storage backends' refusals, the CLI's one-line errors and the Spark doors.
"""

from __future__ import annotations

import re

#: What replaces a secret.
HIDDEN = "***"
#: ``scheme://user[:password]@``: the user info, up to the ``@`` before the host.
#: Every repetition is bounded and a scheme starts a word: the text may be a message quoting a
#: crafted megabyte-long name, and an unbounded ``[A-Za-z0-9+.-]*://`` backtracks over it from
#: every position (quadratic: the fuzzer's case 2257 spent minutes here).
_USER_INFO = re.compile(r"(?P<head>(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]{0,31}://)[^/?#@\s'\"]{0,1024}@")
#: Query parameters that sign or authorize a request (S3's SigV4 and SigV2, Azure's SAS, GCS's
#: signed URLs, and any name holding token, secret, password, signature, credential or key).
_SECRET_PARAM = re.compile(
    r"(?P<head>[?&;](?:X-Amz-[A-Za-z-]+|X-Goog-[A-Za-z-]+|sig|skoid|sktid|Signature|AWSAccessKeyId"
    r"|[A-Za-z0-9_.-]{0,64}(?:token|secret|password|passwd|signature|credential|key)[A-Za-z0-9_.-]{0,64})=)"
    r"[^&#\s'\"]*",
    re.IGNORECASE,
)


def redacted(text: str) -> str:
    """``text`` (a URL, or a message that may hold URLs) with every URL's user info and signing
    query parameters replaced by ``***``. Text without them is returned as it is."""
    text = _USER_INFO.sub(lambda m: f"{m['head']}{HIDDEN}@", text)
    return _SECRET_PARAM.sub(lambda m: f"{m['head']}{HIDDEN}", text)
