# Every target installs what it needs into .venv from pyproject.toml, so a fresh clone needs only python3.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo sweep test lint typecheck pytest clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/blueprinting plan examples/gpt3-175b-selene.toml

# The README's sweep example: 60 searches on a local Ray instance; Parquet, CSV and the plot
# under out/sweep (rerun it to see the resume compute nothing).
sweep: $(STAMP)
	$(BIN)/blueprinting sweep examples/SWEEP.toml --out out/sweep --plot out/sweep/sweep.png

lint: $(STAMP)
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/ruff check src tests benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/pytest

test: lint typecheck pytest

clean:
	rm -rf $(VENV)
