"""Training configuration: typed, validated dataclasses (parsed from YAML in training/config_io.py)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from schemas.errors import ConfigError


@dataclass(frozen=True)
class ModelConfig:
    """Latent transformer + local encoder/decoder sizes. V' and S come from the tokenizer."""

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
    io: str = "hierarchical"  # input/output side: "hierarchical" (BPE-patch) or "bpe" (embedding baseline)
    dropout: float = 0.0
    rope_theta: float = 10000.0
    max_patches: int = 4096  # longest latent context (RoPE has no table to outgrow; used for checks)

    def __post_init__(self) -> None:
        for name in ("latent_dim", "local_dim"):
            heads = self.latent_heads if name == "latent_dim" else self.local_heads
            if getattr(self, name) % heads or (getattr(self, name) // heads) % 2:
                raise ConfigError(f"{name}={getattr(self, name)} must split into an even head size over {heads} heads")
        if self.pooling not in ("mean", "eop"):
            raise ConfigError(f"pooling must be 'mean' or 'eop', got {self.pooling!r}")
        if self.conditioning not in ("prefix", "add"):
            raise ConfigError(f"conditioning must be 'prefix' or 'add', got {self.conditioning!r}")
        if self.io not in ("hierarchical", "bpe"):
            raise ConfigError(f"io must be 'hierarchical' or 'bpe', got {self.io!r}")
        if min(self.latent_layers, self.encoder_layers, self.decoder_layers) < 1:
            raise ConfigError("every transformer needs at least one layer")


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
    if size not in MODEL_SIZES:
        raise ConfigError(f"unknown model size {size!r}; choose one of {', '.join(MODEL_SIZES)}")
    return ModelConfig(**{**MODEL_SIZES[size], **overrides})


@dataclass(frozen=True)
class DataConfig:
    train: str = ""  # shard directory or URI from `hbpe convert`
    eval: str | None = None  # held-out shards
    tokenizer: str | None = None  # default: the shards' own tokenizer copy
    max_patch_size: int | None = None  # re-patch `tokens` with another S (same first stage)
    mode: str | None = None
    cache_dir: str | None = None  # streaming's local cache (default: under the save folder)
    shuffle: bool = True
    shuffle_seed: int = 17
    num_workers: int = 0


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    warmup: str = "10ba"
    schedule: str = "cosine"  # "cosine" (to alpha_f * lr) or "constant"
    alpha_f: float = 0.1
    grad_clip_norm: float = 1.0


@dataclass(frozen=True)
class TrainConfig:
    run_name: str = "hbpe"
    seed: int = 17
    model_size: str = "tiny"
    model: dict[str, Any] = field(default_factory=dict)  # overrides of the size preset
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    global_batch_size: int = 8
    device_microbatch_size: int | str = "auto"
    max_duration: str = "100ba"
    eval_interval: str = "50ba"
    eval_subset_num_batches: int = -1
    precision: str = "auto"  # "auto": amp_bf16 on GPU, fp32 on CPU
    device: str = "auto"
    save_folder: str = "runs/train"
    save_interval: str = "50ba"
    save_num_checkpoints_to_keep: int = 3
    autoresume: bool = False
    load_path: str | None = None
    fsdp: dict[str, Any] | None = None  # e.g. {version: 2} or FSDP1 {sharding_strategy: FULL_SHARD, ...}
    activation_checkpointing: bool = False
    log_interval: str = "10ba"
    console: bool = True  # Composer's console logger (metrics every log_interval, eval progress)
    log_file: str | None = "train.log"

    def __post_init__(self) -> None:
        if self.global_batch_size < 1:
            raise ConfigError(f"global_batch_size must be >= 1, got {self.global_batch_size}")
        if not self.data.train:
            raise ConfigError("data.train is empty: set it to a shard directory from `hbpe convert`")
        model_config(self.model_size, **self.model)  # validates the model block early

    @property
    def model_config(self) -> ModelConfig:
        return model_config(self.model_size, **self.model)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ConfigError(f"unknown config keys {sorted(unknown)}; known: {sorted(known)}")
        d = dict(d)
        try:
            if "data" in d:
                d["data"] = DataConfig(**d["data"])
            if "optim" in d:
                o = dict(d["optim"])
                if "betas" in o:
                    o["betas"] = tuple(o["betas"])
                d["optim"] = OptimConfig(**o)
        except TypeError as e:
            raise ConfigError(f"bad data/optim block: {e}") from e
        return cls(**d)
