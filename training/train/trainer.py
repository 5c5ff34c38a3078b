"""Build and run a Composer Trainer from a TrainConfig (thin: the pieces live in their modules)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from composer import Callback

from hbpe.pipeline import storage
from hbpe.schemas.errors import ConfigError
from hbpe.schemas.train_config import TrainConfig, check_world_divides_batch
from hbpe.training.checkpoint.export_format import save_entropy_copy
from hbpe.training.checkpoint.run_files import write_run_files
from hbpe.training.checkpoint.safe_load import ensure_safe_checkpoint
from hbpe.training.checkpoint.save_folder import (  # re-exported: the save-folder checks are part of the trainer's surface
    check_resume_matches,
    check_save_folder,
    clear_previous_run,
    latest_checkpoint,
    set_aside_incomplete,
    spans_duration,
)
from hbpe.training.data.loader import epoch_samples, read_manifest
from hbpe.training.data.schemes import symbols_per_patch, tiles_apply
from hbpe.training.data.shared_memory import release as release_shared_memory
from hbpe.training.data.stream_cache import release as release_cache
from hbpe.training.data.streams import (
    build_dataloaders,
    cache_root,
    claim_cache,
    local_root,
    train_streams,
)
from hbpe.training.model.build import build_model
from hbpe.training.model.devices import composer_device
from hbpe.training.model.patch_lm import VocabSpec, parameter_counts
from hbpe.training.train.calibration import resolve_entropy_threshold, resolve_tokenizer
from hbpe.training.train.callbacks import KeepNewestCheckpoints, ThroughputMeter, TrainProgress
from hbpe.training.train.compile_blocks import compile_blocks, compile_loss
from hbpe.training.train.composer_model import HierarchicalComposerModel
from hbpe.training.train.host_counts import count_on_host
from hbpe.training.train.launch_command import rendezvous_marked
from hbpe.training.train.loggers import build_callbacks, build_loggers
from hbpe.training.train.metrics_file import METRICS_FILE, MetricsFile
from hbpe.training.train.optimizer import build_optimizer, build_scheduler
from hbpe.training.train.parallelize import attach_fsdp_hooks, parallelism_config

if TYPE_CHECKING:
    from hbpe.pipeline.tokenizer.hierarchical import HierarchicalTokenizer
    from hbpe.schemas.manifest import Manifest
    from hbpe.training.model.patch_lm import PatchLM

log = logging.getLogger(__name__)


@dataclass
class BuiltRun:
    trainer: Any
    tokenizer: Any
    meter: ThroughputMeter
    seq_len: int
    info: dict[str, Any] = field(default_factory=dict)
    cache: str | None = None  # the stream cache this process claimed for the run (claim_cache), if any

    def close(self) -> None:
        """Composer's close; then the run's datasets give back their shared memory (training/data/shared_memory.py:
        streaming would hold it, ~40 file descriptors a run, until the process exits) and the run's stream cache
        is released, so that a process training run after run (`hbpe experiment`, the API) holds neither, nor the
        datasets' idle thread pools."""
        self.trainer.close()
        for dataset in run_datasets(self.trainer):
            stop_dataset_threads(dataset)
            release_shared_memory(dataset)
        if self.cache is not None:
            release_cache(self.cache)


def run_datasets(trainer: Any) -> list[Any]:
    """The StreamingDatasets a Trainer reads: the training loader's and each evaluator's."""
    state = trainer.state
    loaders = [state.train_dataloader, *(getattr(e.dataloader, "dataloader", None) for e in state.evaluators)]
    return [dl.dataset for dl in loaders if dl is not None and hasattr(dl, "dataset")]


def stop_dataset_threads(dataset: Any) -> None:
    """Stop a finished StreamingDataset's background threads and their pool.

    streaming starts a ThreadPoolExecutor per dataset on its first iteration (a prepare and a ready thread each
    epoch) and never shuts it down: its two idle threads outlived every run, 4 a run with an eval set. The epoch
    left mid-way (an eval subset) is told to exit first, so that the shutdown's wait returns at once. Idempotent;
    streaming makes a new pool if the dataset is iterated again.
    """
    iterator = vars(dataset).get("_iterator")
    if iterator is not None:
        iterator.exit()
    executor = vars(dataset).pop("_executor", None)
    if executor is not None:
        executor.shutdown(wait=True, cancel_futures=True)


