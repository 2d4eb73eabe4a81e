package server_test

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	"github.com/hangar-dev/hangar/api/sandboxtool/tooltest"
	"github.com/hangar-dev/hangar/platform/fault"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver/drivertest"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver/local"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/pool"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/server"
)

type env struct {
	srv    *server.Server
	client sandboxv1.SandboxServiceClient
	mini   *miniredis.Miniredis
	repo   string
	commit string
}

type unlimited struct{}

func (unlimited) Wait(ctx context.Context) error { return ctx.Err() }

func start(t testing.TB, mod func(*server.Deps)) *env {
	t.Helper()
	repo, commit := drivertest.NewRepo(t, map[string]string{"README.md": "hello\n"})
	mini := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mini.Addr()})
	t.Cleanup(func() { rdb.Close() })
	deps := server.Deps{
		Redis: rdb, Home: t.TempDir(), WorkDir: repo, KeyPrefix: "hangar:test:",
		DestroyHookTimeout: 10 * time.Second, ReapInterval: time.Hour,
		PoolLimiter: func() pool.Limiter { return unlimited{} },
	}
	if mod != nil {
		mod(&deps)
	}
	if deps.Driver == nil {
		drv, err := local.New(local.Options{Root: deps.Home, Tool: tooltest.Path(t)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { drv.Close() }) // after the server's Close below
		deps.Driver = drv
	}
	srv, err := server.New(context.Background(), deps)
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(
		grpc.ChainUnaryInterceptor(fault.UnaryServerInterceptor(nil)), grpc.InitialWindowSize(4<<20), grpc.InitialConnWindowSize(8<<20),
		grpc.ChainStreamInterceptor(fault.StreamServerInterceptor(nil)))
	sandboxv1.RegisterSandboxServiceServer(gs, srv)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(ln)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithInitialWindowSize(4<<20), grpc.WithInitialConnWindowSize(8<<20))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		gs.Stop()
		if err := srv.Close(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return &env{srv: srv, client: sandboxv1.NewSandboxServiceClient(conn), mini: mini, repo: repo, commit: commit}
}

func wantCode(t testing.TB, err error, code codes.Code, contains string) {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != code || !strings.Contains(st.Message(), contains) {
		t.Errorf("got %v %q, want %v containing %q", st.Code(), st.Message(), code, contains)
	}
}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-time.After(2 * time.Millisecond)
	}
}

type execResult struct {
	stdout, stderr string
	exit           *sandboxv1.ExecExit
}

func execOnce(t testing.TB, c sandboxv1.SandboxServiceClient, id string, token uint64, stdin string, argv ...string) (execResult, error) {
	t.Helper()
	stream, err := c.Exec(context.Background())
	if err != nil {
		return execResult{}, err
	}
	if err := stream.Send(&sandboxv1.ExecRequest{Msg: &sandboxv1.ExecRequest_Start{Start: &sandboxv1.ExecStart{SandboxId: id, FencingToken: token, Command: argv}}}); err != nil {
		return execResult{}, err
	}
	if stdin != "" {
		stream.Send(&sandboxv1.ExecRequest{Msg: &sandboxv1.ExecRequest_Stdin{Stdin: []byte(stdin)}})
	}
	stream.Send(&sandboxv1.ExecRequest{Msg: &sandboxv1.ExecRequest_CloseStdin{CloseStdin: true}})
	var out, errOut bytes.Buffer
	for {
		msg, err := stream.Recv()
		if err != nil {
			return execResult{}, err
		}
		switch m := msg.GetMsg().(type) {
		case *sandboxv1.ExecResponse_Stdout:
			out.Write(m.Stdout)
		case *sandboxv1.ExecResponse_Stderr:
			errOut.Write(m.Stderr)
		case *sandboxv1.ExecResponse_Exit:
			return execResult{out.String(), errOut.String(), m.Exit}, nil
		}
	}
}

