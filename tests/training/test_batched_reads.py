"""Batched reads (training/data/batched_reads.py): the same samples, bytes and order as streaming's per-sample
path, across shuffles, stream mixes, workers, a resume from streaming's state and cache eviction; the layouts it
leaves to streaming; the loader's narrow id columns and worker defaults; `hbpe bench loader`.

The shards are the bundled sample's train split in 59 small shards, lean (tokens only) and with patches stored.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from hbpe.pipeline.shards.reader import load_shard_tokenizer
from hbpe.training.data import batched_reads
from hbpe.training.data.loader import StreamingOptions, StreamSpec, WorkerOptions, build_dataloader
from hbpe.training.data.mds_records import MappedShard, RecordLayout, parse_fixed, record_layout
from hbpe.training.data.shared_memory import release

BATCH = 8


@pytest.fixture(scope="module")
def small_shards(tmp_path_factory, gpt2_tokenizer_dir) -> dict[str, str]:
    """{"lean": ..., "patches": ...}: the sample's train split at seq_len 128, 21 samples a shard (59 shards)."""
    from hbpe.pipeline.beam.convert import run_convert
    from hbpe.schemas.convert_config import ConvertConfig
    from tests.conftest import IN_MEMORY_BEAM, split_sample

    root = tmp_path_factory.mktemp("small-shards")
    train, _ = split_sample(root / "corpus")
    out = {}
    for name, store in (("lean", False), ("patches", True)):
        cfg = ConvertConfig(
            inputs=(str(train),),
            output=str(root / name),
            tokenizer=str(gpt2_tokenizer_dir),
            seq_len=128,
            shard_bytes=1 << 16,
            store_patches=store,
        )
        run_convert(cfg, IN_MEMORY_BEAM, progress=False)
        out[name] = str(root / name)
    return out


@contextlib.contextmanager
def _loader(
    shards, tmp_path, *, batched: bool, seed: int = 17, workers: int = 0, shuffle: bool = True, **kw
) -> Iterator:
    """build_dataloader as training builds it, reading by `batched` reads or streaming's own; its threads, workers
    and shared memory given back afterwards."""
    streams = shards if isinstance(shards, list) else str(shards)
    tok = load_shard_tokenizer(streams if isinstance(streams, str) else streams[0].remote)
    tag = f"{batched}-{seed}-{workers}-{shuffle}-{len(kw)}"
    cache = None if isinstance(streams, list) else str(tmp_path / f"cache-{tag}")
    dl = build_dataloader(
        streams,
        tok,
        batch_size=BATCH,
        cache_dir=cache,
        shuffle=shuffle,
        shuffle_seed=seed,
        workers=WorkerOptions(workers),
        **kw,
    )
    dl.dataset.batched_reads = batched
    try:
        yield dl
    finally:
        iterator = vars(dl.dataset).get("_iterator")
        if iterator is not None:
            iterator.exit()
        executor = vars(dl.dataset).pop("_executor", None)
        if executor is not None:
            executor.shutdown(wait=True)
        release(dl.dataset)


def _record(sample: dict) -> tuple:
    """Everything a consumer can see of a sample: names in order, types, dtypes, shapes and bytes."""
    return tuple(
        (k, type(v).__name__, v.dtype.str, np.shape(v), np.asarray(v).tobytes(), getattr(v, "flags", None) is None
         or v.flags.writeable)
        for k, v in sample.items()
    )  # fmt: skip


def _samples(dl) -> list[tuple]:
    return [_record(s) for s in dl.dataset]


