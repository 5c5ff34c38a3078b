"""`hbpe export --format hf`: an hbpe export that transformers also loads (trust_remote_code=True).

One folder serves both: everything `hbpe export` writes (hbpe_model.json, model.safetensors,
tokenizer/; `hbpe eval`/`generate` read it as before) plus what transformers reads:

    DIR/config.json              model_type "hbpe", auto_map -> the classes below, the model's shape, eos/pad
                                 (the first stage's end-of-text id) and hbpe's whole ModelConfig (`hbpe_model`,
                                 which save_pretrained keeps: hbpe reads such a copy by it, hf_load.py), and
                                 `hbpe_tested_transformers`, the transformers releases the files below are tested with
    DIR/configuration_hbpe.py    HbpeConfig        (training/checkpoint/hf/, copied verbatim: they import no hbpe,
    DIR/modeling_hbpe.py         HbpeForCausalLM    so the folder loads where hbpe is not installed)
    DIR/generation_hbpe.py       its generate()
    DIR/tokenization_hbpe.py     HbpeTokenizer
    DIR/hbpe_*.py                hbpe's own model and generation modules, imports rewritten (hf_library.py)
    DIR/tokenizer_config.json    AutoTokenizer's entry: auto_map -> HbpeTokenizer, which reads tokenizer/; eos, pad

model.safetensors carries the metadata {"format": "pt"} transformers requires (it refuses any other);
hbpe checks the file by its sha256 in hbpe_model.json, not by that field. Only the paper's model
(model.io=hierarchical) has an HF class: the baselines are refused with the reason.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

from hbpe.schemas.errors import ConfigError
from hbpe.training.checkpoint.hf_library import COPY_FILES, is_library_copy, write_library_copies
from hbpe.training.schemes.registry import scheme_spec

HF_SOURCES = ("configuration_hbpe.py", "modeling_hbpe.py", "generation_hbpe.py", "tokenization_hbpe.py")
CONFIG_FILE = "config.json"
HBPE_MODEL_KEY = "hbpe_model"  # config.json's copy of hbpe's ModelConfig
# the transformers the copied files run under (a pip specifier, docs/huggingface.md): 4.57 is the pinned stack's
# (constraints.txt); 5.x from 5.0 (its oldest) to the newest, tests/training/test_hf_transformers5.py's pins. One
# code path serves both majors by asking transformers for features, not versions (hf/modeling_hbpe.py CACHE_NAME).
TESTED_TRANSFORMERS_KEY, TESTED_TRANSFORMERS = "hbpe_tested_transformers", ">=4.57,<6"
EOS_NAMES = ("<|endoftext|>", "<|end_of_text|>")  # the first stage's document end (gpt2 and friends, llama3)
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
# what `save_pretrained` of the model or tokenizer may add beside them: an earlier HF export's files
HF_FILES = (
    *HF_SOURCES,
    *COPY_FILES,
    CONFIG_FILE,
    TOKENIZER_CONFIG_FILE,
    "special_tokens_map.json",
    "generation_config.json",
)
AUTO_MAP = {
    "AutoConfig": "configuration_hbpe.HbpeConfig",
    "AutoModelForCausalLM": "modeling_hbpe.HbpeForCausalLM",
    "AutoTokenizer": ["tokenization_hbpe.HbpeTokenizer", None],
}
_SHAPE = (
    "latent_layers", "latent_dim", "latent_ffn", "latent_heads", "local_dim", "local_ffn", "local_heads",
    "encoder_layers", "decoder_layers", "pooling", "conditioning", "dropout", "rope_theta", "max_patches",
)  # fmt: skip


def check_hf_exportable(cfg: Any) -> None:
    """Only model.io=hierarchical has an HF class (modeling_hbpe.py)."""
    if not scheme_spec(cfg).tokenizer_patches:
        raise ConfigError(
            f"hbpe export --format hf: the checkpoint is a model.io={cfg.io} model; only the hierarchical (BPE-patch) "
            "model has a transformers class: export it without --format hf (hbpe eval/generate read that)"
        )


def eos_token(tok: Any) -> tuple[str, int]:
    """The first stage's end-of-text token and id: eos and pad of the HF folder, the document marker EOD to the model.
    The shipped tokenizer's rule (hf/tokenization_hbpe.py `eos_token_of`, which cannot import hbpe; not imported
    from there: it imports transformers); test_hf_export checks that both name the same id."""
    specials = tok.encoding._special_tokens
    name = next((n for n in EOS_NAMES if n in specials), None) or min(specials, key=specials.get)
    return name, specials[name]


def hf_config(cfg: Any, tok: Any) -> dict[str, Any]:
    """config.json: what HbpeConfig(**...) takes, with transformers' own keys, and hbpe's whole model config
    (`hbpe_model`: `hbpe eval`/`generate` read a save_pretrained folder by it, load.py)."""
    eos = eos_token(tok)[1]
    return {
        "model_type": "hbpe",
        "architectures": ["HbpeForCausalLM"],
        "auto_map": AUTO_MAP,
        "vocab_size": tok.encoding.max_token_value + 1,  # first-stage ids: len(tokenizer)
        "symbol_vocab_size": tok.vocab_size,
        "max_patch_size": tok.max_patch_size,
        **{k: getattr(cfg, k) for k in _SHAPE},
        "eos_token_id": eos,
        "pad_token_id": eos,
        "bos_token_id": eos,
        "tie_word_embeddings": True,  # E, one table for the local encoder and decoder
        "torch_dtype": "float32",
        HBPE_MODEL_KEY: dataclasses.asdict(cfg),
        TESTED_TRANSFORMERS_KEY: TESTED_TRANSFORMERS,
    }


def write_hf_files(dest: Path, cfg: Any, tok: Any) -> None:
    """The transformers half of the folder (write_export calls it before hbpe_model.json, which marks it complete)."""
    src = Path(__file__).parent / "hf"
    for name in HF_SOURCES:
        shutil.copyfile(src / name, dest / name)
    write_library_copies(dest)
    (dest / CONFIG_FILE).write_text(json.dumps(hf_config(cfg, tok), indent=2, sort_keys=True) + "\n")
    eos = eos_token(tok)[0]
    tok_config = {
        "tokenizer_class": "HbpeTokenizer",
        "auto_map": {"AutoTokenizer": AUTO_MAP["AutoTokenizer"]},
        "clean_up_tokenization_spaces": False,
        "model_max_length": cfg.max_patches - 1,  # latent positions: the document marker, then one per token
        "eos_token": eos,
        "pad_token": eos,
        "padding_side": "left",  # generate() continues each row's last token
    }
    (dest / TOKENIZER_CONFIG_FILE).write_text(json.dumps(tok_config, indent=2, sort_keys=True) + "\n")


def remove_hf_files(dest: Path) -> None:
    """A plain export over an earlier HF export: no config.json left to describe weights it no longer fits."""
    for name in HF_FILES:
        (dest / name).unlink(missing_ok=True)
    for path in dest.glob("hbpe_*.py"):  # module copies another hbpe wrote too (a module added or dropped since)
        if is_library_copy(path.name):
            path.unlink()
