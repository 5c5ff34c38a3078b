"""Train, save and load the tokenizer artifact directory (schemas/tokenizer_artifact.py).

Saving writes into a temporary sibling directory and renames it into place, so a
crash never leaves a half-written artifact. Loading needs no network: the rank
file is inside the directory and its sha256 is checked against hbpe_tokenizer.json (tokenizer.json in
artifacts written before issue 19, still read).

Saving also writes the built tables (schemas/tokenizer_tables.py, tables.py): loading reads them
instead of parsing the rank file and building the patch table. An artifact without them (written
before issue 39, or a copy of the spec and rank file alone) loads the old way and says once how to
add them (`add_tables`, `hbpe tokenizer tables`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

import tiktoken

from hbpe.pipeline import storage
from hbpe.pipeline.tokenizer import first_stage, tables
from hbpe.pipeline.tokenizer.hierarchical import HierarchicalTokenizer
from hbpe.pipeline.tokenizer.second_stage.train import train_for_encoding
from hbpe.schemas.canonical import pretty_json, sha256_hex
from hbpe.schemas.errors import ArtifactError, HbpeError, file_problem, os_problem
from hbpe.schemas.names import is_plain_file_name
from hbpe.schemas.tokenizer_artifact import (
    RANK_FILENAME,
    SPEC_FILENAME,
    SPEC_FILENAMES,
    FirstStageSpec,
    SecondStageSpec,
    TokenizerSpec,
)
from hbpe.schemas.tokenizer_tables import TABLES_DATA_FILENAME, TABLES_FILENAMES, TABLES_MANIFEST_FILENAME
from hbpe.schemas.version import HBPE_VERSION

log = logging.getLogger(__name__)
_HINTED: set[str] = set()  # the tokenizers without tables this process has said so of (once each)


def first_stage_spec(enc: tiktoken.Encoding, rank_bytes: bytes) -> FirstStageSpec:
    return FirstStageSpec(
        name=enc.name,
        pattern=enc._pat_str,
        special_tokens=dict(enc._special_tokens),
        rank_file_sha256=sha256_hex(rank_bytes),
        n_vocab=enc.n_vocab,
    )


def train_tokenizer(
    encoding: str | tiktoken.Encoding, *, max_patch_size: int, mode: str = "full", pattern: str | None = None
) -> HierarchicalTokenizer:
    """Second-stage training (Algorithm 1) over a first-stage encoding's vocabulary."""
    enc = first_stage.load_encoding(encoding, pattern=pattern) if isinstance(encoding, str) else encoding
    rank_bytes = first_stage.format_rank_file(enc._mergeable_ranks)
    merges = train_for_encoding(enc, max_patch_size)
    spec = TokenizerSpec(
        first_stage=first_stage_spec(enc, rank_bytes),
        second_stage=SecondStageSpec(max_patch_size=max_patch_size, mode=mode, merges=tuple(merges)),
        hbpe_version=HBPE_VERSION,
    )
    return HierarchicalTokenizer(enc, spec)


def with_patch_size(tok: HierarchicalTokenizer, *, max_patch_size: int, mode: str) -> HierarchicalTokenizer:
    """The same first stage with a second stage retrained for another S or mode."""
    if (max_patch_size, mode) == (tok.max_patch_size, tok.mode):
        return tok
    return train_tokenizer(tok.encoding, max_patch_size=max_patch_size, mode=mode)


def check_out(out_dir: str | os.PathLike, *, overwrite: bool = False, timeout: float | None = None) -> None:
    """The checks `save` makes of `out_dir`, for a caller to make before training: a refusal costs no work.

    For a URI: its bucket exists, and the prefix holds nothing or (with `overwrite`) a tokenizer.
    """
    if storage.is_remote(out_dir):
        _check_remote_out(str(out_dir), overwrite=overwrite, timeout=timeout)
    else:
        _check_local_out(out_dir, overwrite=overwrite)


