# flask-harvest from a checkout. Each target creates its virtual environment when it is missing
# and (re)installs the project into it when setup.cfg, setup.py or pyproject.toml changed.
#
#   make demo       the quickstart: SQLite and the in-process backend, no services needed; installs
#                   only the package's own dependencies (pip install -e .)
#   make test       installs the dev extra (pip install -e ".[dev]"), then what CI runs after starting the services (.ci/run): ruff, mypy, the docs
#                   build, the demo and pytest; PYTEST_ARGS narrows pytest
#   make lowest     pytest on the lowest version of every dependency setup.cfg allows (.venv-lowest)
#   make rq-newest  the RQ tests on the newest RQ setup.cfg allows (.venv-rq-newest)
#
# The tests need PostgreSQL and Redis on 127.0.0.1 (README: the HARVEST_TEST_* variables).

PYTHON ?= python3
VENV ?= .venv
PYTEST_ARGS ?=
# The lowest-versions run: the fault suite kills workers and connections for minutes, and the
# versions it would exercise are the ones the rest of the suite covers.
# The DBOS comparison needs the bench extra and the docs-build check the docs extra, neither of
# which the lowest run installs (install_requires and the test extra); make test runs both.
LOWEST_PYTEST_ARGS ?= tests --ignore=tests/faults --ignore=tests/test_docs_build.py \
	--deselect tests/test_bench.py::test_quick_workflow_benchmarks_compare_with_dbos
RQ_TESTS ?= tests/test_delivery_rq.py tests/test_pool.py tests/test_batch_jobs.py tests/test_outbox.py \
	tests/test_cli.py tests/faults/test_worker_kill.py tests/faults/test_redis_loss.py

INSTALL_INPUTS := setup.cfg setup.py pyproject.toml
BIN := $(VENV)/bin

.PHONY: demo test lowest rq-newest clean-venvs

demo: $(VENV)/.installed-package
	$(BIN)/python examples/quickstart.py

test: $(VENV)/.installed-dev
	@echo "==== Lint: ruff check flask_harvest tests examples bench ===="
	$(BIN)/ruff check flask_harvest tests examples bench
	@echo "==== Types: mypy (configured in pyproject.toml) ===="
	$(BIN)/mypy
	@echo "==== Docs: sphinx-build -W --keep-going ===="
	$(BIN)/sphinx-build -W --keep-going -q -b html docs docs/_build/html
	@echo "==== Demo: python examples/quickstart.py ===="
	$(BIN)/python examples/quickstart.py
	@echo "==== Tests: pytest $(PYTEST_ARGS) ===="
	@# pytest's exit 5 (no tests collected) fails like any other non-zero exit; say so plainly.
	$(BIN)/pytest $(PYTEST_ARGS) || { status=$$?; \
		[ $$status -ne 5 ] || echo "!!!! pytest collected no tests (exit 5); a run without tests is a failure" >&2; \
		exit $$status; }

# The demo needs only Flask and SQLAlchemy (install_requires): the dev extra (the test tools, the
# docs build, the benchmarks' numpy, matplotlib and DBOS) would take minutes to install for nothing.
$(VENV)/.installed-package: $(INSTALL_INPUTS) | $(BIN)/python
	$(BIN)/pip install -e .
	touch $@

# The dev extra holds the package's own dependencies too, so it stands for both stamps.
$(VENV)/.installed-dev: $(INSTALL_INPUTS) | $(BIN)/python
	$(BIN)/pip install -e ".[dev]"
	touch $@ $(VENV)/.installed-package

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# The lowest version of every dependency in install_requires and the test extra (.ci/pins.py);
# pip picks the newest of what those need in turn.
lowest: .venv-lowest/bin/python
	$(PYTHON) .ci/pins.py .venv-lowest/constraints.txt test
	.venv-lowest/bin/pip install -c .venv-lowest/constraints.txt -e ".[test]"
	.venv-lowest/bin/pip check
	.venv-lowest/bin/pip freeze --exclude-editable
	.venv-lowest/bin/pytest $(LOWEST_PYTEST_ARGS)

.venv-lowest/bin/python:
	$(PYTHON) -m venv .venv-lowest

# The newest RQ that setup.cfg allows, whatever the other venvs hold: --upgrade rq.
rq-newest: .venv-rq-newest/bin/python
	.venv-rq-newest/bin/pip install --upgrade -e ".[test]" rq
	.venv-rq-newest/bin/pip show rq | grep -E '^(Name|Version)'
	.venv-rq-newest/bin/pytest $(RQ_TESTS)

.venv-rq-newest/bin/python:
	$(PYTHON) -m venv .venv-rq-newest

clean-venvs:
	rm -rf .venv .venv-lowest .venv-rq-newest
