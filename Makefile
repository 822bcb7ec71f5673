# ztunnel-go build, test and benchmark entry points.
# `make test` installs what it needs (apt packages, pinned Go tools) itself.

SHELL := /bin/bash
GO ?= go
TOOLS := $(CURDIR)/.tools
TOOLS_BIN := $(TOOLS)/bin
CNI_BIN := $(TOOLS)/cni/bin
export PATH := $(TOOLS_BIN):$(PATH)

# Pinned tool versions.
BUF_VERSION := v1.75.0
PROTOC_GEN_GO_VERSION := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.5.1
CNI_PLUGINS_VERSION := v1.10.0
CNITOOL_VERSION := v1.3.1
# fortio for bench-mesh; v1.69+ need a module the proxy here refuses.
FORTIO_VERSION := v1.68.2

APT_PACKAGES := iptables nftables iproute2 tcpdump iperf3 ipset haproxy containerd runc prometheus
FUZZTIME ?= 5s
# The release every binary reports (zctl status, the admin config dump,
# ISTIO_VERSION to the control plane); hack/images stamps the same.
VERSION := $(shell cat VERSION)
VERSION_LDFLAGS := -X github.com/ztunnel-go/ztunnel-go/internal/daemon.version=$(VERSION)

.PHONY: otelcol-bin all build test unit e2e lint deps tools proto proto-check fuzz bench bench-hbone bench-xds bench-cp-scale bench-dns bench-mesh bench-soak bench-waypoint bench-multicluster demo clean k8s-bins deploy-check images images-test istioctl-check istioctl-bin check test-node node-up node-down interop-istiod conformance conformance-test conformance-core

all: build

# Every binary is built as hack/images builds the released ones: static
# (CGO_ENABLED=0: no libc mapped into the node proxy, 1.4 MiB of its RSS) and
# with gRPC's tracing left out (grpcnotrace: golang.org/x/net/trace imports
# html/template, whose reflective method calls keep every exported method of
# every type linked: 4.6 MiB of the node proxy's 20.6 MiB of text and
# rodata, nearly all of it resident). internal/testing/testkit and
# hack/images/build.go use the same; repotest TestBuildTagsAgree checks.
GO_BUILD_TAGS := grpcnotrace
GO_BUILD := CGO_ENABLED=0 $(GO) build -tags $(GO_BUILD_TAGS)

## build: the binaries of cmd/ into bin/ (ztunnel, ztunnel-cni, ztunnel-cp, zctl, ...).
build:
	@mkdir -p bin
	$(GO_BUILD) -ldflags "$(VERSION_LDFLAGS)" -o bin/ ./cmd/...

## demo: a two-node mesh in network namespaces on this machine, a scripted tour, then teardown (KEEP=1 keeps it).
# The demo runs from its built binary, not `go run`: with KEEP=1, Ctrl-C
# reaches it directly and its clean teardown's exit status is make's.
demo: deps tools build
	BIN_DIR=$(CURDIR)/bin KEEP=$(KEEP) bin/ztunnel-demo

## deps: install the OS packages the root tests need (Debian/Ubuntu, as root).
deps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

## tools: pinned Go tools (CNI reference plugins and cnitool for the namespace cluster).
tools: $(CNI_BIN)/bridge $(TOOLS_BIN)/cnitool

$(CNI_BIN)/bridge:
	@mkdir -p $(CNI_BIN)
	GOBIN=$(CNI_BIN) $(GO) install \
		github.com/containernetworking/plugins/plugins/main/bridge@$(CNI_PLUGINS_VERSION) \
		github.com/containernetworking/plugins/plugins/main/loopback@$(CNI_PLUGINS_VERSION) \
		github.com/containernetworking/plugins/plugins/main/ptp@$(CNI_PLUGINS_VERSION) \
		github.com/containernetworking/plugins/plugins/ipam/static@$(CNI_PLUGINS_VERSION) \
		github.com/containernetworking/plugins/plugins/ipam/host-local@$(CNI_PLUGINS_VERSION)

