"""Only the C extension lives here; everything else is in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "hbpe.pipeline.tokenizer.second_stage._merge_core",
            ["pipeline/tokenizer/second_stage/_merge_core.c"],
            extra_compile_args=["-O3", "-std=c99"],
        ),
    ]
)
