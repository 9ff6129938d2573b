# Containers (issue 6): included by the Makefile.
IMAGE ?= kvtb:latest
PUBLIC_BASE ?= python:3.11-slim
LOCAL_BASE ?= kvtb-base:bookworm
COMPOSE ?= $(shell docker compose version >/dev/null 2>&1 && echo "docker compose" || echo docker-compose)
COMPOSE_FILE := deploy/docker-compose.yml
DC = $(COMPOSE) -f $(COMPOSE_FILE)
FRONTEND_PORT ?= 50050

.PHONY: docker base-image wheelhouse image up down compose-test stack-up

docker:
	@deploy/ensure-docker.sh

# A local base image when the public one cannot be pulled (no registry reachable here).
base-image: docker
	deploy/base-image.sh $(LOCAL_BASE)

# torch's CPU build from the host's pip (on this machine pip finds it on local disk; elsewhere
# the directory stays empty and the Dockerfile installs from PyTorch's CPU index).
wheelhouse:
	@mkdir -p deploy/wheelhouse
	@ls deploy/wheelhouse/torch-2.13.0+cpu*.whl >/dev/null 2>&1 || \
	  pip download -q --no-deps -d deploy/wheelhouse torch==2.13.0 || true
	@for f in deploy/wheelhouse/torch-*.whl; do case "$$f" in *+cpu*) ;; *) rm -f "$$f";; esac; done

image: docker wheelhouse
	@base=$(PUBLIC_BASE); \
	if ! docker image inspect $$base >/dev/null 2>&1 && ! docker pull -q $$base >/dev/null 2>&1; then \
	  echo "cannot pull $$base: using a local base image ($(LOCAL_BASE))"; \
	  deploy/base-image.sh $(LOCAL_BASE); base=$(LOCAL_BASE); \
	fi; \
	start=$$(date +%s); \
	docker build -q -f deploy/Dockerfile --build-arg BASE_IMAGE=$$base -t $(IMAGE) . >/dev/null && \
	echo "built $(IMAGE) on $$base in $$(( $$(date +%s) - start )) s"

# PLACEMENT=nic: each service on the CPUs of its placement's plan on this host (deploy/placement.py
# prints the KVTB_<SECTION>_CPUS the compose file gives as cpuset and setting); empty: every CPU.
PLACEMENT ?=

up: image
	@cpus=$$($(if $(PLACEMENT),$(BIN)/python deploy/placement.py $(PLACEMENT),true)) || exit 1; \
	[ -z "$$cpus" ] || echo "placement $(PLACEMENT): $$cpus"; \
	env $$cpus KVTB_IMAGE=$(IMAGE) KVTB_FRONTEND_PORT=$(FRONTEND_PORT) $(DC) up -d
	@echo
	@echo "kvtestbed is up. Chat with it:"
	@echo "  .venv/bin/kvtb chat --frontend localhost:$(FRONTEND_PORT)      (from the host)"
	@echo "  $(DC) run --rm client                    (from a container)"
	@echo "Stop it with: make down"

down:
	KVTB_IMAGE=$(IMAGE) $(DC) down $(if $(VOLUMES),-v,)
	@$(if $(VOLUMES),echo "volumes removed",echo "stopped; the volumes (storage, conversations) remain: make down VOLUMES=1 removes them")

compose-test: install image
	KVTB_COMPOSE_TEST=1 KVTB_IMAGE=$(IMAGE) $(BIN)/python -m pytest -m compose tests/deploy -p no:cacheprovider $(PYTEST_ARGS)

# The swarm form of the compose file (see deploy/stack_file.py).
deploy/docker-stack.yml: deploy/docker-compose.yml deploy/stack_file.py
	$(BIN)/python deploy/stack_file.py

# The stack's credentials are made on this host (once) and given to each service as swarm secrets.
stack-up: image deploy/docker-stack.yml
	$(BIN)/kvtb credentials init deploy/credentials
	@[ "$$(docker info --format '{{.Swarm.LocalNodeState}}')" = active ] || docker swarm init --advertise-addr 127.0.0.1
	docker node update --label-add kvtb.compute=true $$(docker info --format '{{.Swarm.NodeID}}')
	cd deploy && KVTB_IMAGE=$(IMAGE) docker stack deploy -c docker-stack.yml kvtb
	@echo "deployed stack kvtb; chat: .venv/bin/kvtb chat --frontend localhost:$(FRONTEND_PORT); remove: docker stack rm kvtb"