$(TOOLS_BIN)/cnitool:
	@mkdir -p $(TOOLS_BIN)
	GOBIN=$(TOOLS_BIN) $(GO) install github.com/containernetworking/cni/cnitool@$(CNITOOL_VERSION)

## proto: regenerate the workload API, security, CA and ZDS Go code (pinned buf and plugins into .tools/bin).
PROTO_ENV := BUF_VERSION=$(BUF_VERSION) PROTOC_GEN_GO_VERSION=$(PROTOC_GEN_GO_VERSION) \
	PROTOC_GEN_GO_GRPC_VERSION=$(PROTOC_GEN_GO_GRPC_VERSION) TOOLS_BIN=$(TOOLS_BIN)
proto:
	$(PROTO_ENV) hack/proto/gen.sh

## proto-check: fail when the committed generated code is stale.
proto-check:
	$(PROTO_ENV) hack/proto/check.sh

## lint: gofmt and go vet.
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '^\.tools/')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

## check: the inner loop (gofmt, go vet, go test -short): no root, no Kubernetes binaries, no race detector.
## Tests that need root, namespaces, etcd or kube-apiserver, or take long skip with "short: needs ...".
## Go's test cache stays on: a package whose inputs did not change is not run again.
check: lint
	$(GO) test -short -timeout 10m ./...

## unit: every package's tests with the race detector (root-only tests run too when root).
## otelcol-bin: the test OpenTelemetry Collector (hack/otelcol: OTLP receiver + a span file exporter, collector
## v0.165.0), cached in ~/.cache/ztunnel-go/otelcol-<hash of its go.mod/go.sum/main.go>; prints its path.
otelcol-bin:
	@hack/otelcol/build.sh

## k8s-bins: etcd, kube-apiserver, kubectl and helm built from their Go modules (hack/k8s; ~15 min on
## 2 cores the first time, then cached in ~/.cache/ztunnel-go/k8s).
k8s-bins:
	@hack/k8s/build.sh k8s helm >/dev/null

K8S_ENV = ZTG_K8S_BIN=$$(hack/k8s/build.sh k8s)

unit: tools k8s-bins
	@# cmd/zctl's TestBookinfoSamplesAccepted reads Istio's samples from the module cache, at hack/istioctl's version.
	@cd hack/istioctl && $(GO) mod download istio.io/istio
	ZTG_REQUIRE_ROOT=$${ZTG_REQUIRE_ROOT:-$$( [ $$(id -u) = 0 ] && echo 1 )} \
	ZTG_CNI_BIN=$(CNI_BIN) $(K8S_ENV) \
	$(GO) test -race -count=1 -timeout 20m $$($(GO) list ./... | grep -v '/e2e')
	@# Allocation budgets (sync.Pool drops items under -race, so they run without it), in the packages that
	@# have a Test...Allocs (building every package's tests a second time without -race took minutes).
	$(GO) test -count=1 -run 'Allocs' $$(grep -rl --include='*_test.go' '^func Test[A-Za-z0-9_]*Allocs' . | \
		grep -v '^./e2e/' | xargs -n1 dirname | sort -u)
	@# Heap retention is measured without -race too (its shadow memory swamps the bound), so TestOutboundNoRetention
	@# skips under -race and runs here (~4 s).
	$(GO) test -count=1 -run 'TestOutboundNoRetention$$' ./proxy/

## e2e: end-to-end tests in network namespaces (root).
e2e: tools k8s-bins
	@# Under the lock the node tests and hand-run e2e tests take too: two runs from one checkout name their
	@# network namespaces alike.
	@# The OpenTelemetry Collector spans go to in TestTelemetryTracing (hack/otelcol, cached like k8s-bins).
	@if [ -d e2e ]; then ZTG_REQUIRE_ROOT=1 ZTG_CNI_BIN=$(CNI_BIN) $(K8S_ENV) ZTG_OTELCOL=$$(hack/otelcol/build.sh) \
		flock /tmp/e2e.lock $(GO) test -race -count=1 -p 1 -timeout 40m ./e2e/...; fi

