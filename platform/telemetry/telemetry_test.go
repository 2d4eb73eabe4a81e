package telemetry_test

import (
	"context"
	"io"
	"net"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"go.uber.org/goleak"
	"google.golang.org/grpc"

	"github.com/hangar-dev/hangar/platform/telemetry"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func scrape(t *testing.T, tel *telemetry.Telemetry) string {
	t.Helper()
	rec := httptest.NewRecorder()
	tel.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != 200 {
		t.Fatalf("/metrics = %d", rec.Code)
	}
	b, err := io.ReadAll(rec.Body)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	return string(b)
}

// Several services in one process: each Setup has its own registry and its
// metrics stay apart.
func TestSetupTwiceKeepsRegistriesApart(t *testing.T) {
	ctx := context.Background()
	a, err := telemetry.Setup(ctx, telemetry.Options{ServiceName: "session-svc"})
	if err != nil {
		t.Fatalf("Setup a: %v", err)
	}
	defer func() { _ = a.Shutdown(ctx) }()
	b, err := telemetry.Setup(ctx, telemetry.Options{ServiceName: "sandbox-svc"})
	if err != nil {
		t.Fatalf("Setup b: %v", err)
	}
	defer func() { _ = b.Shutdown(ctx) }()

	ca, err := a.MeterProvider().Meter("test").Int64Counter("hangar_test_a_total")
	if err != nil {
		t.Fatalf("counter: %v", err)
	}
	ca.Add(ctx, 3)
	cb, err := b.MeterProvider().Meter("test").Int64Counter("hangar_test_b_total")
	if err != nil {
		t.Fatalf("counter: %v", err)
	}
	cb.Add(ctx, 5)

	ma, mb := scrape(t, a), scrape(t, b)
	if !strings.Contains(ma, "hangar_test_a_total") || strings.Contains(ma, "hangar_test_b_total") {
		t.Errorf("a's metrics:\n%s", ma)
	}
	if !strings.Contains(mb, "hangar_test_b_total") || strings.Contains(mb, "hangar_test_a_total") {
		t.Errorf("b's metrics:\n%s", mb)
	}
	if !strings.Contains(ma, `service_name="session-svc"`) || !strings.Contains(ma, "go_goroutines") {
		t.Errorf("a's metrics lack target_info or runtime metrics:\n%s", ma)
	}
	if _, ok := otel.GetTextMapPropagator().(propagation.TextMapPropagator); !ok {
		t.Error("no global propagator")
	}
	if fields := otel.GetTextMapPropagator().Fields(); !contains(fields, "traceparent") {
		t.Errorf("propagator fields = %v, want traceparent", fields)
	}
	if err := a.Shutdown(ctx); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if err := a.Shutdown(ctx); err != nil {
		t.Errorf("second Shutdown: %v", err)
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// collector is a minimal OTLP/gRPC trace collector.
type collector struct {
	collectortrace.UnimplementedTraceServiceServer
	mu    sync.Mutex
	names []string
}

func (c *collector) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				c.names = append(c.names, s.GetName())
			}
		}
	}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

func TestSetupExportsSpansToOTLP(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	col := &collector{}
	srv := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(srv, col)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	defer func() {
		srv.Stop()
		<-served
	}()

	ctx := context.Background()
	tel, err := telemetry.Setup(ctx, telemetry.Options{ServiceName: "test-svc", OTLPEndpoint: lis.Addr().String()})
	if err != nil {
		t.Fatalf("Setup: %v", err)
	}
	_, span := tel.TracerProvider().Tracer("test").Start(ctx, "exported-span")
	span.End()
	// Shutdown flushes the batch to the collector before returning.
	if err := tel.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	col.mu.Lock()
	defer col.mu.Unlock()
	if !contains(col.names, "exported-span") {
		t.Errorf("collector got spans %v, want exported-span", col.names)
	}
}
