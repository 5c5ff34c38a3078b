"""Training configuration: typed, validated dataclasses (parsed from YAML in training/train/config_io.py).

Every field is checked against its annotation whenever a config is built (from YAML, from
`key=value` overrides, or in code), so a mistake is one ConfigError naming the key, the
value, the expected type and an example, e.g.
`optim.lr: got 'abc' (a string), expected a finite number; e.g. optim.lr=0.001`,
not a TypeError deep inside Composer. The checks follow the annotations (schemas/config_check.py),
so a new field is checked without new code; this module holds the sections, their choices and
ranges, and the examples the messages give. Local paths are checked where a config is loaded
(training/train/config_io.py), not here: Composer's launcher ranks parse the same config.
"""

from __future__ import annotations

import difflib
import posixpath
import re
from dataclasses import asdict, dataclass, field, is_dataclass, replace
from typing import Any, ClassVar, Self

# the generic checks, under the private names this module's sections have always called them by
from hbpe.schemas.config_check import Section, path_field
from hbpe.schemas.config_check import check_choice as _check_choice
from hbpe.schemas.config_check import check_range as _check_range
from hbpe.schemas.config_check import fail as _fail
from hbpe.schemas.config_check import scalar as _scalar
from hbpe.schemas.config_check import show as _show
from hbpe.schemas.errors import ConfigError
from hbpe.schemas.locations import SUPPORTED_SCHEMES, check_location, check_output_prefix, is_uri
from hbpe.schemas.schemes import scheme_names


def _reads(default: str | None) -> Any:
    """A path a run reads (shards, a tokenizer, a checkpoint): schemas/config_check.py's path_values lists it."""
    return path_field(default, writes=False)


def _writes(default: str | None, *, under: str | None = None) -> Any:
    """A path a run writes (checkpoints, caches, logs), relative to the working directory or to key `under`."""
    return path_field(default, writes=True, under=under)


# model.local_layout (training/model/packing.py): the real positions of each patch only, or all S of them
LOCAL_LAYOUTS = ("packed", "padded")
# model.packed_attention: "auto" (the loader's tiles on an accelerator, training/model/tiles.py; the native
# per-patch kernel on CPU, training/model/patch_attention.py), or always "tiles" or the torch path's length "blocks"
PACKED_ATTENTION = ("auto", "blocks", "tiles")
PATCH_BOUNDARIES = ("eop", "given")  # model.patch_boundaries of the space and entropy baselines
MAX_HASH_BUCKETS = 1 << 24  # rows per n-gram table (BLT's 500K is far below): an untrusted config asks no more

# Composer's time units (composer.core.time.TimeUnit) less `sec` and `1h30m` wall-clock strings,
# which its schedulers and checkpoint intervals do not all take
TIME_UNITS = ("ba", "ep", "sp", "tok", "iter", "dur")
_TIME = re.compile(r"((?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?)(" + "|".join(TIME_UNITS) + ")", re.IGNORECASE)
# what Composer 0.32.1's Trainer accepts (composer.core.precision.Precision) less amp_fp8, which
# needs transformer_engine (not in hbpe's stack); "auto" is hbpe's: amp_bf16 on a GPU, fp32 on CPU
PRECISIONS = ("auto", "fp32", "amp_fp16", "amp_bf16")
# composer.utils.device.get_device; tpu/neuron/hpu need torch_xla or Habana packages hbpe does not ship
DEVICES = ("auto", "cpu", "gpu", "mps")
# URI schemes shards and tokenizers may be read from: the stores hbpe is tested against (streaming could read
# more, see schemas/locations.py); `file://` is a local path and is read as one
URI_SCHEMES = SUPPORTED_SCHEMES
# URI schemes a save_folder may be in: Composer uploads the checkpoints there (its RemoteUploader's
# backends: s3, gs, oci, sftp, libcloud, dbfs) and hbpe the run files (streaming's uploaders, as above)
SAVE_FOLDER_SCHEMES = SUPPORTED_SCHEMES  # oci too in Composer, but untested in hbpe (schemas/locations.py)
# streaming 0.13's shuffle algorithms (streaming.base.shuffle.algos); py1e is its default
SHUFFLE_ALGOS = ("py1e", "py1br", "py1s", "py2s", "naive")
# Composer's experiment trackers a `loggers:` block can name, and their classes in composer.loggers
# (training/train/loggers.py builds them; one list for the config check and the builder)
LOGGER_CLASSES = {"tensorboard": "TensorboardLogger", "wandb": "WandBLogger", "mlflow": "MLFlowLogger"}
LOGGERS = tuple(LOGGER_CLASSES)
# Composer's callbacks a `callbacks:` block can name, as llm-foundry spells them, and their classes in composer.callbacks
CALLBACK_CLASSES = {
    "speed_monitor": "SpeedMonitor",
    "lr_monitor": "LRMonitor",
    "memory_monitor": "MemoryMonitor",
    "optimizer_monitor": "OptimizerMonitor",
    "runtime_estimator": "RuntimeEstimator",
    "nan_monitor": "NaNMonitor",
    "activation_monitor": "ActivationMonitor",
    "early_stopper": "EarlyStopper",
    "threshold_stopper": "ThresholdStopper",
    "memory_snapshot": "MemorySnapshot",
    "oom_observer": "OOMObserver",
    "system_metrics_monitor": "SystemMetricsMonitor",
}
CALLBACKS = tuple(CALLBACK_CLASSES)
# the arguments of those loggers and callbacks that name local files or folders (a `loggers:` block is Composer's
# arguments, not typed fields, so path_field cannot mark them): an experiment keeps each inside its --out, with the
# library's default where it is not given (training/train/loggers.py: local_outputs). A filename is in its folder.
# tests/training/test_config_paths.py holds this against the classes' signatures, so a new one is not missed.
ARGUMENT_PATHS: dict[str, tuple[str, ...]] = {
    "loggers.tensorboard": ("log_dir",),
    "loggers.wandb": ("init_kwargs.dir",),
    "loggers.mlflow": ("tracking_uri", "model_registry_uri"),  # a server (http://...) is not a path
    "callbacks.memory_snapshot": ("folder", "filename"),
    "callbacks.oom_observer": ("folder", "filename"),
}
# streaming's cache_limit text (streaming.base.util.bytes_to_int): a number and a unit in powers of 1024
_BYTE_UNITS = {"b": 1, "kb": 1 << 10, "mb": 1 << 20, "gb": 1 << 30, "tb": 1 << 40}
_BYTES = re.compile(r"(\d+(?:\.\d+)?)\s*(" + "|".join(_BYTE_UNITS) + ")", re.IGNORECASE)
# Composer's seeds are numpy's: 0 <= seed < 2**32 (composer.utils.reproducibility.seed_all)
MAX_SEED = 2**32 - 1