## interop-istiod: istiod (pilot-discovery from the istio.io/istio module, hack/istiod/build.sh; 10-20 min the first
## time, then cached in ~/.cache/ztunnel-go) and ztunnel-cp on one real API server with the same objects; the
## workload API each serves a node proxy is compared field by field (e2e/interop, docs/istiod-differences.md).
## Not part of `make test`. ISTIOD_REPORT=file writes every difference as JSON lines.
interop-istiod: k8s-bins
	@bin=$$(hack/istiod/build.sh) && dir=$$(hack/istiod/build.sh -m) && \
	ZTG_ISTIOD_BIN=$$bin ZTG_ISTIO_DIR=$$dir ZTG_ISTIOD_REPORT=$(ISTIOD_REPORT) $(K8S_ENV) \
	$(GO) test -count=1 -timeout 15m -run 'TestIstiodDifferential$$' -v ./e2e/interop/

## deploy-check: helm lint, helm template vs deploy/manifests, server-side dry-run + RBAC check on a real API server.
deploy-check: k8s-bins
	deploy/check.sh

## images: OCI archives of ztunnel, ztunnel-cni, ztunnel-cp, zctl (and waypoint) in bin/images/, built without a
## container daemon or base image (hack/images; IMAGE_REGISTRY names the registry in their references).
IMAGE_REGISTRY ?= ghcr.io/ztunnel-go
images:
	cd hack/images && $(GO) run . -repo $(CURDIR) -out $(CURDIR)/bin/images -registry $(IMAGE_REGISTRY)

## test-node: a real single-node cluster on this machine (internal/testing/realnode: etcd, kube-apiserver,
## controller manager, scheduler, kube-proxy and kubelet v1.37.2 from hack/k8s/build.sh; containerd and runc from
## apt; bridge + host-local CNI), the chart installed with helm from the images of `make images`, the TestNode*
## tests of e2e/node, teardown (root; under the e2e lock). CoreDNS v1.15.0 (hack/k8s/build.sh coredns) is the
## cluster DNS, in an image hack/images/testimage writes beside the pause and test-app images. Istio's istioctl
## (istioctl-bin) is pointed at the installed node (TestNodeIstioctl). RUN=regexp picks tests.
NODE_TEST_IMAGES := $(CURDIR)/bin/test-images
test-node: deps tools images istioctl-bin
	@dirs=$$(hack/k8s/build.sh k8s helm node coredns) && \
	(cd hack/images && $(GO) run ./testimage -repo $(CURDIR) -out $(NODE_TEST_IMAGES) -coredns $$(sed -n 4p <<<"$$dirs")/coredns >/dev/null) && \
	flock /tmp/e2e.lock env ZTG_REQUIRE_NODE=1 ZTG_K8S_BIN=$$(sed -n 1p <<<"$$dirs") ZTG_HELM_BIN=$$(sed -n 2p <<<"$$dirs") \
		ZTG_NODE_BIN=$$(sed -n 3p <<<"$$dirs") ZTG_CNI_BIN=$(CNI_BIN) ZTG_IMAGES=$(CURDIR)/bin/images \
		ZTG_TEST_IMAGES=$(NODE_TEST_IMAGES) ZTG_ISTIOCTL=$(ISTIOCTL_BIN) \
		$(GO) test -count=1 -v -timeout 25m ./e2e/node/ $(if $(RUN),-run '$(RUN)')

