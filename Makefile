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

# The dashboard test drives Debian's chromium through chromedriver; install them when missing (root or sudo).
APT := $(shell [ "$$(id -u)" = 0 ] && echo apt-get || echo "sudo -n apt-get")
browser:  ## Debian's chromium + chromedriver for the dashboard test (it skips without them)
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  { $(APT) install -y -q --no-install-recommends chromium chromium-driver >/dev/null 2>&1 || \
	    { $(APT) update -q >/dev/null 2>&1 && $(APT) install -y -q --no-install-recommends chromium chromium-driver >/dev/null 2>&1; } || \
	    echo "note: could not install chromium/chromedriver; the dashboard test will skip"; }

# The Slurm integration tests start real daemons (munged, slurmctld, one slurmd per node): Debian's packages.
slurm:  ## Debian's Slurm 22.05 + munge for the real-Slurm tests (they skip without them)
	@command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sinfo >/dev/null && command -v munged >/dev/null || \
	  { echo "installing slurmctld slurmd slurm-client munge with apt-get: the Slurm integration tests run against real Slurm daemons"; \
	    $(APT) install -y -q --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null 2>&1 || \
	    { $(APT) update -q >/dev/null 2>&1 && $(APT) install -y -q --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null 2>&1; } || \
	    echo "note: could not install Slurm; the real-Slurm tests will skip"; }

test: $(STAMP) browser slurm lint  ## lint + docs build + full test suite (includes the slow end-to-end tests)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -q -d site
	$(BIN)/python -m pytest -q -p no:cacheprovider -n 2 --dist loadgroup

test-fast: $(STAMP) browser slurm lint  ## lint + docs build + test suite without the slow end-to-end tests
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -q -d site
	$(BIN)/python -m pytest -q -p no:cacheprovider -n 2 --dist loadgroup -m 'not slow'

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