def save(
    tok: HierarchicalTokenizer, out_dir: str | os.PathLike, *, overwrite: bool = False, with_tables: bool = True
) -> Path | str:
    """Write the artifact directory atomically: built in a sibling temp dir, then renamed into place.

    `with_tables`: write the built tables too (the artifact loads without them, only slower).

    An existing non-empty `out_dir` is replaced only with `overwrite=True`, and only when it is a
    tokenizer directory (hbpe_tokenizer.json, or an older tokenizer.json, and the rank file it names): a
    folder holding anything else is refused, never deleted, so `--out .` or `--out ~/data` cannot wipe the user's files.
    A URI (s3://, gs://, ...) is built locally and uploaded: see `_save_remote`.
    """
    if storage.is_remote(out_dir):
        return _save_remote(tok, str(out_dir), overwrite=overwrite, with_tables=with_tables)
    out = _check_local_out(out_dir, overwrite=overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    # built in a plain folder inside mkdtemp's: that one is 0o700, this one gets the umask's mode, as any
    # mkdir (a shared export's tokenizer/ was unreadable to the other users)
    tmp = work / out.name
    old = None
    try:
        tmp.mkdir()
        (tmp / RANK_FILENAME).write_bytes(first_stage.format_rank_file(tok.encoding._mergeable_ranks))
        if with_tables:
            tables.write(tok, tmp)
        (tmp / SPEC_FILENAME).write_text(pretty_json(tok.spec.to_dict()))
        if out.exists():
            # moved aside, not deleted, until the new one is in place: a failed rename loses nothing
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            os.replace(out, old / out.name)
        os.replace(tmp, out)
    except BaseException:
        if old is not None and not out.exists() and (old / out.name).exists():
            os.replace(old / out.name, out)
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)  # empty once the new folder is in place
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)  # holds only the checked tokenizer files
    return Path(out_dir)  # as the caller spelled it (the demo prints it beside its other relative paths)


def _check_local_out(out_dir: str | os.PathLike, *, overwrite: bool) -> Path:
    """`out_dir` resolved, when it may take the tokenizer; ArtifactError naming it otherwise."""
    # resolved first: '.' has the name "" and the parent '.', which put the temp dir inside the output
    out = Path(out_dir).resolve()
    if out.parent == out:
        raise ArtifactError(f"{out_dir} is a filesystem root: give a new or empty directory for the tokenizer")
    if out.exists() and not out.is_dir():
        raise ArtifactError(f"{out_dir} is a file, not a directory: give a new or empty directory for the tokenizer")
    names = sorted(p.name for p in out.iterdir()) if out.exists() else []
    _refuse_unless_replaceable(out_dir, names, _artifact_names(out), overwrite=overwrite)
    return out


def _refuse_unless_replaceable(
    out_dir: str | os.PathLike, names: list[str], artifact_names: set[str], *, overwrite: bool
) -> None:
    """Refuse a destination holding anything but a tokenizer, and a tokenizer without `overwrite`."""
    foreign = [n for n in names if n not in artifact_names]
    if foreign:
        listed = ", ".join(foreign[:5]) + (f" ... ({len(foreign)} in all)" if len(foreign) > 5 else "")
        raise ArtifactError(
            f"{out_dir} holds files hbpe did not write: {listed}; overwriting only replaces a tokenizer directory "
            "(hbpe_tokenizer.json and its rank file): choose a new or empty directory, or move those files away"
        )
    if names and not overwrite:
        raise ArtifactError(f"{out_dir} already holds a tokenizer; pass --overwrite to replace it")


def _check_remote_out(uri: str, *, overwrite: bool, timeout: float | None) -> None:
    """A bucket prefix may take the tokenizer: the bucket exists, and the prefix is empty or a tokenizer."""
    storage.check_bucket(uri, timeout=timeout)
    names = storage.list_dir(uri, timeout=timeout)
    artifact_names = {*SPEC_FILENAMES, RANK_FILENAME, *TABLES_FILENAMES}
    for name in (*SPEC_FILENAMES, TABLES_MANIFEST_FILENAME):  # the files an earlier spec or manifest names too
        if name in names:
            spec = storage.read_if_exists(storage.join(uri, name), timeout=timeout)
            artifact_names |= _names_in_spec(spec or b"")
    _refuse_unless_replaceable(uri, names, artifact_names, overwrite=overwrite)


