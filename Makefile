# Every target installs the environment first (scripts/install.sh is idempotent).
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: install test test-fast test-gpu test-compat demo demo-seg lint clean

install:
	@bash scripts/install.sh

# the whole suite (what CI runs)
test: install
	$(PY) -m pytest $(PYTEST_ARGS)

# everything but the end-to-end runs marked slow (training, multi-process, exports)
test-fast: install
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

# the GPU tier: the tests marked cuda (skipped without a GPU), then the GPU timing table;
# the table is written even when a test fails, and the exit status is the first failure's
GPU_REPORT ?= work_dirs/gpu_report
test-gpu: install
	@status=0; \
	$(PY) -m pytest -m cuda $(PYTEST_ARGS) || status=$$?; \
	$(PY) tools/analysis/gpu_report.py --out $(GPU_REPORT) || \
		{ s=$$?; [ $$status -ne 0 ] || status=$$s; }; \
	if [ -f $(GPU_REPORT)/table.md ]; then \
		echo "GPU table: $(GPU_REPORT)/table.md (figures: $(GPU_REPORT)/report.json)"; \
	else echo "no GPU table written"; fi; \
	exit $$status

# the whole suite on one stack, in its own environment (not in CI; scripts/test_compat.sh):
# STACK=oldest (the default; scripts/constraints-oldest.txt in .venv-compat, where
# scripts/dump_api_inventory.py writes the API floors), STACK=current (constraints.txt in
# .venv, as make test), STACK=onedl or continuation (OneDL's continuation of the toolkits,
# scripts/constraints-onedl.txt in .venv-onedl)
STACK ?= oldest
test-compat:
	@bash scripts/test_compat.sh $(STACK) $(PYTEST_ARGS)

demo: install
	$(PY) tools/demo.py --task det

demo-seg: install
	$(PY) tools/demo.py --task seg

lint: install
	$(PY) -m pip install -q ruff && $(VENV)/bin/ruff check --isolated --select E,F,W --line-length 100 inline_mm tools tests

clean:
	rm -rf work_dirs .pytest_cache