## conformance: Gateway API's mesh conformance suite v1.6.3 (hack/conformance, its own module), profiles MESH-HTTP and
## MESH-GRPC, core and extended, against our waypoint on the real node of test-node; writes the suite's report to
## docs/conformance/report.yaml and the per-test table to docs/conformance/results.md, then tears the node down (root;
## under the e2e lock). The suite's echo workload is Istio's echo app, built from the istio.io/istio module at
## hack/istioctl's version into the image the suite's manifests name (hack/images/testimage -echo). It exits non-zero
## while a test fails (docs/conformance/README.md lists them). conformance-test, part of `make test`, runs the same
## tests and writes no report (~2 min warm); conformance-core runs MESH-HTTP's core tests only.
ECHO_BIN := $(CURDIR)/bin/echo
ECHO_PKGS := istio.io/istio/pkg/test/echo/cmd/server istio.io/istio/pkg/test/echo/cmd/client
# conformance_run SCOPE,REPORT_DIR
define conformance_run
	@dirs=$$(hack/k8s/build.sh k8s helm node coredns) && \
	(cd hack/conformance && CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o $(ECHO_BIN)/ $(ECHO_PKGS)) && \
	certs=$$(cd hack/conformance && $(GO) list -m -f '{{.Dir}}' istio.io/istio)/tests/testdata/certs/dns && \
	install -m 0644 $$certs/cert-chain.pem $(ECHO_BIN)/cert.crt && install -m 0644 $$certs/key.pem $(ECHO_BIN)/cert.key && \
	(cd hack/images && $(GO) run ./testimage -repo $(CURDIR) -out $(NODE_TEST_IMAGES) -coredns $$(sed -n 4p <<<"$$dirs")/coredns \
		-echo $(ECHO_BIN) >/dev/null) && \
	cd hack/conformance && flock /tmp/e2e.lock env ZTG_REQUIRE_NODE=1 ZTG_K8S_BIN=$$(sed -n 1p <<<"$$dirs") \
		ZTG_HELM_BIN=$$(sed -n 2p <<<"$$dirs") ZTG_NODE_BIN=$$(sed -n 3p <<<"$$dirs") ZTG_CNI_BIN=$(CNI_BIN) \
		ZTG_IMAGES=$(CURDIR)/bin/images ZTG_TEST_IMAGES=$(NODE_TEST_IMAGES) ZTG_CONFORMANCE_SCOPE=$(1) ZTG_CONFORMANCE_REPORT=$(2) \
		$(GO) test -count=1 -v -timeout 40m -run 'TestMeshConformance$$' .
endef

conformance: deps tools images
	$(call conformance_run,all,$(CURDIR)/docs/conformance)

conformance-test: deps tools images
	$(call conformance_run,all,)

conformance-core: deps tools images
	$(call conformance_run,core,)

## node-up: the real node of test-node with our images (make images) and the test images imported, left running for
## a person to follow docs/install.md by hand (prints KUBECONFIG, PATH and the containerd socket); node-down tears it
## down (safe twice). The lock is taken while it starts (flock -o: the node's processes do not keep it).
node-up: deps tools images
	@dirs=$$(hack/k8s/build.sh k8s helm node coredns) && \
	(cd hack/images && $(GO) run ./testimage -repo $(CURDIR) -out $(NODE_TEST_IMAGES) -coredns $$(sed -n 4p <<<"$$dirs")/coredns >/dev/null) && \
	flock -o /tmp/e2e.lock $(GO) run ./internal/testing/realnode/nodeup -k8s-bin $$(sed -n 1p <<<"$$dirs") \
		-helm-bin $$(sed -n 2p <<<"$$dirs") -node-bin $$(sed -n 3p <<<"$$dirs") -cni-bin $(CNI_BIN) \
		-images $(CURDIR)/bin/images -test-images $(NODE_TEST_IMAGES)

node-down:
	flock -o /tmp/e2e.lock $(GO) run ./internal/testing/realnode/nodeup -down

## istioctl-check: Istio's own istioctl code (hack/istioctl, a module of its own: istio.io/istio stays out of go.mod)
## reads a live node proxy's config dump (every ztunnel-config view, the same rows zctl shows), and istioctl
## analyze finds nothing about the chart's objects or a waypoint's. ~85 s warm (most of it building ztunnel,
## ztunnel-cp and zctl); the first run also compiles the istio packages (~10-20 min on 2 cores).
istioctl-check:
	cd hack/istioctl && $(GO) vet ./... && $(GO) test -count=1 -timeout 30m ./...

## istioctl-bin: bin/istioctl, Istio's istioctl with its ztunnel-config and analyze commands (hack/istioctl/cmd/istioctl;
## the istio packages istioctl-check compiles, plus istioctl's kubectl helpers), for test-node and a person on node-up.
ISTIOCTL_BIN := $(CURDIR)/bin/istioctl
istioctl-bin:
	@mkdir -p bin
	cd hack/istioctl && $(GO) build -o $(ISTIOCTL_BIN) ./cmd/istioctl