# Examples for fields whose default does not make one (empty, null, or a whole section)
_EXAMPLES = {
    "data.train": "data.train=runs/demo/shards-train",
    "data.eval": "data.eval=runs/demo/shards-eval",
    "data.tokenizer": "data.tokenizer=runs/demo/tokenizer",
    "data.max_patch_size": "data.max_patch_size=8",
    "data.mode": "data.mode=minimal",
    "data.cache_dir": "data.cache_dir=/tmp/hbpe-stream-cache",
    "data.streams": "'data.streams=[{remote: runs/a, proportion: 0.7}, {remote: runs/b, proportion: 0.3}]'",
    "data.cache_limit": "data.cache_limit=10gb",
    "data.num_canonical_nodes": "data.num_canonical_nodes=8",
    "data.predownload": "data.predownload=64",
    "data.shuffle_block_size": "data.shuffle_block_size=262144",
    "data.epoch_size": "data.epoch_size=100000",
    "data.eval_samples": "data.eval_samples=320",
    # a stream is an item of the data.streams list: its examples are that item, as YAML
    "data.streams.remote": "{remote: runs/demo/shards-train, proportion: 0.5}",
    "data.streams.local": "{remote: gs://bucket/shards, local: /tmp/stream-a}",
    "data.streams.proportion": "{remote: runs/demo/shards-train, proportion: 0.5}",
    "data.streams.repeat": "{remote: runs/demo/shards-train, repeat: 2}",
    "data.streams.choose": "{remote: runs/demo/shards-train, choose: 1000}",
    "loggers": "'loggers={tensorboard: {log_dir: runs/tb}}'",
    "callbacks": "'callbacks={memory_monitor: {}}'",
    "model": "model.latent_layers=4",
    "model.patching.entropy_model": "model.patching.entropy_model=runs/bytes/latest-rank0.pt",
    "model.patching.entropy_threshold": "model.patching.entropy_threshold=1.5",
    "model.patching.entropy_target_bytes": "model.patching.entropy_target_bytes=4.5",
    "model.patching.entropy_model_sha256": "model.patching.entropy_model_sha256=" + "0123456789abcdef" * 4,
    "fsdp": "'fsdp={version: 2}'",
    "load_path": "load_path=runs/train/latest-rank0.pt",
    "device_microbatch_size": "device_microbatch_size=4",
}


def _check_time(key: str, value: Any, example: str, *, zero_ok: bool = False, fraction_ok: bool = True) -> None:
    """A Composer time string (`100ba`, `2ep`, `1000sp`, `1e6tok`, `0.1dur`), as composer.core.Time reads it."""
    m = _TIME.fullmatch(value) if isinstance(value, str) else None
    if m is None:
        raise _fail(key, value, f"a Composer time string: a number and a unit ({', '.join(TIME_UNITS)})", example)
    number, unit = float(m.group(1)), m.group(2).lower()
    if unit == "dur":
        if not fraction_ok:
            raise ConfigError(f"{key}={value}: a fraction of the run (dur) cannot set the run's length; e.g. {example}")
        if number > 1:
            raise ConfigError(f"{key}={value}: dur is a fraction of the run, from 0 to 1; e.g. {key}=0.1dur")
    elif number != int(number):
        raise ConfigError(f"{key}={value}: {unit} counts whole units; e.g. {example}")
    if number == 0 and not zero_ok:
        raise ConfigError(f"{key}={value}: must be more than 0; e.g. {example}")


def _local_or_uri(key: str, value: str | None, schemes: tuple[str, ...] = URI_SCHEMES) -> str | None:
    """A shard/tokenizer location: `file:///x` -> `/x`; a misspelt URI, or one of a scheme streaming cannot read, is refused."""

    return check_location(value, where=f"{key}={value}", schemes=schemes) if value else value


def _time_unit(value: str, max_unit: str) -> str:
    """The unit Composer's warm-up schedulers compare a time in: dur takes the run's unit, ep becomes ba."""
    unit = _TIME.fullmatch(value).group(2).lower()  # type: ignore[union-attr]  # checked by _check_time
    if unit == "dur":
        unit = max_unit
    return "ba" if unit == "ep" else unit


