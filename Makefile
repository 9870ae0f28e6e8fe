# patchbench: see README.md. Every target sets up what it needs first (idempotent).
SGLANG  ?= 0.5.1.post3
VENV    := $(if $(filter 0.5.1.post3,$(SGLANG)),.venv,.venv-$(SGLANG))
PY      := $(VENV)/bin/python
PROFILE ?= auto
CONFIG  ?= configs/pr9460-h200.yaml
PYTEST_ARGS ?=
# RAY=1: also install the optional Ray extra (patchbench matrix --on ray); make test always does
RAY     ?= 0

# every supported pin (a CPU profile in requirements/ per pin)
PINS    := $(patsubst requirements/cpu-%.txt,%,$(wildcard requirements/cpu-*.txt))
# the unit tests that need neither sglang, the network nor a browser (the pull-request workflow)
LIGHT_MARKERS := not e2e and not needs_sglang and not network and not browser

.PHONY: setup setup-ray setup-all setup-browser setup-light demo bench test test-light nightly lint check-patch doctor \
        gpu-check check-gpu-profile clean-cache calibrate

setup:
	scripts/setup.sh $(SGLANG) $(VENV) $(PROFILE)
	@if [ "$(RAY)" = 1 ]; then $(MAKE) --no-print-directory setup-ray VENV=$(VENV); fi

# the optional Ray extra, into $(VENV) (idempotent)
setup-ray:
	@$(VENV)/bin/python -c "import ray" 2>/dev/null || \
	    $(VENV)/bin/python -m pip install --disable-pip-version-check --progress-bar off --no-cache-dir \
	    -r requirements/ray.txt

# headless Chromium for the dashboard's browser test (Debian packages chromium, chromium-driver)
setup-browser:
	scripts/setup_browser.sh

# both supported pins (the tests exercise both releases)
setup-all:
	scripts/setup.sh 0.5.1.post3 .venv $(PROFILE)
	scripts/setup.sh 0.5.23 .venv-0.5.23 $(PROFILE)

# the whole A/B pipeline on the CPU: stock vs upstream PR #9460 vs ours, sglang 0.5.1.post3
# (PORT=N: serve on port N instead of the config's 30100)
demo: setup
	$(PY) -m patchbench bench configs/demo-cpu.yaml $(if $(PORT),--port $(PORT))

bench: setup
	$(PY) -m patchbench bench $(CONFIG) $(if $(PORT),--port $(PORT))

nightly: setup
	$(PY) -m patchbench nightly $(if $(NIGHTLY_CONFIG),$(NIGHTLY_CONFIG),configs/nightly-h200.yaml)

check-patch: setup
	$(PY) -m patchbench check-patch

doctor: setup
	$(PY) -m patchbench doctor $(DOCTOR_CONFIG)

test: setup-all setup-browser
	$(MAKE) --no-print-directory setup-ray VENV=.venv
	scripts/run_tests.sh $(PYTEST_ARGS)

# ruff over the whole tree: lint, then the format check (any venv with ruff: make lint PY=...)
lint:
	@$(PY) -m ruff --version >/dev/null 2>&1 || $(MAKE) setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# a light venv without sglang (harness only): what the pull-request workflow installs
setup-light:
	[ -x .venv-light/bin/python ] || python3 -m venv .venv-light
	.venv-light/bin/python -m pip install --disable-pip-version-check --progress-bar off --no-cache-dir \
	    -r requirements/harness.txt -r requirements/ray.txt
	.venv-light/bin/python -m pip install --disable-pip-version-check --no-deps -e .

# the unit tests that need no sglang, no network and no browser, in .venv-light (set up first;
# LIGHT_PY=... runs them with another interpreter that has requirements/harness.txt)
LIGHT_PY ?= .venv-light/bin/python
test-light:
	@if [ "$(LIGHT_PY)" = .venv-light/bin/python ]; then $(MAKE) --no-print-directory setup-light; fi
	$(LIGHT_PY) -m pytest -q -p no:cacheprovider -m "$(LIGHT_MARKERS)" $(PYTEST_ARGS)

# resolve, without installing, what `make setup PROFILE=gpu` installs for every pin (asks the
# package index, so it is not part of make test)
check-gpu-profile:
	@for pin in $(PINS); do SETUP_DRY_RUN=1 scripts/setup.sh $$pin - gpu || exit $$?; done

gpu-check:
	bash scripts/gpu_check.sh

# the verdict calibration on synthetic runs (a tool outside the package; docs/calibration.md):
# CALIBRATE_ARGS=... passes options, e.g. "--design-only"; tools/calibrate_nightly.py for the gates
calibrate: setup
	$(PY) tools/calibrate.py $(CALIBRATE_ARGS)

clean-cache:
	rm -rf .cache/overlays .cache/patches