func TestEnvironments(t *testing.T) {
	e := start(t, nil)
	ctx := context.Background()
	list, err := e.client.ListEnvironments(ctx, &sandboxv1.ListEnvironmentsRequest{})
	if err != nil || len(list.GetEnvironments()) != 1 || list.GetEnvironments()[0].GetName() != "local" || list.GetEnvironments()[0].GetBaseRef() != e.commit {
		t.Fatalf("List = %v %v", list, err)
	}
	_, err = e.client.GetEnvironment(ctx, &sandboxv1.GetEnvironmentRequest{Name: "nope"})
	wantCode(t, err, codes.NotFound, `environment "nope" not found`)
	_, err = e.client.ApplyEnvironment(ctx, &sandboxv1.ApplyEnvironmentRequest{Environment: &sandboxv1.Environment{Name: "Bad_Name", Repository: e.repo}})
	wantCode(t, err, codes.InvalidArgument, "DNS label")
	resp, err := e.client.ApplyEnvironment(ctx, &sandboxv1.ApplyEnvironmentRequest{Environment: &sandboxv1.Environment{
		Name: "web", Repository: e.repo, BaseRef: "main", Egress: sandboxv1.Egress_EGRESS_NONE, Env: map[string]string{"A": "b"}}})
	if err != nil || !resp.GetCreated() || resp.GetEnvironment().GetEgress() != sandboxv1.Egress_EGRESS_NONE {
		t.Fatalf("Apply = %v %v", resp, err)
	}
	got, err := e.client.GetEnvironment(ctx, &sandboxv1.GetEnvironmentRequest{Name: "web"})
	if err != nil || got.GetEnvironment().GetEnv()["A"] != "b" || got.GetEnvironment().GetUpdatedAt() == nil {
		t.Errorf("Get = %v %v", got, err)
	}
	_, err = e.client.GetPool(ctx, &sandboxv1.GetPoolRequest{Environment: "ghost"})
	wantCode(t, err, codes.NotFound, `"ghost"`)
	if _, err := e.client.DeleteEnvironment(ctx, &sandboxv1.DeleteEnvironmentRequest{Name: "web"}); err != nil {
		t.Fatal(err)
	}
	_, err = e.client.DeleteEnvironment(ctx, &sandboxv1.DeleteEnvironmentRequest{Name: "web"})
	wantCode(t, err, codes.NotFound, `"web"`)
}

func TestAcquireExecRelease(t *testing.T) {
	e := start(t, nil)
	ctx := context.Background()
	_, err := e.client.AcquireSandbox(ctx, &sandboxv1.AcquireSandboxRequest{Environment: "missing"})
	wantCode(t, err, codes.NotFound, `environment "missing" not found`)

	acq, err := e.client.AcquireSandbox(ctx, &sandboxv1.AcquireSandboxRequest{Holder: "session/one", WorkKey: "one", Env: map[string]string{"EXTRA": "x"}})
	if err != nil {
		t.Fatal(err)
	}
	sb, l := acq.GetSandbox(), acq.GetLease()
	if sb.GetState() != sandboxv1.SandboxState_SANDBOX_STATE_LEASED || !strings.HasSuffix(sb.GetWorkDir(), "/sandboxes/one/work") ||
		sb.GetBaseCommit() != e.commit || l.GetFencingToken() == 0 || l.GetHolder() != "session/one" || l.GetTtlSeconds() != 60 {
		t.Fatalf("acquire = %v", acq)
	}
	res, err := execOnce(t, e.client, sb.GetId(), l.GetFencingToken(), "piped in", "sh", "-c", `cat; echo; cat README.md; echo "$EXTRA" >&2; exit 7`)
	if err != nil {
		t.Fatal(err)
	}
	if res.stdout != "piped in\nhello\n" || res.stderr != "x\n" || res.exit.GetExitCode() != 7 {
		t.Errorf("exec = %+v", res)
	}
	res, err = execOnce(t, e.client, sb.GetId(), l.GetFencingToken(), "", "no-such-tool", "--x")
	if err != nil || res.exit.GetExitCode() != 127 || !strings.Contains(res.stderr, "no-such-tool") {
		t.Errorf("missing binary = %+v %v", res, err)
	}
	_, err = execOnce(t, e.client, sb.GetId(), l.GetFencingToken()+1, "", "true")
	wantCode(t, err, codes.FailedPrecondition, "stale")
	_, err = execOnce(t, e.client, "sb-nope", 1, "", "true")
	wantCode(t, err, codes.NotFound, `sandbox "sb-nope" not found`)

	// Files.
	if _, err := e.client.WriteFile(ctx, &sandboxv1.WriteFileRequest{SandboxId: sb.GetId(), FencingToken: l.GetFencingToken(), Path: "notes/a.txt", Content: []byte("abc")}); err != nil {
		t.Fatal(err)
	}
	rf, err := e.client.ReadFile(ctx, &sandboxv1.ReadFileRequest{SandboxId: sb.GetId(), FencingToken: l.GetFencingToken(), Path: "notes/a.txt"})
	if err != nil || string(rf.GetContent()) != "abc" || rf.GetInfo().GetType() != sandboxv1.FileType_FILE_TYPE_REGULAR || rf.GetInfo().GetMode() != 0o644 {
		t.Errorf("ReadFile = %v %v", rf, err)
	}
	_, err = e.client.ReadFile(ctx, &sandboxv1.ReadFileRequest{SandboxId: sb.GetId(), FencingToken: l.GetFencingToken(), Path: "../../../etc/passwd"})
	wantCode(t, err, codes.InvalidArgument, "leaves the sandbox")
	_, err = e.client.StatFile(ctx, &sandboxv1.StatFileRequest{SandboxId: sb.GetId(), FencingToken: l.GetFencingToken(), Path: "gone.txt"})
	wantCode(t, err, codes.NotFound, `"gone.txt"`)
	lf, err := e.client.ListFiles(ctx, &sandboxv1.ListFilesRequest{SandboxId: sb.GetId(), FencingToken: l.GetFencingToken()})
	if err != nil || len(lf.GetFiles()) != 3 {
		t.Errorf("ListFiles = %v %v", lf, err)
	}

	// Renew, list, release.
	rl, err := e.client.RenewLease(ctx, &sandboxv1.RenewLeaseRequest{SandboxId: sb.GetId(), FencingToken: l.GetFencingToken(), TtlSeconds: 120})
	if err != nil || rl.GetLease().GetTtlSeconds() != 120 {
		t.Errorf("renew = %v %v", rl, err)
	}
	_, err = e.client.RenewLease(ctx, &sandboxv1.RenewLeaseRequest{SandboxId: sb.GetId(), FencingToken: 1})
	wantCode(t, err, codes.FailedPrecondition, "stale")
	ls, err := e.client.ListSandboxes(ctx, &sandboxv1.ListSandboxesRequest{})
	if err != nil || len(ls.GetSandboxes()) != 1 {
		t.Errorf("list = %v %v", ls, err)
	}
	_, err = e.client.ReleaseSandbox(ctx, &sandboxv1.ReleaseSandboxRequest{SandboxId: sb.GetId(), FencingToken: l.GetFencingToken() + 5})
	wantCode(t, err, codes.FailedPrecondition, "stale")
	if _, err := e.client.ReleaseSandbox(ctx, &sandboxv1.ReleaseSandboxRequest{SandboxId: sb.GetId(), FencingToken: l.GetFencingToken()}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "sandbox gone", func() bool {
		_, err := e.client.GetSandbox(ctx, &sandboxv1.GetSandboxRequest{SandboxId: sb.GetId()})
		return status.Code(err) == codes.NotFound
	})
}