def check_samples(cfg: TrainConfig, samples: int, *, world: int) -> None:
    """Enough samples for one global batch: with drop_last a smaller set gives 0 batches per epoch,
    and Composer then loops over empty epochs without end."""
    if samples < cfg.global_batch_size:
        where = cfg.data.train or f"one epoch of data.streams ({', '.join(cfg.data.train_sources)})"
        raise ConfigError(
            f"{where} has {samples} samples, fewer than global_batch_size={cfg.global_batch_size} "
            f"(per device: {cfg.global_batch_size // world} on {world} processes), so no batch could be formed; "
            "lower global_batch_size or convert more text"
        )


def check_not_finished(cfg: TrainConfig, trainer: Any) -> None:
    """A resumed (autoresume or load_path) run already at max_duration: Composer's fit() refuses it with a
    ValueError; say it here, as a config matter, before the run files are touched."""
    state = trainer.state
    done = state.timestamp.get(state.max_duration.unit)
    if state.max_duration <= done:
        source = f"load_path {cfg.load_path}" if cfg.load_path else f"the run in save_folder {cfg.save_folder}"
        also = " (with optim.allow_new_duration=true: its schedule spans max_duration)" if spans_duration(cfg) else ""
        raise ConfigError(
            f"{source} is already trained to {done} (max_duration={cfg.max_duration}); raise max_duration above "
            f"{done} to continue it{also}, or set save_folder to a new folder for a new run"
        )


def guard_checkpoint_loading(cfg: TrainConfig, *, resume_from: str | None) -> None:
    """No checkpoint Composer loads may run code.

    Composer unpickles checkpoints with `weights_only=False`. Its validation hook checks every
    file right before it loads one (remote, after the download, and sharded included); the
    explicit checks here give the one-line error before the Trainer exists (DCP would wrap the
    hook's error in its own). `resume_from`: what autoresume continues (`latest_checkpoint`).
    """

    os.environ["CHECKPOINT_VALIDATION_FUNCTION"] = "hbpe.training.checkpoint.safe_load.composer_checkpoint_validator"
    for path in (cfg.load_path, resume_from):
        if path and not storage.is_remote(path):
            ensure_safe_checkpoint(path)


def _start(cfg: TrainConfig, *, save_enabled: bool) -> tuple[str, int]:
    """Seed, join the process group, claim the save folder -> (device, world size)."""
    from composer.utils import dist, reproducibility

    reproducibility.seed_all(cfg.seed)
    device = composer_device(cfg.device)
    world = dist.get_world_size()
    if world > 1:
        with rendezvous_marked():  # `hbpe train` on node R > 0 bounds this wait (launch_command.RendezvousWatch)
            dist.initialize_dist(device)  # early, for the barrier below (the Trainer reuses the process group)
    if save_enabled:
        check_save_folder(cfg)
        dist.barrier()  # every rank has looked at the folder before rank 0 writes the run files into it
    check_world_divides_batch(cfg, world)
    return device, world


def keep_previous_log(path: str) -> str | None:
    """Move an earlier session's log aside (`train.log` -> `train.log.1`, `.2`, ...) -> its new name.

    Composer's FileLogger truncates its file, and a resumed run would otherwise lose the log of the
    session it continues. Rank 0 only: the other ranks see the same local path on one node.
    """
    if int(os.environ.get("RANK", "0")) != 0 or not os.path.isfile(path):
        return None
    n = 1
    while os.path.exists(f"{path}.{n}"):
        n += 1
    os.replace(path, f"{path}.{n}")
    return f"{path}.{n}"


