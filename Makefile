# BandPilot: the two set-up commands are `make run` (main job) and `make test` (test suite).
# Both create/reuse a virtualenv in .venv with pinned dependencies; nothing needs a network
# beyond the package index, no server and no GPU.
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: run test test-fast lint docs bench install browser slurm clean-state help

help:  ## list targets
	@grep -E '^[a-z-]+:.*## ' Makefile | sed 's/:.*## /\t/'

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[test]'
	@rm -f $(VENV)/.installed-* && touch $(STAMP)

install: $(STAMP)  ## create .venv and install pinned dependencies

run: $(STAMP)  ## main job: emulated H100 + Het-4Mix -> profile -> DVC -> train/sweep -> register -> evaluate -> promote -> dispatch
	$(BIN)/bandpilot pipeline

# The dashboard test drives Debian's chromium through chromedriver: when they are missing, `browser`
# says what it installs with apt and why, then installs them; `make test APT=no` (or
# BANDPILOT_NO_APT=1) declines and the dashboard test skips with its reason.
browser:  ## Debian's chromium + chromedriver for the dashboard test (APT=no: skip; the test then skips)
	@APT="$(APT)" CHROMIUM="$(CHROMIUM)" CHROMEDRIVER="$(CHROMEDRIVER)" APT_GET="$(APT_GET)" sh tests/install_browser.sh

# The Slurm integration tests start real daemons (munged, slurmctld, one slurmd per node) from Debian's
# packages: `slurm` says what it installs with apt and why; APT=no declines and those tests skip.
slurm:  ## Debian's Slurm 22.05 + munge for the real-Slurm tests (APT=no: skip; the tests then skip)
	@APT="$(APT)" APT_GET="$(APT_GET)" sh tests/install_slurm.sh

test: $(STAMP) browser slurm lint  ## lint + docs build + full test suite (includes the slow end-to-end tests)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -q -d site
	$(BIN)/python -m pytest -q -rs -p no:cacheprovider -n 2 --dist loadgroup

test-fast: $(STAMP) browser slurm lint  ## lint + docs build + test suite without the slow end-to-end tests
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -q -d site
	$(BIN)/python -m pytest -q -rs -p no:cacheprovider -n 2 --dist loadgroup -m 'not slow'

lint: $(STAMP)  ## layer contracts (import-linter), no cross-module private names, ruff, mypy (config in pyproject.toml)
	$(BIN)/lint-imports
	$(BIN)/python tools/check_private_imports.py
	$(BIN)/ruff check --quiet .
	$(BIN)/mypy

docs: $(STAMP)  ## build the documentation site into site/ (offline; `.venv/bin/mkdocs serve` for a live preview)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -d site

bench: $(STAMP)  ## speed and accuracy benchmarks (figures in docs/benchmarks.md)
	$(BIN)/python -m benchmarks

clean-state:  ## remove local stores (mlruns, data, queue, prefect home); keeps .venv
	rm -rf mlruns/mlflow.db mlruns/artifacts data .bandpilot .dvc-remote reports
