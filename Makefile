# Convenience targets; .ci/run is what CI runs.
.PHONY: gen test up lint install

gen: ## regenerate protobuf, gRPC, gateway and OpenAPI code
	api/generate.sh

lint:
	bin/tools/buf lint

test:
	.ci/run

up:
	go run ./cli/cmd/hangar up

install: ## build the hangar CLI and its sandbox helper into $(go env GOPATH)/bin (put it on PATH)
	go install ./cli/cmd/hangar ./sandbox-svc/cmd/hangar-sandbox
