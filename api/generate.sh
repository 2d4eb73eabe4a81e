#!/usr/bin/env bash
# Regenerates every generated file from api/hangar/**/*.proto: Go messages,
# gRPC stubs, grpc-gateway handlers and the merged OpenAPI document.
# buf and every protoc plugin are pinned Go tools (api/tools/go.mod,
# api/tools/buf/go.mod), built from the Go module proxy; nothing else is
# downloaded and no remote plugin is used.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${HANGAR_TOOLS_BIN:-$root/bin/tools}
mkdir -p "$bin"
(cd "$root/api/tools" && GOWORK=off go build -o "$bin/" tool)
(cd "$root/api/tools/buf" && GOWORK=off go build -o "$bin/" tool)
cd "$root"
find api/hangar -name '*.pb.go' -o -name '*.pb.gw.go' | xargs -r rm -f
rm -f api/openapi/*.swagger.json
PATH="$bin:$PATH" buf generate
# Title, version and the bearer scheme of the merged OpenAPI document.
(cd "$root/api" && GOWORK=off go run ./openapi/finish openapi/hangar.swagger.json)
