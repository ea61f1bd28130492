# Two commands do all set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
LISTEN ?= 0.0.0.0:1883
DATA   ?= ./data
PYTEST_ARGS ?=

.PHONY: install run test test-deps lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

run: install
	$(BIN)/mqtt-bridge --listen $(LISTEN) --data-dir $(DATA)

test-deps: install
	deploy/ensure-debian-packages.sh mosquitto mosquitto-clients:mosquitto_pub \
		default-jre-headless:java maven:mvn
	deploy/rocketmq/fetch.sh

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy bridge/mqtt bridge/router bridge/session.py bridge/auth.py bridge/passwd.py \
		bridge/config.py bridge/state.py bridge/storage/rocketmq_mapping.py \
		bridge/storage/rocketmq_wire.py bridge/storage/rocketmq_messages.py bridge/storage/rocketmq_bytes.py

test: test-deps lint
	$(BIN)/pytest $(PYTEST_ARGS)

bench: test-deps
	$(BIN)/python tests/bench/run_bench.py $(BENCH_ARGS)
	$(BIN)/python tests/bench/durability_contrast.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .mypy_cache
