"""Only the C extensions live here; everything else is in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "hbpe.pipeline.tokenizer.second_stage._merge_core",
            ["pipeline/tokenizer/second_stage/_merge_core.c"],
            extra_compile_args=["-O3", "-std=c99"],
        ),
        # -fopenmp-simd: the `omp simd` loops vectorise (reductions too) with no OpenMP runtime linked;
        # -ffp-contract=off: no fused multiply-adds, so every platform rounds as the tests measured
        Extension(
            "hbpe.training.model._patch_attention",
            ["training/model/_patch_attention.c"],
            depends=["training/model/_patch_attention_impl.h"],
            extra_compile_args=["-O3", "-std=c99", "-fopenmp-simd", "-ffp-contract=off"],
        ),
    ]
)
