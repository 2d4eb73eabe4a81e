# Convenience targets; .ci/run is what CI runs.
.PHONY: gen test up lint

gen: ## regenerate protobuf, gRPC, gateway and OpenAPI code
	api/generate.sh

lint:
	bin/tools/buf lint

test:
	.ci/run

up:
	go run ./cli/cmd/hangar up
