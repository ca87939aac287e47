"""Deprecated import name of the lakesink reader: use ``lakesink_reader`` (the same objects).

``reader`` is also the name of an unrelated package on PyPI; installing both breaks one of
them. This alias stays for a while and warns on import.
"""

import sys
import warnings

import lakesink_reader
import lakesink_reader.lake
from lakesink_reader import *  # noqa: F403 - the alias re-exports the whole public API
from lakesink_reader import __all__  # noqa: F401

warnings.warn(
    "'import reader' is deprecated: import lakesink_reader (same functions and classes)",
    DeprecationWarning,
    stacklevel=2,
)
lake = lakesink_reader.lake
sys.modules[__name__ + ".lake"] = lake
