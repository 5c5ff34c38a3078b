"""Names read from untrusted files (an index, a tokenizer spec, a checkpoint, a bucket) that must stay in a folder.

A plain file name is joined to a folder; a relative object name (`/`-separated) to a folder
tree. Either is refused before it is joined when it could leave the folder: `..`, an absolute
path, a backslash (a separator on Windows), a NUL, a drive letter or URI scheme (`:`).

>>> is_plain_file_name("shard.00000.mds"), is_plain_file_name("../x"), is_plain_file_name("a/b")
(True, False, False)
>>> is_relative_object_name("run/ep0-ba4/.metadata"), is_relative_object_name("run/../x")
(True, False)
"""

from __future__ import annotations

from typing import Any

_UNSAFE = ("/", "\\", "\0", ":")


def is_plain_file_name(name: Any) -> bool:
    """A string that names a file directly inside a folder: no separator, not `.`/`..`, not empty."""
    return isinstance(name, str) and name not in ("", ".", "..") and not any(c in name for c in _UNSAFE)


def is_relative_object_name(name: Any) -> bool:
    """A `/`-separated name whose every part is a plain file name (an object below a bucket prefix)."""
    return isinstance(name, str) and bool(name) and all(is_plain_file_name(part) for part in name.split("/"))