@pytest.mark.parametrize("layout", ["lean", "patches"])
@pytest.mark.parametrize("shuffle_algo", ["py1e", "py1s"])
def test_batched_reads_yield_streamings_samples_in_its_order(small_shards, tmp_path, layout, shuffle_algo):
    options = StreamingOptions(shuffle_algo=shuffle_algo, shuffle_block_size=64)
    with _loader(small_shards[layout], tmp_path, batched=False, options=options) as dl:
        want = _samples(dl)
    with _loader(small_shards[layout], tmp_path, batched=True, options=options) as dl:
        got = _samples(dl)
        maps = vars(dl.dataset)["_hbpe_maps"]
        assert maps and all(isinstance(m, MappedShard) for m in maps.values())  # read by the maps, not get_item
        assert len(maps) <= batched_reads.MAPS_HELD < 59
    assert got == want
    assert want[0][0][:4] == ("num_bytes", "int64", "<i8", ())  # a numpy scalar, as streaming decodes it
    # every sample in a shuffled order (py1s pads its 64 canonical nodes' shares with repeats: 1280 samples)
    assert len(want) == {"py1e": 1222, "py1s": 1280}[shuffle_algo] and len({s[-1][4] for s in want}) == 1222


def test_a_weighted_mix_of_streams_reads_the_same_samples(small_shards, tmp_path):
    def mix(tag: str) -> list[StreamSpec]:
        return [
            StreamSpec(small_shards["lean"], str(tmp_path / tag / "a"), proportion=3.0),
            StreamSpec(small_shards["patches"], str(tmp_path / tag / "b"), proportion=1.0),
        ]

    options = StreamingOptions(epoch_size=500)
    with _loader(mix("old"), tmp_path, batched=False, options=options) as dl:
        want = [(s["tokens"].tobytes(), "patches" in s) for s in dl.dataset]
    with _loader(mix("new"), tmp_path, batched=True, options=options) as dl:
        got = [(s["tokens"].tobytes(), "patches" in s) for s in dl.dataset]
    assert got == want and len(got) == 500
    assert 300 < sum(not p for _, p in got) < 450  # both streams drawn, about 3:1


def _batches(dl, n: int | None = None) -> list[dict[str, torch.Tensor]]:
    out = []
    for i, b in enumerate(dl):
        if n is not None and i == n:
            break
        out.append(b)
    return out


def _same_batches(a: list[dict], b: list[dict]) -> bool:
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(x[k].dtype == y[k].dtype and torch.equal(x[k], y[k]) for k in x)
        for x, y in zip(a, b, strict=True)
    )


def test_workers_deliver_the_global_order_of_one_process(small_shards, tmp_path):
    with _loader(small_shards["patches"], tmp_path, batched=False) as dl:
        want = _batches(dl)
    with _loader(small_shards["patches"], tmp_path, batched=True, workers=2) as dl:
        got = _batches(dl)
    assert len(want) == 1222 // BATCH
    assert _same_batches(got, want)


def test_a_resumed_epoch_continues_with_the_same_samples(small_shards, tmp_path):
    """Composer's autoresume: a new process loads streaming's state_dict (the samples seen) and reads on."""
    shards = small_shards["lean"]
    with _loader(shards, tmp_path, batched=False) as dl:
        whole = _batches(dl)
    seen = 37  # batches before the "kill": a resume point inside a chunk of the ready window
    with _loader(shards, tmp_path, batched=True, seed=17, workers=0, verify="size") as dl:
        first = _batches(dl, seen)
        state = dl.dataset.state_dict(seen * BATCH, False)
    assert _same_batches(first, whole[:seen])
    for batched in (True, False):
        with _loader(shards, tmp_path / f"resumed-{batched}", batched=batched) as dl:
            dl.dataset.load_state_dict(state)
            rest = _batches(dl)
        assert _same_batches(rest, whole[seen:]), batched


