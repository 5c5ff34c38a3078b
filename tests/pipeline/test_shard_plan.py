import apache_beam as beam
import pytest
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline
from apache_beam.testing.util import assert_that, equal_to

from hbpe.pipeline.beam.encode import EncodeUnits, UnitSummary
from hbpe.pipeline.beam.shard_tasks import plan_shards
from hbpe.pipeline.corpus.documents import RecordPolicy
from hbpe.pipeline.corpus.files import WorkUnit


def test_plan_shards_drop_and_pad():
    units = [UnitSummary(index=0, stream_patches=7), UnitSummary(index=1, stream_patches=6)]
    drop = plan_shards(units, seq_len=4, samples_per_shard=2, tail="drop")
    assert (drop.samples, drop.tail_dropped, drop.tail_padded) == (3, 1, 0)
    assert [(t.index, t.first_sample, t.num_samples, t.pieces, t.pad) for t in drop.tasks] == [
        (0, 0, 2, ((0, 0, 7), (1, 0, 1)), 0),
        (1, 2, 1, ((1, 1, 5),), 0),
    ]
    assert drop.tail_pieces == ((1, 5, 6),)
    pad = plan_shards(units, seq_len=4, samples_per_shard=2, tail="pad")
    assert (pad.samples, pad.tail_dropped, pad.tail_padded) == (4, 0, 3)
    assert [(t.pieces, t.pad) for t in pad.tasks] == [(((0, 0, 7), (1, 0, 1)), 0), (((1, 1, 6),), 3)]


def test_encode_units_counts(tmp_path, gpt2_tokenizer_dir):
    src = tmp_path / "a.jsonl"
    src.write_text('{"text": "hello world"}\n{"text": ""}\n{"text": "bye"}\n')
    staging = str(tmp_path / "staging")
    unit = WorkUnit(0, 0, str(src), "jsonl", None, 0, None)
    with BeamTestPipeline() as p:
        out = (
            p
            | beam.Create([unit])
            | EncodeUnits(str(gpt2_tokenizer_dir), staging, RecordPolicy(), "file", 256)
            | beam.Map(
                lambda s: (
                    s.counts.documents_read,
                    s.counts.documents_written,
                    s.counts.rejected_by_reason,
                    s.counts.tokens,
                    s.stream_patches,
                )
            )
        )
        assert_that(out, equal_to([(3, 2, {"empty_text": 1}, 3, 5)]))


@pytest.mark.parametrize("store_patches", [False, True], ids=["lean", "stored"])
def test_mds_format_is_byte_identical_to_streaming_writer(tmp_path, store_patches):
    import json

    import numpy as np
    from streaming import MDSWriter

    from hbpe.pipeline.shards import mds_format
    from hbpe.schemas.shard_columns import HASHES, mds_columns

    rng = np.random.default_rng(0)
    cols = mds_columns(16, 4, store_patches=store_patches)
    values = {
        "tokens": rng.integers(-2, 50000, size=(5, 16), dtype=np.int32),
        "patches": rng.integers(0, 400, size=(5, 16, 4), dtype=np.uint16),
        "num_bytes": rng.integers(0, 1000, size=5, dtype=np.int64),
    }
    values = {k: v for k, v in values.items() if k in cols}
    with MDSWriter(
        out=str(tmp_path / "ref"), columns=cols, compression="zstd", hashes=list(HASHES), size_limit=None
    ) as w:
        for i in range(5):
            w.write({k: v[i] for k, v in values.items()})
    (ref_entry,) = json.loads((tmp_path / "ref" / "index.json").read_text())["shards"]
    data, entry = mds_format.write_shard(cols, values, basename="shard.00000.mds.zstd", hashes=list(HASHES))
    assert data == (tmp_path / "ref" / "shard.00000.mds.zstd").read_bytes()
    assert entry == ref_entry
    back = mds_format.decode_raw_shard(mds_format.decompress(data), entry)
    for k, v in values.items():
        assert np.array_equal(back[k], v)
