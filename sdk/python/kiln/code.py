"""Packing a source directory as a script job's code: a gzip'd tar of the tree minus what its
``.kilnignore`` excludes, the same rules as ``kiln code push`` (kiln's code/ module).

``.kilnignore`` uses gitignore's syntax: blank lines and ``#`` comments; ``!`` re-includes; a
trailing ``/`` matches directories only; a pattern with a ``/`` before its end is anchored to the
top, one without matches a name at any depth; ``*``, ``?`` and ``[...]`` stop at ``/``; ``**``
matches across directories; ``\\`` escapes. The last matching line decides; a file below an
excluded directory stays out. ``.git/`` is excluded unless a line re-includes it.

Standard library only.
"""

from __future__ import annotations

import gzip
import io
import os
import stat
import tarfile
from dataclasses import dataclass
from typing import IO, cast

from .errors import KilnError

IGNORE_FILE = ".kilnignore"
MAX_ENTRIES = 10000


@dataclass(frozen=True)
class _Pattern:
    text: str
    negate: bool
    dir_only: bool
    anchored: bool


def _class_match(p: str, i: int, c: str) -> tuple[int, bool] | None:
    """The character class at p[i] ('['): (index past its ']', whether c is in it), or None
    when it does not close (then '[' is an ordinary character)."""
    j = i + 1
    neg = j < len(p) and p[j] in "!^"
    if neg:
        j += 1
    hit = False
    first = True
    while j < len(p) and (p[j] != "]" or first):
        first = False
        lo = p[j]
        if lo == "\\" and j + 1 < len(p):
            j += 1
            lo = p[j]
        hi = lo
        if j + 2 < len(p) and p[j + 1] == "-" and p[j + 2] != "]":
            j += 2
            hi = p[j]
            if hi == "\\" and j + 1 < len(p):
                j += 1
                hi = p[j]
        if lo <= c <= hi:
            hit = True
        j += 1
    if j >= len(p):
        return None
    return j + 1, hit != neg


def _wildmatch(p: str, pi: int, t: str, ti: int) -> bool:
    while pi < len(p):
        ch = p[pi]
        if ch == "*":
            whole = (pi + 1 < len(p) and p[pi + 1] == "*" and (pi == 0 or p[pi - 1] == "/")
                     and (pi + 2 == len(p) or p[pi + 2] == "/"))
            if whole and pi + 2 == len(p):
                return True
            if whole:
                s = ti
                while True:
                    if _wildmatch(p, pi + 3, t, s):
                        return True
                    k = t.find("/", s)
                    if k < 0:
                        return False
                    s = k + 1
            while pi < len(p) and p[pi] == "*":
                pi += 1
            if pi == len(p):
                return "/" not in t[ti:]
            s = ti
            while True:
                if _wildmatch(p, pi, t, s):
                    return True
                if s >= len(t) or t[s] == "/":
                    return False
                s += 1
        if ch == "?":
            if ti >= len(t) or t[ti] == "/":
                return False
        elif ch == "[":
            if ti >= len(t) or t[ti] == "/":
                return False
            m = _class_match(p, pi, t[ti])
            if m is None:
                if t[ti] != "[":
                    return False
            else:
                if not m[1]:
                    return False
                pi = m[0] - 1
        else:
            if ch == "\\" and pi + 1 < len(p):
                pi += 1
                ch = p[pi]
            if ti >= len(t) or t[ti] != ch:
                return False
        pi += 1
        ti += 1
    return ti == len(t)


class KilnIgnore:
    """The patterns of a ``.kilnignore`` (``text``; None: only the defaults)."""

    def __init__(self, text: str | None = None) -> None:
        self._patterns: list[_Pattern] = []
        self._add(".git/")
        for line in (text or "").split("\n"):
            self._add(line[:-1] if line.endswith("\r") else line)

    def _add(self, line: str) -> None:
        while line.endswith(" ") and not line.endswith("\\ "):
            line = line[:-1]
        if not line or line.startswith("#"):
            return
        negate = line.startswith("!")
        if negate:
            line = line[1:]
        dir_only = line.endswith("/") and not line.endswith("\\/")
        if dir_only:
            line = line[:-1]
        if not line:
            return
        anchored = "/" in line
        if line.startswith("/"):
            line = line[1:]
        if line:
            self._patterns.append(_Pattern(line, negate, dir_only, anchored))

    def match(self, path: str, is_dir: bool) -> bool:
        """Whether ``path`` (relative to the top, '/'-separated) is excluded by the patterns
        themselves (a parent's exclusion is the walker's business)."""
        base = path.rsplit("/", 1)[-1]
        excluded = False
        for pt in self._patterns:
            if pt.dir_only and not is_dir:
                continue
            if excluded == (not pt.negate):
                continue
            if _wildmatch(pt.text, 0, path if pt.anchored else base, 0):
                excluded = not pt.negate
        return excluded


