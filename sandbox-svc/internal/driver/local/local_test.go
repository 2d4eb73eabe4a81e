package local_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver/drivertest"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver/local"
)

func newDriver(t *testing.T, gw local.Gateway) *local.Driver {
	t.Helper()
	return newDriverOpts(t, local.Options{Gateway: gw})
}

func newDriverOpts(t *testing.T, opts local.Options) *local.Driver {
	t.Helper()
	opts.Root = t.TempDir()
	d, err := local.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func TestConformance(t *testing.T) {
	drivertest.Run(t, func(t *testing.T) driver.Driver { return newDriver(t, local.Gateway{}) })
}

func TestDestroyRemovesDirectory(t *testing.T) {
	repo, _ := drivertest.NewRepo(t, map[string]string{"a": "b"})
	d := newDriver(t, local.Gateway{})
	sb, err := d.Create(context.Background(), driver.Spec{ID: "x1", WorkKey: "sess", Repository: repo})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Dir(sb.Info().WorkDir)
	if dir != filepath.Join(d.Dir(), "sess") {
		t.Errorf("sandbox dir = %s", dir)
	}
	if err := sb.Destroy(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("sandbox dir after destroy: %v", err)
	}
}

// The gateway stays reachable from an egress-none sandbox through the
// relay, over TCP and over a unix socket, while other host ports are not.
func TestGatewayRelay(t *testing.T) {
	repo, _ := drivertest.NewRepo(t, map[string]string{"a": "b"})
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "gateway:"+r.URL.Path) })

	tcpLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "gw.sock")
	unixLn, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	for _, ln := range []net.Listener{tcpLn, unixLn} {
		srv := &http.Server{Handler: handler}
		go srv.Serve(ln)
		t.Cleanup(func() { srv.Close() })
	}
	other, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()

	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	freeAddr := free.Addr().String()
	free.Close()

	cases := []struct {
		name string
		gw   local.Gateway
	}{
		{"tcp", local.ParseGateway(tcpLn.Addr().String())},
		{"unix", local.Gateway{Listen: freeAddr, Target: "unix:" + sock}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := newDriver(t, tc.gw)
			sb, err := d.Create(context.Background(), driver.Spec{ID: "relay-" + tc.name, Repository: repo, Egress: driver.EgressNone})
			if err != nil {
				t.Fatal(err)
			}
			defer sb.Destroy(context.Background())
			out, errOut, st := drivertest.Run1(t, sb, driver.ExecRequest{Argv: []string{"sh", "-c", `curl -sS -m 10 "http://$HANGAR_GATEWAY_ADDR/v1/messages"`}})
			if st.Code != 0 || out != "gateway:/v1/messages" {
				t.Errorf("through the relay: %q %q %+v", out, errOut, st)
			}
			_, _, st = drivertest.Run1(t, sb, driver.ExecRequest{Argv: []string{"curl", "-sS", "-m", "10", "http://" + other.Addr().String() + "/"}})
			if st.Code == 0 {
				t.Errorf("a non-gateway host port is reachable under egress none")
			}
		})
	}
}

func TestParseGateway(t *testing.T) {
	if g := local.ParseGateway("127.0.0.1:8080"); g.Listen != "127.0.0.1:8080" || g.Target != "127.0.0.1:8080" {
		t.Errorf("tcp: %+v", g)
	}
	if g := local.ParseGateway("unix:/run/gw.sock"); g.Listen != local.DefaultRelayListen || g.Target != "unix:/run/gw.sock" {
		t.Errorf("unix: %+v", g)
	}
}
