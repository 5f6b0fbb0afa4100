# Two set-up commands on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CONFIG ?= build_configs/tiny-dflash.yaml
PROMPT ?= Q: 482 + 356\nA:

.PHONY: install demo test lint clean

# torch first, pinned to the CPU wheel: an unpinned torch would pull a multi-GB CUDA build
$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

demo: install
	@echo "== speculative ($(CONFIG)) =="
	$(VENV)/bin/trtspec generate --config $(CONFIG) --prompt "$$(printf '$(PROMPT)')" --max-tokens 120
	@echo "== target alone (--drafter none) =="
	$(VENV)/bin/trtspec generate --config $(CONFIG) --prompt "$$(printf '$(PROMPT)')" --max-tokens 120 --drafter none

test: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/pytest -q

lint: install
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache
