# Containers (issue 6): included by the Makefile.
IMAGE ?= kvtb:latest
PROMETHEUS_IMAGE ?= kvtb-prometheus:latest
PUBLIC_BASE ?= python:3.11-slim
LOCAL_BASE ?= kvtb-base:bookworm
COMPOSE ?= $(shell docker compose version >/dev/null 2>&1 && echo "docker compose" || echo docker-compose)
COMPOSE_FILE := deploy/docker-compose.yml
DC = $(COMPOSE) -f $(COMPOSE_FILE)
FRONTEND_PORT ?= 50050

.PHONY: docker base-image wheelhouse image prometheus-image up down compose-test stack-up

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

# The base image in $$base: PUBLIC_BASE when it is here or can be pulled, else the local one (made once).
PICK_BASE = base=$(PUBLIC_BASE); \
	if ! docker image inspect $$base >/dev/null 2>&1 && ! docker pull -q $$base >/dev/null 2>&1; then \
	  echo "cannot pull $$base: using a local base image ($(LOCAL_BASE))"; \
	  deploy/base-image.sh $(LOCAL_BASE); base=$(LOCAL_BASE); \
	fi

image: docker wheelhouse
	@$(PICK_BASE); \
	start=$$(date +%s); \
	docker build -q -f deploy/Dockerfile --build-arg BASE_IMAGE=$$base -t $(IMAGE) . >/dev/null && \
	echo "built $(IMAGE) on $$base in $$(( $$(date +%s) - start )) s"

# Prometheus for the profile `monitoring`: Debian's package on the same Debian base (one cached apt layer).
prometheus-image: docker
	@$(PICK_BASE); \
	start=$$(date +%s); \
	docker build -q -f deploy/prometheus/Dockerfile --build-arg BASE_IMAGE=$$base -t $(PROMETHEUS_IMAGE) \
	  deploy/prometheus >/dev/null && \
	echo "built $(PROMETHEUS_IMAGE) on $$base in $$(( $$(date +%s) - start )) s"

# PLACEMENT=nic: each service on the CPUs of its placement's plan on this host (deploy/placement.py
# prints the KVTB_<SECTION>_CPUS the compose file gives as cpuset and setting); empty: every CPU.
PLACEMENT ?=
# REPLICAS=2: the second agent and compute node pair too (profile `replicas`), in the frontend's list;
# the compute nodes split the compute CPUs (placement shared unless PLACEMENT says otherwise).
REPLICAS ?= 1
REPLICA_LIST := replica-0=smartnic:50051=smartnic,replica-1=smartnic1:50051=smartnic-1
PLACED := $(or $(PLACEMENT),$(if $(filter 2,$(REPLICAS)),shared))
# MONITORING=1: Prometheus too (profile `monitoring`), scraping every service; http://127.0.0.1:9090.
MONITORING ?=
comma := ,
space := $(subst ,, )
PROFILES = $(subst $(space),$(comma),$(strip $(if $(filter 2,$(REPLICAS)),replicas) $(if $(MONITORING),monitoring)))
REPLICA_ENV = $(if $(filter 2,$(REPLICAS)),KVTB_FRONTEND_REPLICAS=$(REPLICA_LIST)) $(if $(PROFILES),COMPOSE_PROFILES=$(PROFILES))

# `make up`'s arguments are checked as the Makefile is read: a bad one is refused before any build.
ifneq ($(filter up,$(MAKECMDGOALS)),)
ifneq ($(filter x1x x2x,x$(strip $(REPLICAS))x),x$(strip $(REPLICAS))x)
$(error REPLICAS=$(REPLICAS): 1 or 2 (the compose file has two pairs))
endif
ifneq ($(filter-out x xshared xnic,x$(strip $(PLACEMENT))),)
$(error PLACEMENT=$(PLACEMENT): shared, nic or empty (every CPU))
endif
endif
# The services of the profiles this `make up` does not name (a second pair after REPLICAS=2, Prometheus
# after MONITORING=1): stopped and removed, so that only what the frontend's list names runs.
STALE = $(strip $(if $(filter 2,$(REPLICAS)),,compute1 smartnic1) $(if $(MONITORING),,prometheus))

# install: the placement script and the `kvtb chat` it suggests run from the project's .venv
up: install image $(if $(MONITORING),prometheus-image)
	@cpus=$$($(if $(PLACED),$(BIN)/python deploy/placement.py $(PLACED) --replicas $(REPLICAS),true)) || exit 1; \
	[ -z "$$cpus" ] || echo "placement $(PLACED): $$cpus"; \
	$(if $(STALE),COMPOSE_PROFILES=replicas$(comma)monitoring KVTB_IMAGE=$(IMAGE) $(DC) rm -s -f $(STALE) >/dev/null 2>&1 || true;) \
	env $$cpus $(REPLICA_ENV) KVTB_IMAGE=$(IMAGE) KVTB_PROMETHEUS_IMAGE=$(PROMETHEUS_IMAGE) \
	  KVTB_FRONTEND_PORT=$(FRONTEND_PORT) $(DC) up -d --remove-orphans
	@echo
	@echo "kvtestbed is up. Chat with it:"
	@echo "  .venv/bin/kvtb chat --frontend localhost:$(FRONTEND_PORT)      (from the host)"
	@echo "  $(DC) run --rm client                    (from a container)"
	@$(if $(MONITORING),echo "Prometheus: http://127.0.0.1:9090 (dashboard: deploy/grafana/kvtestbed.json)")
	@echo "Stop it with: make down"

down:
	COMPOSE_PROFILES=replicas,monitoring KVTB_IMAGE=$(IMAGE) $(DC) down $(if $(VOLUMES),-v,)
	@$(if $(VOLUMES),echo "volumes removed",echo "stopped; the volumes (storage, conversations) remain: make down VOLUMES=1 removes them")

compose-test: install image prometheus-image
	KVTB_COMPOSE_TEST=1 KVTB_IMAGE=$(IMAGE) KVTB_PROMETHEUS_IMAGE=$(PROMETHEUS_IMAGE) $(BIN)/python -m pytest -m compose tests/deploy -p no:cacheprovider $(PYTEST_ARGS)

# The swarm form of the compose file (see deploy/stack_file.py).
deploy/docker-stack.yml: deploy/docker-compose.yml deploy/stack_file.py
	$(BIN)/python deploy/stack_file.py

# The stack's credentials are made on this host (once) and given to each service as swarm secrets.
stack-up: image deploy/docker-stack.yml
	$(BIN)/kvtb credentials init deploy/credentials --replicas 2
	@[ "$$(docker info --format '{{.Swarm.LocalNodeState}}')" = active ] || docker swarm init --advertise-addr 127.0.0.1
	docker node update --label-add kvtb.compute=true $$(docker info --format '{{.Swarm.NodeID}}')
	cd deploy && KVTB_IMAGE=$(IMAGE) docker stack deploy -c docker-stack.yml kvtb
	@echo "deployed stack kvtb; chat: .venv/bin/kvtb chat --frontend localhost:$(FRONTEND_PORT); remove: docker stack rm kvtb"