def log_file_path(cfg: TrainConfig) -> str:
    """Where the run's log goes: log_file in the save folder (a bucket run's: runs/<run_name>).

    TrainConfig refuses a name out of it as written; this is the same check on the resolved path, so a symlink
    in the save folder cannot carry the log elsewhere.
    """
    root = local_root(cfg)
    path = os.path.join(root, cfg.log_file or "")
    resolved = Path(path).resolve()
    if not resolved.is_relative_to(Path(root).resolve()):
        raise ConfigError(
            f"log_file={cfg.log_file} resolves to {resolved}, outside the save folder {root} (through a symlink); "
            "the log goes in the save folder: name a file there, e.g. log_file=train.log (or log_file=null for none)"
        )
    return path


def _model(cfg: TrainConfig, tok: HierarchicalTokenizer) -> tuple[PatchLM, Any]:
    """(the model with its FSDP hooks, the ComposerModel around it) for `cfg.model` shaped by `tok`."""

    model = attach_fsdp_hooks(build_model(cfg.model, VocabSpec.from_tokenizer(tok)))
    cmodel = HierarchicalComposerModel(
        model, max_patch_size=tok.max_patch_size, loss_normalization=cfg.optim.loss_normalization
    )
    if cfg.compile:  # HBPE_COMPILE_BACKEND: another dynamo backend (the tests' aot_eager builds no C++)
        backend = os.environ.get("HBPE_COMPILE_BACKEND", "inductor")
        compile_blocks(model, backend=backend)
        compile_loss(cmodel, backend=backend)
    return model, cmodel


def _with_host_counts(loader: Any) -> Any:
    """The train loader as Composer's DataSpec, counting a batch's samples by its `first_target` rows: its batches
    carry the loader's host counts as plain floats (training/data/schemes.py HostCounts), which Composer's
    default count refuses (it broadcasts them to every microbatch, and leaves them on the host)."""
    from composer.core import DataSpec

    return DataSpec(loader, get_num_samples_in_batch=lambda batch: int(batch["first_target"].shape[0]))


def _precision(cfg: TrainConfig, device: str) -> str:
    return cfg.precision if cfg.precision != "auto" else ("amp_bf16" if device == "gpu" else "fp32")


def _trainer_kwargs(
    cfg: TrainConfig,
    *,
    device: str,
    device_batch: int,
    callbacks: list[Callback],
    loggers: list[Any],
    save_enabled: bool,
    resume_from: str | None = None,
    tiled: bool = False,
) -> dict[str, Any]:
    """Composer Trainer arguments other than the model, data and optimizer: schedule, precision, saving, logging.

    `tiled`: the loader lays out tiles per microbatch (training/data/schemes.py `tiles_apply`).

    `callbacks` and `loggers` are every one the run has (the config's blocks built by `build_run`);
    `resume_from` what autoresume continues (`latest_checkpoint`).
    """
    from composer.algorithms import GradientClipping
    from composer.loggers import FileLogger

    micro = cfg.device_microbatch_size
    if micro == "auto" and (device != "gpu" or tiled):
        # Composer's auto microbatching needs CUDA OOM signals; and it would split the loader's tiles
        # (training/data/tile_layout.py), laid out per microbatch before Composer could choose one
        micro = device_batch
    all_loggers = list(loggers)
    if cfg.log_file and save_enabled:
        log_path = log_file_path(cfg)
        if resume_from or cfg.load_path:
            keep_previous_log(log_path)
        all_loggers.append(FileLogger(filename=log_path, flush_interval=1))
    if save_enabled:  # every run's metrics as JSON lines beside its log (a bucket run: under runs/RUN_NAME)
        metrics_path = os.path.join(local_root(cfg), METRICS_FILE)
        all_loggers.append(MetricsFile(metrics_path, append=bool(resume_from or cfg.load_path)))
    clip = cfg.optim.grad_clip_norm
    return dict(
        max_duration=cfg.max_duration,
        algorithms=[GradientClipping(clipping_type="norm", clipping_threshold=clip)] if clip else [],
        callbacks=callbacks,
        loggers=all_loggers,
        run_name=cfg.run_name,
        seed=cfg.seed,
        device=device,
        precision=_precision(cfg, device),
        device_train_microbatch_size=micro,
        parallelism_config=parallelism_config(
            cfg.fsdp, activation_checkpointing=cfg.activation_checkpointing, on_gpu=device == "gpu"
        ),
        save_folder=cfg.save_folder if save_enabled else None,
        save_interval=cfg.save_interval,
        save_num_checkpoints_to_keep=cfg.save_num_checkpoints_to_keep,
        save_overwrite=cfg.save_overwrite,
        **_load_kwargs(cfg, resume_from),
        progress_bar=False,
        load_progress_bar=False,  # a checkpoint downloaded from a bucket (resume, load_path): no bar either
        log_to_console=cfg.console_metrics,
        console_log_interval=cfg.log_interval,
        python_log_level=None,
    )