def _save_remote(tok: HierarchicalTokenizer, uri: str, *, overwrite: bool, with_tables: bool) -> str:
    """Build the artifact in a local temporary directory, then upload it under the prefix `uri`.

    An object store has no rename, so the rank file and tables go first and hbpe_tokenizer.json last: a
    prefix holding hbpe_tokenizer.json holds a whole artifact. `overwrite` replaces the objects of the same
    names (while the rank file is replaced, a reader of the old hbpe_tokenizer.json sees a hash mismatch,
    an error, never a wrong tokenizer).
    """
    _check_remote_out(uri, overwrite=overwrite, timeout=None)
    with tempfile.TemporaryDirectory(prefix="hbpe-tokenizer-") as tmp:
        local = Path(save(tok, Path(tmp, "tokenizer"), with_tables=with_tables))
        for name in (RANK_FILENAME, TABLES_DATA_FILENAME, TABLES_MANIFEST_FILENAME, SPEC_FILENAME):
            if (local / name).exists():
                storage.upload_file(local / name, storage.join(uri, name))
    return uri


def _artifact_names(path: Path) -> set[str]:
    """The names an hbpe tokenizer directory holds: its spec file (either name), the rank file it names, and
    the tables (the manifest and the data file it names)."""
    names = {*SPEC_FILENAMES, RANK_FILENAME, *TABLES_FILENAMES}
    for file in (spec_path(path), path / TABLES_MANIFEST_FILENAME):
        with contextlib.suppress(OSError):
            names |= _names_in_spec(file.read_bytes())
    return names


def _names_in_spec(spec: bytes) -> set[str]:
    """The rank file a spec file names, or the data file a tables manifest names (set() when unreadable)."""
    with contextlib.suppress(ValueError, KeyError, TypeError):
        d = json.loads(spec)
        name = d["file"] if "file" in d else d["first_stage"]["rank_file"]
        return {name} if isinstance(name, str) else set()
    return set()


def spec_path(path: str | os.PathLike) -> Path:
    """The spec file of a tokenizer directory: hbpe_tokenizer.json, or tokenizer.json in one written before issue
    19 (both read alike; a missing one is named by its current name)."""
    for name in SPEC_FILENAMES:
        if (Path(path) / name).is_file():
            return Path(path) / name
    return Path(path) / SPEC_FILENAME