def test_evicted_shards_are_read_again_in_the_same_order(small_shards, tmp_path):
    shards = small_shards["patches"]
    index = json.loads((Path(shards) / "index.json").read_text())
    largest = max(e["raw_data"]["bytes"] + e["zip_data"]["bytes"] for e in index["shards"])
    # 4 of the 59 shards cached at a time, so shards are evicted all along. The window streaming prepares ahead
    # (predownload samples of a shuffle block) must fit in it, or streaming's own threads wait on each other for ever
    options = StreamingOptions(cache_limit=4 * largest, predownload=8, shuffle_block_size=42)
    with _loader(shards, tmp_path, batched=False, options=options) as dl:
        want = _samples(dl)
    with _loader(shards, tmp_path, batched=True, options=options) as dl:
        got = _samples(dl)
        assert dl.dataset.cache_usage <= 4 * largest
    assert got == want


def _mds(tmp_path, columns: dict[str, str], rows: list[dict], *, compression: str | None) -> str:
    from streaming import MDSWriter

    out = tmp_path / "mds"
    with MDSWriter(out=str(out), columns=columns, compression=compression, size_limit=1 << 8) as w:
        for row in rows:
            w.write(row)
    return str(out)


def _dataset(remote: str, local: str, *, batched: bool):
    from streaming import Stream

    from hbpe.training.data.loader import _checked_dataset_class, _one_dataset_setup_at_a_time

    with _one_dataset_setup_at_a_time():
        ds = _checked_dataset_class()(streams=[Stream(remote=remote, local=local)], batch_size=4, shuffle=True)
    ds.batched_reads = batched
    return ds


@pytest.mark.parametrize(
    ("columns", "compression", "mapped"),
    [
        ({"x": "ndarray:float32:3", "y": "uint8", "z": "float64"}, None, True),  # streaming's writer, fixed sizes
        ({"x": "ndarray:float32:3", "text": "str", "n": "int"}, "zstd", False),  # a variable-size column
        ({"x": "ndarray:float32", "y": "uint8"}, None, False),  # an ndarray of no static shape
    ],
)
def test_other_mds_layouts_read_as_streaming_reads_them(tmp_path, columns, compression, mapped):
    rng = np.random.default_rng(0)
    rows = []
    for i in range(90):
        row = {"x": rng.random(3, dtype=np.float32), "y": np.uint8(i), "z": float(i) / 3, "text": "é" * (i % 7), "n": i}
        rows.append({k: row[k] for k in columns})
    remote = _mds(tmp_path, columns, rows, compression=compression)
    seen = {}
    for batched in (False, True):
        ds = _dataset(remote, str(tmp_path / f"cache-{batched}"), batched=batched)
        seen[batched] = [
            tuple((k, type(v).__name__, np.asarray(v).tobytes() if k != "text" else v) for k, v in s.items())
            for s in ds
        ]
        if batched:
            layouts = vars(ds).get("_hbpe_layouts", {})
            assert len(layouts) == ds.num_shards >= 5 and all((lay is not None) == mapped for lay in layouts.values())
        release(ds)
    assert seen[True] == seen[False] and len(seen[True]) == 90


def test_parse_fixed_takes_static_numeric_encodings_only():
    assert parse_fixed("ndarray:int32:128") == (np.dtype("int32"), (128,))
    assert parse_fixed("float16") == (np.dtype("float16"), ())
    for other in ("ndarray:int32", "ndarray::4", "ndarray:int32:0", "ndarray:object:4", "str", "pkl", "int", "jpeg"):
        assert parse_fixed(other) is None, other


