# kubectl cp-rollout — build, test and release tasks.
# A fresh machine needs only Go: everything else is built or installed here.

GO      ?= go
PKG     := github.com/cp-rollout/cp-rollout
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT  ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
DATE    ?= $(shell date -u +%Y-%m-%dT%H:%M:%SZ)
# grpcnotrace leaves out gRPC's golang.org/x/net/trace (and html/template with
# it): request tracing the tool never turns on. .goreleaser.yaml sets the same.
TAGS    := grpcnotrace
LDFLAGS := -X $(PKG)/pkg/version.version=$(VERSION) \
           -X $(PKG)/pkg/version.commit=$(COMMIT) \
           -X $(PKG)/pkg/version.date=$(DATE)

# Heavy tools live outside the checkout so every clone reuses them.
CACHE_DIR      ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/cp-rollout
GORELEASER_VER := v2.15.1
GORELEASER     := $(CACHE_DIR)/tools/goreleaser-$(GORELEASER_VER)/goreleaser
# krew and its manifest validator, built from the Go module proxy (v0.4.4 is
# the newest it serves) for release-check.
KREW_VER       := v0.4.4
KREW_DIR       := $(CACHE_DIR)/tools/krew-$(KREW_VER)
KREW           := $(KREW_DIR)/kubectl-krew
# The release's SBOM generator (goreleaser's sboms: section runs it).
CYCLONEDX_VER  := v1.10.0
CYCLONEDX      := $(CACHE_DIR)/tools/cyclonedx-gomod-$(CYCLONEDX_VER)/cyclonedx-gomod
# TEST_SUMMARY=1 (CI sets it) runs the tests under gotestsum, which prints the
# same verbose output and then, at the end, the whole output of each failed
# test: the lines that say why it failed, which go test -v leaves among the
# interleaved output of the tests that ran beside it.
GOTESTSUM_VER  := v1.13.0
GOTESTSUM      := $(CACHE_DIR)/tools/gotestsum-$(GOTESTSUM_VER)/gotestsum
TEST_SUMMARY   ?=
GOTEST         := $(if $(TEST_SUMMARY),$(GOTESTSUM) --format standard-verbose --,$(GO) test)
TEST_TIMEOUT   ?= 45m
# Tests run in parallel this many at a time within a package (go test's
# -parallel, GOMAXPROCS by default). Simulator scenarios mostly wait on
# provisioning delays, etcd's health interval and Lease expiry, so more of them
# than cores fit; the simulator start-ups, which do not wait, are limited to
# two at a time by internal/sim/simtest.
TEST_PARALLEL  ?= 4

.PHONY: all build plugin demo sim test test-e2e test-packages test-long test-runbooks test-faults test-capi capi-binaries bench bench-fleet bench-startup fleet-scale board-capture envtest lint release-check clean
all: build

build: plugin ## bin/kubectl-cp_rollout, its kubectl completion helper, bin/cp-rollout-sim
	$(GO) build -o bin/cp-rollout-sim ./cmd/cp-rollout-sim

plugin: ## bin/kubectl-cp_rollout and its kubectl completion helper
	$(GO) build -tags '$(TAGS)' -ldflags '$(LDFLAGS)' -o bin/kubectl-cp_rollout ./cmd/kubectl-cp_rollout
	install -m 0755 cmd/kubectl_complete-cp_rollout/kubectl_complete-cp_rollout bin/

demo: build ## upgrade a simulated 3-machine control plane from v1.35.2 to v1.36.3
	hack/demo.sh

sim: build ## run the simulator in the foreground for your own experiments
	@echo "In another shell: export KUBECONFIG=$(CURDIR)/bin/sim.kubeconfig PATH=$(CURDIR)/bin:\$$PATH"
	@echo "then: kubectl cp-rollout status demo"
	KUBEBUILDER_ASSETS=$$(hack/envtest-binaries.sh) bin/cp-rollout-sim up --kubeconfig-out bin/sim.kubeconfig

# The simulator's kube-apiserver and etcd, built from the Go module proxy once
# and cached outside the checkout (the first build takes about 7 minutes).
envtest:
	@hack/envtest-binaries.sh >/dev/null