def _load_kwargs(cfg: TrainConfig, resume_from: str | None) -> dict[str, Any]:
    """Composer's load_path: what autoresume continues, or the config's load_path.

    hbpe finds the resume point itself (`latest_checkpoint`: the newest complete checkpoint) and
    hands it to Composer as a load_path, which Composer loads as its autoresume would. Composer's own
    autoresume follows `latest-rank0.pt`, which a kill between saving a checkpoint and moving the
    symlink leaves behind; in a bucket it would also download the checkpoint into a local folder
    named after the URI (`./s3:/bucket/run/latest-rank0.pt`).
    """
    if cfg.autoresume:
        return {"autoresume": False, "load_path": resume_from or cfg.load_path}
    return {"autoresume": False, "load_path": cfg.load_path}


def _without_a_credentials_object_at_the_bucket_root(make: Callable[..., Any]) -> Callable[..., Any]:
    """`make` (Composer's Trainer) run with Composer's write check of a bucket save_folder skipped.

    Composer proves it may write by uploading `.credentials_validated_successfully` at the bucket's
    root, outside the prefix the user gave, and leaves it there. hbpe's run files prove the same
    inside the save folder, with the same credentials, before the first step (`write_run_files`
    in build_run), so nothing is lost by skipping it.
    """

    def made(*args: Any, **kwargs: Any) -> Any:
        from composer.utils import remote_uploader

        check = remote_uploader.validate_credentials
        remote_uploader.validate_credentials = lambda *a, **kw: None
        try:
            return make(*args, **kwargs)
        finally:
            remote_uploader.validate_credentials = check

    return made


def _poll_uploads_often(trainer: Any) -> None:
    """Composer uploads `latest-rank0.pt.symlink` once it sees the checkpoint in the bucket, looking every 30 s
    (its attribute is there for tests to shorten): each save, and the end of the run, waited up to 30 s for a
    small checkpoint whose upload took well under one. One HEAD request a second while an upload runs is nothing."""
    saver = getattr(trainer, "_checkpoint_saver", None)
    if getattr(saver, "remote_uploader", None) is not None and hasattr(
        saver, "_symlink_upload_wait_before_next_try_in_seconds"
    ):
        saver._symlink_upload_wait_before_next_try_in_seconds = 1.0


@dataclass(frozen=True)
class RunPlan:
    """What `build_run` trains, every check done once the process group is up and before anything is built or
    written: the tokenizer (hence S: resolve_tokenizer decides it, once), the config as trained, the training
    shards' manifests and the checkpoint autoresume continues."""

    cfg: TrainConfig  # as trained: an entropy threshold chosen on the shards included
    device: str
    world: int
    tok: HierarchicalTokenizer
    derived: dict[str, Any] | None  # another second stage than the shards' (resolve_tokenizer), else None
    entropy_model: Any | None
    manifests: list[Manifest]  # of cfg.data.train_sources, in order
    resume_from: str | None

    @property
    def device_batch(self) -> int:
        return self.cfg.global_batch_size // self.world

    @property
    def seq_len(self) -> int:
        return self.manifests[0].seq_len  # the same for every stream (data.stream_source checks it)


