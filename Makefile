# Entry points that each do all set-up on a fresh machine:
#   make demo   -- create .venv, install, run the offline quickstart
#   make test   -- create .venv, install, run the test suite
#   make docs   -- create .venv, install, build the documentation site into site/ (strict)
#   make notebooks -- create .venv, install with jupyter (the notebooks extra), execute every
#                 notebook into a temporary folder (TINY=1: at the tests' tiny size)
#   make help-snapshot -- rewrite fedjax_dp/_help.json from the live parser, after changing a
#                 flag, a setting's help or a component (tests/test_console.py says when)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-slow docs notebooks bench install clean help-snapshot

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/fedjax-dp run --output-dir runs/quickstart --overwrite

# A test whose worker process crashed (a segfault inside XLA's CPU compiler, which no test's
# code can catch) runs once more; a test that fails runs once (--only-rerun matches no failure).
test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --durations=15 --reruns 1 --only-rerun "only a crashed worker"

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

docs: $(STAMP)
	$(BIN)/mkdocs build --strict --site-dir site

# Each notebook runs in its own folder, as jupyter runs it, with figures inline (MPLBACKEND unset);
# the executed copies go to a new temporary folder, and the committed notebooks are left as they
# are (python notebooks/execute.py rewrites their outputs in place).
notebooks: $(STAMP)
	$(BIN)/pip install -q -c constraints.txt -e '.[notebooks]'
	out=$$(mktemp -d) && env -u MPLBACKEND $(if $(TINY),FEDJAX_DP_TINY=1) $(BIN)/jupyter nbconvert \
	  --to notebook --execute --ExecutePreprocessor.timeout=3600 --output-dir "$$out" \
	  notebooks/*.ipynb && echo "executed notebooks in $$out"

help-snapshot: $(STAMP)
	$(BIN)/python -c 'from fedjax_dp import console; console.write_snapshot()'

clean:
	rm -rf $(VENV) runs site