test: lint envtest plugin $(if $(TEST_SUMMARY),$(GOTESTSUM)) ## every package's tests and the end-to-end scenarios but the long and fault suites
	@$(MAKE) --no-print-directory -j2 --output-sync=target test-e2e test-packages PLUGIN_DIR=$(CURDIR)/bin

# test/e2e takes longest by far. `go test ./...` would start it only after the
# packages sorted before it, so it runs as a second go test of its own beside
# them; --output-sync keeps each one's output together.
# Under `make test` every test binary runs the plugin that `make plugin` put in
# bin/ (PLUGIN_DIR) instead of linking its own, about ten seconds of CPU each.
# TEST_VERBOSE=-v (CI sets it) prints every test with its duration.
TEST_VERBOSE ?=
TEST_FLAGS := -count=1 -timeout $(TEST_TIMEOUT) -parallel $(TEST_PARALLEL) $(TEST_VERBOSE)
TEST_ENV   := KUBEBUILDER_ASSETS=$$(hack/envtest-binaries.sh) $(if $(PLUGIN_DIR),CP_ROLLOUT_PLUGIN_DIR=$(PLUGIN_DIR))
# The fault suite: the end-to-end scenarios that kill the tool, stop or cut
# off what it talks to, or take its Lease (docs/reliability.md). Each runs
# for minutes on a simulator of its own; `make test` leaves them to
# `make test-faults`, and CI runs both.
FAULTS     := ^Test(Kill|SecondRunLocked|ReplacementNeverProvisions|WorkloadAPIServerUnreachable|LeaseLostMidRun|ManagementAPIServerRestart|MemberRestarted|MoveLeaderFallsBack|HandbackAfterInterrupted|NoKeyMaterial)
# The long suite: end-to-end scenarios of ten minutes and more each on a busy
# two-core machine, one of which would be most of `make test`'s time alone;
# `make test-long` runs them, and CI runs it too.
LONG       := ^Test(ClusterClassUpgradeThroughTwoMinors|LeastPrivilege|Fleet.*|DeadMachineKCPAlone)$$
# The runbook suite: the recovery runbooks (docs/recovery.md) and the
# rollouts of every change (docs/gitops.md) end to end, each a few minutes on
# a simulator of its own, and the simulator's own scenarios of its faults and
# of every change KCP rolls out. `make test` keeps one of each kind (a dead
# machine replaced, a failed run explained, a gate's steps) and leaves the
# rest — the gates that stop a run, wait --for done on KCP's own rollout —
# to `make test-runbooks`, which CI runs too.
RUNBOOKS   := ^Test(ClusterClassRestartAndTemplate|GateDaemonSetsUnready|GateStopsTheRun|WaitForKCPsOwnRollout|UpgradeReplacesUnhealthy|Compound(TwoDeadMembersFiveReplicas|DeadMemberAndAPIServerDown|AllCondemnedEtcdHealthy)|DrainBlockedByPDB|RaisedDrainTimeoutReachesTheDeletingMachine|WorkersScaleAfterHandbackOfAFailedRun|UpgradeWithNewMachineTemplate|PauseThenRolloutOfASpecChange|RestartReplacesEveryMachine|RolloutOfExpiringCertificates)$$
SIM_RUNBOOKS := ^Test(EveryRolloutChangeIsVisibleToKCP|FaultAnnotations|StagedFindings)$$
# The simulator's own long scenario: two simulators starting on one
# namespace, seven minutes of both cores beside the end-to-end suite.
SIM_LONG   := ^TestClustersShareANamespace$$
# E2E_ALONE runs after the rest of the fault suite, with nothing beside it: the
# management API server restart must take seconds, as it does on a real
# control plane, not the minute it can take beside a dozen simulated API
# servers (the tool then rightly gives up its Lease).
E2E_ALONE  := ^TestManagementAPIServerRestart$$
# KILL_MATRIX=full kills every operation of the kill matrix at every step
# boundary (about 25 minutes more); by default three operations at every
# fourth boundary.
KILL_MATRIX ?= part
# The Cluster API matrix: the verbs against each proven release's own
# controller binaries (test/e2e/capi_test.go), about 12 minutes a release;
# CAPI_RELEASES=v1.13.6 runs one.
CAPI       := ^TestCAPIReleases$$
CAPI_RELEASES ?= v1.13.6 v1.14.2
empty :=
space := $(empty) $(empty)
test-e2e:
	$(TEST_ENV) $(GOTEST) $(TEST_FLAGS) -skip '$(FAULTS)|$(LONG)|$(RUNBOOKS)|$(CAPI)' ./test/e2e
