"""One wording for files that cannot be read, so every command says "FILE: no such file" rather
than Python's "[Errno 2] No such file or directory: 'FILE'"."""

from __future__ import annotations

import errno


def describe(exc: OSError) -> str:
    """What is wrong with the file, in a few words (without its name)."""
    if isinstance(exc, FileNotFoundError):
        return "no such file"
    if isinstance(exc, IsADirectoryError):
        return "is a folder, not a file"
    if isinstance(exc, PermissionError):
        return "permission denied"
    if exc.errno is not None:
        return exc.strerror or errno.errorcode.get(exc.errno, str(exc))
    return str(exc)
