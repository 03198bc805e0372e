# Shared Device Group — developer entry points. Everything installs into ./.venv.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
IMG    ?= ghcr.io/deviceshare/sdg-manager:dev

.PHONY: install controlplane node-binaries realnode helm docs test unit lint fmt demo envtest docker-build image deploy undeploy clean bench typecheck

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

install: $(BIN)/python  ## Install sdgruntime (its own distribution) and SDG with its test extras into .venv
	$(BIN)/pip install --quiet -e ./sdgruntime -e '.[test,otlp,docs]'

controlplane: install  ## Build kube-apiserver, kube-scheduler and etcd once per machine (cached)
	$(BIN)/python -m sdgruntime.envtest.build

node-binaries: install  ## Also build a real node's kubelet, kube-controller-manager and containerd (runc shim, ctr) once per machine (cached)
	$(BIN)/python -m sdgruntime.envtest.build --node

# The real-node tier (tests/realnode) runs as root only; elsewhere it is skipped with the reason.
realnode: install  ## As root: build the real node's parts, the GPU simulator and the NRI CDI plugin (hack/node) once per machine
	@if [ "$$(id -u)" = 0 ]; then \
	  $(MAKE) --no-print-directory node-binaries && \
	  $(BIN)/python -c 'from hack.node.simulators import ensure_gpusim; print(ensure_gpusim())' && \
	  $(BIN)/python -c 'from hack.node.nri import ensure_cdiinject; print(ensure_cdiinject())'; \
	else echo "not root: tests/realnode will be skipped (a kubelet and containerd need root)"; fi

helm: install  ## Build the helm CLI from hack/helm once per machine (cached), for the chart tests
	$(BIN)/python -m sdgruntime.envtest.helm

test: controlplane helm realnode docs typecheck  ## Type-check, lint, then run every test (unit + integration against the real local API server)
	$(BIN)/ruff check .
	cd hack/node/gpusim && GOFLAGS=-mod=mod go test ./...  # the GPU simulator against a fake kubelet
	cd hack/node/cdiinject && GOFLAGS=-mod=mod go test ./...  # the NRI CDI plugin's annotation parsing
	$(BIN)/pytest -q

unit: install  ## Fast unit tests only (no control plane)
	$(BIN)/pytest -q tests/unit tests/runtime -m "not integration"

typecheck: install  ## mypy over sdgruntime, api, controllers, webhooks, cli ([tool.mypy]); then sdgruntime alone, by its own config
	$(BIN)/mypy
	cd sdgruntime && $(abspath $(BIN))/mypy --cache-dir $(abspath .tmp/mypy-sdgruntime)

docs: install  ## Build the documentation site (docs/, mkdocs.yml) into .tmp/site; warnings fail
	$(BIN)/mkdocs build --strict --site-dir .tmp/site

lint:
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

fmt:
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

envtest: controlplane  ## Run a bare local control plane until Ctrl-C
	$(BIN)/python -m sdgruntime.envtest --crds config/crd --kubeconfig-out .tmp/kubeconfig

demo: controlplane realnode  ## The whole system on the local control plane
	$(BIN)/python hack/demo.py

docker-build:
	docker build -t $(IMG) .

image:  ## The manager image without a registry: podman on a Debian base made by mmdebstrap (root; hack/image.py)
	$(PYTHON) hack/image.py

deploy: install  ## Install SDG on the cluster of the current kubeconfig (needs cert-manager)
	$(BIN)/kubectl apply --server-side -k config/default

undeploy: install
	$(BIN)/kubectl delete --ignore-not-found -k config/default

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .ruff_cache .tmp sdgruntime/build sdgruntime/*.egg-info

bench: controlplane  ## Benchmarks: placement at 1000 nodes (pure) and end to end
	$(BIN)/python hack/bench/bench_placement.py
	$(BIN)/python hack/bench/bench_e2e.py

.PHONY: bench-compare
bench-compare: controlplane  ## SDG vs kube-scheduler, a raw binder and kopf, S1-S8 (~7 min on 2 cores; SCALE=small ~1 min)
	$(BIN)/pip install --quiet -e '.[test,otlp,bench]'
	$(BIN)/python hack/bench/compare.py --scale $(or $(SCALE),full)

.PHONY: bench-soak
bench-soak: controlplane  ## Memory under churn: the manager's RSS over rounds of groups+pods made and deleted (DURATION=540 s, WARMUP=200 s; CENSUS=1 for tracemalloc; SPLIT=1 for the parts in three processes; the issue bar: DURATION=1200)
	$(BIN)/pip install --quiet -e '.[test,otlp,bench]'
	$(BIN)/python hack/bench/soak.py --duration $(or $(DURATION),540) --warmup $(or $(WARMUP),200) $(if $(CENSUS),--census) $(if $(SPLIT),--split)