test-packages:
	$(TEST_ENV) $(GOTEST) $(TEST_FLAGS) -skip '$(SIM_LONG)|$(SIM_RUNBOOKS)' $$($(GO) list ./... | grep -v /test/e2e)

test-runbooks: envtest plugin $(if $(TEST_SUMMARY),$(GOTESTSUM)) ## the recovery runbooks and every-change rollouts end to end, and the simulator's faults and changes
	$(TEST_ENV) CP_ROLLOUT_PLUGIN_DIR=$(CURDIR)/bin $(GOTEST) $(TEST_FLAGS) -run '$(RUNBOOKS)' ./test/e2e
	$(TEST_ENV) $(GOTEST) $(TEST_FLAGS) -run '$(SIM_RUNBOOKS)' ./internal/sim

test-long: envtest plugin $(if $(TEST_SUMMARY),$(GOTESTSUM)) ## the long suite: a ClusterClass cluster upgraded two minors with its workers, least privilege under the audit log, fleets of four clusters, simulators sharing a namespace, KCP alone replacing a dead machine
	$(TEST_ENV) CP_ROLLOUT_PLUGIN_DIR=$(CURDIR)/bin $(GOTEST) $(TEST_FLAGS) -run '$(LONG)' ./test/e2e
	$(TEST_ENV) $(GOTEST) $(TEST_FLAGS) -run '$(SIM_LONG)' ./internal/sim

# Each release's core, kubeadm bootstrap and KCP managers, built from the Go
# module proxy once and cached outside the checkout (the first build of a
# release takes about 5 minutes on two cores).
capi-binaries: build
	@for v in $(CAPI_RELEASES); do bin/cp-rollout-sim build-capi $$v >/dev/null || exit 1; done

test-capi: envtest plugin capi-binaries $(if $(TEST_SUMMARY),$(GOTESTSUM)) ## the Cluster API matrix: upgrade, scale, replace and a ClusterClass upgrade against v1.13.6's and v1.14.2's own controller binaries
	$(TEST_ENV) CP_ROLLOUT_PLUGIN_DIR=$(CURDIR)/bin $(GOTEST) $(TEST_FLAGS) -timeout 60m -run '$(CAPI)/^($(subst $(space),|,$(strip $(CAPI_RELEASES))))$$' ./test/e2e

test-faults: envtest plugin $(if $(TEST_SUMMARY),$(GOTESTSUM)) ## the fault suite: SIGKILL at step boundaries, stopped members, unreachable API servers, lost Leases
	$(TEST_ENV) CP_ROLLOUT_PLUGIN_DIR=$(CURDIR)/bin $(if $(filter full,$(KILL_MATRIX)),CP_ROLLOUT_FULL_KILL_MATRIX=1) \
		$(GOTEST) $(TEST_FLAGS) $(if $(filter full,$(KILL_MATRIX)),-timeout 90m) -run '$(FAULTS)' -skip '$(E2E_ALONE)' ./test/e2e
	$(TEST_ENV) CP_ROLLOUT_PLUGIN_DIR=$(CURDIR)/bin $(GOTEST) $(TEST_FLAGS) -run '$(E2E_ALONE)' ./test/e2e

bench: plugin bench-fleet bench-startup ## the tool against the real KCP on the simulator, 3 runs of 4 rollouts (about 50 minutes), bench-fleet and bench-startup; figures in bench/ and docs/performance.md
	@mkdir -p bench
	KUBEBUILDER_ASSETS=$$(hack/envtest-binaries.sh) CP_ROLLOUT_PLUGIN_DIR=$(CURDIR)/bin CP_ROLLOUT_BENCH_OUT=$(CURDIR)/bench \
		$(GO) test ./test/e2e -run '^$$' -bench BenchmarkRollout -benchtime 1x -timeout 150m
	@hack/bench-doc.sh bench/results.md docs/performance.md

