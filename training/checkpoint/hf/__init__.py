"""The Hugging Face face of an hbpe model: the files `hbpe export --format hf` copies into an export.

    configuration_hbpe.py   HbpeConfig (a transformers PretrainedConfig, model_type "hbpe")
    modeling_hbpe.py        HbpeForCausalLM (a PreTrainedModel, GenerationMixin): the hierarchical patch LM
    generation_hbpe.py      its generate(): one token a patch, the local decoder's, with KV caches
    tokenization_hbpe.py    HbpeTokenizer (a PreTrainedTokenizer): text <-> first-stage ids <-> patches

They are copied verbatim and loaded by `transformers` with `trust_remote_code=True` from the export
folder, where hbpe may not be installed: they import only the standard library, numpy, torch,
tiktoken and transformers, and the hbpe_*.py files beside them, never `hbpe`. Those are hbpe's own
model and generation modules (training/model/*, training/inference/kv_decode.py, patch_decode.py,
sampling.py and the schemas they read), which the export copies with their import lines rewritten
(training/checkpoint/hf_library.py; tests/training/test_hf_library.py holds the copies equal to the
library): modeling_hbpe.py and generation_hbpe.py are the transformers adapter around them, and the
tokenizer's table gather (tokenization_hbpe.py) is the one copy of hbpe math left, held equal by
tests/training/test_hf_export.py (tokens, patches against hbpe's own). tests/training/test_hf_causal_lm.py
checks generate() against `hbpe generate` and the loss against hbpe's. They refuse what hbpe's loader refuses
(sizes out of hbpe's bounds, non-finite numbers or weights) with one ValueError; the config's bounds are copies
of hbpe's, held equal by tests/training/test_hf_guards.py.

One set of files serves transformers 4.57 and 5.x (config.json's `hbpe_tested_transformers`): where 5 differs they
ask transformers which form it has, never its version (docs/huggingface.md lists where); under transformers 5 in a
venv without hbpe: tests/training/test_hf_transformers5.py.
"""
