"""`--input` patterns -> corpus files: directories walked, globs expanded, each real file and folder once.

A local directory is walked following its links to folders (a corpus often links shared
data in), but every real folder is entered once, by its (st_dev, st_ino): `ln -s . self`
or two folders linking each other end the walk instead of repeating the corpus 40 times
over (the kernel's link limit) or growing without bound. A file reached under a second
path (a symlink or a hard link to a file already found) is read once too. What was left
out for this is returned as `skipped`, with the reason and the path read instead, for the
manifest and the conversion's summary; so are what a folder or glob holds besides files and
folders: a FIFO, socket or device (it has no size to cut into ranges, and a FIFO blocks the
read) and a link to nothing. Given directly, such a path is an error.

    DIR/a.jsonl                  read
    DIR/self -> .                skipped: directory_already_read, same as DIR
    DIR/sub/b.jsonl              read
    DIR/link.jsonl -> a.jsonl    skipped: file_already_read, same as DIR/a.jsonl
    DIR/pipe.jsonl (mkfifo)      skipped: not_a_regular_file
    DIR/gone.jsonl -> nowhere    skipped: dangling_link

Real folders are walked before any link to a folder is followed, so the path kept is the
plain one when there is one.
"""

from __future__ import annotations

import fnmatch
import glob
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field

from hbpe.pipeline import storage
from hbpe.pipeline.beam.stores import filesystems
from hbpe.pipeline.corpus.files import KNOWN_SUFFIXES, detect_or_none
from hbpe.schemas.errors import ConfigError

DIRECTORY_ALREADY_READ = "directory_already_read"  # a link to a folder walked already (a loop, or a 2nd path)
FILE_ALREADY_READ = "file_already_read"  # the same file under another path (symlink or hard link)
NOT_A_REGULAR_FILE = "not_a_regular_file"  # a FIFO, socket or device in a folder or glob
DANGLING_LINK = "dangling_link"  # a symbolic link to nothing in a folder or glob


@dataclass(frozen=True)
class SkippedInput:
    path: str
    reason: str
    same_as: str | None = None  # the path read instead, for the paths read once

    def to_dict(self) -> dict[str, str]:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass
class InputSelection:
    paths: list[str]  # sorted corpus files, each real file once
    skipped: list[SkippedInput] = field(default_factory=list)  # sorted by path


def find_inputs(
    patterns: Iterable[str], *, excludes: Iterable[str] = (), skip_prefixes: Iterable[str] = ()
) -> InputSelection:
    """Expand files, directories and globs (local or URI) into the corpus files, each real file once.

    Directories are walked recursively; like glob, the walk skips hidden files and folders
    (.DS_Store, .git/). A file is left out when an exclude pattern matches its name, its path
    relative to the directory given, or its path, e.g. '*.md', '.DS_Store', 'docs/*'; and when
    its real path starts with one of `skip_prefixes` (the output directory: hbpe's own outputs
    are never inputs). Files whose format the name does not tell are refused together, listed.
    """
    excludes, skip = tuple(excludes), tuple(skip_prefixes)

    def excluded(path: str, root: str | None) -> bool:
        names = [os.path.basename(path), path] + ([os.path.relpath(path, root)] if root else [])
        return any(fnmatch.fnmatch(n, pat) for pat in excludes for n in names)

    found: set[str] = set()
    unknown: list[str] = []
    skipped: list[SkippedInput] = []
    for pat in patterns:
        root = None
        walk = _Walk(skipped)  # one per pattern: the same folder under two --input is found by its files
        if storage.is_remote(pat):
            matches = [m.path for m in filesystems().match([pat])[0].metadata_list]
        elif os.path.isdir(pat):
            root = pat
            matches = list(walk.files(pat))
        elif "**" in pat:  # glob's ** follows links to folders without end: walk its base instead
            matches = [p for p in walk.files(_glob_base(pat)) if _glob_match(p, pat)]
        else:
            _refuse_special(pat)
            matches = [p for p in glob.glob(pat) if not os.path.isdir(p)]
        if skip:
            matches = [p for p in matches if storage.is_remote(p) or not os.path.realpath(p).startswith(skip)]
        candidates = [p for p in matches if not excluded(p, root)]
        kept = _regular_files(candidates, skipped)
        if not kept:
            why = f" (all {len(matches)} excluded by --exclude)" if matches else ""
            if candidates:
                why = f" (only {len(candidates)} FIFO, device or link to nothing, such as {candidates[0]})"
            raise ConfigError(f"--input {pat!r} matches no file{why}; check the path or quote the glob")
        unknown += [p for p in kept if detect_or_none(p) is None]
        found.update(kept)
    if unknown:
        unknown = sorted(set(unknown))
        shown = ", ".join(unknown[:5]) + (f" ... ({len(unknown)} in all)" if len(unknown) > 5 else "")
        ext = os.path.splitext(unknown[0])[1]
        example = f"*{ext}" if ext else os.path.basename(unknown[0])
        raise ConfigError(
            f"the inputs hold {len(unknown)} file(s) of unknown format: {shown}; hbpe reads {KNOWN_SUFFIXES}: "
            f"leave the others out with --exclude GLOB (repeatable, e.g. --exclude '{example}'), "
            "or select files with a glob such as --input 'DIR/*.jsonl'"
        )
    paths, duplicates = _once_per_file(sorted(found))
    return InputSelection(paths, sorted(skipped + duplicates, key=lambda s: s.path))


