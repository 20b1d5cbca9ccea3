# kvtier — see README.md. Every target works on a fresh machine with Go 1.26.
GO            ?= go
CC            ?= cc
BIN           ?= bin
STATICCHECK   := honnef.co/go/tools/cmd/staticcheck@v0.8.2
VERSION       ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
REVISION      ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
LDFLAGS       := -X main.version=$(VERSION) -X main.revision=$(REVISION)
# Packages with goroutines: also tested under the race detector. Not
# host/datareplay: one goroutine drives it, its tiers' concurrency is raced
# in their own packages, and with invariants on it takes 7+ minutes here.
RACE_PKGS     ?= ./registry/... ./tiers/... ./indexes/... $(shell $(GO) list ./host/... | grep -v /host/datareplay) ./plugins/... ./bench/... ./internal/slabfile/...
# Extra flags for `go test` (e.g. TESTFLAGS=-short).
TESTFLAGS     ?=
# Protobuf code generators, pinned (protoc itself is Debian's protobuf-compiler).
PROTOC        ?= protoc
PROTOC_GEN_GO      := google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
PROTOC_GEN_GO_GRPC := google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.5.1
PROTO_FILES   := $(wildcard plugins/proto/kvtier/*/v*/*.proto)
API_PROTO     := api/kvtier/engine/v1/engine.proto api/kvtier/store/v1/store.proto

.PHONY: build native test bench plugins lint fuzz run proto clean

build: native
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/kvtier ./cmd/kvtier

# The Python clients' one-pass copy + CRC-32C library (clients/python/kvtier/
# native.py loads bin/libkvtiercopy.so from a checkout). Plain -O2: its
# AVX-512 and SSE 4.2 functions carry target attributes and are picked at
# load time, so one build runs on any x86-64 (and elsewhere on a table).
NATIVE_SRC    := clients/python/kvtier/_native/kvtiercopy.c
native:
	@mkdir -p $(BIN)
	$(CC) -O2 -shared -fPIC -o $(BIN)/libkvtiercopy.so $(NATIVE_SRC)

# Plugin binaries used by the tests and the plugin benchmark.
plugins:
	@if [ -d plugins/examples ]; then \
		for d in plugins/examples/*/; do \
			[ -f "$$d/main.go" ] || continue; \
			n=$$(basename $$d); \
			echo "build plugin $$n"; \
			$(GO) build -o $(BIN)/plugins/kvtier-plugin-$$n ./$$d || exit 1; \
		done; \
	fi

# The Python client's tests run on Debian's /usr/bin/python3 (not a pyenv
# python on PATH) with python3-pytest and python3-numpy from apt (.ci/run
# installs them). The 8-rank 100k-tick simulation runs without the
# invariants tag: its per-tick self-checks take it to 9 minutes.
test: plugins
	$(GO) vet ./...
	$(GO) test -tags invariants -count=1 $(TESTFLAGS) ./...
	$(GO) test -count=1 $(TESTFLAGS) -run '^TestSim100k$$' ./host/simrun/
	$(GO) test -race -tags invariants -count=1 $(TESTFLAGS) $(RACE_PKGS)
	/usr/bin/python3 -m pytest -q clients/python/tests

bench: build plugins
	$(GO) test -run '^$$' -bench . -benchtime 1x -count 1 ./...

# Every Go fuzz target for a count of executions each (FUZZ_EXECS, default
# 100000; FUZZ_CAP seconds at most a target): scripts/fuzz-sweep.sh.
fuzz:
	GO=$(GO) scripts/fuzz-sweep.sh

lint:
	GOBIN=$(CURDIR)/$(BIN)/tools $(GO) install $(STATICCHECK)
	$(GO) vet ./...
	$(BIN)/tools/staticcheck ./...

# Regenerate the committed code of the plugin protocol (plugins/proto) and
# of the engine and store APIs (api/enginev1, api/storev1, clients/python/kvtier/{engine,store}/v1).
proto:
	GOBIN=$(CURDIR)/$(BIN)/tools $(GO) install $(PROTOC_GEN_GO)
	GOBIN=$(CURDIR)/$(BIN)/tools $(GO) install $(PROTOC_GEN_GO_GRPC)
	PATH=$(CURDIR)/$(BIN)/tools:$$PATH $(PROTOC) -I plugins/proto \
		--go_out=. --go_opt=module=github.com/kvtier/kvtier \
		--go-grpc_out=. --go-grpc_opt=module=github.com/kvtier/kvtier \
		$(PROTO_FILES)
	PATH=$(CURDIR)/$(BIN)/tools:$$PATH $(PROTOC) -I api \
		--go_out=. --go_opt=module=github.com/kvtier/kvtier \
		--go-grpc_out=. --go-grpc_opt=module=github.com/kvtier/kvtier \
		api/kvtier/engine/v1/engine.proto
	# NB: -I api/kvtier for the store API's Go code: its file registers as
	# store/v1/store.proto, because the plugin protocol's file registers
	# as kvtier/store/v1/store.proto and one Go binary links both (the
	# registry refuses a path twice). Python keeps kvtier/store/v1.
	PATH=$(CURDIR)/$(BIN)/tools:$$PATH $(PROTOC) -I api/kvtier \
		--go_out=. --go_opt=module=github.com/kvtier/kvtier \
		--go-grpc_out=. --go-grpc_opt=module=github.com/kvtier/kvtier \
		api/kvtier/store/v1/store.proto
	$(PROTOC) -I api --python_out=clients/python \
		--grpc_out=clients/python --plugin=protoc-gen-grpc=$$(command -v grpc_python_plugin) \
		$(API_PROTO)

# The system at work: kvtier serve on the embedded demo stack, driven by
# kvtier loadgen (every loaded byte verified), then stopped (scripts/run-demo.sh).
run: build
	BIN=$(BIN) scripts/run-demo.sh

clean:
	rm -rf $(BIN)
