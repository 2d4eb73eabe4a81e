package sessions

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/hangar-dev/hangar/session-svc/internal/store"
)

// cutProxy forwards TCP to the machine's PostgreSQL and can cut the link
// (every connection closed, new ones refused) and put it back on the same
// address: an outage of the database as hangar sees it, without stopping
// the shared server.
type cutProxy struct {
	addr, target string

	mu    sync.Mutex
	ln    net.Listener
	conns []net.Conn
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{addr: ln.Addr().String(), target: target}
	p.serve(ln)
	t.Cleanup(p.cut)
	return p
}

func (p *cutProxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, up)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(up, c); up.Close() }()
			go func() { _, _ = io.Copy(c, up); c.Close() }()
		}
	}()
}

func (p *cutProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

func (p *cutProxy) restore(t *testing.T) {
	t.Helper()
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		t.Fatalf("listen again on %s: %v", p.addr, err)
	}
	p.serve(ln)
}

// Events recorded while the session database is unreachable are kept, in
// order and with the time they happened, and written once it answers
// again; events that come after wait behind them.
func TestEventsKeptWhileDatabaseDown(t *testing.T) {
	ctx := t.Context()
	direct := "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	if u := os.Getenv("HANGAR_TEST_DATABASE_URL"); u != "" {
		direct = u
	}
	cfg, err := pgx.ParseConfig(direct)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, direct)
	if err != nil {
		t.Skipf("no PostgreSQL at %s: %v", direct, err)
	}
	_ = conn.Close(ctx)
	var raw [6]byte
	_, _ = rand.Read(raw[:])
	schema := "events_backlog_" + hex.EncodeToString(raw[:])
	t.Cleanup(func() {
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, direct)
		if err != nil {
			t.Errorf("drop schema: %v", err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("drop schema: %v", err)
		}
	})
	proxy := newCutProxy(t, net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
	url := fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable", cfg.User, proxy.addr, cfg.Database)
	st, err := store.Open(ctx, store.Options{DatabaseURL: url, Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if err := st.CreateSession(ctx, &store.Session{Name: "outage", State: store.StateIdle}); err != nil {
		t.Fatal(err)
	}
	m := New(Deps{Store: st, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	t.Cleanup(func() { _ = m.Close(context.Background()) })

	m.appendStoreEvents(ctx, "outage", []store.Event{{Turn: 1, Kind: "text", Text: "before"}})
	proxy.cut()
	m.appendStoreEvents(ctx, "outage", []store.Event{{Turn: 1, Kind: "command", Text: "during 1"}})
	m.appendStoreEvents(ctx, "outage", []store.Event{{Turn: 1, Kind: "text", Text: "during 2"}, {Turn: 1, Kind: "usage", Text: "during 3"}})
	if n := m.keptEvents(); n != 3 {
		t.Fatalf("events kept while the database is down: %d, want 3", n)
	}
	downUntil := time.Now()
	proxy.restore(t)
	m.appendStoreEvents(ctx, "outage", []store.Event{{Turn: 1, Kind: "text", Text: "after"}})
	deadline := time.Now().Add(time.Minute)
	for m.keptEvents() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d events still kept a minute after the database came back", m.keptEvents())
		}
		<-time.After(20 * time.Millisecond)
	}
	evs, err := st.ListEvents(ctx, "outage", 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"before", "during 1", "during 2", "during 3", "after"}
	if len(evs) != len(want) {
		t.Fatalf("events after the outage: %+v, want %v", evs, want)
	}
	for i, e := range evs {
		if e.Text != want[i] || e.Seq != int64(i+1) {
			t.Errorf("event %d = seq %d %q, want seq %d %q", i, e.Seq, e.Text, i+1, want[i])
		}
		if i >= 1 && i <= 3 && e.Time.After(downUntil) {
			t.Errorf("event %q is dated %v, after the outage ended (%v): want when it happened", e.Text, e.Time, downUntil)
		}
	}
}
