"""Using a trained model: BPB on shards (evaluate.py), generation (generate.py, kv_decode.py,
byte_generation.py), zero-shot tasks (zero_shot/), and Table 1's columns measured on shards (scheme_stats.py)."""
