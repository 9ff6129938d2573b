"""Private by default: what a service makes, only its own user may read.

Transcripts, storage data, journals and logs name users and hold their words. Every service
process calls `make_private()` first (the `kvtb serve` and `kvtb up` entry points do, and
kvtb.launch starts children with the same umask), so every directory it makes is 0700 and every
file 0600, whatever the umask it was started with. Children inherit the umask.

`private_dir(path)` makes a directory 0700, or narrows an existing one to 0700; `private_tree`
narrows what an older run left (directories 0700, files 0600).
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

PRIVATE_UMASK = 0o077
DIR_MODE = 0o700
FILE_MODE = 0o600


def make_private() -> int:
    """Set this process's umask to 077 (new files 0600, new directories 0700); the old umask."""
    return os.umask(PRIVATE_UMASK)


def private_dir(path: str | os.PathLike, narrow: bool = True) -> Path:
    """Make `path` (and its missing parents) a directory of mode 0700; with `narrow`, an existing one is
    narrowed to 0700 too (without, it is left as it is: a log's directory may be a shared one).

    Parents made here are 0700 too; existing parents are left as they are (they may be /var or $HOME).
    Raises NotADirectoryError when path is a file, PermissionError when another user owns it, ValueError
    when asked to narrow a shared sticky directory such as /tmp."""
    path = Path(path)
    old = os.umask(PRIVATE_UMASK)
    try:
        path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    except FileExistsError as exc:
        raise NotADirectoryError(f"{path} is not a directory") from exc
    finally:
        os.umask(old)
    mode = path.stat().st_mode
    if narrow and stat.S_IMODE(mode) != DIR_MODE:
        if mode & stat.S_ISVTX:
            raise ValueError(f"{path} is a shared directory (sticky, like /tmp): give a directory of its own")
        os.chmod(path, DIR_MODE)
    return path


def data_dir(path: str | os.PathLike) -> Path:
    """A service's data directory: private_dir(path), except that a shared sticky directory (such as /tmp,
    given as the directory itself) is left as it is rather than refused; the files in it are 0600 anyway."""
    try:
        return private_dir(path)
    except ValueError:
        return private_dir(path, narrow=False)


def private_tree(path: str | os.PathLike) -> int:
    """Narrow every directory under path (itself included) to 0700 and every file to 0600; symbolic links
    are not followed. How many modes it changed."""
    root = private_dir(path)
    changed = 0
    for top, dirs, files in os.walk(root):
        for name, mode in [(d, DIR_MODE) for d in dirs] + [(f, FILE_MODE) for f in files]:
            entry = os.path.join(top, name)
            st = os.lstat(entry)
            if stat.S_ISLNK(st.st_mode) or stat.S_IMODE(st.st_mode) == mode:
                continue
            if stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode):
                os.chmod(entry, mode)
                changed += 1
    return changed


def open_private(path: str | os.PathLike, mode: str = "ab"):
    """Open a file for writing, created 0600 (an existing regular file narrowed to 0600; /dev/null is left
    as it is)."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if "a" in mode else os.O_TRUNC)
    fd = os.open(path, flags, FILE_MODE)
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) != FILE_MODE:
            os.fchmod(fd, FILE_MODE)
        return os.fdopen(fd, mode)
    except BaseException:
        os.close(fd)
        raise

