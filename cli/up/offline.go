package up

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/hangar-dev/hangar/gateway-svc/scripted"
)

// upstreamVars are the gateway's model settings; when none is set, `hangar
// up` runs offline against the scripted upstream.
var upstreamVars = []string{"HANGAR_ANTHROPIC_URL", "HANGAR_ANTHROPIC_API_KEY", "HANGAR_OPENAI_URL", "HANGAR_OPENAI_API_KEY"}

// offlineModel is the scripted upstream `hangar up` starts when it has no
// model credentials, so a new user can run a session end to end on a fresh
// machine.
type offlineModel struct {
	// URL is its base URL (the Anthropic base; the OpenAI base is URL+"/v1").
	URL string
	srv *http.Server
	lis net.Listener
}

// needsOfflineModel reports whether no upstream variable is set.
func needsOfflineModel(lookupEnv func(string) (string, bool)) bool {
	for _, name := range upstreamVars {
		if v, ok := lookupEnv(name); ok && v != "" {
			return false
		}
	}
	return true
}

// listenOfflineModel loads the script (HANGAR_SCRIPT, or the built-in demo)
// and listens on a free loopback port; serve starts answering.
func listenOfflineModel(lookupEnv func(string) (string, bool), logger *slog.Logger) (*offlineModel, error) {
	script := scripted.Demo()
	if path, ok := lookupEnv("HANGAR_SCRIPT"); ok && path != "" {
		s, err := scripted.Load(path)
		if err != nil {
			return nil, fmt.Errorf("HANGAR_SCRIPT=%s: %w", path, err)
		}
		script = s
	}
	h, err := scripted.New(script)
	if err != nil {
		return nil, fmt.Errorf("the offline model's script: %w", err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("the offline model cannot listen: %w", err)
	}
	return &offlineModel{
		URL: "http://" + lis.Addr().String(),
		lis: lis,
		srv: &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn)},
	}, nil
}

// serve answers until ctx ends.
func (m *offlineModel) serve(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() { errc <- m.srv.Serve(m.lis) }()
	select {
	case err := <-errc:
		return fmt.Errorf("the offline model stopped: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := m.srv.Shutdown(sctx); err != nil {
		_ = m.srv.Close()
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("the offline model: %w", err)
	}
	return nil
}

func (m *offlineModel) close() { _ = m.lis.Close() }