bench-startup: ## `version` of the stripped release binary, median of 10 after a warm-up, and its size beside kubectl's; figures in bench/startup.json
	@mkdir -p bench
	CP_ROLLOUT_BENCH_OUT=$(CURDIR)/bench $(GO) test ./test/e2e -run '^$$' -bench BenchmarkStartup -benchtime 1x

bench-fleet: plugin ## status -A over 1,000 inert clusters of 5 machines: time and peak memory; a staged fleet run's own machinery (rollouts stubbed) at 1,000 and 2,000 clusters: placement, record writes, memory, fleet status (about 10 minutes); figures in bench/fleet-status.json and bench/fleet-run.json
	@mkdir -p bench
	KUBEBUILDER_ASSETS=$$(hack/envtest-binaries.sh) CP_ROLLOUT_PLUGIN_DIR=$(CURDIR)/bin CP_ROLLOUT_BENCH_OUT=$(CURDIR)/bench \
		$(GO) test ./test/e2e -run '^$$' -bench 'Benchmark(StatusFleet|FleetRun)' -benchtime 1x -timeout 30m

fleet-scale: ## the largest fleet of simulated clusters this machine holds (CLUSTERS=32, PARALLEL=4), upgraded in three stages; figures in bench/fleet-sim.json
	@mkdir -p bench
	hack/fleet-scale.sh bench/fleet-sim.json

board-capture: ## a staged fleet run of six simulated clusters in tmux, the live board captured into docs/fleet-board.txt (about 3 minutes)
	hack/board-capture.sh docs/fleet-board.txt

lint: ## gofmt and go vet
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

# Tool builds print nothing unless they fail; a half-built tool is never left
# under its final name, so an interrupted build is redone.
$(GOTESTSUM):
	@echo "installing gotestsum $(GOTESTSUM_VER) into $(dir $@) (once)"
	@mkdir -p $(dir $@)
	@GOBIN=$(dir $@) $(GO) install gotest.tools/gotestsum@$(GOTESTSUM_VER) >$(dir $@)install.log 2>&1 \
		|| { cat $(dir $@)install.log; exit 1; }

$(GORELEASER):
	@echo "installing goreleaser $(GORELEASER_VER) into $(dir $@) (once)"
	@mkdir -p $(dir $@)
	@GOBIN=$(dir $@) $(GO) install github.com/goreleaser/goreleaser/v2@$(GORELEASER_VER) >$(dir $@)install.log 2>&1 \
		|| { cat $(dir $@)install.log; exit 1; }

# kubectl finds krew as kubectl-krew; the validator lands beside it.
$(KREW):
	@echo "installing krew $(KREW_VER) into $(KREW_DIR) (once)"
	@rm -rf $(KREW_DIR).tmp && mkdir -p $(KREW_DIR).tmp
	@GOBIN=$(KREW_DIR).tmp $(GO) install sigs.k8s.io/krew/cmd/krew@$(KREW_VER) \
		sigs.k8s.io/krew/cmd/validate-krew-manifest@$(KREW_VER) >$(KREW_DIR).tmp/install.log 2>&1 \
		|| { cat $(KREW_DIR).tmp/install.log; exit 1; }
	@mv $(KREW_DIR).tmp/krew $(KREW_DIR).tmp/kubectl-krew
	@rm -rf $(KREW_DIR) && mv $(KREW_DIR).tmp $(KREW_DIR)

$(CYCLONEDX):
	@echo "installing cyclonedx-gomod $(CYCLONEDX_VER) into $(dir $@) (once)"
	@mkdir -p $(dir $@)
	@GOBIN=$(dir $@) $(GO) install github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod@$(CYCLONEDX_VER) >$(dir $@)install.log 2>&1 \
		|| { cat $(dir $@)install.log; exit 1; }

release-check: $(GORELEASER) $(KREW) $(CYCLONEDX) ## snapshot release for this platform with its SBOM, krew manifest validated, installed by krew, run
	@PATH=$(dir $(CYCLONEDX)):$$PATH hack/release-check.sh $(GORELEASER) $(KREW_DIR)

clean:
	rm -rf bin dist
