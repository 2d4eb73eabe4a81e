// Package openapi carries the OpenAPI (Swagger 2.0) document generated from
// the hangar contract, merged across every service.
package openapi

import (
	_ "embed"

	// The contract's packages, registered wherever the document is served:
	// apiserver rewrites the document's hangar.* enums to the JSON names
	// the gateway speaks, from the registered descriptors.
	_ "github.com/hangar-dev/hangar/api/hangar/checkpoint/v1"
	_ "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	_ "github.com/hangar-dev/hangar/api/hangar/replay/v1"
	_ "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	_ "github.com/hangar-dev/hangar/api/hangar/session/v1"
)

// Document is the merged OpenAPI document, served at GET /openapi.json.
//
//go:embed hangar.swagger.json
var Document []byte