def skipped_line(skipped: list[SkippedInput]) -> str:
    """One line for the log: how many paths were left out and why, the first few, and where the full list is."""
    once = [s for s in skipped if s.same_as is not None]
    others = [s for s in skipped if s.same_as is None]
    parts = []
    if once:
        parts.append(
            f"skipped {len(once)} input path(s) whose folder or file was read under another path (a symlink loop "
            f"or a second link): {_first(once, lambda s: f'same as {s.same_as}')}"
        )
    if others:
        parts.append(
            f"skipped {len(others)} input path(s) that are no regular file (a FIFO, socket or device, or a link to "
            f"nothing): {_first(others, lambda s: s.reason)}"
        )
    return "; ".join(parts) + "; the manifest lists them under skipped_inputs"


def _first(skipped: list[SkippedInput], why: Callable[[SkippedInput], str]) -> str:
    shown = ", ".join(f"{s.path} ({why(s)})" for s in skipped[:3])
    return shown + (f" and {len(skipped) - 3} more" if len(skipped) > 3 else "")


def _refuse_special(path: str) -> None:
    """A path given directly that exists but is no file or folder (a FIFO, /dev/zero, a link to nothing): ConfigError."""
    if glob.has_magic(path) or not os.path.lexists(path) or os.path.isfile(path) or os.path.isdir(path):
        return
    if os.path.islink(path) and not os.path.exists(path):
        raise ConfigError(f"--input {path!r} is a link to {os.readlink(path)!r}, which does not exist; fix the link")
    mode = os.stat(path).st_mode
    kind = next((k for test, k in _SPECIAL if test(mode)), "not a file or folder")
    raise ConfigError(
        f"--input {path!r} is not a regular file ({kind}): hbpe reads corpus files, which it can size, split "
        "and read again on --resume; write the data to a file and pass that"
    )


_SPECIAL = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _regular_files(paths: list[str], skipped: list[SkippedInput]) -> list[str]:
    """The regular files of `paths` (URIs, files, links to files); the others are appended to `skipped`."""
    files = []
    for p in paths:
        if storage.is_remote(p) or os.path.isfile(p):
            files.append(p)
        else:
            dangling = os.path.islink(p) and not os.path.exists(p)
            skipped.append(SkippedInput(p, DANGLING_LINK if dangling else NOT_A_REGULAR_FILE))
    return files


