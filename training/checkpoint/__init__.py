"""Checkpoints, in order: safe unpickling (safe_load.py), run folders and save-folder pointers (run_files.py,
save_folder.py), checks of a description against its tokenizer and weights (load_checks.py), the export
format (names.py, export_format.py, entropy_files.py), bucket copies (remote.py), sharded DCP reading
(sharded.py), then `load_model` on top (load.py); `hbpe export` and `hbpe checkpoint consolidate` are
tools over them (export.py, consolidate.py)."""
