# Newcomer commands: `make demo` and `make test`. Both run `make setup` first (idempotent, cached).
SHELL := /bin/bash
VENV  := .venv
PY    := $(VENV)/bin/python
CS    := $(VENV)/bin/coldstart
# The venv is shared by every checkout on the machine (cached by its requirements), and its editable
# install of coldstart points at whichever checkout ran `make setup` last: this checkout's code comes
# first for every target and every process they start (tests, servers, `python -m coldstart`).
export PYTHONPATH := $(CURDIR)/toolkit$(if $(PYTHONPATH),:$(PYTHONPATH))

.PHONY: setup demo test bench bench-load bench-criu clean

setup:
	./scripts/setup

demo: setup
	./scripts/demo

# pytest exit 5 ("no tests collected") is a failure of the suite, not a pass.
test: setup
	@set +e; $(PY) -m pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "error: pytest collected no tests" >&2; exit 1; fi; exit $$rc

bench: bench-load bench-criu

bench-load: setup
	$(CS) bench load

bench-criu: setup
	$(CS) bench criu

clean:
	rm -rf build .pytest_cache
