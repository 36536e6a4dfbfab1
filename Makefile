# Two entry points: `make demo` and `make test`. Both build .venv from PyPI
# on first use; nothing outside this folder is installed.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.inagg-installed

.PHONY: demo test venv clean bench synth-report

venv: $(STAMP)

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found: install Python 3.11 or newer"; exit 1; }
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "error: inagg needs Python 3.11 or newer ($(PYTHON) is $$($(PYTHON) -V))"; exit 1; }
	@command -v g++ >/dev/null || { echo "error: g++ not found: Verilator needs a C++ compiler (Debian/Ubuntu: apt-get install g++)"; exit 1; }
	@command -v perl >/dev/null || { echo "error: perl not found: Verilator's front end is a perl script (Debian/Ubuntu: apt-get install perl)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,synth,torch]'
	@touch $@

demo: $(STAMP)
	$(BIN)/inagg demo

# Two pytest-xdist workers, as CI has two cores (TEST_WORKERS=0: one process). --dist loadfile
# keeps a file's tests, which share their Verilated builds, in one worker (loadgroup's
# xdist_group marks are ignored under pytest 9.2: pytest-xdist issue 1386). xdist 3.8 hands
# out files with the most tests first unless told --no-loadscope-reorder, which would start
# the ECP5 build and the cocotb files (a few tests each) last, alone at the end of the run;
# without it they go in tests/conftest.py's order, first.
TEST_WORKERS ?= 2

test: $(STAMP)
	$(BIN)/python -m pytest -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

bench: $(STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) build sim_build .pytest_cache

synth-report: $(STAMP)
	$(BIN)/python bench/synth.py

# Compile-check p4/ with the P4 compilers that are installed (p4test, p4c-bm2-ss,
# p4c-barefoot); prints which checks ran and which were skipped and why.
.PHONY: p4-check
p4-check: $(STAMP)
	$(BIN)/python p4/check.py
