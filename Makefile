# sandboxd — build, test, demo. Everything runs as root on Linux (runc, namespaces, cgroups).
GO        ?= go
BIN       := bin
CACHE     ?= /var/cache/sandboxd
DATA      ?= /var/lib/sandboxd
TOOL      := $(GO) tool -modfile=tools/go.mod
# The version `sandboxd version` and `sbx --version` print (internal/version).
VERSION   ?= $(shell bash scripts/version.sh)
LDFLAGS   := -X github.com/sandboxd/sandboxd/internal/version.version=$(VERSION)
export SANDBOXD_CACHE := $(CACHE)

.PHONY: all build agent console console-check generate deps pydeps images runsc pebble seaweedfs prometheus jaeger test conformance crun-test pysdk-test test-short bench bench-smoke bench-sdk demo lint fmt clean k8s-up k8s-down k8s-test manifests bench-k8s runner-image agent-sandbox

all: build

build: agent
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/sandboxd ./cmd/sandboxd
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/sbx ./cmd/sbx

# The web console's bundle (internal/console/web/dist, committed and embedded, so `build`
# needs no Node): `make console` type-checks (tsc) and rebuilds it with the pinned npm
# packages (Node >= 18);
# `make console-check` fails when the committed bundle is not what the sources build.
console:
	cd internal/console/web && npm ci --no-audit --no-fund && npm run typecheck && npm run build

console-check: console
	git diff --exit-code -- internal/console/web/dist

# The agent runs inside arbitrary images, so it must be static. Go tests get theirs from
# internal/testenv.Agent, with these flags; scripts that need the binary run this target
# (BIN=dir puts it elsewhere, GOARCH=... builds it for another architecture).
agent:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w' -o $(BIN)/sandbox-agent ./cmd/sandbox-agent

# The Kubernetes runner's images (deploy/README.md): static sandboxd and the agent, as
# docker-archive tarballs in bin/image (RUNNER_IMAGE, AGENT_IMAGE name them; ARGS=-push
# pushes them instead, e.g. ARGS="-push").
runner-image:
	bash scripts/build-runner-image.sh $(or $(ARGS),-out $(BIN)/image)

# Regenerates gen/ and the OpenAPI document (internal/openapi) from api/ with tools pinned in
# tools/go.mod (Go module proxy only).
generate:
	rm -rf gen
	$(TOOL) buf generate

deps:
	bash scripts/install-deps.sh --test

# Test images (busybox, Debian + python3) as rootfs tarballs, cached under $(CACHE).
images:
	bash scripts/build-test-images.sh

# gVisor's runsc (static, pinned, precompiled seccomp programs) for the `gvisor` runtime class, cached under $(CACHE)/runsc/<version>+<seccomp revision>/.
# ~1-3 min cold, instant when cached; tests of the gvisor class skip without it.
runsc:
	bash scripts/build-runsc.sh

# Let's Encrypt's Pebble (pinned), the ACME server internal/acme's tests run; ~10 s cold.
pebble:
	bash scripts/build-pebble.sh >/dev/null

# SeaweedFS (pinned, Apache-2.0), the S3-compatible server internal/blob/s3's tests run;
# ~4 min cold, instant when cached.
seaweedfs:
	bash scripts/build-seaweedfs.sh >/dev/null

# Prometheus (pinned, Apache-2.0): promtool checks the metrics (internal/metrics) and the
# server scrapes a `sandboxd dev` (test/e2e); a long cold build (see the script), instant cached.
prometheus:
	bash scripts/build-prometheus.sh >/dev/null

# Jaeger (pinned, Apache-2.0): the OTLP receiver and trace store of the tracing test
# (test/e2e TestTracingJaeger) and the tracing overhead benchmark (bench/); ~5 min cold,
# instant cached.
# Jaeger (the tracing test's OTLP receiver and trace store). `make test` does not wait for
# it: the test that needs it builds it then (internal/tracing/jaegertest.Need), while
# the other packages run.
jaeger:
	bash scripts/build-jaeger.sh >/dev/null

test: deps pydeps build images runsc pebble seaweedfs prometheus
	$(GO) test -count=1 -timeout 30m ./...
	$(MAKE) bench-smoke
	$(MAKE) pysdk-test
	$(MAKE) conformance
	$(MAKE) k8s-test

# The official cwsandbox client (pinned): the conformance suite and the Go tests that drive
# it (test/e2e, test/multicluster, test/k8s) need it, and CI requires it.
pydeps:
	python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore -r test/conformance/requirements.txt

# The official cwsandbox client (pinned) against a `sandboxd dev` the suite starts.
conformance: build pydeps
	SANDBOXD_CONFORMANCE_REQUIRED=1 python3 -m pytest -q test/conformance

# The runc class run by crun (--oci-runtime crun, docs/oci-runtime.md): the backend
# contract (runtimetest) and the runtime choice's own tests, under
# scripts/cgroup-v1-ns.sh (crun refuses a hybrid cgroup host with cgroup2 controllers,
# such as the CI VM; the script is a no-op change elsewhere). ~20-40 s. Needs crun
# (scripts/install-deps.sh --test installs it); SANDBOXD_REQUIRE_CRUN=1 (CI) fails
# without it.
crun-test:
	@if ! command -v crun >/dev/null; then \
	  if [ "$${SANDBOXD_REQUIRE_CRUN:-}" = 1 ]; then echo "crun-test: no crun (apt-get install -y crun)"; exit 1; fi; \
	  echo "crun-test: skipped, no crun"; exit 0; fi
	$(GO) test -c -o $(BIN)/local.test ./internal/runtime/local/
	cd internal/runtime/local && SANDBOXD_TEST_OCI_RUNTIME=crun $(CURDIR)/scripts/cgroup-v1-ns.sh $(CURDIR)/$(BIN)/local.test -test.count=1 -test.timeout 10m \
	  -test.run 'TestConformance/runc|TestCreateExecAndConfinement|TestSealedRunc|TestOCIRuntimeSwitchRefused|TestApplyOCIRuntime|TestOCIStateOf|TestValidateOCIRuntime'

