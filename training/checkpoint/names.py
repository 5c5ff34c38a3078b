"""The file names of an `hbpe export` directory (export_format.py), shared by the modules that find them."""

EXPORT_FORMAT = "hbpe-model"
EXPORT_VERSION = 1
MODEL_FILE = "hbpe_model.json"
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_DIR = "tokenizer"
ENTROPY_DIR = "entropy_model"  # io=entropy: its entropy model, an export itself (entropy_files.py)
