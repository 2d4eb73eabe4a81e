// Package platform is the root of the shared runtime every hangar service
// uses. It holds no code itself; see the sub-packages:
//
//   - config: typed configuration from flags and HANGAR_* environment variables
//   - fault: domain errors and their single mapping to gRPC statuses
//   - auth: bearer-token authentication for gRPC and HTTP
//   - logging: slog loggers that carry the trace id from the context
//   - telemetry: OpenTelemetry tracing and Prometheus metrics
//   - rpc: the gRPC server and client constructors
//   - apiserver: one port serving gRPC, REST, /healthz, /readyz, /metrics and
//     /openapi.json, the token checked before any body is read
//   - redisconn: a Redis connection, embedded (miniredis, password required)
//     when no URL is given
//   - blob: an object store interface and its local directory implementation
//   - service: assembles logger, telemetry and apiserver into one service process
package platform
