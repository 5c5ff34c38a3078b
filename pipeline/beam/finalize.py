"""FinalizeOutput: commit the staged shards, then index.json, manifest, rejects and COMPLETED.

Runs once, after every shard is written. Until it finishes, the output holds no
COMPLETED marker, and readers (`hbpe shards ...`, the trainer) refuse it.

An --overwrite builds the new output in a folder of its own inside the old one
(OUTPUT/.hbpe-new-XXXXXXXX) and swaps them only once it is complete (`replace_output`),
so a failed or interrupted run leaves the previous output as it was, and a swap cut
short is finished by `--resume`; only names hbpe writes (`is_hbpe_entry`) are ever deleted.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field

import numpy as np

from hbpe.pipeline.beam import fs
from hbpe.pipeline.beam.shard_tasks import ShardPlan, read_pieces
from hbpe.pipeline.beam.units import UnitSummary, unit_rejects_path
from hbpe.schemas import shard_columns
from hbpe.schemas.canonical import pretty_json
from hbpe.schemas.errors import HbpeError
from hbpe.schemas.manifest import Counts, Manifest, derived_statistics
from hbpe.schemas.tokenizer_artifact import RANK_FILENAME, SPEC_FILENAME, SPEC_FILENAMES, TokenizerSpec
from hbpe.schemas.tokenizer_tables import TABLES_DATA_FILENAME, TABLES_MANIFEST_FILENAME
from hbpe.schemas.version import HBPE_VERSION

STAGING_DIRNAME = ".hbpe-staging"
# what a conversion writes at the top of its output; ".tmp-<hex>" is a write_atomic in flight
_HBPE_ENTRY = re.compile(
    r"(shard\.\d{5,}\.mds\.zstd|index\.json|manifest\.json|COMPLETED)(\.tmp-[0-9a-f]{12})?"
    rf"|{shard_columns.REJECTS_DIRNAME}|{shard_columns.TOKENIZER_DIRNAME}|{re.escape(STAGING_DIRNAME)}"
    r"|\.hbpe-new-[0-9a-f]{8}"
)


def is_hbpe_entry(name: str) -> bool:
    """True for a name `hbpe convert` writes directly inside its output directory."""
    return _HBPE_ENTRY.fullmatch(name) is not None


def discard_hbpe_entries(path: str) -> list[str]:
    """Delete what hbpe wrote directly inside `path`; returns the names it left (written by someone else)."""
    names = fs.top_entries(path)
    fs.delete_entries(path, [n for n in names if is_hbpe_entry(n)])
    return [n for n in names if not is_hbpe_entry(n)]


def replace_output(build: str, output: str) -> None:
    """Put a complete output `build` (a `.hbpe-new-*` folder inside `output`) in place of the previous one.

    Copies, never moves, so the build stays whole until the new output is: a swap cut short at
    any point (kill -9 included; a bucket swap of 150 shards takes seconds) is finished by
    running it again (`--resume` does), and readers never see a mix, as the marker goes
    first and comes back last:

        1. output/COMPLETED goes: readers refuse the folder from here on
        2. the previous output's files that the new one has not (extra shards, ...) go
        3. the build's files are copied over the old ones (locally hard links: no data copied)
        4. output/COMPLETED, last: the new output is readable
        5. the build goes, its COMPLETED first (what a kill leaves of it is only leftovers)

    Until step 1 the previous output is readable as it was. Files hbpe did not write stay.
    """
    name = build.rstrip("/").rsplit("/", 1)[-1]
    done = shard_columns.COMPLETED_FILENAME
    new = [r for r in fs.list_files(build) if r.split("/", 1)[0] != STAGING_DIRNAME]
    if done not in new:
        raise HbpeError(f"internal: {build} is not a complete output (no {done}): it cannot replace {output}")
    fs.delete_entries(output, [done])
    keep, tops = set(new), {r.split("/", 1)[0] for r in new}
    # whole entries the new output has not (extra shards, a staging, other builds), then stale files inside
    # the folders both have (a tokenizer's rank file of another name)
    fs.delete_entries(output, [n for n in fs.top_entries(output) if is_hbpe_entry(n) and n not in tops | {name}])
    fs.delete_files(output, [r for r in fs.list_files(output) if _doomed(r, name, keep)])
    fs.copy_files([(fs.join(build, r), fs.join(output, r)) for r in new if r != done])
    fs.copy_files([(fs.join(build, done), fs.join(output, done))])
    fs.delete_entries(build, [done])
    fs.delete_tree(build)


def _doomed(rel: str, build_name: str, keep: set[str]) -> bool:
    """Whether the swap deletes `rel` in the output: hbpe's, not the new output's, not inside the build."""
    top = rel.split("/", 1)[0]
    return top != build_name and is_hbpe_entry(top) and rel not in keep


@dataclass(frozen=True)
class FinalizeContext:
    output: str
    staging: str
    config: dict
    inputs: list[dict]
    tokenizer_spec: TokenizerSpec
    started_at: float
    timing: dict = field(default_factory=dict)  # how this run went (runner, units reused): recorded under timing
    skipped_inputs: list[dict] = field(default_factory=list)  # inputs.SkippedInput dicts: read once, or no file


def sum_counts(units: list[UnitSummary], plan: ShardPlan) -> tuple[Counts, list[int]]:
    c = Counts()
    hist = np.zeros(max((len(u.histogram) for u in units), default=1), dtype=np.int64)
    for u in units:
        c.add(u.counts)
        hist[: len(u.histogram)] += u.histogram
    c.patches = plan.total_patches
    c.samples = plan.samples
    c.tail_patches_dropped = plan.tail_dropped
    c.tail_patches_padded = plan.tail_padded
    return c, hist.tolist()


def finalize_output(
    entries: list[tuple[int, dict]], *, ctx: FinalizeContext, units: list[UnitSummary], plan: ShardPlan
) -> dict:
    units = sorted(units, key=lambda u: u.index)
    entries = sorted(entries, key=lambda e: e[0])
    if [i for i, _ in entries] != list(range(len(plan.tasks))):
        raise HbpeError(f"internal: expected {len(plan.tasks)} shards, got indices {[i for i, _ in entries][:10]}...")
    counts, hist = sum_counts(units, plan)
    counts.tail_tokens_dropped = int((read_pieces(ctx.staging, plan.tail_pieces) >= 0).sum())
    if not counts.balanced():
        raise HbpeError(
            f"accounting failed: documents_read={counts.documents_read} != written {counts.documents_written} "
            f"+ rejected {counts.documents_rejected}"
        )
    spec = ctx.tokenizer_spec
    names = [shard_columns.shard_basename(i) for i, _ in entries]

    # 1. shards into place (each rename is atomic; nothing reads them before COMPLETED)
    for name in names:
        fs.rename(fs.join(ctx.staging, "shards", name), fs.join(ctx.output, name))
    # 2. the plain MDS index, written the way MDSWriter writes it
    index = {"version": 2, "shards": [e for _, e in entries]}
    fs.write_atomic(fs.join(ctx.output, shard_columns.INDEX_FILENAME), json.dumps(index, sort_keys=True).encode())
    # 3. rejects, concatenated in unit (= input) order
    rejects = b"".join(fs.read_bytes(unit_rejects_path(ctx.staging, u.index)) for u in units)
    fs.write_atomic(fs.join(ctx.output, shard_columns.REJECTS_DIRNAME, "rejects.jsonl"), rejects)
    # 4. a copy of the tokenizer, so the shards are self-describing
    # (object to object: a local copy in between was a /tmp/hbpe-* folder left behind by every remote conversion)
    # the spec under its current name, also when the input tokenizer (copied as it was) is an older one's
    # tokenizer.json: the same bytes, the same fingerprint
    staged = fs.join(ctx.staging, "tokenizer")
    spec_name = next((n for n in SPEC_FILENAMES if fs.size(fs.join(staged, n)) is not None), SPEC_FILENAME)
    copies = [(spec_name, SPEC_FILENAME), (RANK_FILENAME, RANK_FILENAME)]
    # its built tables where the tokenizer has them (data before manifest), so that whoever loads the shards'
    # tokenizer loads it in a fraction of the time (pipeline/tokenizer/tables.py); they are checked on load
    copies += [
        (n, n) for n in (TABLES_DATA_FILENAME, TABLES_MANIFEST_FILENAME) if fs.size(fs.join(staged, n)) is not None
    ]
    for src, name in copies:
        data = fs.read_bytes(fs.join(staged, src))
        fs.write_atomic(fs.join(ctx.output, shard_columns.TOKENIZER_DIRNAME, name), data)
    manifest = Manifest(
        hbpe_version=HBPE_VERSION,
        shard_schema_version=shard_columns.SHARD_SCHEMA_VERSION,
        tokenizer_fingerprint=spec.fingerprint,
        first_stage_fingerprint=spec.first_stage.fingerprint,
        max_patch_size=spec.second_stage.max_patch_size,
        mode=spec.second_stage.mode,
        seq_len=ctx.config["seq_len"],
        config=ctx.config,
        inputs=ctx.inputs,
        counts=counts,
        statistics=derived_statistics(counts, hist),
        shards=names,
        timing={"wall_time_s": round(time.time() - ctx.started_at, 3), **ctx.timing},
        skipped_inputs=ctx.skipped_inputs,
        columns=list(shard_columns.column_names(store_patches=ctx.config["store_patches"])),
    )
    fs.write_atomic(fs.join(ctx.output, shard_columns.MANIFEST_FILENAME), pretty_json(manifest.to_dict()).encode())
    # 5. the commit marker, last
    fs.write_atomic(fs.join(ctx.output, shard_columns.COMPLETED_FILENAME), b"")
    fs.delete_tree(ctx.staging)
    return manifest.to_dict()