# The Python helper module sdk/python (sandboxd_ext) against a local HTTP server; no
# sandboxd needed, nothing installed (pytest's pythonpath finds it in the tree).
pysdk-test: pydeps
	python3 -m pytest -q sdk/python

test-short:
	$(GO) test -short -count=1 ./...

# BenchmarkDensity's sandbox count (BENCH_DENSITY_N) is 200 here, 12 in bench-smoke, and
# BenchmarkDockerPeer's idle containers (BENCH_PEER_IDLE) 10 here, 3 in bench-smoke.
bench: build images runsc pydeps jaeger
	BENCH_DENSITY_N=$${BENCH_DENSITY_N:-200} $(GO) test -run '^$$' -bench . -benchtime 50x -timeout 30m ./bench/...

# API call -> first command through the official Python client and the Go SDK, sequential,
# staggered and in bursts of 10/50/100, against a `sandboxd dev` it starts (bench/sdk/run.py;
# BENCH_SDK_RUNS, BENCH_SDK_BURSTS, BENCH_SDK_STAGGER_MS).
bench-sdk: build images pydeps
	python3 bench/sdk/run.py

# Every benchmark once, so that none rots unnoticed: those of bench/ and every Benchmark
# func under internal/ (the packages are found, not listed), -benchtime 1x, the edge
# comparison measured briefly. Part of `make test`; its figures mean nothing (`make
# bench` measures). test/k8s's runs in `make k8s-test`. A benchmark that leaves anything
# on the host fails: bench/'s stacks each check at their teardown that no sandbox cgroup
# (with its agent) is left, and the package at its end that none of its cgroups,
# processes in them or bridges is (stacktest.Env.HostLeftovers, removed then); bench/sdk
# purges its sandboxes and waits for them to go before it stops its server, and that its
# server's cgroup parent went (what stayed is killed and removed); bench/sdk/test_run.py
# checks that a run leaves no file in the temp dir but a failed run's log.
BENCH_PKGS = $(sort $(dir $(shell grep -rl --include='*_test.go' '^func Benchmark' bench internal)))
bench-smoke: build images runsc pydeps jaeger
	EDGE_BENCH_DURATION=200ms BENCH_DENSITY_N=12 BENCH_PEER_IDLE=3 $(GO) test -count=1 -run '^$$' -bench . -benchtime 1x -timeout 10m $(addprefix ./,$(BENCH_PKGS))
	python3 -m pytest -q -p no:cacheprovider bench/sdk/test_run.py
	BENCH_SDK_SMOKE=1 python3 bench/sdk/run.py

# Brings sandboxd dev up on loopback and runs a Python sandbox through the official client.
demo: deps build images
	bash scripts/demo.sh

# The Kubernetes backend against a one-node cluster on this host (test/k8s/README.md):
# kube-* binaries built once from the Go module proxy (~9 min cold, cached under
# $(CACHE)/k8s/<version>), etcd + containerd from Debian. k8s-test brings the cluster up,
# runs test/k8s and always tears it down.
k8s-up: images
	bash scripts/install-deps.sh --k8s
	bash test/k8s/up.sh

k8s-down:
	bash test/k8s/down.sh

k8s-test: images agent-sandbox
	bash scripts/install-deps.sh --k8s
	bash scripts/build-helm.sh >/dev/null
	bash test/k8s/up.sh && SANDBOXD_K8S_REQUIRED=1 $(GO) test -count=1 -timeout 20m -v ./test/k8s/... && \
	  SANDBOXD_K8S_REQUIRED=1 SANDBOXD_BENCH_N=7 $(GO) test -count=1 -run '^$$' -bench TimeToFirstCommand -benchtime 1x -timeout 10m ./test/k8s/; \
	  rc=$$?; bash test/k8s/down.sh; exit $$rc

# CI (k8s-test) runs the benchmark with 7 sandboxes per line: 10 cost +150 s over 2 on a
# loaded 2-core host (~4.5 s a sample, 4 lines), 7 about +95 s.
# Time to first command on Kubernetes beside the local backend and the Kubernetes peer
# kubernetes-sigs/agent-sandbox (claim → first command, warm pool of 0 and of 1), 20 each
# (test/k8s BenchmarkTimeToFirstCommand); brings the cluster up and always down.
bench-k8s: images agent-sandbox
	bash scripts/install-deps.sh --k8s
	bash test/k8s/up.sh && $(GO) test -count=1 -run '^$$' -bench TimeToFirstCommand -benchtime 1x -timeout 20m ./test/k8s/; \
	  rc=$$?; bash test/k8s/down.sh; exit $$rc

# The Kubernetes peer's controller (kubernetes-sigs/agent-sandbox, built once from the Go
# module proxy, ~2-7 min cold) and the CRDs its module ships, cached under
# $(CACHE)/agent-sandbox/<version>.
agent-sandbox:
	bash scripts/build-agent-sandbox.sh >/dev/null

# deploy/kubernetes/runner.yaml from the Helm chart deploy/helm/sandboxd-runner (helm built
# once from the Go module proxy, cached under $(CACHE)/helm/<version>).
manifests:
	bash scripts/render-k8s-manifests.sh

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo 'gofmt: files above need formatting'; exit 1; }
	$(GO) vet ./...
	$(TOOL) golangci-lint run --allow-parallel-runners ./...

fmt:
	gofmt -w $$(git ls-files '*.go')

clean:
	rm -rf $(BIN)
