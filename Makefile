# patchbench: see README.md. Every target sets up what it needs first (idempotent).
SGLANG  ?= 0.5.1.post3
VENV    := $(if $(filter 0.5.1.post3,$(SGLANG)),.venv,.venv-$(SGLANG))
PY      := $(VENV)/bin/python
PROFILE ?= auto
CONFIG  ?= configs/pr9460-h200.yaml
PYTEST_ARGS ?=

.PHONY: setup setup-all demo bench test nightly lint check-patch doctor gpu-check clean-cache

setup:
	scripts/setup.sh $(SGLANG) $(VENV) $(PROFILE)

# both supported pins (the tests exercise both releases)
setup-all:
	scripts/setup.sh 0.5.1.post3 .venv $(PROFILE)
	scripts/setup.sh 0.5.23 .venv-0.5.23 $(PROFILE)

# the whole A/B pipeline on the CPU: stock vs upstream PR #9460 vs ours, sglang 0.5.1.post3
demo: setup
	$(PY) runner.py bench configs/demo-cpu.yaml

bench: setup
	$(PY) runner.py bench $(CONFIG)

nightly: setup
	$(PY) runner.py nightly $(if $(NIGHTLY_CONFIG),$(NIGHTLY_CONFIG),configs/nightly-h200.yaml)

check-patch: setup
	$(PY) runner.py check-patch

doctor: setup
	$(PY) runner.py doctor $(DOCTOR_CONFIG)

test: setup-all
	scripts/run_tests.sh $(PYTEST_ARGS)

lint: setup
	$(PY) -m compileall -q patchbench suites runner.py scripts tests

gpu-check:
	bash scripts/gpu_check.sh

clean-cache:
	rm -rf .cache/overlays .cache/patches