def test_a_shard_whose_offsets_do_not_step_by_the_record_is_left_to_streaming(tmp_path):
    from streaming.base.format.mds.reader import MDSReader

    from hbpe.pipeline.shards.mds_format import encode_raw_shard, shard_config

    columns = {"tokens": "ndarray:int32:4", "num_bytes": "int64"}
    values = {"tokens": np.arange(12, dtype=np.int32).reshape(3, 4), "num_bytes": np.array([5, 6, 7])}
    raw = bytearray(encode_raw_shard(columns, values, compression=None, hashes=[]))
    info = {"basename": "shard.00000.mds", "bytes": len(raw), "hashes": {}}
    reader = MDSReader.from_json(str(tmp_path), None, {**shard_config(columns, None, []), "samples": 3,
                                                        "raw_data": info, "zip_data": None})  # fmt: skip
    layout = record_layout(reader)
    assert layout == RecordLayout(layout.columns, 24) and [c.name for c in layout.columns] == ["num_bytes", "tokens"]
    path = tmp_path / "shard.00000.mds"
    path.write_bytes(raw)
    got = MappedShard.open(str(path), layout, 3).gather(np.array([2, 0]))
    assert got["tokens"].tolist() == [[8, 9, 10, 11], [0, 1, 2, 3]] and got["num_bytes"].tolist() == [7, 5]
    assert not got["tokens"].flags.writeable  # as streaming's decoded arrays
    assert MappedShard.open(str(path), layout, 4) is None  # another sample count than the header's
    raw[8:12] = (int.from_bytes(raw[8:12], "little") + 1).to_bytes(4, "little")  # offset of sample 1 moved
    path.write_bytes(raw)
    assert MappedShard.open(str(path), layout, 3) is None
    with pytest.raises(FileNotFoundError):
        MappedShard.open(str(tmp_path / "gone.mds"), layout, 3)


# ---- the eval set of data.eval_samples (training/data/eval_set.py) ------------------------------------------------

EVAL_SAMPLES = 96  # 12 blocks of a batch, spread over the 59 shards


@contextlib.contextmanager
def _eval_loader(shards, tmp_path, *, batched: bool, workers: int = 0) -> Iterator:
    """The eval loader as training builds it with data.eval_samples: the held-out loader (in order, every batch)
    narrowed to the eval set's blocks by `spread_eval_loader`."""
    from hbpe.training.data.streams import spread_eval_loader

    with _loader(shards, tmp_path, batched=batched, workers=workers, shuffle=False, drop_last=False) as held:
        yield spread_eval_loader(held, 1222, EVAL_SAMPLES, device_batch=BATCH)


def _counting_get_item(dataset) -> list[int]:
    """The sample ids streaming's per-sample `get_item` reads from now on (in this process)."""
    calls: list[int] = []
    per_sample = dataset.get_item

    def get_item(sample_id: int, *args, **kwargs):
        calls.append(sample_id)
        return per_sample(sample_id, *args, **kwargs)

    dataset.get_item = get_item
    return calls


@pytest.mark.parametrize("layout", ["lean", "patches"])
def test_the_eval_set_is_read_a_block_at_a_time_with_the_same_batches(small_shards, tmp_path, layout):
    from hbpe.training.data.eval_set import eval_blocks

    with _eval_loader(small_shards[layout], tmp_path, batched=False) as dl:
        calls = _counting_get_item(dl.dataset.dataset)
        want = _batches(dl)
        assert len(calls) == EVAL_SAMPLES  # today's path, the reference: one get_item per sample
    with _eval_loader(small_shards[layout], tmp_path, batched=True) as dl:
        calls = _counting_get_item(dl.dataset.dataset)
        got = _batches(dl)
        maps = vars(dl.dataset.dataset).get("_hbpe_maps", {})
    assert calls == [] and maps and all(isinstance(m, MappedShard) for m in maps.values())
    assert _same_batches(got, want)
    # the blocks' samples in van der Corput order, as the shards hold them
    rows = _shard_rows(small_shards[layout])
    assert ("patches" in rows[0]) == (layout == "patches")
    rows = [s["tokens"] for s in rows]
    blocks = eval_blocks(1222, EVAL_SAMPLES, BATCH)
    assert len(blocks) == len(got) == EVAL_SAMPLES // BATCH and blocks != sorted(blocks)
    for (start, n), batch in zip(blocks, got, strict=True):
        assert np.array_equal(batch["tokens"].numpy(), np.stack(rows[start : start + n]))