def _once_per_file(paths: list[str]) -> tuple[list[str], list[SkippedInput]]:
    """Each real file once: of the paths to one file, the plain one (not a link) if any, else the first."""
    by_file: dict[tuple[int, int], list[str]] = {}
    for p in paths:
        if storage.is_remote(p):
            by_file[(-1, len(by_file))] = [p]  # a bucket has no links
            continue
        st = os.stat(p)
        by_file.setdefault((st.st_dev, st.st_ino), []).append(p)
    kept, skipped = [], []
    for group in by_file.values():
        first = min(group, key=lambda p: (os.path.islink(p) if not storage.is_remote(p) else False, p))
        kept.append(first)
        skipped += [SkippedInput(p, FILE_ALREADY_READ, first) for p in group if p != first]
    return sorted(kept), skipped


class _Walk:
    """A directory walk that enters every real folder once; what it leaves out is appended to `skipped`."""

    def __init__(self, skipped: list[SkippedInput]) -> None:
        self.seen: dict[tuple[int, int], str] = {}  # (st_dev, st_ino) of a folder -> the path it was read under
        self.skipped = skipped

    def files(self, root: str) -> Iterator[str]:
        """Every non-hidden file under `root`: real folders first, then the links to folders, each folder once."""
        if not os.path.isdir(root):
            return
        links = [root]  # the root itself is "followed" like a link: it may be one
        while links:
            top = links.pop(0)
            try:
                st = os.stat(top)
            except OSError:  # a dangling or unreadable link: glob would not list it either
                continue
            if (key := (st.st_dev, st.st_ino)) in self.seen:
                self.skipped.append(SkippedInput(top, DIRECTORY_ALREADY_READ, self.seen[key]))
                continue
            self.seen[key] = top
            for dirpath, dirnames, filenames in os.walk(top):  # links to folders are listed, not entered
                keep = []
                for d in sorted(n for n in dirnames if not n.startswith(".")):
                    path = os.path.join(dirpath, d)
                    if os.path.islink(path):
                        links.append(path)
                        continue
                    st = os.stat(path)
                    if (key := (st.st_dev, st.st_ino)) in self.seen:  # a bind mount of a folder read already
                        self.skipped.append(SkippedInput(path, DIRECTORY_ALREADY_READ, self.seen[key]))
                        continue
                    self.seen[key] = path
                    keep.append(d)
                dirnames[:] = keep
                yield from (os.path.join(dirpath, f) for f in sorted(filenames) if not f.startswith("."))


def _glob_base(pattern: str) -> str:
    """The folder part of a glob before its first wildcard: 'data/*/x.jsonl' -> 'data'."""
    parts = []
    for part in pattern.split("/"):
        if glob.has_magic(part):
            break
        parts.append(part)
    return "/".join(parts) or ("/" if pattern.startswith("/") else ".")


def _glob_match(path: str, pattern: str) -> bool:
    """Whether `path` matches `pattern` as glob matches it: '*' within a name, '**' any number of folders.

    >>> _glob_match("d/a/b/x.jsonl", "d/**/*.jsonl"), _glob_match("d/x.jsonl", "d/**/*.jsonl")
    (True, True)
    """
    base = _glob_base(pattern)
    rel = os.path.relpath(path, base).split(os.sep)
    pats = [p for p in os.path.relpath(pattern, base).split("/") if p]
    return _match_parts(rel, pats)


def _match_parts(parts: list[str], pats: list[str]) -> bool:
    if not pats:
        return not parts
    if pats[0] == "**":
        return any(_match_parts(parts[i:], pats[1:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatch.fnmatchcase(parts[0], pats[0]) and _match_parts(parts[1:], pats[1:])


def resolve_inputs(
    patterns: Iterable[str], *, excludes: Iterable[str] = (), skip_prefixes: Iterable[str] = ()
) -> list[str]:
    """The sorted corpus files of files, directories and globs (local or URI), each real file once.

    See `find_inputs`, which also says what it left out (symlink loops, second paths to a file).
    """
    return find_inputs(patterns, excludes=excludes, skip_prefixes=skip_prefixes).paths