def _info(name: str, kind: bytes, mode: int, size: int = 0, link: str = "") -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.type = kind
    ti.mode = mode
    ti.size = size
    ti.linkname = link
    ti.mtime = 0
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    return ti


def pack_dir(directory: str, out: IO[bytes]) -> int:
    """Writes the tree under ``directory``, minus what its ``.kilnignore`` excludes, as a gzip'd
    tar to ``out``: files, directories and symbolic links (kept as links) in name order, modes
    0644 / 0755, owners and times zeroed, so that the same tree packs to the same bytes. Returns
    the number of regular files. Raises KilnError for what no code archive may hold (a FIFO, a
    device, a set-user-ID file, a link to an absolute path or out of the tree, more than 10,000
    entries); the message says to leave it out with ``.kilnignore``."""
    if not os.path.isdir(directory):
        raise KilnError("%s is not a directory" % directory, code="not_found", status=0)
    text = None
    ig_path = os.path.join(directory, IGNORE_FILE)
    if os.path.isfile(ig_path) and not os.path.islink(ig_path):
        with open(ig_path, encoding="utf-8") as f:
            text = f.read()
    ignore = KilnIgnore(text)
    files = 0
    entries = 0

    def refuse(rel: str, what: str) -> KilnError:
        return KilnError('"%s" %s' % (rel, what), code="invalid_argument", field="source",
                         hint="leave it out with a line in %s" % IGNORE_FILE, status=0)

    gz = gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0)
    with tarfile.open(fileobj=cast(IO[bytes], gz), mode="w", format=tarfile.PAX_FORMAT) as tar:
        def walk(path: str, rel: str) -> None:
            nonlocal files, entries
            for name in sorted(os.listdir(path)):
                full = os.path.join(path, name)
                r = rel + "/" + name if rel else name
                st = os.lstat(full)
                is_dir = stat.S_ISDIR(st.st_mode)
                if ignore.match(r, is_dir):
                    continue
                entries += 1
                if entries > MAX_ENTRIES:
                    raise refuse(r, "is past the 10000 entries an archive may hold")
                if stat.S_ISREG(st.st_mode):
                    if st.st_mode & (stat.S_ISUID | stat.S_ISGID):
                        raise refuse(r, "is set-user-ID or set-group-ID")
                    mode = 0o755 if st.st_mode & 0o111 else 0o644
                    with open(full, "rb") as f:
                        tar.addfile(_info(r, tarfile.REGTYPE, mode, st.st_size), f)
                    files += 1
                elif stat.S_ISLNK(st.st_mode):
                    target = os.readlink(full)
                    parts = [x for x in target.split("/") if x not in ("", ".")]
                    up = 0
                    seen_name = False
                    bad = target.startswith("/")
                    for x in parts:
                        if x == "..":
                            up += 1
                            bad = bad or seen_name or up > r.count("/")
                        else:
                            seen_name = True
                    if bad:
                        raise refuse(r, "is a symbolic link (to %s) that leads out of the tree" % target)
                    tar.addfile(_info(r, tarfile.SYMTYPE, 0o777, 0, target))
                elif is_dir:
                    tar.addfile(_info(r, tarfile.DIRTYPE, 0o755))
                    walk(full, r)
                elif stat.S_ISFIFO(st.st_mode):
                    raise refuse(r, "is a FIFO")
                elif stat.S_ISSOCK(st.st_mode):
                    raise refuse(r, "is a socket")
                else:
                    raise refuse(r, "is a device file")

        walk(directory, "")
    gz.close()
    if files == 0:
        raise KilnError("%s holds no files to pack" % directory, code="invalid_argument", field="source",
                        hint="check %s: it may exclude everything" % IGNORE_FILE, status=0)
    return files


def pack_dir_bytes(directory: str) -> bytes:
    """pack_dir into memory."""
    buf = io.BytesIO()
    pack_dir(directory, buf)
    return buf.getvalue()