def _shard_rows(shards: str) -> list[dict]:
    from hbpe.pipeline.shards.reader import ShardDir

    return list(ShardDir(shards).samples())


def test_the_eval_set_keeps_the_loaders_workers_and_their_batches(small_shards, tmp_path):
    with _eval_loader(small_shards["patches"], tmp_path, batched=False) as dl:
        want = _batches(dl)
    with _eval_loader(small_shards["patches"], tmp_path, batched=True, workers=2) as dl:
        assert dl.num_workers == 2  # the held-out loader's processes, not reads in the training process
        got = _batches(dl)
    assert _same_batches(got, want) and len(got) == EVAL_SAMPLES // BATCH


@pytest.mark.parametrize(
    ("columns", "mapped"),
    [({"x": "ndarray:float32:3", "y": "uint8"}, True), ({"x": "ndarray:float32:3", "text": "str"}, False)],
)
def test_the_eval_sets_samples_of_other_layouts_read_as_streaming_reads_them(tmp_path, columns, mapped):
    from hbpe.training.data.eval_set import IndexedSamples

    rng = np.random.default_rng(0)
    rows = [{"x": rng.random(3, dtype=np.float32), "y": np.uint8(i), "text": "é" * (i % 7)} for i in range(90)]
    remote = _mds(tmp_path, columns, [{k: r[k] for k in columns} for r in rows], compression="zstd")
    indices = [70, 71, 72, 5, 6, 7, 40, 41, 89]  # blocks across shards, out of order
    seen = {}
    for batched in (False, True):
        ds = _dataset(remote, str(tmp_path / f"cache-{batched}"), batched=batched)
        calls = _counting_get_item(ds)
        loader = torch.utils.data.DataLoader(IndexedSamples(ds, indices), batch_size=3, collate_fn=list)
        seen[batched] = [
            tuple((k, type(v).__name__, np.asarray(v).tobytes() if k != "text" else v) for k, v in s.items())
            for batch in loader
            for s in batch
        ]
        assert len(calls) == (0 if batched and mapped else len(indices)), batched
        release(ds)
    assert seen[True] == seen[False] and len(seen[True]) == len(indices)


# ---- the loader's batches on their way to the device ----------------------------------------------------------


def test_id_columns_stay_narrow_and_the_model_widens_them(small_shards, tmp_path):
    from hbpe.schemas.train_config import model_config
    from hbpe.training.model.build import build_model
    from hbpe.training.model.patch_lm import VocabSpec

    with _loader(small_shards["patches"], tmp_path, batched=True) as dl:
        batch = next(iter(dl))
        tok = dl.collate_fn.tok
    assert (batch["tokens"].dtype, batch["patches"].dtype) == (torch.int32, torch.int16)
    assert batch["target_bytes"].dtype == torch.int64
    torch.manual_seed(0)
    model = build_model(model_config("tiny"), VocabSpec.from_tokenizer(tok)).eval()
    wide = {k: v.long() for k, v in batch.items()}
    with torch.no_grad():
        (logits, targets), (logits64, targets64) = model(batch), model(wide)
    assert targets.dtype == torch.int64 and torch.equal(targets, targets64) and torch.equal(logits, logits64)


