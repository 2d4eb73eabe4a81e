// Package openapi carries the OpenAPI (Swagger 2.0) document generated from
// the hangar contract, merged across every service.
package openapi

import _ "embed"

// Document is the merged OpenAPI document, served at GET /openapi.json.
//
//go:embed hangar.swagger.json
var Document []byte
