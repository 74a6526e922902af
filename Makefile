# The suite's entry points. `make demo` and `make test` set everything up first when needed.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
# Benchmarks `make demo` runs when BENCH=all (the default runs every one the suite has).
ALL_BENCHES := cosmoflow deepcam
STAMP := $(VENV)/.setup-stamp
DEMO_DIR ?= demo
NP ?= 2

.PHONY: setup demo slurm-demo test test-suite test-fast fuzz bench bench-reference study hpo-study scaling clean-demo help
help:
	@echo "make demo    set up, generate the mini dataset, train with horovodrun -np $(NP) to the target,"
	@echo "             check the MLPerf log, print a summary   (BENCH=cosmoflow|deepcam|all)"
	@echo "make test    set up, run the test suite"
	@echo "make fuzz    the command-line fuzz tests with 1,000 inputs per command (FUZZ_EXAMPLES=N)"
	@echo "make slurm-demo  CosmoFlow mini to its target through a rendered Slurm script, submitted to a"
	@echo "             one-node Slurm started on this host (needs root; docs/jobs.md)"
	@echo "make setup   (re)install Debian packages, .venv, TensorFlow, Horovod, DALI, the project"
	@echo "make study   CosmoFlow mini campaigns at global batch 4, 8 and 16 (SEEDS=3 runs each, about"
	@echo "             11 min per run here), then the analysis report in studies/study (docs/campaigns.md)"
	@echo "make hpo-study  CosmoFlow mini hyperparameter searches at global batch 4-32 (BATCHES; TRIALS=8 each),"
	@echo "             then SEEDS=3 runs of each best setting and their report in studies/hpo_study (docs/hpo.md)"
	@echo "make scaling CosmoFlow mini on 1 and 2 ranks (one epoch each, about 20 min here): weak and strong"
	@echo "             scaling efficiency and where a step goes, report in studies/scaling (docs/metrics.md)"
	@echo "make bench   CosmoFlow and DeepCAM training throughput, input-pipeline (loader) throughput and"
	@echo "             staging throughput against cp -r / tar -x (writes benchmarks/results/*.json and"
	@echo "             the tables in docs/performance.md and docs/staging.md)"
	@echo "make bench-reference REFERENCE=/path/to/mlcommons-hpc [ROUNDS=2]   the MLCommons reference models' training"
	@echo "             steps beside the suite's, each in its own environment, in one run (docs/performance.md)"

# Set-up runs when .venv is missing or older than the files that define it.
$(STAMP): setup.py pyproject.toml constraints.txt scripts/setup.sh
	VENV=$(VENV) scripts/setup.sh

setup:
	VENV=$(VENV) scripts/setup.sh

# BENCH=cosmoflow|deepcam on the command line or in the environment runs one benchmark.
BENCH ?= all
demo: $(STAMP)
	@PY=$(PY) NP=$(NP) DEMO_DIR=$(DEMO_DIR) scripts/demo.sh $(if $(filter all,$(BENCH)),$(ALL_BENCHES),$(BENCH))

slurm-demo: $(STAMP)
	@PY=$(PY) DEMO_DIR=$(DEMO_DIR) scripts/slurm_demo.sh

# The unit and fuzz tests run on TEST_WORKERS processes (pytest-xdist), then the integration tests: those not marked
# serial on TEST_WORKERS processes too (a module's tests in one process: tests/integration/conftest.py), then the
# serial ones (elastic, faults, Slurm) one at a time, on an otherwise idle host, as they time what they watch.
# JUNIT_DIR=DIR writes each run's JUnit XML report there (benchmarks/suite_time.py times `make test-suite`).
TEST_WORKERS ?= 2
test: $(STAMP)
	@$(MAKE) --no-print-directory test-suite

test-suite:
	$(PY) -m pytest tests/unit tests/fuzz -n $(TEST_WORKERS) $(if $(JUNIT_DIR),--junitxml=$(JUNIT_DIR)/unit.xml)
	$(PY) -m pytest tests/integration -m "not serial" -n $(TEST_WORKERS) --dist loadgroup $(if $(JUNIT_DIR),--junitxml=$(JUNIT_DIR)/integration.xml)
	$(PY) -m pytest tests/integration -m serial $(if $(JUNIT_DIR),--junitxml=$(JUNIT_DIR)/integration-serial.xml)

fuzz: $(STAMP)
	FUZZ_EXAMPLES=$${FUZZ_EXAMPLES:-1000} $(PY) -m pytest tests/fuzz -m fuzz -n $(TEST_WORKERS)

test-fast: $(STAMP)
	$(PY) -m pytest tests -m "not slow"

bench: $(STAMP)
	$(PY) benchmarks/cosmoflow_throughput.py
	$(PY) benchmarks/deepcam_throughput.py
	$(PY) benchmarks/loader_throughput.py
	$(PY) benchmarks/staging_throughput.py

# REFERENCE: a checkout of https://github.com/mlcommons/hpc, from the command line or the environment.
bench-reference: $(STAMP)
	$(PY) benchmarks/reference_compare.py $(if $(REFERENCE),--reference $(REFERENCE)) $(if $(ROUNDS),--rounds $(ROUNDS))

study: $(STAMP)
	PY=$(PY) scripts/study.sh

hpo-study: $(STAMP)
	PY=$(PY) scripts/hpo_study.sh

scaling: $(STAMP)
	PY=$(PY) scripts/scaling.sh

clean-demo:
	rm -rf $(DEMO_DIR)