class _Section(Section):
    """A section of the training config: checked by schemas/config_check.py, with the examples of _EXAMPLES."""

    _examples = _EXAMPLES


# Upper bounds of ModelConfig's sizes: far beyond any model hbpe trains (the largest published transformers
# have widths near 25k, ffn near 100k, about 100 layers), yet finite, so that a config or an edited
# hbpe_model.json (untrusted) cannot ask for hundreds of gigabytes; each is checked before anything is built.
MODEL_SIZE_LIMITS: dict[str, int] = {
    "latent_layers": 1024,
    "latent_dim": 65536,
    "latent_ffn": 262144,
    "latent_heads": 1024,
    "local_dim": 65536,
    "local_ffn": 262144,
    "local_heads": 1024,
    "encoder_layers": 1024,
    "decoder_layers": 1024,
    "max_patches": 1 << 20,  # the latent context
}
MAX_PATCH_BYTES = 1024  # model.patching.max_bytes: byte patches of at most this many bytes (+ EOP), a local sequence

# model keys of configs and runs written before the byte-patch settings moved into `model.patching`, and
# their names there: still read (ModelConfig.from_dict moves them), so old configs and checkpoints load
FLAT_PATCHING_KEYS = {
    "patch_max_bytes": "max_bytes",
    "patch_boundaries": "boundaries",
    "hash_ngram_buckets": "hash_ngram_buckets",
    "entropy_model": "entropy_model",
    "entropy_threshold": "entropy_threshold",
    "entropy_target_bytes": "entropy_target_bytes",
    "entropy_bounded": "entropy_bounded",
    "entropy_model_sha256": "entropy_model_sha256",
}


def nest_patching(model: dict[str, Any]) -> dict[str, Any]:
    """A model mapping with the flat keys of older configs moved into its `patching` section.

    >>> nest_patching({"io": "space", "patch_max_bytes": 4})
    {'io': 'space', 'patching': {'max_bytes': 4}}
    """
    flat = [k for k in model if k in FLAT_PATCHING_KEYS]
    if not flat:
        return model
    section = model.get("patching") or {}
    if not isinstance(section, dict):
        section = asdict(section) if is_dataclass(section) else section  # type: ignore[arg-type]
        if not isinstance(section, dict):
            return model  # not a mapping: from_dict names the problem
    both = [k for k in flat if FLAT_PATCHING_KEYS[k] in section]
    if both:
        new = f"model.patching.{FLAT_PATCHING_KEYS[both[0]]}"
        raise ConfigError(f"model.{both[0]} and {new} are the same setting, given twice; keep only {new}")
    out = {k: v for k, v in model.items() if k not in FLAT_PATCHING_KEYS}
    out["patching"] = {**section, **{FLAT_PATCHING_KEYS[k]: model[k] for k in flat}}
    return out


@dataclass(frozen=True)
class PatchingConfig(_Section):
    """The byte-patch baselines' own settings (space, entropy: BLT's patcher); the other schemes ignore them."""

    _section: ClassVar[str] = "model.patching"

    max_bytes: int = 6  # space and bounded entropy patching: longer patches are split (BLT's 6)
    # "eop" closes each byte patch with an EOP symbol the decoder predicts (and BPB pays for); "given" is BLT's
    # setup, the paper's: the patcher gives the boundaries, the decoder predicts only bytes
    boundaries: str = "eop"
    # BLT's hash n-gram embeddings (n = 3..8) added to the local encoder's byte embeddings, one table of this many
    # rows per n (0: none); training/model/hash_ngrams.py
    hash_ngram_buckets: int = 0
    # io=entropy: checkpoint of a model.io=bytes model giving next-byte entropies
    entropy_model: str | None = _reads(None)
    entropy_threshold: float | None = None  # io=entropy: a patch starts where the entropy (nats) exceeds it ...
    entropy_target_bytes: float | None = None  # ... or the threshold reaching this mean patch length (hbpe train)
    entropy_bounded: bool = True  # io=entropy: split patches at max_bytes (false: the unbounded variant)
    # io=entropy: sha256 of the entropy model's weights as exported (hbpe train records it and copies the model
    # into the run folder; eval, generate and export check the copy against it); given: the model must match it
    entropy_model_sha256: str | None = None

    def __post_init__(self) -> None:
        self._check_fields()
        m, key = self.max_bytes, "model.patching.max_bytes"  # an hbpe_run.json is untrusted: checked before allocating
        _check_range(key, m >= 1, m, "must be at least 1", f"{key}=6")
        _check_range(key, m <= MAX_PATCH_BYTES, m, f"must be at most {MAX_PATCH_BYTES}", f"{key}=6")
        _check_choice("model.patching.boundaries", self.boundaries, PATCH_BOUNDARIES)
        b = self.hash_ngram_buckets
        _check_range(
            "model.patching.hash_ngram_buckets", 0 <= b <= MAX_HASH_BUCKETS, b, f"must be in 0..{MAX_HASH_BUCKETS}",
            "model.patching.hash_ngram_buckets=82000",
        )  # fmt: skip
        sha = self.entropy_model_sha256
        if sha is not None and not re.fullmatch(r"[0-9a-f]{64}", sha):
            raise ConfigError(
                f"model.patching.entropy_model_sha256={sha}: not a sha256 (64 lowercase hex digits); leave it unset "
                f"(hbpe train records it) or copy it from the entropy run's export; e.g. "
                f"{self._example_of('entropy_model_sha256')}"
            )
        t = self.entropy_target_bytes
        _check_range(
            "model.patching.entropy_target_bytes", t is None or t >= 1, t, "must be >= 1",
            "model.patching.entropy_target_bytes=4.5",
        )  # fmt: skip


