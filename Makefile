# The two commands a newcomer needs: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# Tests run in a shuffled order (pytest-randomly), a new one each run unless SEED is given:
# `make test SEED=1234` repeats the order of the run that printed that seed.
ifndef SEED
SEED := $(shell od -An -N4 -tu4 /dev/urandom | tr -d ' ')
endif
# Tests run on JOBS pytest-xdist workers, each taking whole groups (tests/conftest.py: a module,
# the real-node tests on the shared real-node cluster, or those starting their own); the long
# e2e groups mostly wait on clusters, so more workers than cores pay (on 2 cores: 3 workers
# kept 1.3 cores busy, 20.4 min; 4 kept 1.4, 18.1 min; a fresh-clone .ci/run took 21.0 min on
# 4, then 17.8 on 5 with the real-node images built sooner). JOBS=0 runs in this process.
JOBS ?= 5
PYTEST := $(BIN)/pytest -q -p randomly --randomly-seed=$(SEED) -n $(JOBS)

.PHONY: demo test lint typecheck unit e2e testenv packages bench manifests clean image standins gpu-test

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

## demo: a simulated GPU cluster running the whole stack, left up (hack/testenv down stops it)
demo: $(STAMP) testenv
	$(BIN)/python -m gpu_operator.testenv.demo $(DEMO_ARGS)

## test: every check and test, e2e against a real local control plane
test: lint typecheck testenv
	@echo "test order: seed $(SEED) (make test SEED=$(SEED) repeats it)"
	$(PYTEST) --durations=25 tests

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	@echo "test order: seed $(SEED) (make unit SEED=$(SEED) repeats it)"
	$(PYTEST) tests/unit

e2e: $(STAMP) testenv
	@echo "test order: seed $(SEED) (make e2e SEED=$(SEED) repeats it)"
	$(PYTEST) tests/e2e

## testenv: build (once, cached) etcd, kube-apiserver, kcm, kube-scheduler, kwok, kubelet,
## kube-proxy, containerd and the real nodes' images
testenv: $(STAMP)
	hack/testenv build

## packages: as root, install the Debian packages real nodes need (one line and no change otherwise)
NODE_PACKAGES := runc containernetworking-plugins iptables buildah busybox-static mmdebstrap
packages:
	@if [ "$$(id -u)" != 0 ]; then echo "packages: not root, not installing $(NODE_PACKAGES)"; \
	elif ! command -v apt-get >/dev/null; then echo "packages: no apt-get, install $(NODE_PACKAGES) by hand"; \
	elif dpkg -s $(NODE_PACKAGES) >/dev/null 2>&1; then echo "packages: $(NODE_PACKAGES) installed"; \
	else apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $(NODE_PACKAGES); fi

## image: the project's image from the Dockerfile with buildah, as an OCI archive in the testenv
## cache (no registry: the FROM image is a local Debian bookworm + python3 stand-in)
image:
	hack/build-components.sh image

## standins: stand-ins for NVIDIA's operand images (driver, toolkit, device plugin, DCGM) built
## FROM the project's image; they run the project's SIMULATED operands (testenv and demo only)
standins: image
	hack/build-components.sh standins

## gpu-test: prepare .gpu-carry/ for the read-only real-GPU tier (tests/gpu): the CUDA probe built
## here with the glibc it links, and the wheels the GPU machine lacks; prints the device call that
## runs hack/gpu-tier.sh there (tests/gpu/README.md)
gpu-test: $(STAMP)
	PYTHON=$(BIN)/python hack/gpu-tier.sh prepare

bench: $(STAMP)
	for b in benchmarks/bench_*.py; do $(BIN)/python $$b || exit 1; done

## manifests: regenerate crds/, deploy/ (with the Helm chart and the README's values table) and
## bundle/ after changing the API, RBAC or defaults
manifests: $(STAMP)
	$(BIN)/gpu-operator crd > crds/clusterpolicy.yaml.tmp && mv crds/clusterpolicy.yaml.tmp crds/clusterpolicy.yaml
	$(BIN)/gpu-operator crd --kind GPUCluster > crds/gpucluster.yaml.tmp && mv crds/gpucluster.yaml.tmp crds/gpucluster.yaml
	$(BIN)/gpu-operator crd --kind nvidiadriver > crds/nvidiadriver.yaml.tmp && mv crds/nvidiadriver.yaml.tmp crds/nvidiadriver.yaml
	$(BIN)/gpu-operator crd --kind computedomain > crds/computedomain.yaml.tmp && mv crds/computedomain.yaml.tmp crds/computedomain.yaml
	$(BIN)/gpu-operator deploy --output-dir deploy/
	$(BIN)/gpu-operator chart --output-dir deploy/helm/gpu-operator --readme README.md
	$(BIN)/gpu-operator bundle --version $$($(BIN)/python -c 'import gpu_operator; print(gpu_operator.__version__)') --output-dir bundle/

clean:
	rm -rf $(VENV) .testenv .gpu-carry build dist src/*.egg-info
