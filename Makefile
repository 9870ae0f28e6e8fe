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

# q: one value as one shell word, whatever it holds (spaces, quotes, $, ;): every variable a
# user can set on the command line reaches a recipe through it
q = '$(subst ','\'',$(1))'

# every supported pin (a CPU profile in requirements/ per pin)
PINS    := $(patsubst requirements/cpu-%.txt,%,$(wildcard requirements/cpu-*.txt))
# the unit tests that need neither sglang, the network nor a browser (the pull-request workflow)
LIGHT_MARKERS := not e2e and not needs_sglang and not network and not browser

.PHONY: setup setup-ray setup-all setup-browser setup-light demo bench test test-light nightly lint lint-workflows \
        check-patch doctor \
        gpu-check check-gpu-profile clean-cache calibrate test-calibration

setup:
	scripts/setup.sh $(call q,$(SGLANG)) $(call q,$(VENV)) $(call q,$(PROFILE))
	@if [ $(call q,$(RAY)) = 1 ]; then $(MAKE) --no-print-directory setup-ray VENV=$(call q,$(VENV)); fi

# the optional Ray extra, into $(VENV) (idempotent)
setup-ray:
	@$(call q,$(VENV)/bin/python) -c "import ray" 2>/dev/null || \
	    $(call q,$(VENV)/bin/python) -m pip install --quiet --disable-pip-version-check --progress-bar off --no-cache-dir \
	    -r requirements/ray.txt

# headless Chromium for the dashboard's browser test (Debian packages chromium, chromium-driver)
setup-browser:
	scripts/setup_browser.sh

# both supported pins (the tests exercise both releases), one after the other: side by side
# took as long on the 2-core machine (from scratch: 381 s side by side, 385 s one after the other)
setup-all:
	scripts/setup.sh 0.5.1.post3 .venv $(call q,$(PROFILE))
	scripts/setup.sh 0.5.23 .venv-0.5.23 $(call q,$(PROFILE))

# the whole A/B pipeline on the CPU: stock vs upstream PR #9460 vs ours, sglang 0.5.1.post3
# (PORT=N: serve on port N instead of the config's 30100)
demo: setup
	$(call q,$(PY)) -m patchbench bench configs/demo-cpu.yaml $(if $(PORT),--port $(call q,$(PORT)))

bench: setup
	$(call q,$(PY)) -m patchbench bench $(call q,$(CONFIG)) $(if $(PORT),--port $(call q,$(PORT)))

nightly: setup
	$(call q,$(PY)) -m patchbench nightly $(call q,$(if $(NIGHTLY_CONFIG),$(NIGHTLY_CONFIG),configs/nightly-h200.yaml))

check-patch: setup
	$(call q,$(PY)) -m patchbench check-patch

doctor: setup
	$(call q,$(PY)) -m patchbench doctor $(if $(DOCTOR_CONFIG),$(call q,$(DOCTOR_CONFIG)))

# everything (what .ci/run runs): both venvs (with the Ray extra in .venv) and Chromium, then
# scripts/run_tests.sh (unit tests, then end to end); prints the time of each part and the total
test:
	@$(MAKE) --no-print-directory setup-all setup-browser
	@$(MAKE) --no-print-directory setup-ray VENV=.venv
	@echo "== setup: $$(( $$(date +%s) - $(STARTED) )) s"
	@$(MAKE) --no-print-directory lint-workflows
	@scripts/run_tests.sh $(PYTEST_ARGS); rc=$$?; \
	echo "== make test: $$(( $$(date +%s) - $(STARTED) )) s in all (exit $$rc)"; exit $$rc

# ruff over the whole tree: lint, then the format check, then the workflows (any venv with ruff
# and zizmor: make lint PY=...)
lint:
	@$(PY) -m ruff --version >/dev/null 2>&1 || $(MAKE) setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	@$(MAKE) --no-print-directory lint-workflows PY=$(PY)

# the workflows and the composite action: zizmor's security audit offline (no token, no network;
# a finding accepted on purpose carries `# zizmor: ignore[audit] reason` on its line), then
# actionlint (.github/actionlint.yaml names the self-hosted runners' labels)
WORKFLOWS := .github/workflows .github/actions
lint-workflows:
	@bin="$$($(PY) -c 'import sysconfig; print(sysconfig.get_path("scripts"))')"; \
	{ [ -x "$$bin/zizmor" ] && [ -x "$$bin/actionlint" ]; } || $(MAKE) --no-print-directory setup; \
	echo "zizmor --offline $(WORKFLOWS)"; "$$bin/zizmor" --offline --strict-collection --no-progress $(WORKFLOWS) && \
	echo "actionlint .github/workflows/*.yml" && "$$bin/actionlint" .github/workflows/*.yml

# a light venv without sglang (harness only): what the pull-request workflow installs
setup-light:
	[ -x .venv-light/bin/python ] || python3 -m venv .venv-light
	.venv-light/bin/python -m pip install --quiet --disable-pip-version-check --progress-bar off --no-cache-dir \
	    -r requirements/harness.txt -r requirements/ray.txt
	.venv-light/bin/python -m pip install --quiet --disable-pip-version-check --no-deps -e .

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
