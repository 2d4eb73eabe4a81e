// Package app wires session-svc: its configuration, its gRPC services and
// their REST routes. cmd/session-svc runs it alone; `hangar up` runs it in
// one process with the other services.
package app

import (
	"context"
	"log/slog"
	"net"
	"net/http"

	"google.golang.org/grpc"

	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/api/openapi"
	"github.com/hangar-dev/hangar/platform/service"
	"github.com/hangar-dev/hangar/session-svc/internal/server"
)

// Name is the service's name in logs, traces and metrics.
const Name = "session-svc"

// App is a configured session-svc, ready to serve.
type App struct {
	svc *service.Service
}

// New builds the service from cfg. logger may be nil.
func New(ctx context.Context, cfg Config, logger *slog.Logger) (*App, error) {
	svc, err := service.New(ctx, service.Options{
		Name:   Name,
		Common: cfg.Common,
		Logger: logger,
		Register: func(s *grpc.Server) {
			sessionv1.RegisterSessionServiceServer(s, &server.Sessions{})
			sessionv1.RegisterJobServiceServer(s, &server.Jobs{})
		},
		Gateways: []service.Gateway{
			sessionv1.RegisterSessionServiceHandler,
			sessionv1.RegisterJobServiceHandler,
		},
		OpenAPI: openapi.Document,
	})
	if err != nil {
		return nil, err
	}
	return &App{svc: svc}, nil
}

// Handler serves gRPC and REST in-process (for a front door).
func (a *App) Handler() http.Handler { return a.svc.Handler() }

// Run serves on lis until ctx ends.
func (a *App) Run(ctx context.Context, lis net.Listener) error { return a.svc.Serve(ctx, lis) }
