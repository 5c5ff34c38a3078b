"""`python -m hbpe.training.inference.zero_shot.lm_eval_cli ARGS`: lm-eval's command line with the "hbpe" model registered.

lm-eval 0.4.13 looks a `--model` name up in its registry, which holds its own models
(lm_eval/models/__init__.py: MODEL_MAPPING) and whatever code has registered before the lookup;
it reads no entry points, so a plain `lm_eval --model hbpe` cannot find hbpe. This module
registers it, then runs lm-eval's own CLI with the same arguments:

    python -m hbpe.training.inference.zero_shot.lm_eval_cli run --model hbpe \\
        --model_args checkpoint=runs/demo/train --tasks my_task --include_path tasks/
"""

from __future__ import annotations


def main() -> None:
    from lm_eval.__main__ import cli_evaluate

    import hbpe.training.inference.zero_shot.lm_eval_adapter  # noqa: F401  (registers the "hbpe" model)

    cli_evaluate()


if __name__ == "__main__":
    main()