## images-test: the image builder's vet and tests (two full builds give the same digests; root runs its iptables).
images-test:
	cd hack/images && $(GO) vet ./... && $(GO) test -count=1 -timeout 15m ./...

## fuzz: a short run of every fuzz target (FUZZTIME=5s each by default; `make fuzz FUZZTIME=5m` for a long run).
## A run that fails only with the engine's own "context deadline exceeded" at the end of a short -fuzztime and
## writes no failing input is run again, up to three runs in all; any real failure (a written input) fails at once.
fuzz:
	@for pkg in $$($(GO) list ./...); do \
		dir=$$($(GO) list -f '{{.Dir}}' $$pkg); \
		for f in $$(grep -ho '^func Fuzz[A-Za-z0-9_]*' $$dir/*_test.go 2>/dev/null | sed 's/func //'); do \
			echo "fuzz $$pkg $$f"; \
			for try in 1 2 3; do \
				out=$$($(GO) test -run='^$$' -fuzz="^$$f$$" -fuzztime=$(FUZZTIME) $$pkg 2>&1); rc=$$?; echo "$$out"; \
				[ $$rc -eq 0 ] && break; \
				if [ $$try -lt 3 ] && echo "$$out" | grep -q 'context deadline exceeded' && ! echo "$$out" | grep -q 'Failing input written'; then \
					echo "fuzz $$pkg $$f: the fuzzing engine hit its own deadline with no failing input (run $$try); running it again"; \
				else exit 1; fi; \
			done; \
		done; \
	done

## test: everything CI runs, the real node (test-node) included.
test: deps tools lint proto-check unit e2e deploy-check images-test istioctl-check test-node conformance-test
	@$(MAKE) --no-print-directory fuzz FUZZTIME=3s

bench-hbone:
	$(GO) run ./bench/hbone

## bench-xds: node state footprint and full sync at 100k workloads, control-plane push latency to 100 clients.
bench-xds:
	$(GO) run ./bench/xds

## bench-cp-scale: control plane at 10k and 50k pods: full and per-change translation, push to 100 node clients, RSS.
bench-cp-scale:
	$(GO) run ./bench/cpscale $(if $(CHURN),-churn $(CHURN))

## bench-dns: answers from state vs a bare miekg/dns server; added latency of forwarding.
bench-dns:
	$(GO) run ./bench/dns

## bench-mesh: mesh vs direct traffic on a two-node namespace cluster, beside HAProxy 2.6 as the peer (root; iperf3, fortio, haproxy).
bench-mesh: deps tools build
	$(GO) run ./bench/mesh -bin-dir bin -fortio-version $(FORTIO_VERSION)

## bench-soak: 10,000 concurrent tunnels through the two-node mesh, opened and closed in waves for SOAK (default
## 10m, e.g. `SOAK=3m make bench-soak`): errors, node proxy RSS slope and goroutines; then CHURN (default 10000,
## 0: none) short-lived client pods, one tunnel each: the istio_* series count (root; run under flock /tmp/e2e.lock).
bench-soak: deps tools build
	$(GO) run ./bench/soak -bin-dir bin $(if $(SOAK),-duration $(SOAK)) -churn $(or $(CHURN),10000)

## bench-waypoint: the L7 waypoint binary beside HAProxy 2.6 in HTTP mode, 1k req/s of 1 KiB HTTP/1.1 over 16
## connections on loopback (haproxy; ROUNDS=5 by default, PROFILE=file writes the waypoint's CPU profile).
bench-waypoint: deps
	@mkdir -p bin
	$(GO_BUILD) -o bin/waypoint ./cmd/waypoint
	$(GO) run ./bench/waypoint -waypoint bin/waypoint $(if $(ROUNDS),-rounds $(ROUNDS)) $(if $(PROFILE),-cpuprofile $(PROFILE))

## bench-multicluster: added latency of double HBONE through the real east-west gateway beside HBONE on one network,
## new connections and 1 KiB requests on reused ones, on loopback with each role its own process.
bench-multicluster:
	$(GO) run ./bench/multicluster

bench: bench-hbone bench-xds bench-dns bench-mesh bench-waypoint

clean:
	rm -rf bin .tools
