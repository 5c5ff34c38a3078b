"""WriteMdsShards: the Beam step that writes the planned shards (the plan and the writer live in shards.py)."""

from __future__ import annotations

import apache_beam as beam
from apache_beam.metrics import Metrics

from hbpe.pipeline.beam import fs
from hbpe.pipeline.beam.shard_tasks import ShardTask, write_shard


class _WriteShardFn(beam.DoFn):
    def __init__(self, tokenizer_dir: str, staging: str, seq_len: int, store_patches: bool) -> None:
        self.tokenizer_dir, self.staging, self.seq_len = tokenizer_dir, staging, seq_len
        self.store_patches = store_patches
        self.shards_written = Metrics.counter("hbpe", "shards_written")
        self.samples_written = Metrics.counter("hbpe", "samples_written")

    def setup(self) -> None:
        self.tok = fs.load_tokenizer(self.tokenizer_dir)

    def process(self, task: ShardTask):
        index, entry = write_shard(self.tok, self.staging, task, self.seq_len, store_patches=self.store_patches)
        self.shards_written.inc()
        self.samples_written.inc(task.num_samples)
        yield index, entry


class WriteMdsShards(beam.PTransform):
    """PCollection[ShardTask] -> PCollection[(shard index, MDS index entry)]."""

    def __init__(self, tokenizer_dir: str, staging: str, seq_len: int, *, store_patches: bool) -> None:
        super().__init__()
        self._fn = _WriteShardFn(tokenizer_dir, staging, seq_len, store_patches)

    def expand(self, tasks):
        return (
            tasks
            | "SpreadShards" >> beam.Reshuffle()  # (ShardTask,) spread over workers
            | "WriteShard" >> beam.ParDo(self._fn)  # (index, entry)
        )