// Stdin and stdout stream through the RPC with backpressure: 64 MiB in and
// out of cat without either side buffering it.
func TestExecStreamsLargeData(t *testing.T) {
	e := start(t, nil)
	acq, err := e.client.AcquireSandbox(context.Background(), &sandboxv1.AcquireSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	const size = 64 << 20
	stream, err := e.client.Exec(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	stream.Send(&sandboxv1.ExecRequest{Msg: &sandboxv1.ExecRequest_Start{Start: &sandboxv1.ExecStart{
		SandboxId: acq.GetSandbox().GetId(), FencingToken: acq.GetLease().GetFencingToken(), Command: []string{"cat"}}}})
	go func() {
		chunk := bytes.Repeat([]byte{'z'}, 32<<10)
		for sent := 0; sent < size; sent += len(chunk) {
			if err := stream.Send(&sandboxv1.ExecRequest{Msg: &sandboxv1.ExecRequest_Stdin{Stdin: chunk}}); err != nil {
				return
			}
		}
		stream.Send(&sandboxv1.ExecRequest{Msg: &sandboxv1.ExecRequest_CloseStdin{CloseStdin: true}})
	}()
	var got, maxChunk int
	for {
		msg, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if out := msg.GetStdout(); out != nil {
			got += len(out)
			maxChunk = max(maxChunk, len(out))
		}
		if ex := msg.GetExit(); ex != nil {
			if ex.GetExitCode() != 0 {
				t.Errorf("exit %v", ex)
			}
			break
		}
	}
	if got != size || maxChunk > server.ExecChunk {
		t.Errorf("got %d bytes (max chunk %d), want %d", got, maxChunk, size)
	}
}

func TestExecCancelKillsProcessGroup(t *testing.T) {
	e := start(t, nil)
	acq, err := e.client.AcquireSandbox(context.Background(), &sandboxv1.AcquireSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	id, tok := acq.GetSandbox().GetId(), acq.GetLease().GetFencingToken()
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := e.client.Exec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	stream.Send(&sandboxv1.ExecRequest{Msg: &sandboxv1.ExecRequest_Start{Start: &sandboxv1.ExecStart{
		SandboxId: id, FencingToken: tok, Command: []string{"sh", "-c", "sleep 1000 & echo $!; wait"}}}})
	msg, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	pid := strings.TrimSpace(string(msg.GetStdout()))
	cancel()
	waitFor(t, "child gone", func() bool {
		r, err := execOnce(t, e.client, id, tok, "", "sh", "-c", "cat /proc/"+pid+"/stat 2>/dev/null | awk '{print $3}'")
		return err == nil && (r.stdout == "" || strings.TrimSpace(r.stdout) == "Z")
	})

	// A signal message reaches the process group.
	stream, err = e.client.Exec(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	stream.Send(&sandboxv1.ExecRequest{Msg: &sandboxv1.ExecRequest_Start{Start: &sandboxv1.ExecStart{SandboxId: id, FencingToken: tok, Command: []string{"sh", "-c", "echo up; sleep 1000"}}}})
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	stream.Send(&sandboxv1.ExecRequest{Msg: &sandboxv1.ExecRequest_Signal{Signal: "TERM"}})
	for {
		msg, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if ex := msg.GetExit(); ex != nil {
			if ex.GetSignal() != "TERM" {
				t.Errorf("exit %v", ex)
			}
			break
		}
	}
}

// AcquireSandbox with copy_of: the copy holds the source's work at its own
// paths; the source's lease must be current and the copy is leased on its
// own.
func TestAcquireCopy(t *testing.T) {
	e := start(t, nil)
	ctx := context.Background()
	src, err := e.client.AcquireSandbox(ctx, &sandboxv1.AcquireSandboxRequest{Holder: "session/a", WorkKey: "a"})
	if err != nil {
		t.Fatal(err)
	}
	sid, stok := src.GetSandbox().GetId(), src.GetLease().GetFencingToken()
	if res, err := execOnce(t, e.client, sid, stok, "", "sh", "-c", `echo work > new.txt && echo "$HOME" > "$HOME/where"`); err != nil || res.exit.GetExitCode() != 0 {
		t.Fatalf("exec: %+v %v", res, err)
	}
	_, err = e.client.AcquireSandbox(ctx, &sandboxv1.AcquireSandboxRequest{WorkKey: "b", CopyOf: sid})
	wantCode(t, err, codes.InvalidArgument, "copy_of_fencing_token")
	_, err = e.client.AcquireSandbox(ctx, &sandboxv1.AcquireSandboxRequest{WorkKey: "b", CopyOf: sid, CopyOfFencingToken: stok + 1})
	wantCode(t, err, codes.FailedPrecondition, "stale")
	_, err = e.client.AcquireSandbox(ctx, &sandboxv1.AcquireSandboxRequest{WorkKey: "b", CopyOf: "sb-nope", CopyOfFencingToken: 1})
	wantCode(t, err, codes.NotFound, "sb-nope")

	cp, err := e.client.AcquireSandbox(ctx, &sandboxv1.AcquireSandboxRequest{Holder: "session/b", WorkKey: "b", CopyOf: sid, CopyOfFencingToken: stok})
	if err != nil {
		t.Fatal(err)
	}
	sb, l := cp.GetSandbox(), cp.GetLease()
	if sb.GetId() == sid || !strings.HasSuffix(sb.GetWorkDir(), "/sandboxes/b/work") || sb.GetBaseCommit() != e.commit ||
		l.GetFencingToken() == 0 || l.GetHolder() != "session/b" {
		t.Fatalf("copy = %v", cp)
	}
	res, err := execOnce(t, e.client, sb.GetId(), l.GetFencingToken(), "", "sh", "-c", `cat new.txt README.md "$HOME/where"`)
	want := "work\nhello\n" + src.GetSandbox().GetHomeDir() + "\n"
	if err != nil || res.stdout != want {
		t.Errorf("copy holds %q (%v), want %q", res.stdout, err, want)
	}
	// Shared where the copy is an overlay mount, and only then.
	if shared := cp.GetSharedCopy(); shared != drivertest.MountPoint(t, filepath.Dir(sb.GetWorkDir())) {
		t.Errorf("shared_copy = %v, but the copy's work tree is mounted: %v", shared, !shared)
	}
	// Once the source has written a file, its writes become a layer of
	// their own over the one it shares: a copy of it still shares.
	if res, err := execOnce(t, e.client, sid, stok, "", "sh", "-c", `echo more >> new.txt`); err != nil || res.exit.GetExitCode() != 0 {
		t.Fatalf("exec: %+v %v", res, err)
	}
	cp2, err := e.client.AcquireSandbox(ctx, &sandboxv1.AcquireSandboxRequest{Holder: "session/c", WorkKey: "c", CopyOf: sid, CopyOfFencingToken: stok})
	if err != nil {
		t.Fatal(err)
	}
	if shared := cp2.GetSharedCopy(); shared != drivertest.MountPoint(t, filepath.Dir(cp2.GetSandbox().GetWorkDir())) {
		t.Errorf("a copy of a source written to since it was shared: shared_copy = %v, but its work tree is mounted: %v", shared, !shared)
	}
	if res, err := execOnce(t, e.client, cp2.GetSandbox().GetId(), cp2.GetLease().GetFencingToken(), "", "cat", "new.txt"); err != nil || res.stdout != "work\nmore\n" {
		t.Errorf("second copy holds %+v %v", res, err)
	}
	if _, err := e.client.ReleaseSandbox(ctx, &sandboxv1.ReleaseSandboxRequest{SandboxId: sid, FencingToken: stok}); err != nil {
		t.Fatal(err)
	}
	// The copy outlives its source.
	if res, err := execOnce(t, e.client, sb.GetId(), l.GetFencingToken(), "", "cat", "new.txt"); err != nil || res.stdout != "work\n" {
		t.Errorf("copy after the source's release: %+v %v", res, err)
	}
}

func TestWarmPool(t *testing.T) {
	e := start(t, nil)
	ctx := context.Background()
	if _, err := e.client.ApplyEnvironment(ctx, &sandboxv1.ApplyEnvironmentRequest{Environment: &sandboxv1.Environment{
		Name: "warm", Repository: e.repo, WarmPoolSize: 2, Setup: []string{"echo ready > .setup"}}}); err != nil {
		t.Fatal(err)
	}
	poolState := func() *sandboxv1.Pool {
		p, err := e.client.GetPool(ctx, &sandboxv1.GetPoolRequest{Environment: "warm"})
		if err != nil {
			t.Fatal(err)
		}
		return p.GetPool()
	}
	waitFor(t, "pool full", func() bool { return poolState().GetReady() == 2 })
	ls, _ := e.client.ListSandboxes(ctx, &sandboxv1.ListSandboxesRequest{Environment: "warm"})
	if len(ls.GetSandboxes()) != 2 || ls.GetSandboxes()[0].GetState() != sandboxv1.SandboxState_SANDBOX_STATE_READY {
		t.Errorf("ready sandboxes = %v", ls)
	}
	acq, err := e.client.AcquireSandbox(ctx, &sandboxv1.AcquireSandboxRequest{Environment: "warm", WorkKey: "sess-w"})
	if err != nil {
		t.Fatal(err)
	}
	if !acq.GetSandbox().GetFromPool() || !strings.HasSuffix(acq.GetSandbox().GetWorkDir(), "/sess-w/work") {
		t.Errorf("acquire = %v", acq.GetSandbox())
	}
	r, err := execOnce(t, e.client, acq.GetSandbox().GetId(), acq.GetLease().GetFencingToken(), "", "sh", "-c", "cat .setup; pwd")
	if err != nil || r.stdout != "ready\n"+acq.GetSandbox().GetWorkDir()+"\n" {
		t.Errorf("warm sandbox exec = %+v %v", r, err)
	}
	cold, err := e.client.AcquireSandbox(ctx, &sandboxv1.AcquireSandboxRequest{Environment: "warm", Cold: true})
	if err != nil || cold.GetSandbox().GetFromPool() {
		t.Fatalf("cold acquire = %v %v", cold, err)
	}
	waitFor(t, "refill", func() bool { p := poolState(); return p.GetReady() == 2 && p.GetHits() == 1 })
	// Released sandboxes are destroyed, never returned to the pool.
	if _, err := e.client.ReleaseSandbox(ctx, &sandboxv1.ReleaseSandboxRequest{SandboxId: acq.GetSandbox().GetId(), FencingToken: acq.GetLease().GetFencingToken()}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "released sandbox gone", func() bool {
		ls, _ := e.client.ListSandboxes(ctx, &sandboxv1.ListSandboxesRequest{Environment: "warm"})
		for _, sb := range ls.GetSandboxes() {
			if sb.GetId() == acq.GetSandbox().GetId() {
				return false
			}
		}
		return len(ls.GetSandboxes()) == 3 // two ready plus the cold one
	})
	// Drain the pool and miss.
	for range 2 {
		if _, err := e.client.AcquireSandbox(ctx, &sandboxv1.AcquireSandboxRequest{Environment: "warm"}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.client.ApplyEnvironment(ctx, &sandboxv1.ApplyEnvironmentRequest{Environment: &sandboxv1.Environment{
		Name: "warm", Repository: e.repo, WarmPoolSize: 0, Setup: []string{"echo ready > .setup"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.AcquireSandbox(ctx, &sandboxv1.AcquireSandboxRequest{Environment: "warm"}); err != nil {
		t.Fatal(err)
	}
	if p := poolState(); p.GetTargetSize() != 0 {
		t.Errorf("pool after shrink = %v", p)
	}
}

// Destroy hooks: a subscriber hears of a destruction before it happens,
// can still use the sandbox with the notice's token, and destruction
// waits for its ack. Covers release and lease expiry.
func TestDestroyHooks(t *testing.T) {
	e := start(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	watch, err := e.client.WatchDestroys(ctx, &sandboxv1.WatchDestroysRequest{Subscriber: "session-svc"})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "subscribed", func() bool { return e.srv.Subscribers() == 1 })

	for _, tc := range []struct {
		name   string
		reason sandboxv1.DestroyReason
		end    func(id string, tok uint64)
	}{
		{"release", sandboxv1.DestroyReason_DESTROY_REASON_RELEASE, func(id string, tok uint64) {
			if _, err := e.client.ReleaseSandbox(ctx, &sandboxv1.ReleaseSandboxRequest{SandboxId: id, FencingToken: tok}); err != nil {
				t.Fatal(err)
			}
		}},
		{"expiry", sandboxv1.DestroyReason_DESTROY_REASON_LEASE_EXPIRED, func(id string, tok uint64) {
			e.mini.FastForward(2 * time.Second)
			_, err := execOnce(t, e.client, id, tok, "", "true")
			wantCode(t, err, codes.FailedPrecondition, "expired")
			go e.srv.ReapNow(context.Background())
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			acq, err := e.client.AcquireSandbox(ctx, &sandboxv1.AcquireSandboxRequest{Holder: "session/h", TtlSeconds: 1})
			if err != nil {
				t.Fatal(err)
			}
			id, tok := acq.GetSandbox().GetId(), acq.GetLease().GetFencingToken()
			tc.end(id, tok)
			msg, err := watch.Recv()
			if err != nil {
				t.Fatal(err)
			}
			n := msg.GetNotice()
			if n.GetSandboxId() != id || n.GetReason() != tc.reason || n.GetHolder() != "session/h" || n.GetFencingToken() != tok {
				t.Fatalf("notice = %v", n)
			}
			// Still whole until the ack.
			r, err := execOnce(t, e.client, id, n.GetFencingToken(), "", "cat", "README.md")
			if err != nil || r.stdout != "hello\n" {
				t.Fatalf("exec during the hook = %+v %v", r, err)
			}
			g, err := e.client.GetSandbox(ctx, &sandboxv1.GetSandboxRequest{SandboxId: id})
			if err != nil || g.GetSandbox().GetState() != sandboxv1.SandboxState_SANDBOX_STATE_DESTROYING {
				t.Fatalf("state during hook = %v %v", g, err)
			}
			if _, err := e.client.AckDestroy(ctx, &sandboxv1.AckDestroyRequest{NoticeId: n.GetNoticeId(), Subscriber: "session-svc"}); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "destroyed", func() bool {
				_, err := e.client.GetSandbox(ctx, &sandboxv1.GetSandboxRequest{SandboxId: id})
				return status.Code(err) == codes.NotFound
			})
		})
	}
	_, err = e.client.AckDestroy(ctx, &sandboxv1.AckDestroyRequest{NoticeId: "dn-unknown", Subscriber: "session-svc"})
	wantCode(t, err, codes.NotFound, "dn-unknown")
}

func TestTerminal(t *testing.T) {
	e := start(t, nil)
	ctx := context.Background()
	acq, err := e.client.AcquireSandbox(ctx, &sandboxv1.AcquireSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	id, tok := acq.GetSandbox().GetId(), acq.GetLease().GetFencingToken()
	open := func(termID string) (sandboxv1.SandboxService_AttachTerminalClient, string, chan *sandboxv1.ExecExit, context.CancelFunc) {
		sctx, cancel := context.WithCancel(ctx)
		st, err := e.client.AttachTerminal(sctx)
		if err != nil {
			t.Fatal(err)
		}
		st.Send(&sandboxv1.AttachTerminalRequest{Msg: &sandboxv1.AttachTerminalRequest_Open{Open: &sandboxv1.TerminalOpen{
			SandboxId: id, FencingToken: tok, Command: []string{"sh"}, TerminalId: termID, Size: &sandboxv1.TerminalSize{Rows: 24, Cols: 80},
			PathPrepend: []string{"/opt/hangar-test/bin"}}}})
		first, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		exit := make(chan *sandboxv1.ExecExit, 1)
		go func() {
			for {
				m, err := st.Recv()
				if err != nil {
					close(exit)
					return
				}
				if ex := m.GetExit(); ex != nil {
					exit <- ex
					return
				}
			}
		}()
		return st, first.GetTerminalId(), exit, cancel
	}
	st, termID, firstDone, cancel := open("")
	defer cancel()
	if !strings.HasPrefix(termID, "term-") {
		t.Fatalf("terminal id %q", termID)
	}
	st.Send(&sandboxv1.AttachTerminalRequest{Msg: &sandboxv1.AttachTerminalRequest_Input{Input: []byte("export MARK=kept; echo one-$((1+1))\n")}})
	st.Send(&sandboxv1.AttachTerminalRequest{Msg: &sandboxv1.AttachTerminalRequest_Resize{Resize: &sandboxv1.TerminalSize{Rows: 33, Cols: 99}}})
	st.Send(&sandboxv1.AttachTerminalRequest{Msg: &sandboxv1.AttachTerminalRequest_Input{Input: []byte("stty size\n")}})
	st.Send(&sandboxv1.AttachTerminalRequest{Msg: &sandboxv1.AttachTerminalRequest_Input{Input: []byte("echo \"path=$PATH\"\n")}})
	// A second client attaching while the first is attached is refused.
	waitFor(t, "size echoed", func() bool { return terminalSaw(e, id, tok, termID, "33 99") })
	// path_prepend goes in front of the sandbox's PATH.
	waitFor(t, "PATH echoed", func() bool { return terminalSaw(e, id, tok, termID, "/opt/hangar-test/bin:") })
	st.Send(&sandboxv1.AttachTerminalRequest{Msg: &sandboxv1.AttachTerminalRequest_Detach{Detach: true}})
	// The server ends the stream once it has detached the client.
	if ex, ok := <-firstDone; ok {
		t.Fatalf("detach ended the process: %v", ex)
	}
	cancel()

	// Re-attach: the shell kept its state; scrollback is replayed.
	st2, again, exit, cancel2 := open(termID)
	defer cancel2()
	if again != termID {
		t.Fatalf("re-attached to %q", again)
	}
	st2.Send(&sandboxv1.AttachTerminalRequest{Msg: &sandboxv1.AttachTerminalRequest_Input{Input: []byte("echo $MARK; exit 3\n")}})
	ex := <-exit
	if ex.GetExitCode() != 3 {
		t.Errorf("terminal exit = %v", ex)
	}
	stream, _ := e.client.AttachTerminal(ctx)
	stream.Send(&sandboxv1.AttachTerminalRequest{Msg: &sandboxv1.AttachTerminalRequest_Open{Open: &sandboxv1.TerminalOpen{SandboxId: id, FencingToken: tok, TerminalId: "term-nope"}}})
	_, err = stream.Recv()
	wantCode(t, err, codes.NotFound, "term-nope")
}

// terminalSaw reports whether the terminal's scrollback (seen by a
// re-attach attempt) contains want. While a client is attached, another
// attach is refused, so this reads the scrollback through a second open
// only after checking the refusal.
func terminalSaw(e *env, id string, tok uint64, termID, want string) bool {
	st, err := e.client.AttachTerminal(context.Background())
	if err != nil {
		return false
	}
	defer st.CloseSend()
	st.Send(&sandboxv1.AttachTerminalRequest{Msg: &sandboxv1.AttachTerminalRequest_Open{Open: &sandboxv1.TerminalOpen{SandboxId: id, FencingToken: tok, TerminalId: termID}}})
	_, err = st.Recv()
	if status.Code(err) != codes.FailedPrecondition {
		return false
	}
	return e.srv.TerminalScrollbackContains(termID, want)
}

func TestCloseDestroysWithShutdown(t *testing.T) {
	e := start(t, nil)
	ctx := context.Background()
	watchCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	watch, err := e.client.WatchDestroys(watchCtx, &sandboxv1.WatchDestroysRequest{Subscriber: "s"})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "subscribed", func() bool { return e.srv.Subscribers() == 1 })
	acq, err := e.client.AcquireSandbox(ctx, &sandboxv1.AcquireSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	closed := make(chan error, 1)
	go func() { closed <- e.srv.Close(ctx) }()
	msg, err := watch.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if msg.GetNotice().GetReason() != sandboxv1.DestroyReason_DESTROY_REASON_SHUTDOWN || msg.GetNotice().GetSandboxId() != acq.GetSandbox().GetId() {
		t.Errorf("notice = %v", msg.GetNotice())
	}
	e.client.AckDestroy(ctx, &sandboxv1.AckDestroyRequest{NoticeId: msg.GetNotice().GetNoticeId(), Subscriber: "s"})
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	_, err = e.client.AcquireSandbox(ctx, &sandboxv1.AcquireSandboxRequest{})
	wantCode(t, err, codes.Unavailable, "shutting down")
}

// A session's --repo: GetEnvironment checks and resolves the other
// repository, AcquireSandbox clones it (not the environment's), and exec's
// path_prepend puts directories before the sandbox's own PATH, which stays.
func TestAdHocRepositoryAndPathPrepend(t *testing.T) {
	// Unisolated: the prepended directory is one of the test's, which an
	// isolated sandbox does not see (only the agent CLIs' are bound).
	e := start(t, func(d *server.Deps) {
		drv, err := local.New(local.Options{Root: d.Home, Tool: tooltest.Path(t), Isolation: local.IsolationNone})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { drv.Close() })
		d.Driver = drv
	})
	ctx := context.Background()
	other, otherCommit := drivertest.NewRepo(t, map[string]string{"OTHER.md": "other\n"})

	got, err := e.client.GetEnvironment(ctx, &sandboxv1.GetEnvironmentRequest{Name: "local", ResolveBase: true})
	if err != nil || got.GetBaseCommit() != e.commit || got.GetEnvironment().GetRepository() != e.repo {
		t.Errorf("GetEnvironment(local, resolve) = %v, %v; want base %s", got, err, e.commit)
	}
	got, err = e.client.GetEnvironment(ctx, &sandboxv1.GetEnvironmentRequest{Name: "local", Repository: other})
	if err != nil || got.GetBaseCommit() != otherCommit || got.GetEnvironment().GetRepository() != other || got.GetEnvironment().GetName() != "local" {
		t.Errorf("GetEnvironment(local, repository) = %v, %v; want %s at %s", got, err, other, otherCommit)
	}
	_, err = e.client.GetEnvironment(ctx, &sandboxv1.GetEnvironmentRequest{Name: "local", Repository: filepath.Join(other, "gone")})
	wantCode(t, err, codes.FailedPrecondition, "is not a directory on hangar's machine")

	acq, err := e.client.AcquireSandbox(ctx, &sandboxv1.AcquireSandboxRequest{Holder: "session/adhoc", WorkKey: "adhoc", Repository: other})
	if err != nil {
		t.Fatal(err)
	}
	sb, token := acq.GetSandbox(), acq.GetLease().GetFencingToken()
	if sb.GetBaseCommit() != otherCommit {
		t.Errorf("ad-hoc sandbox base %s, want %s", sb.GetBaseCommit(), otherCommit)
	}
	res, err := execOnce(t, e.client, sb.GetId(), token, "", "cat", "OTHER.md")
	if err != nil || res.stdout != "other\n" {
		t.Errorf("the ad-hoc sandbox's work tree: %+v %v", res, err)
	}

	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "only-here"), []byte("#!/bin/sh\necho found\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	stream, err := e.client.Exec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&sandboxv1.ExecRequest{Msg: &sandboxv1.ExecRequest_Start{Start: &sandboxv1.ExecStart{
		SandboxId: sb.GetId(), FencingToken: token, PathPrepend: []string{bin},
		Command: []string{"sh", "-c", `only-here && echo "$PATH"`},
	}}}); err != nil {
		t.Fatal(err)
	}
	stream.CloseSend()
	var out bytes.Buffer
	for {
		msg, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if o := msg.GetStdout(); o != nil {
			out.Write(o)
		}
		if msg.GetExit() != nil {
			break
		}
	}
	// The driver's tool directory (hangar-agent) comes before everything.
	if want := bin + ":" + os.Getenv("PATH") + "\n"; !strings.HasPrefix(out.String(), "found\n") || !strings.HasSuffix(out.String(), ":"+want) {
		t.Errorf("exec with path_prepend printed %q, want found and a PATH ending in %q", out.String(), want)
	}
}

// TestLocalDefaultPool: the built-in local environment, which has no
// warm_pool_size of its own, keeps a pool per recent repository once one
// is acquired, so the next acquire (a resume whose sandbox was not
// cached) takes a ready sandbox; cold acquires and other repositories
// don't take from it, and only the most recent repositories keep one.
func TestLocalDefaultPool(t *testing.T) {
	e := start(t, func(d *server.Deps) { d.LocalPoolSize, d.LocalPoolRepos, d.LocalPoolQuiet = 1, 1, time.Millisecond })
	ctx := context.Background()
	acquire := func(req *sandboxv1.AcquireSandboxRequest) *sandboxv1.AcquireSandboxResponse {
		t.Helper()
		acq, err := e.client.AcquireSandbox(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return acq
	}
	if first := acquire(&sandboxv1.AcquireSandboxRequest{WorkKey: "first"}); first.GetSandbox().GetFromPool() {
		t.Fatalf("the first acquire of a repository found a pool: %v", first.GetSandbox())
	}
	waitFor(t, "the default pool to fill", func() bool { return e.srv.LocalPoolReady(e.repo) == 1 })
	warm := acquire(&sandboxv1.AcquireSandboxRequest{WorkKey: "second"})
	if !warm.GetSandbox().GetFromPool() || !strings.HasSuffix(warm.GetSandbox().GetWorkDir(), "/second/work") {
		t.Fatalf("second acquire = %v", warm.GetSandbox())
	}
	if r, err := execOnce(t, e.client, warm.GetSandbox().GetId(), warm.GetLease().GetFencingToken(), "", "cat", "README.md"); err != nil || r.stdout != "hello\n" {
		t.Errorf("pooled sandbox = %+v %v", r, err)
	}
	waitFor(t, "the default pool to refill", func() bool { return e.srv.LocalPoolReady(e.repo) == 1 })
	if cold := acquire(&sandboxv1.AcquireSandboxRequest{WorkKey: "cold", Cold: true}); cold.GetSandbox().GetFromPool() {
		t.Errorf("a cold acquire took from the pool: %v", cold.GetSandbox())
	}
	other, _ := drivertest.NewRepo(t, map[string]string{"OTHER.md": "other\n"})
	if o := acquire(&sandboxv1.AcquireSandboxRequest{WorkKey: "other", Repository: other}); o.GetSandbox().GetFromPool() {
		t.Errorf("another repository's acquire took from the pool: %v", o.GetSandbox())
	}
	// One repository kept: the other's pool replaced the first's.
	if n := e.srv.LocalPoolReady(e.repo); n != -1 {
		t.Errorf("the older repository's pool is still there (%d ready)", n)
	}
	waitFor(t, "the other repository's pool to fill", func() bool { return e.srv.LocalPoolReady(other) == 1 })
}
