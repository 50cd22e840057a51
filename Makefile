# Every target builds its own virtual environment in .venv on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)
DEMO   := demo-output

.PHONY: test test-fast demo bench learn reproduce fuzz clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	@rm -f $(VENV)/.installed-* && touch $(STAMP)

# lint-imports checks the package's layers first ([tool.importlinter] in pyproject.toml,
# docs/architecture.md): an import circle or an import running back up fails the test.
test: $(STAMP)
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q

test-fast: $(STAMP)
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q -m 'not slow'

demo: $(STAMP)
	@mkdir -p $(DEMO)
	$(BIN)/python tests/data/cifar.py $(DEMO)/rows.npy
	$(BIN)/rfsgen skeleton skeletons/cifar-deep.yaml
	$(BIN)/rfsgen sample skeletons/cifar-deep.yaml -n 4096 --seed 1 -o $(DEMO)/features.h5 --overwrite
	$(BIN)/rfsgen inspect $(DEMO)/features.h5
	$(BIN)/rfsgen transform $(DEMO)/features.h5 $(DEMO)/rows.npy -o $(DEMO)/features-of-rows.h5 --overwrite
	$(BIN)/rfsgen kernel skeletons/cifar-deep.yaml $(DEMO)/rows.npy -o $(DEMO)/K.npy --overwrite
	$(BIN)/python tests/data/compare.py $(DEMO)/features-of-rows.h5 $(DEMO)/K.npy

reproduce: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[plot,sklearn]'
	$(BIN)/python tests/reproduce/figure3.py --out reproduce-output
	$(BIN)/python tests/reproduce/figure4.py --out reproduce-output
	$(BIN)/python tests/reproduce/table1.py --out reproduce-output
	$(BIN)/python tests/reproduce/eof.py --out reproduce-output
	$(BIN)/python tests/reproduce/eof_counts.py

bench: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[bench]'
	$(BIN)/python tests/bench/bench.py --out bench-output

learn: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[bench]'
	$(BIN)/python tests/learn/learn.py --out learn-output

# The long fuzz budget (tests/fuzz/): FUZZ_CASES generated cases over every kind (issue 37's
# surfaces included), 2 processes; failures, minimised reproducers and the counts table land in
# fuzz-output/.  FUZZ_KINDS picks a subset (e.g. FUZZ_KINDS=expressions,labels,domains,eof,obsm,budget,exact).
FUZZ_CASES ?= 10000
FUZZ_SEED  ?= 1
FUZZ_KINDS ?= skeletons,rows,features,shards,signals,expressions,labels,domains,eof,obsm,budget,exact
fuzz: $(STAMP)
	$(BIN)/python tests/fuzz/run.py --cases $(FUZZ_CASES) --seed $(FUZZ_SEED) --kinds $(FUZZ_KINDS) --jobs 2 --mode fork \
		--time-limit 20 --memory-limit 3G --out fuzz-output

clean:
	rm -rf $(VENV) $(DEMO) bench-output learn-output reproduce-output fuzz-output build *.egg-info .pytest_cache .import_linter_cache
