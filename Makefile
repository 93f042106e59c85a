# llm-epp: `make test` and `make demo` set themselves up (a .venv with the project and its dev tools).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test lint typecheck imports unit demo bench-overhead proto clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	$(BIN)/python -m pip install --quiet -e examples/plugin-example
	touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples scripts
	$(BIN)/ruff format --check src tests benchmarks examples scripts

typecheck: $(STAMP)
	$(BIN)/mypy

imports: $(STAMP)
	$(BIN)/lint-imports

unit: $(STAMP)
	$(BIN)/pytest -q

test: lint typecheck imports unit

demo: $(STAMP)
	$(BIN)/python -m examples.demo

proto: $(STAMP)
	$(BIN)/python scripts/gen_proto.py

bench-overhead: $(STAMP)
	$(BIN)/python -m benchmarks.overhead

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
