# patchbench: see README.md. Every target sets up what it needs first (idempotent).
SGLANG  ?= 0.5.1.post3
VENV    := $(if $(filter 0.5.1.post3,$(SGLANG)),.venv,.venv-$(SGLANG))
PY      := $(VENV)/bin/python
PROFILE ?= auto
CONFIG  ?= configs/pr9460-h200.yaml
PYTEST_ARGS ?=
# when this make started (seconds since the epoch): make test prints the time since
STARTED := $(shell date +%s)
# RAY=1: also install the optional Ray extra (patchbench matrix --on ray); make test always does
RAY     ?= 0

# every supported pin (a CPU profile in requirements/ per pin)
PINS    := $(patsubst requirements/cpu-%.txt,%,$(wildcard requirements/cpu-*.txt))
# the pins make test sets up and exercises, and the venv of a pin
TEST_PINS := 0.5.1.post3 0.5.23
venv_of  = $(if $(filter 0.5.1.post3,$(1)),.venv,.venv-$(1))
# GB of disk a fresh CPU venv of pin $(1) needs (its `# disk-gb:` line); 0 once the venv exists
fresh_gb = $(if $(wildcard $(call venv_of,$(1))/bin/python),0,$(shell sed -n 's/^\# disk-gb: *\([0-9]*\).*/\1/p' requirements/cpu-$(1).txt))
# the unit tests that need neither sglang, the network nor a browser (the pull-request workflow)
LIGHT_MARKERS := not e2e and not needs_sglang and not network and not browser

.PHONY: setup setup-ray setup-all setup-browser setup-light demo bench test test-light nightly lint check-patch doctor \
        gpu-check check-gpu-profile clean-cache calibrate test-calibration

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

# both pins the tests exercise, set up side by side (each output line starts with its pin); a
# venv whose stamp is current is left as it is (scripts/setup.sh)
setup-all:
	@$(MAKE) --no-print-directory -j$(words $(TEST_PINS)) $(addprefix setup-pin-,$(TEST_PINS))

# one pin's venv (setup-pin-0.5.23: .venv-0.5.23), the Ray extra where RAY_PINS names the pin;
# SETUP_ALSO_GB: the disk the other pins' fresh venvs need beside it
setup-pin-%:
	@SETUP_ALSO_GB=$$(( 0 $(foreach p,$(filter-out $*,$(TEST_PINS)),+ $(call fresh_gb,$(p))) )) \
	  bash -o pipefail -c '$(MAKE) --no-print-directory setup SGLANG=$* \
	    RAY=$(if $(filter $*,$(RAY_PINS)),1,$(RAY)) 2>&1 | sed -u "s/^/[$*] /"'

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

# everything (what .ci/run runs): both venvs (with the Ray extra in .venv) and Chromium side by
# side, then scripts/run_tests.sh (unit tests, then end to end); prints the time of each part and
# the total
test:
	@$(MAKE) --no-print-directory -j3 $(addprefix setup-pin-,$(TEST_PINS)) setup-browser RAY_PINS=0.5.1.post3
	@echo "== setup: $$(( $$(date +%s) - $(STARTED) )) s"
	@scripts/run_tests.sh $(PYTEST_ARGS); rc=$$?; \
	echo "== make test: $$(( $$(date +%s) - $(STARTED) )) s in all (exit $$rc)"; exit $$rc

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

# the verdict calibration on synthetic runs (tools/calibrate.py, outside the package; its numbers
# are in docs/calibration.md), 400 trials a row unless CALIBRATE_ARGS says otherwise, e.g.
# CALIBRATE_ARGS="--design-only --trials 100" (tools/calibrate.py --help). Exit 1 when the
# config's schedule (--config, configs/pr9460-h200.yaml) misses a target.
# tools/calibrate_nightly.py calibrates the nightly's gates.
calibrate: setup
	$(PY) tools/calibrate.py $(CALIBRATE_ARGS)

# the calibration tests left out of every other run (-m calibration; the daily CI job), in
# .venv-light like test-light (LIGHT_PY=... for another interpreter)
test-calibration:
	@if [ "$(LIGHT_PY)" = .venv-light/bin/python ]; then $(MAKE) --no-print-directory setup-light; fi
	$(LIGHT_PY) -m pytest -q -p no:cacheprovider -m calibration tests/tools $(PYTEST_ARGS)

clean-cache:
	rm -rf .cache/overlays .cache/patches