def load_spec(path: str | os.PathLike) -> TokenizerSpec:
    spec_file = spec_path(path)
    problem = file_problem(spec_file, missing="not found")
    if problem is not None:
        raise ArtifactError(
            f"{spec_file} {problem}: {path} is not a tokenizer directory (create one with `hbpe tokenizer train`)"
        )
    try:
        raw = json.loads(spec_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ArtifactError(f"{spec_file}: not valid JSON ({e}); restore or retrain the tokenizer") from e
    return TokenizerSpec.from_dict(raw, source=str(spec_file))


def load(path: str | os.PathLike, *, use_tables: bool = True) -> HierarchicalTokenizer:
    """Load and verify an artifact directory (local, or a gs:// / s3:// URI): version, fingerprint, rank-file hash,
    and the tables' size, hash and shapes when it has them.

    `use_tables=False`: ignore any tables, parse the rank file and build the patch table (as `add_tables` does).
    """
    if storage.is_remote(path):
        return _load_remote(str(path), use_tables=use_tables)
    return _load_local(path, use_tables=use_tables)


def add_tables(path: str | os.PathLike) -> dict[str, int]:
    """Write the built tables into an existing artifact (local or a URI) -> {file name: bytes}.

    The tokenizer is built from its rank file and merges, never from tables already there, so this
    also replaces altered or outdated ones.
    """
    tok = load(path, use_tables=False)
    if not storage.is_remote(path):
        try:
            return tables.write(tok, path)
        except OSError as e:  # a read-only folder, a folder where a table file goes
            raise ArtifactError(f"cannot write the tables into {path}: {os_problem(e)}") from None
    uri = str(path)
    with tempfile.TemporaryDirectory(prefix="hbpe-tables-") as tmp:
        written = tables.write(tok, tmp)
        for name in written:  # the data file first, the manifest that vouches for it last
            storage.upload_file(Path(tmp, name), storage.join(uri, name))
    return written


def fetch(uri: str, into: str | os.PathLike) -> str:
    """The artifact's files at `uri` (its spec file, the rank file it names, and its tables when it has them)
    downloaded into `into`.

    Names missing remotely are left out, for `load`'s checks to name; errors name the URI, not the copy.
    """
    local = str(into)
    try:
        # an older artifact's name too; tables when it has them
        storage.localize_dir(uri, [*SPEC_FILENAMES, TABLES_MANIFEST_FILENAME], into=local)
        # the rank file's name is in the spec, the tables data file's in their manifest
        named = _names_in_spec(Path(local, TABLES_MANIFEST_FILENAME).read_bytes()) if _has_tables(local) else set()
        # a name that is not a plain file name is refused by the manifest's check when the tables are read
        data = sorted(n for n in named if is_plain_file_name(n))
        storage.localize_dir(uri, [load_spec(local).first_stage.rank_file, *data], into=local)
    except ArtifactError as e:
        raise ArtifactError(str(e).replace(local, uri.rstrip("/"))) from e
    return local


def _has_tables(folder: str | os.PathLike) -> bool:
    return Path(folder, TABLES_MANIFEST_FILENAME).is_file()


def _load_remote(uri: str, *, use_tables: bool) -> HierarchicalTokenizer:
    """Download the files into a temporary directory and load that; errors name the URI, not the copy."""
    with tempfile.TemporaryDirectory(prefix="hbpe-tokenizer-") as local:
        fetch(uri, local)
        try:
            return _load_local(local, use_tables=use_tables, shown=uri.rstrip("/"))
        except ArtifactError as e:
            raise ArtifactError(str(e).replace(local, uri.rstrip("/"))) from e


def _load_local(path: str | os.PathLike, *, use_tables: bool, shown: str | None = None) -> HierarchicalTokenizer:
    spec = load_spec(path)
    fs = spec.first_stage
    rank_path = Path(path) / fs.rank_file
    problem = file_problem(rank_path, missing="is missing")
    if problem is not None:
        raise ArtifactError(f"{rank_path} {problem}: the tokenizer directory is incomplete; copy it whole or retrain")
    data = rank_path.read_bytes()
    if sha256_hex(data) != fs.rank_file_sha256:
        raise ArtifactError(
            f"{rank_path} was altered: its sha256 {sha256_hex(data)[:16]}... differs from its spec's "
            f"{fs.rank_file_sha256[:16]}...; restore the original file or retrain"
        )
    loaded = _read_tables(path, spec, rank_file_size=len(data), shown=shown or str(path)) if use_tables else None
    ranks = loaded.ranks if loaded else first_stage.parse_rank_file(data, source=str(rank_path))
    spec_file = spec_path(path)
    fix = "restore the tokenizer directory from its source or retrain it with `hbpe tokenizer train`"
    clash = sorted(set(fs.special_tokens.values()) & set(ranks.values()))
    if clash:
        raise ArtifactError(f"{spec_file}: special token ids {clash[:3]} are also ranks of {rank_path.name}; {fix}")
    try:
        enc = tiktoken.Encoding(
            name=fs.name, pat_str=fs.pattern, mergeable_ranks=ranks, special_tokens=fs.special_tokens
        )
    except ValueError as e:  # the split pattern does not compile (tiktoken's regex engine says where)
        raise ArtifactError(f"{spec_file}: first_stage.pattern is not a valid split pattern ({e}); {fix}") from None
    if enc.n_vocab != fs.n_vocab:
        raise ArtifactError(
            f"{spec_file}: first_stage.n_vocab is {fs.n_vocab}, but {rank_path.name} and the special tokens give "
            f"{enc.n_vocab}; {fix}"
        )
    try:
        return HierarchicalTokenizer(enc, spec, tables=loaded.patches if loaded else None)
    except ArtifactError:
        raise
    except HbpeError as e:  # e.g. merges learned for a larger S than the spec now says
        raise ArtifactError(f"{spec_file}: the second stage does not fit this first stage ({e}); {fix}") from None


def _read_tables(
    path: str | os.PathLike, spec: TokenizerSpec, *, rank_file_size: int, shown: str
) -> tables.LoadedTables | None:
    """The artifact's tables, checked; None (said once per tokenizer) when it has none this hbpe reads."""
    manifest = tables.read_manifest(path, shown=str(path))
    if manifest is not None:
        return tables.read(path, manifest, spec, rank_file_size=rank_file_size, shown=str(path))
    if shown not in _HINTED:
        _HINTED.add(shown)
        log.warning(
            "%s has no built tables (%s) for this hbpe, so loading parses the rank file and builds the patch table; "
            "add them with %s to load it several times faster",
            shown,
            TABLES_MANIFEST_FILENAME,
            tables.rebuild_hint(shown),
        )
    return None