def plan_run(cfg: TrainConfig, *, device: str, world: int, save_enabled: bool = True) -> RunPlan:
    """The checks of `build_run` that read the shards and the save folder; they write nothing."""
    from composer.utils import dist

    # read once: S here, seq_len and the epoch's samples below, shard checks in the loader
    train_manifests = [read_manifest(src) for src in cfg.data.train_sources]
    tok, derived = resolve_tokenizer(cfg, train_manifests)
    cfg, entropy_model = resolve_entropy_threshold(cfg, tok)
    if save_enabled:
        check_resume_matches(cfg, tok)
        if cfg.log_file:
            log_file_path(cfg)
    check_samples(cfg, epoch_samples(train_streams(cfg, train_manifests), cfg.data.epoch_size), world=world)
    check_canonical_nodes(cfg, nodes=world // dist.get_local_world_size())
    resume_from = latest_checkpoint(cfg) if cfg.autoresume and save_enabled else None
    return RunPlan(cfg, device, world, tok, derived, entropy_model, train_manifests, resume_from)


def build_run(
    cfg: TrainConfig,
    *,
    callbacks: list[Callback] | None = None,
    loggers: list[Any] | None = None,
    eval_enabled: bool = True,
    save_enabled: bool = True,
) -> BuiltRun:
    """Everything `fit()` needs, checked before anything is written: tokenizer, shards, model, Trainer."""
    from composer.utils import dist

    # the config's loggers and callbacks first: a wrong argument or a missing package is said before any work
    config_loggers = build_loggers(cfg.loggers, log_root=local_root(cfg))
    config_callbacks = build_callbacks(cfg.callbacks)
    device, world = _start(cfg, save_enabled=save_enabled)
    plan = plan_run(cfg, device=device, world=world, save_enabled=save_enabled)
    claimed = None
    if dist.get_local_rank() == 0:  # the rank that fills this node's cache; the others only read it
        claim_cache(plan.cfg)
        claimed = cache_root(plan.cfg)
    meter = ThroughputMeter()
    trainer, model = _trainer(
        plan,
        callbacks=[
            *config_callbacks,
            meter,
            KeepNewestCheckpoints(),  # the run's newest N checkpoints across a resumption
            *([TrainProgress()] if cfg.console else []),
            *(callbacks or []),
        ],
        loggers=[*config_loggers, *(loggers or [])],
        eval_enabled=eval_enabled,
        save_enabled=save_enabled,
    )
    _poll_uploads_often(trainer)
    # the run files and the clearing of an old run come last: any refusal above leaves the folder as it was,
    # so fixing the mistake and running again is not refused as "already holds a run"
    try:
        check_not_finished(plan.cfg, trainer)
    except ConfigError:
        BuiltRun(trainer, plan.tok, meter, plan.seq_len, cache=claimed).close()
        raise
    if save_enabled:
        _start_run_folder(plan)
    return BuiltRun(trainer, plan.tok, meter, plan.seq_len, _run_info(plan, model), cache=claimed)


def _trainer(
    plan: RunPlan, *, callbacks: list[Any], loggers: list[Any], eval_enabled: bool, save_enabled: bool
) -> tuple[Any, PatchLM]:
    """(the Composer Trainer, the model it trains): data loaders, model, optimizer; a resumed checkpoint is loaded."""
    from composer import Trainer

    cfg = plan.cfg
    train_dl, eval_dl = build_dataloaders(
        cfg,
        plan.tok,
        plan.manifests,
        device_batch=plan.device_batch,
        eval_enabled=eval_enabled,
        entropy_model=plan.entropy_model,
        device=plan.device,
    )
    try:
        model, cmodel = _model(cfg, plan.tok)
        count_on_host(train_dl, cfg.model, vocab_size=model.io.vocab_size)
        optimizer, scheduler = build_optimizer(cmodel, cfg.optim, device=plan.device), build_scheduler(cfg.optim)
        guard_checkpoint_loading(cfg, resume_from=plan.resume_from)
        trainer = _without_a_credentials_object_at_the_bucket_root(Trainer)(
            model=cmodel,
            train_dataloader=_with_host_counts(train_dl),
            eval_dataloader=eval_dl,
            eval_interval=cfg.eval_interval if eval_dl is not None else 0,
            eval_subset_num_batches=cfg.eval_subset_num_batches,
            optimizers=optimizer,
            schedulers=scheduler,
            **_trainer_kwargs(
                cfg,
                device=plan.device,
                device_batch=plan.device_batch,
                callbacks=callbacks,
                loggers=loggers,
                save_enabled=save_enabled,
                resume_from=plan.resume_from,
                tiled=tiles_apply(
                    cfg.model, device=plan.device, symbols_per_patch=symbols_per_patch(cfg.model, plan.tok)
                ),
            ),
        )
    except BaseException:
        # a refusal after the loaders exist (a bad load_path, an fsdp block): their streaming datasets hold shared
        # memory named after the cache folder, and a corrected rerun in this process would be refused as
        # "Reused local directory" until the garbage collector happened to find them
        for loader in (train_dl, eval_dl):
            if loader is not None:
                release_shared_memory(getattr(loader, "dataset", loader))
        raise
    return trainer, model


def _start_run_folder(plan: RunPlan) -> None:
    """Rank 0 clears an old run (or sets aside a cut-short checkpoint) and writes the run files; every rank waits."""
    from composer.utils import dist

    cfg = plan.cfg
    if dist.get_global_rank() == 0:
        if cfg.save_overwrite:
            clear_previous_run(cfg.save_folder)
        elif cfg.autoresume:
            set_aside_incomplete(cfg.save_folder, plan.resume_from)  # a cut-short checkpoint's name would stop fit()
        write_run_files(
            cfg.save_folder,
            model_cfg=cfg.model,
            tok=plan.tok,
            seq_len=plan.seq_len,
            train_config=cfg.to_dict(),
            derived_tokenizer=plan.derived,
        )
        if plan.entropy_model is not None:  # the run keeps the entropy model it is trained with (entropy_files.py)
            save_entropy_copy(plan.entropy_model, cfg.save_folder)
    dist.barrier()  # no rank saves a checkpoint before rank 0 has cleared the old run


def _run_info(plan: RunPlan, model: PatchLM) -> dict[str, Any]:
    counts = parameter_counts(model)
    return {
        "device": plan.device,
        "world_size": plan.world,
        "precision": _precision(plan.cfg, plan.device),
        "params": counts["total"],
        "params_by_part": counts,  # the paper's count: a tied matrix once
        "vocab_size": plan.tok.vocab_size,
        "max_patch_size": plan.tok.max_patch_size,
        "seq_len": plan.seq_len,
        "derived_tokenizer": plan.derived,
        "model": asdict(plan.cfg.model),  # as trained: an entropy threshold chosen on the shards included
    }


def train(cfg: TrainConfig) -> dict[str, Any]:
    run = build_run(cfg)
    resumed_at = int(run.trainer.state.timestamp.batch)  # Composer loads a resumed checkpoint in Trainer()
    if resumed_at:
        log.info("resuming at batch %d", resumed_at)
    t = time.perf_counter()
    run.trainer.fit()
    wall = time.perf_counter() - t
    metrics = {f"{k}": float(v.compute()) for k, v in run.trainer.state.eval_metrics.get("eval", {}).items()}
    run.close()  # the next run may take the cache
    return {
        **run.info,
        "wall_s": wall,
        "eval": metrics,
        "throughput": run.meter.summary(),
        "save_folder": cfg.save_folder,
        "batches": int(run.trainer.state.timestamp.batch),  # the run's total, a resumed session's included
        "resumed_at_batch": resumed_at,
    }


def check_canonical_nodes(cfg: TrainConfig, *, nodes: int) -> None:
    """A new run's num_canonical_nodes and node count must divide one another (streaming's partitioning).

    A resumed run takes the value saved in its checkpoint, and streaming then re-partitions the
    same order for any node count (its relaxed partitioning), so only a fresh start is checked.
    """
    n = cfg.data.num_canonical_nodes
    if n is None or n % nodes == 0 or nodes % n == 0:
        return
    if cfg.load_path or (cfg.autoresume and latest_checkpoint(cfg)):
        return
    raise ConfigError(
        f"data.num_canonical_nodes={n} and the {nodes} nodes of this run do not divide one another, which streaming "
        f"needs to start a run; e.g. data.num_canonical_nodes={nodes * max(1, n // nodes)} (or null: one per node)"
    )
