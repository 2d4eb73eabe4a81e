// Package telemetry sets up OpenTelemetry tracing and metrics for a service.
//
// Traces go to an OTLP/gRPC collector when an endpoint is configured;
// otherwise spans are still created (so logs carry trace ids and context
// propagates) but not exported. Metrics are exposed for Prometheus to scrape
// through MetricsHandler, from a registry that belongs to this Telemetry
// alone, so several services in one process do not collide.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Options configures Setup.
type Options struct {
	// ServiceName is the service.name resource attribute, e.g. "session-svc".
	ServiceName string
	// OTLPEndpoint is the host:port of an OTLP/gRPC collector, reached
	// without TLS. Empty means spans are not exported.
	OTLPEndpoint string
}

// Telemetry owns a service's tracer and meter providers.
type Telemetry struct {
	tracerProvider *sdktrace.TracerProvider
	meterProvider  *sdkmetric.MeterProvider
	registry       *prometheus.Registry

	metricsHandler func() http.Handler

	shutdownOnce sync.Once
	shutdownErr  error
}

// Setup creates the providers, installs them as the OpenTelemetry globals
// together with the W3C trace-context and baggage propagator, and returns
// them. Call Shutdown to flush and release them.
//
// When several services run in one process, each calls Setup: each gets its
// own providers and Prometheus registry, and the globals end up pointing at
// the last one. Code that should report to a specific service passes that
// service's TracerProvider and MeterProvider explicitly (rpc.ServerOptions
// and apiserver.Options take them).
func Setup(ctx context.Context, opts Options) (*Telemetry, error) {
	res, err := resource.Merge(resource.Default(),
		resource.NewSchemaless(attribute.String("service.name", opts.ServiceName)))
	if err != nil {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}

	tpOpts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	if opts.OTLPEndpoint != "" {
		// The exporter connects lazily: an unreachable collector does not
		// fail Setup, spans are dropped and the SDK logs the export errors.
		exp, err := otlptracegrpc.New(ctx,
			otlptracegrpc.WithEndpoint(opts.OTLPEndpoint),
			otlptracegrpc.WithInsecure())
		if err != nil {
			return nil, fmt.Errorf("telemetry: OTLP exporter for %s: %w", opts.OTLPEndpoint, err)
		}
		tpOpts = append(tpOpts, sdktrace.WithBatcher(exp))
	}
	tp := sdktrace.NewTracerProvider(tpOpts...)

	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		_ = tp.Shutdown(ctx)
		return nil, fmt.Errorf("telemetry: prometheus exporter: %w", err)
	}
	if err := registerRuntimeCollectors(reg); err != nil {
		_ = tp.Shutdown(ctx)
		return nil, err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter), sdkmetric.WithResource(res))

	otel.SetTracerProvider(tp)
	otel.SetMeterProvider(mp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(
		propagation.TraceContext{}, propagation.Baggage{}))

	return &Telemetry{
		tracerProvider: tp,
		meterProvider:  mp,
		registry:       reg,
		metricsHandler: sync.OnceValue(func() http.Handler {
			// Registry also exposes the handler's own error counters.
			return promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})
		}),
	}, nil
}

func registerRuntimeCollectors(reg *prometheus.Registry) error {
	for _, c := range []prometheus.Collector{
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("telemetry: register runtime collector: %w", err)
		}
	}
	return nil
}

// TracerProvider returns this service's tracer provider.
func (t *Telemetry) TracerProvider() trace.TracerProvider { return t.tracerProvider }

// MeterProvider returns this service's meter provider.
func (t *Telemetry) MeterProvider() metric.MeterProvider { return t.meterProvider }

// Registry returns the Prometheus registry behind MetricsHandler, for
// collectors that do not go through OpenTelemetry.
func (t *Telemetry) Registry() *prometheus.Registry { return t.registry }

// MetricsHandler serves this service's metrics in the Prometheus exposition
// format.
func (t *Telemetry) MetricsHandler() http.Handler {
	return t.metricsHandler()
}

// Shutdown flushes pending spans and stops the providers. It is safe to call
// more than once; later calls return the first call's result.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	t.shutdownOnce.Do(func() {
		t.shutdownErr = errors.Join(t.tracerProvider.Shutdown(ctx), t.meterProvider.Shutdown(ctx))
		if t.shutdownErr != nil {
			t.shutdownErr = fmt.Errorf("telemetry: shutdown: %w", t.shutdownErr)
		}
	})
	return t.shutdownErr
}