@dataclass(frozen=True)
class ModelConfig(_Section):
    """Latent transformer + local encoder/decoder sizes. V' and S come from the tokenizer."""

    _section: ClassVar[str] = "model"

    latent_layers: int = 2
    latent_dim: int = 64
    latent_ffn: int = 128
    latent_heads: int = 4
    local_dim: int = 64
    local_ffn: int = 128
    local_heads: int = 4
    encoder_layers: int = 1
    decoder_layers: int = 1
    pooling: str = "mean"  # how a patch's symbol states become e_t: "mean" over real symbols, or "eop"
    conditioning: str = "prefix"  # how h_t enters the decoder: "prefix" position, or "add" to every input
    # input/output side, a registered scheme (training/schemes/): "hierarchical" (BPE-patch), or a baseline over
    # the same shards: "bpe" (embedding matrix), "bytes" (byte level), "space" / "entropy" (byte patches)
    io: str = "hierarchical"
    tie_embeddings: bool = True  # BPE baseline: one matrix for input embedding and output head, as in the paper
    dropout: float = 0.0  # dropout probability in every transformer block
    rope_theta: float = 10000.0  # RoPE's base
    max_patches: int = 4096  # longest latent context (RoPE has no table to outgrow; used for checks)
    # the byte-patch baselines' settings (space, entropy), a section of their own: the fields above are the
    # network's shape, these the patcher's; older configs and runs give them flat (FLAT_PATCHING_KEYS)
    patching: PatchingConfig = field(default_factory=PatchingConfig)
    # the local models' positions (training/model/packing.py): "packed" computes the real symbols of each patch
    # only; "padded" all S of every patch, PAD included (the paper's layout; the same function and weights)
    local_layout: str = "packed"
    # how packed local models attend within a patch: "auto" runs the loader's tiles on an accelerator (one masked
    # attention call per layer, static shapes, no host sync: training/model/tiles.py) and the native kernel on CPU
    # in float32/64; "tiles" the tiles everywhere; "blocks" the torch path (one SDPA call per patch length). The
    # same function and weights: a checkpoint loads under any of them
    packed_attention: str = "auto"

    def __post_init__(self) -> None:
        self._check_fields()
        for name, limit in MODEL_SIZE_LIMITS.items():  # at least a layer, a width and a head; at most the limit
            value = getattr(self, name)
            _check_range(f"model.{name}", value >= 1, value, "must be at least 1", self._example_of(name))
            # an hbpe_model.json or hbpe_run.json is untrusted: a size is refused before any tensor is allocated
            _check_range(f"model.{name}", value <= limit, value, f"must be at most {limit}", self._example_of(name))
        for name, heads in (("latent_dim", self.latent_heads), ("local_dim", self.local_heads)):
            dim = getattr(self, name)
            if dim % heads or (dim // heads) % 2:  # RoPE rotates pairs of channels within a head
                raise ConfigError(
                    f"model.{name}={dim} must split into an even head size over {heads} heads; "
                    f"e.g. model.{name}={heads * max(2, dim // heads + (dim // heads) % 2)}"
                )
        _check_choice("model.pooling", self.pooling, ("mean", "eop"))
        _check_choice("model.conditioning", self.conditioning, ("prefix", "add"))
        _check_choice("model.io", self.io, scheme_names())  # the registered schemes (training/schemes/)
        _check_choice("model.local_layout", self.local_layout, LOCAL_LAYOUTS)
        _check_choice("model.packed_attention", self.packed_attention, PACKED_ATTENTION)
        if self.io == "entropy":
            p = self.patching
            if not p.entropy_model:
                raise ConfigError(
                    "model.io=entropy needs model.patching.entropy_model: the checkpoint of a byte-level model trained "
                    "with model.io=bytes on the same shards; e.g. model.patching.entropy_model=runs/bytes/latest-rank0.pt"
                )
            if p.entropy_threshold is None and p.entropy_target_bytes is None:
                raise ConfigError(
                    "model.io=entropy needs model.patching.entropy_threshold (nats) or "
                    "model.patching.entropy_target_bytes (a mean patch length to choose the threshold for); "
                    "e.g. model.patching.entropy_target_bytes=4.5"
                )
        _check_range("model.dropout", 0 <= self.dropout < 1, self.dropout, "must be in [0, 1)", "model.dropout=0.1")
        _check_range("model.rope_theta", self.rope_theta > 0, self.rope_theta, "must be > 0", "model.rope_theta=10000")

    @classmethod
    def from_dict(cls, d: Any) -> Self:
        """As every section's, and the flat keys of older configs and runs (`patch_max_bytes`) read into `patching`."""
        return super().from_dict(nest_patching(d) if isinstance(d, dict) else d)

    def with_patching(self, **changes: Any) -> ModelConfig:
        """This config with some of model.patching's settings replaced (e.g. the entropy threshold hbpe train chose)."""
        return replace(self, patching=replace(self.patching, **changes))


# The paper's sizes (latent / local), SPEC section 1; `tiny` trains on 2 CPU cores in minutes.
MODEL_SIZES: dict[str, dict[str, Any]] = {
    "tiny": {},
    "small": dict(
        latent_layers=12,
        latent_dim=768,
        latent_ffn=2048,
        latent_heads=12,
        local_dim=512,
        local_ffn=512,
        local_heads=8,
        encoder_layers=3,
        decoder_layers=3,
    ),
    "medium": dict(
        latent_layers=24,
        latent_dim=1024,
        latent_ffn=2816,
        latent_heads=16,
        local_dim=512,
        local_ffn=512,
        local_heads=8,
        encoder_layers=3,
        decoder_layers=3,
    ),
}


def model_config(size: str = "tiny", **overrides: Any) -> ModelConfig:
    """A size preset (`tiny`, `small`, `medium`) with some fields replaced."""
    return _model_config(size, overrides)


def _model_config(size: str, overrides: dict[Any, Any]) -> ModelConfig:
    _check_choice("model_size", size, tuple(MODEL_SIZES))
    return ModelConfig.from_dict({**MODEL_SIZES[size], **overrides})  # unknown keys are named as model.KEY


def byte_count(value: int | str) -> int:
    """streaming's cache_limit as bytes: `10gb` -> 10 * 2**30 (its units are powers of 1024)."""
    if isinstance(value, int):
        return value
    m = _BYTES.fullmatch(value.strip())
    if m is None:
        raise ValueError(value)
    return int(float(m.group(1)) * _BYTE_UNITS[m.group(2).lower()])


@dataclass(frozen=True)
class StreamConfig(_Section):
    """One stream of a training mix: streaming's `Stream` (its shards, its cache, its weight).

    At most one weight: `proportion` (relative: the share of an epoch drawn from this stream),
    `repeat` (absolute: how many times each sample is drawn per epoch; 0.5 = half of them) or
    `choose` (absolute: samples per epoch). None of the three: every sample once.
    """

    _section: ClassVar[str] = "data.streams"

    remote: str = _reads("")  # shard directory or URI from `hbpe convert`
    local: str | None = _writes(None)  # this stream's cache (default: under data.cache_dir)
    proportion: float | None = None
    repeat: float | None = None
    choose: int | None = None

    def __post_init__(self) -> None:
        self._check_fields()
        if not self.remote:
            raise ConfigError(
                f"data.streams.remote is empty: every stream needs its shards; e.g. {self._example_of('remote')}"
            )
        object.__setattr__(self, "remote", _local_or_uri("data.streams.remote", self.remote))
        if self.local is not None and is_uri(self.local):
            raise ConfigError(
                f"data.streams.local={self.local}: a stream's cache is a local directory, not a URI; "
                f"e.g. {self._example_of('local')}"
            )
        given = [name for name in ("proportion", "repeat", "choose") if getattr(self, name) is not None]
        if len(given) > 1:
            raise ConfigError(
                f"data.streams.{given[1]}={_scalar(getattr(self, given[1]))}: the stream {self.remote} is already "
                f"weighed by {given[0]}; streaming's Stream takes one of proportion, repeat, choose; "
                f"e.g. {self._example_of(given[0])}"
            )
        for name in given:
            value = getattr(self, name)
            _check_range(f"data.streams.{name}", value > 0, value, "must be > 0", self._example_of(name))

    @property
    def relative(self) -> bool:
        return self.proportion is not None

    @property
    def absolute(self) -> bool:
        return self.repeat is not None or self.choose is not None


@dataclass(frozen=True)
class DataConfig(_Section):
    """Training and eval shards, and how streaming reads them.

    `train` (one shard directory) or `streams` (a mix of several, each weighted). The sample
    order is a function of the shards, the weights, `shuffle_seed`, `shuffle_algo`,
    `shuffle_block_size` and `num_canonical_nodes`, not of the devices: streaming saves it in
    every checkpoint, so a run resumes on another number of nodes in the same order.
    """

    _section: ClassVar[str] = "data"

    train: str | None = _reads("")  # shard directory or URI from `hbpe convert` (null when data.streams mixes several)
    eval: str | None = _reads(None)  # held-out shards
    # samples per evaluation, in blocks of one device batch spread over the whole of data.eval, every prefix of
    # them spread too (training/data/eval_set.py); null: every held-out sample in order (eval_subset_num_batches
    # then reads the first batches of the split)
    eval_samples: int | None = None
    streams: tuple[StreamConfig, ...] | None = None  # several training streams, each with its weight
    tokenizer: str | None = _reads(None)  # default: the (first) training shards' own tokenizer copy
    max_patch_size: int | None = None  # re-patch `tokens` with another S (same first stage)
    mode: str | None = None  # with data.max_patch_size: "full" or "minimal" merges (default: the tokenizer's)
    cache_dir: str | None = _writes(None)  # streaming's local cache (default: under the save folder)
    shuffle: bool = True  # shuffle the training samples (streaming's shuffle)
    shuffle_seed: int = 17  # the sample order's seed (with the shards, weights and shuffle_algo)
    # dataloader worker processes per rank (0: in the training process). null: on a GPU min(8, CPUs per process - 1),
    # at least 1; on CPU 0, since the training step's threads use the cores (training/data/streams.py loader_workers)
    num_workers: int | None = None
    pin_memory: bool | None = None  # page-locked batches, copied to the GPU asynchronously (null: on a GPU)
    persistent_workers: bool = True  # with workers: they live across epochs and evaluations, not started anew
    prefetch_factor: int | None = None  # batches each worker prepares ahead (null: torch's 2; none without workers)
    # streaming's knobs (null: streaming's own default). num_canonical_nodes null = the number of nodes of the
    # run that starts (64x that for py1s/py2s); it is saved in checkpoints, so a resumed run keeps its order
    num_canonical_nodes: int | None = None
    predownload: int | None = None  # samples each worker downloads ahead (null: 8 x the device batch)
    cache_limit: int | str | None = None  # bytes or `10gb`: evict cached shards beyond it (null: keep all)
    shuffle_algo: str = "py1e"  # streaming's shuffle algorithm: py1e, py1br, py1s, py2s or naive
    shuffle_block_size: int | None = None  # null: max(4_000_000 // num_canonical_nodes, 2**18)
    epoch_size: int | None = None  # samples per epoch drawn across the streams (null: by their weights)

    def __post_init__(self) -> None:
        self._check_fields()
        for name in ("train", "eval", "tokenizer", "cache_dir"):
            object.__setattr__(self, name, _local_or_uri(f"data.{name}", getattr(self, name)))
        m = self.max_patch_size
        _check_range("data.max_patch_size", m is None or m >= 2, m, "S must be at least 2", "data.max_patch_size=8")
        if self.mode is not None:
            _check_choice("data.mode", self.mode, ("full", "minimal"))
        seed = self.shuffle_seed
        _check_range(
            "data.shuffle_seed", 0 <= seed <= MAX_SEED, seed, f"must be in 0..{MAX_SEED}", "data.shuffle_seed=17"
        )
        workers = self.num_workers
        _check_range("data.num_workers", workers is None or workers >= 0, workers, "must be >= 0", "data.num_workers=2")
        for name in (
            "num_canonical_nodes", "predownload", "shuffle_block_size", "epoch_size", "eval_samples", "prefetch_factor",
        ):  # fmt: skip
            value = getattr(self, name)
            _check_range(f"data.{name}", value is None or value >= 1, value, "must be >= 1", self._example_of(name))
        _check_choice("data.shuffle_algo", self.shuffle_algo, SHUFFLE_ALGOS)
        self._check_cache_limit()
        self._check_streams()

    def _check_cache_limit(self) -> None:
        if self.cache_limit is None:
            return
        try:
            limit = byte_count(self.cache_limit)
        except ValueError:
            raise ConfigError(
                f"data.cache_limit: got {_show(self.cache_limit)}, expected bytes or a size with a unit "
                f"({', '.join(_BYTE_UNITS)}); e.g. data.cache_limit=10gb"
            ) from None
        _check_range("data.cache_limit", limit >= 1, self.cache_limit, "must be > 0", "data.cache_limit=10gb")

    def _check_streams(self) -> None:
        """data.train or data.streams, and weights streaming can apply (its Stream.validate_weights)."""
        if self.streams is None:
            return
        if self.train:
            raise ConfigError(
                f"data.train={self.train} and data.streams are both set; train on one: data.train=null to mix "
                "data.streams, or data.streams=null"
            )
        if not self.streams:
            raise ConfigError(f"data.streams is empty: list at least one stream; e.g. {self._example_of('streams')}")
        for key in ("remote", "local"):
            seen: dict[str, int] = {}
            for i, s in enumerate(self.streams):
                value = getattr(s, key)
                if value is not None and value in seen:
                    fix = "weigh it once with repeat: 2" if key == "remote" else "give each stream its own cache"
                    raise ConfigError(
                        f"data.streams[{i}].{key}={value} repeats data.streams[{seen[value]}].{key}; {fix}"
                    )
                if value is not None:
                    seen[value] = i
        first = self.streams[0]
        for i, s in enumerate(self.streams[1:], start=1):
            if s.relative != first.relative:
                has, lacks = (0, i) if first.relative else (i, 0)
                raise ConfigError(
                    f"data.streams[{has}] has a proportion and data.streams[{lacks}] has none; streaming weighs "
                    "every stream by proportion (relative) or none of them (repeat, choose, or every sample once)"
                )
        if self.epoch_size is not None and any(s.absolute for s in self.streams):
            raise ConfigError(
                f"data.epoch_size={self.epoch_size} with repeat/choose weights, which fix the epoch themselves; "
                "weigh the streams by proportion, or set data.epoch_size=null"
            )

    @property
    def train_sources(self) -> tuple[str, ...]:
        """The training shard directories: data.train, or every stream's remote in order."""
        if self.streams:
            return tuple(s.remote for s in self.streams)
        return (self.train,) if self.train else ()

    @property
    def cache_limit_bytes(self) -> int | None:
        return None if self.cache_limit is None else byte_count(self.cache_limit)


LOSS_NORMALIZATIONS = ("symbol", "byte")  # optim.loss_normalization


@dataclass(frozen=True)
class OptimConfig(_Section):
    _section: ClassVar[str] = "optim"

    lr: float = 1e-3  # AdamW's peak learning rate
    betas: tuple[float, float] = (0.9, 0.95)  # AdamW's moment decays
    eps: float = 1e-8  # AdamW's epsilon
    weight_decay: float = 0.1  # AdamW's decoupled weight decay (see decay_embeddings)
    warmup: str = "10ba"  # linear warm-up, in max_duration's unit or a fraction (0.05dur)
    schedule: str = "cosine"  # "cosine" (to alpha_f * lr) or "constant"
    alpha_f: float = 0.1  # the cosine schedule ends at alpha_f * lr
    grad_clip_norm: float = 1.0  # 0 turns clipping off
    # autoresume with another max_duration than the run's: a cosine schedule (or a warm-up in dur) is laid over the
    # new length, and the learning rate jumps to its value at the checkpoint's batch; refused unless this is true
    allow_new_duration: bool = False
    # the training loss: mean NLL per predicted symbol (tokens for BPE, symbols for BPE-patch: each scheme's own
    # unit, so gradient clipping acts on different scales), or per byte of text (nll_sum / target_bytes: one unit
    # for every scheme, which the experiments use). Either is over the local (micro)batch; ranks average it
    loss_normalization: str = "symbol"
    # weight decay of embedding tables and output heads (a tied head is its embedding): false exempts every
    # nn.Embedding (also when tied to the head) while an untied Linear head decays; true decays every matrix
    decay_embeddings: bool = False

    def __post_init__(self) -> None:
        # before the type check, so `optim.warmup=10` is told about units rather than "expected a string"
        _check_time("optim.warmup", self.warmup, "optim.warmup=10ba", zero_ok=True)
        self._check_fields()
        _check_range("optim.lr", self.lr > 0, self.lr, "must be > 0", "optim.lr=3.0e-4")
        b = self.betas
        _check_range("optim.betas", all(0 <= x < 1 for x in b), b, "each must be in [0, 1)", "optim.betas=[0.9,0.95]")
        _check_range("optim.eps", self.eps > 0, self.eps, "must be > 0", "optim.eps=1.0e-8")
        wd = self.weight_decay
        _check_range("optim.weight_decay", wd >= 0, wd, "must be >= 0", "optim.weight_decay=0.1")
        _check_choice("optim.schedule", self.schedule, ("cosine", "constant"))
        _check_choice("optim.loss_normalization", self.loss_normalization, LOSS_NORMALIZATIONS)
        _check_range("optim.alpha_f", 0 <= self.alpha_f <= 1, self.alpha_f, "must be in [0, 1]", "optim.alpha_f=0.1")
        g = self.grad_clip_norm
        _check_range("optim.grad_clip_norm", g >= 0, g, "must be >= 0 (0: no clipping)", "optim.grad_clip_norm=1.0")


@dataclass(frozen=True)
class TrainConfig(_Section):
    run_name: str = "hbpe"  # the run's name in logs and trackers (and runs/<run_name> for a bucket run)
    seed: int = 17  # weights' initialization and every other random choice (0..2**32-1)
    model_size: str = "tiny"  # the model preset: tiny, small or medium (MODEL_SIZES); model: overrides its sizes
    # given as overrides of the size preset (a mapping: YAML, key=value), kept as the validated ModelConfig they make
    model: ModelConfig = field(default_factory=dict)  # type: ignore[assignment]
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    global_batch_size: int = 8  # samples per optimizer step, over every process
    device_microbatch_size: int | str = "auto"  # samples per forward pass ("auto": Composer finds it on a GPU)
    max_duration: str = "100ba"  # the run's length in a Composer unit: 100ba, 2ep, 1e6tok
    eval_interval: str = "50ba"  # evaluate on data.eval every so often (and at the end)
    eval_subset_num_batches: int = -1  # batches per evaluation (-1: all of data.eval, or data.eval_samples)
    precision: str = "auto"  # "auto": amp_bf16 on GPU, fp32 on CPU
    device: str = "auto"  # auto (a GPU when there is one), cpu, gpu or mps
    # a folder, or a bucket prefix (SAVE_FOLDER_SCHEMES) for the checkpoints and run files; caches and logs then
    # stay local, under runs/<run_name>
    save_folder: str = _writes("runs/train")
    save_interval: str = "50ba"  # a checkpoint every so often (and at the end)
    save_num_checkpoints_to_keep: int = 3  # the newest kept (-1: all)
    autoresume: bool = False  # continue from save_folder's newest complete checkpoint when there is one
    save_overwrite: bool = False  # replace a previous run's checkpoints in save_folder (Composer's convention)
    load_path: str | None = _reads(None)  # a checkpoint to start from (weights, optimizer and position)
    fsdp: dict[str, Any] | None = None  # e.g. {version: 2} or FSDP1 {sharding_strategy: FULL_SHARD, ...}
    activation_checkpointing: bool = False  # recompute activations in the backward pass: less memory, more time
    # torch.compile each transformer block (latent and local stacks) on its own, as torchtitan does: on a GPU with
    # the loader's tiles (model.packed_attention auto) one graph per block, no graph break (hbpe bench step)
    compile: bool = False
    log_interval: str = "10ba"  # how often metrics go to the loggers (and to console_metrics)
    console: bool = True  # a progress line on stderr: batches, loss, BPB, KB/s, time left; each eval's BPB
    console_metrics: bool = False  # Composer's console logger too: every metric every log_interval, as blocks
    # Composer's log of every metric, in the save folder (a bucket run's: runs/<run_name>); null: none
    log_file: str | None = _writes("train.log", under="save_folder")
    # experiment trackers, Composer's loggers by name with their arguments: {tensorboard: {log_dir: ...}, wandb:
    # {project: ...}, mlflow: {tracking_uri: ...}} (null arguments: the defaults); training/train/loggers.py builds them
    loggers: dict[str, Any] = field(default_factory=dict)
    # Composer's callbacks by llm-foundry's names with their arguments: {memory_monitor: {}, ...}; speed_monitor
    # and lr_monitor always run (their arguments can be given here)
    callbacks: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.model, ModelConfig):  # validated once, here: every reader gets the typed section
            if not isinstance(self.model, dict):
                raise _fail("model", self.model, "a mapping of model settings", "model.latent_layers=4")
            object.__setattr__(self, "model", _model_config(self.model_size, self.model))
        # time strings first: `max_duration=100` gets the message about units, not "expected a string"
        _check_time("max_duration", self.max_duration, "max_duration=100ba", fraction_ok=False)
        for name in ("eval_interval", "save_interval", "log_interval"):
            _check_time(name, getattr(self, name), f"{name}=50ba")
        self._check_fields()
        _check_range("seed", 0 <= self.seed <= MAX_SEED, self.seed, f"must be in 0..{MAX_SEED}", "seed=17")
        if self.load_path and self.load_path.startswith("file://"):
            object.__setattr__(self, "load_path", self.load_path[len("file://") :])
        self._check_warmup_unit()
        if self.global_batch_size < 1:
            raise ConfigError(f"global_batch_size must be >= 1, got {self.global_batch_size}; e.g. global_batch_size=8")
        micro = self.device_microbatch_size
        if micro != "auto" and not (isinstance(micro, int) and micro >= 1):
            raise _fail("device_microbatch_size", micro, "'auto' or an integer >= 1", "device_microbatch_size=4")
        _check_choice("precision", self.precision, PRECISIONS)
        _check_choice("device", self.device, DEVICES)
        if self.device == "cpu" and self.precision not in ("auto", "fp32"):
            raise ConfigError(
                f"precision={self.precision} needs a GPU (Composer trains fp32 on CPU); with device=cpu use precision=fp32"
            )
        n = self.eval_subset_num_batches
        _check_range("eval_subset_num_batches", n == -1 or n >= 1, n, "-1 (all) or >= 1", "eval_subset_num_batches=20")
        k = self.save_num_checkpoints_to_keep
        _check_range("save_num_checkpoints_to_keep", k >= -1, k, "-1 (all) or >= 0", "save_num_checkpoints_to_keep=3")
        for name in ("run_name", "save_folder"):
            _check_range(name, bool(getattr(self, name)), "''", "must not be empty", self._example_of(name))
        object.__setattr__(self, "save_folder", _local_or_uri("save_folder", self.save_folder, SAVE_FOLDER_SCHEMES))
        check_output_prefix(self.save_folder, where=f"save_folder={self.save_folder}")
        self._check_log_file()
        if not self.data.train_sources:
            raise ConfigError(
                "data.train is empty: set it to a shard directory from `hbpe convert` (or mix several with data.streams)"
            )
        self._check_loggers()

    def _check_log_file(self) -> None:
        """The log goes in the save folder, as its help says: a file name or relative path that stays inside it
        (the trainer checks the resolved path again, symlinks followed, once the folder exists)."""
        name = self.log_file
        if not name:
            return
        parts = posixpath.normpath(name).split("/")
        if posixpath.isabs(name) or is_uri(name) or parts[0] in ("..", "."):
            raise ConfigError(
                f"log_file={name}: the log goes in the save folder ({self.save_folder}), so log_file is a file name "
                "inside it, not an absolute path or one out of it; e.g. log_file=train.log (or log_file=null for none)"
            )

    def _check_loggers(self) -> None:
        """Names and argument blocks only: the arguments themselves are checked against Composer's classes."""
        for key, known in (("loggers", LOGGERS), ("callbacks", CALLBACKS)):
            block = getattr(self, key)
            for name, args in block.items():
                if name not in known:
                    near = difflib.get_close_matches(str(name), known, n=1)
                    hint = f" (did you mean {key}.{near[0]}?)" if near else ""
                    raise ConfigError(f"unknown {key[:-1]} {key}.{name}{hint}; known: {', '.join(known)}")
                if args is not None and not isinstance(args, dict):
                    raise _fail(f"{key}.{name}", args, "a mapping of its arguments or null", f"{key}.{name}={{}}")

    def _check_warmup_unit(self) -> None:
        """Composer's warm-up schedulers need optim.warmup in max_duration's unit (even a 0 warm-up)."""
        max_unit = _time_unit(self.max_duration, "ba")
        if _time_unit(self.optim.warmup, max_unit) == max_unit:
            return
        warm_unit = _time_unit(self.optim.warmup, max_unit)
        raise ConfigError(
            f"optim.warmup={self.optim.warmup} and max_duration={self.max_duration} use different units "
            f"({warm_unit}, {max_unit}) and Composer's warm-up must count in the run's unit; set optim.warmup in "
            f"{max_unit} (e.g. optim.warmup=0{max_unit}, or a fraction of the run: optim.warmup=0.05dur) "
            f"or give max_duration in {warm_unit}"
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_world_divides_batch(cfg: TrainConfig, world: int, *, how: str = "") -> None:
    """global_batch_size must split evenly over the `world` processes (`how`: how they were asked for)."""
    if cfg.global_batch_size % world:
        fix = world * max(1, cfg.global_batch_size // world)
        raise ConfigError(
            f"global_batch_size {cfg.global_batch_size} is not divisible by the {world} processes{how}; "
            f"e.g. global_batch_size={fix}"
        )