def test_loader_workers_default_to_the_gpu_and_keep_what_the_config_says(sample_shards, tmp_path):
    from hbpe.training.data.streams import default_workers, loader_workers
    from hbpe.training.train.config_io import load_config

    def cfg(*extra: str):
        # data.eval given: tiny's default (runs/demo/shards-eval) exists only after `make demo`, not on a fresh clone
        shards = [f"data.train={sample_shards[0]}", f"data.eval={sample_shards[1]}"]
        return load_config("tiny", [*shards, f"save_folder={tmp_path}", *extra])

    cpus = default_workers(len(os.sched_getaffinity(0)), 1, on_gpu=True)
    assert loader_workers(cfg(), device="gpu") == WorkerOptions(cpus, pin_memory=True, persistent_workers=True)
    assert loader_workers(cfg(), device="cpu") == WorkerOptions(0, pin_memory=False, persistent_workers=True)
    given = cfg(
        "data.num_workers=3", "data.pin_memory=false", "data.prefetch_factor=4", "data.persistent_workers=false"
    )
    assert loader_workers(given, device="gpu") == WorkerOptions(3, False, False, 4)
    shares = ((2, 1), (16, 1), (64, 1), (16, 4), (4, 8))  # (CPUs, processes)
    assert [default_workers(c, p, on_gpu=True) for c, p in shares] == [1, 8, 8, 3, 1]
    # torch refuses prefetch_factor and persistent_workers without workers: they are left out there
    assert WorkerOptions(0, True, True, 4).dataloader_kwargs() == {"num_workers": 0, "pin_memory": True}
    assert WorkerOptions(2, False, True, 4).dataloader_kwargs() == {
        "num_workers": 2, "pin_memory": False, "persistent_workers": True, "prefetch_factor": 4,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("data.num_workers=-1", r"^data.num_workers=-1: must be >= 0; e.g. data.num_workers=2$"),
        ("data.prefetch_factor=0", r"^data.prefetch_factor=0: must be >= 1; e.g. data.prefetch_factor=1$"),
    ],
)
def test_loader_options_are_checked(sample_shards, override, message):
    from hbpe.schemas.errors import ConfigError
    from hbpe.training.train.config_io import load_config

    with pytest.raises(ConfigError, match=message):
        load_config("tiny", [f"data.train={sample_shards[0]}", override])


# ---- hbpe bench loader ------------------------------------------------------------------------------------------


def test_bench_loader_times_both_paths_on_the_same_samples(small_shards):
    from click.testing import CliRunner

    from hbpe.cli import main

    args = ["bench", "loader", "--data", small_shards["lean"], "--batch-size", "8", "--repeat", "3", "--batches", "3"]
    r = CliRunner().invoke(main, [*args, "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output[r.output.index("{") :])
    assert out["paths"].keys() == {"per_sample", "batched"} and (out["repeat"], out["batches"]) == (3, 3)
    for p in out["paths"].values():
        assert p["samples_per_s"] * p["ms_per_batch"] / 1e3 == pytest.approx(8)  # the same (median) round
        assert len(p["mb_per_s_all"]) == 3 and min(p["mb_per_s_all"]) <= p["mb_per_s"] <= max(p["mb_per_s_all"])
    assert out["same_samples"] is True  # each round: one epoch's batches, the same bytes on both paths
    assert out["ratio"] == pytest.approx(out["paths"]["batched"]["mb_per_s"] / out["paths"]["per_sample"]["mb_per_s"])
    too_few = CliRunner().invoke(main, ["bench", "loader", "--data", small_shards["lean"], "--batch-size", "500"])
    assert too_few.exit_code != 0
    assert "has 1222 samples: 2 batches of 500 an epoch, fewer than the 5 warm-up batches" in too_few.output


def test_bench_loader_times_the_eval_set_on_both_paths(small_shards):
    from click.testing import CliRunner

    from hbpe.cli import main

    args = ["bench", "loader", "--data", small_shards["patches"], "--batch-size", "8", "--repeat", "3"]
    r = CliRunner().invoke(main, [*args, "--eval-samples", "48", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output[r.output.index("{") :])
    assert (out["loader"], out["eval_samples"], out["batches"], out["warmup"]) == ("eval_set", 48, 6, 0)
    assert out["same_samples"] is True  # each round the whole eval set on both paths
    for p in out["paths"].values():
        assert p["samples_per_s"] * p["ms_per_batch"] / 1e3 == pytest.approx(8)
    text = CliRunner().invoke(main, [*args, "--eval-samples", "48"])
    assert text.exit_code == 0 and "(eval set of data.eval_samples=48)" in text.output
