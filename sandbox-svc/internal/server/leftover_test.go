package server_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver/drivertest"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver/local"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/lease"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/server"
)

// A process that died without destroying its sandboxes leaves their
// directories; the next start removes those whose lease is gone at once and
// the others once their lease expires.
func TestStartReapsLeftovers(t *testing.T) {
	home := t.TempDir()
	repo, _ := drivertest.NewRepo(t, map[string]string{"a": "b"})
	crashed, err := local.New(local.Options{Root: home})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	dirs := map[string]string{}
	for _, id := range []string{"sb-unleased", "sb-leased"} {
		sb, err := crashed.Create(ctx, driver.Spec{ID: id, WorkKey: "sess-" + id, Environment: "local", Repository: repo})
		if err != nil {
			t.Fatal(err)
		}
		dirs[id] = filepath.Dir(sb.Info().WorkDir)
	}
	crashed.Close() // the process is gone; its directories stay

	mini := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mini.Addr()})
	defer rdb.Close()
	const prefix = "hangar:leftover-test:"
	if _, err := lease.New(rdb, prefix, nil).Acquire(ctx, "sandbox:sb-leased", "session/x", 30*time.Second); err != nil {
		t.Fatal(err)
	}

	e := start(t, func(d *server.Deps) { d.Home, d.Redis, d.KeyPrefix = home, rdb, prefix })
	if _, err := os.Stat(dirs["sb-unleased"]); !os.IsNotExist(err) {
		t.Errorf("unleased leftover after start: %v, want removed", err)
	}
	if _, err := os.Stat(dirs["sb-leased"]); err != nil {
		t.Errorf("leased leftover after start: %v, want kept while its lease lives", err)
	}
	e.srv.ReapNow(ctx)
	if _, err := os.Stat(dirs["sb-leased"]); err != nil {
		t.Errorf("leased leftover after a reap with the lease alive: %v", err)
	}
	mini.FastForward(31 * time.Second)
	e.srv.ReapNow(ctx)
	if _, err := os.Stat(dirs["sb-leased"]); !os.IsNotExist(err) {
		t.Errorf("leftover after its lease expired: %v, want removed", err)
	}
}
