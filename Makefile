# Two set-up commands on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CONFIG ?= build_configs/tiny-dflash.yaml
PROMPT ?= Q: 482 + 356\nA:
DEMO_OUT ?= demo-out
HTTP_PORT ?= 8000
GRPC_PORT ?= 8001
METRICS_PORT ?= 8002
OPENAI_PORT ?= 9000
# pytest-xdist workers for `make test`: a served test spends about half its time waiting on a server or
# a child process, so two workers keep the 2-core CI machine busy; TEST_WORKERS=0: one process
TEST_WORKERS ?= 2

.PHONY: install demo test bench lint clean

# torch first, pinned: the CPU wheel where pip's configuration offers it (README, Quick start)
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
	@echo "== served: build the Triton repository, serve it, one streaming gRPC request, stop =="
	rm -rf $(DEMO_OUT)  # the demo's own output, rebuilt each time
	$(VENV)/bin/trtspec build $(CONFIG) --out $(DEMO_OUT)
	@$(VENV)/bin/trtspec serve $(DEMO_OUT) --http-port $(HTTP_PORT) --grpc-port $(GRPC_PORT) \
	    --metrics-port $(METRICS_PORT) --openai-port $(OPENAI_PORT) & pid=$$!; trap 'kill -TERM $$pid; wait $$pid' EXIT; \
	  $(VENV)/bin/trtspec generate --url grpc://127.0.0.1:$(GRPC_PORT) --wait 300 --stream \
	    --prompt "$$(printf '$(PROMPT)')" --max-tokens 120

test: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/pytest -q --durations=30 -n $(TEST_WORKERS) --dist loadscope

# regenerates docs/BENCHMARKS.md and docs/bench/*.png (run on an otherwise idle machine)
bench: install
	$(VENV)/bin/trtspec bench build_configs/tiny-dflash.yaml build_configs/tiny-dspark.yaml \
	    build_configs/tiny-eagle3.yaml build_configs/tiny-eagle3-k16.yaml build_configs/tiny-draft-model.yaml \
	    --tasks code,math,chat --prompts 8 --max-tokens 192 --concurrency 1,2,4,8 --tree auto \
	    --out docs/bench --doc docs/BENCHMARKS.md

lint: install
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache $(DEMO_OUT)
