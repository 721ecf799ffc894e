# Two entry points that work on a fresh machine with only Python 3.11:
#   make demo   -- create .venv, install, train SRNN on the built-in chorales, save figures + MIDI
#   make test   -- create .venv if needed, install test extras, lint (ruff), run the test suite
#   make lint   -- fix what ruff can fix and format the code
#   make docs   -- build the documentation site into docs/_build/html (warnings are errors)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.pyro-seq-installed
DEMO_OUT ?= demo_out

.PHONY: test demo install clean docs lint

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): setup.cfg pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q --upgrade "setuptools>=64" wheel
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q --no-build-isolation -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

LINTED := pyro_seq tests benchmarks tutorials docs/conf.py

test: $(STAMP)
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -rs tests

lint: $(STAMP)
	$(BIN)/ruff check --fix $(LINTED)
	$(BIN)/ruff format $(LINTED)

demo: $(STAMP)
	$(BIN)/pyro-seq train --model srnn --data chorales --epochs 200 --time-limit 240 --threads 1 \
		--z-dim 32 --model-option d_dim=128 --model-option hidden_dim=200 \
		--kl-anneal-steps 500 --out $(DEMO_OUT)
	$(BIN)/pyro-seq evaluate $(DEMO_OUT) --objective iwae --particles 16
	$(BIN)/pyro-seq sample $(DEMO_OUT) --length 64

# The site: API pages, design notes, equations index, benchmarks, references, changelog, and
# the tutorials executed as notebooks (full runs, cached in docs/_build/.jupyter_cache until a
# tutorial changes; PYRO_SEQ_SMOKE=1 make docs runs their short mode). Warnings are errors.
DOCS_STAMP := $(VENV)/.pyro-seq-docs-installed

$(DOCS_STAMP): setup.cfg pyproject.toml | $(STAMP)
	$(BIN)/python -m pip install -q --no-build-isolation -e ".[docs]"
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	$(BIN)/python -m sphinx -W --keep-going -b html docs docs/_build/html
	@echo "open docs/_build/html/index.html"

clean:
	rm -rf $(VENV) $(DEMO_OUT) docs/_build
