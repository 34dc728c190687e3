# Every target installs the environment first (scripts/install.sh is idempotent).
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: install test demo demo-seg lint clean

install:
	@bash scripts/install.sh

test: install
	$(PY) -m pytest $(PYTEST_ARGS)

demo: install
	$(PY) tools/demo.py --task det

demo-seg: install
	$(PY) tools/demo.py --task seg

lint: install
	$(PY) -m pip install -q ruff && $(VENV)/bin/ruff check --isolated --select E,F,W --line-length 100 inline_mm tools tests

clean:
	rm -rf work_dirs .pytest_cache
