package e2e_test

// Sessions on pods: hangar's stack with HANGAR_SANDBOX_DRIVER=kubernetes
// against a control plane and a real node (kubelet, containerd, runc,
// bridge CNI) the test starts itself (sandbox-svc/kubetest), the real
// Claude Code in the pods (it is in the sandbox image .ci/build-kube-image
// builds), through the real gateway, which listens on the node's address
// so the pods reach it.

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/sandbox-svc/kubetest"
)

// podNode is the real node's name; podImageClaudeEnv is what
// .ci/build-kube-image prints when the image has Claude Code (its path
// there).
const (
	podNode           = "real-node"
	podImageClaudeEnv = "HANGAR_KUBE_IMAGE_CLAUDE"
)

// podCluster is a control plane with a real node, for one test.
type podCluster struct {
	*kubetest.Cluster
	// nodeIP is the node's InternalIP: the pods reach this machine there.
	nodeIP string
	image  string
}

// startPodCluster starts etcd, kube-apiserver and a real node with the
// sandbox image imported, until the test ends; it skips, saying why,
// where a real node cannot run here.
func startPodCluster(t testing.TB) *podCluster {
	t.Helper()
	assets, skip := kubetest.Assets()
	if skip == "" {
		skip = kubetest.NodeSkip(assets)
	}
	if skip != "" {
		t.Skip("no real node for sessions on pods: " + skip)
	}
	ctx := context.Background()
	c, err := kubetest.Start(ctx, assets, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	if err := c.StartNode(ctx, assets, podNode); err != nil {
		log := c.Log("kubelet-" + podNode)
		t.Fatalf("real node: %v\nkubelet log tail:\n%s", err, log[max(0, len(log)-4000):])
	}
	node, err := c.Client.CoreV1().Nodes().Get(ctx, podNode, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pc := &podCluster{Cluster: c, image: os.Getenv(kubetest.ImageEnv)}
	for _, a := range node.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			pc.nodeIP = a.Address
		}
	}
	if pc.nodeIP == "" {
		t.Fatalf("node %s has no InternalIP: %v", podNode, node.Status.Addresses)
	}
	return pc
}

// vars are the settings of a hangar whose sandboxes are pods in ns on the
// node: the gateway on the node's address (a free port), which is what
// sandbox-svc hands the pods (HANGAR_GATEWAY_ADDR) and what the gateway
// points the agents at (its base URL defaults to http://<its address>).
func (c *podCluster) vars(ns string) map[string]string {
	return map[string]string{
		"HANGAR_SANDBOX_DRIVER":  "kubernetes",
		"HANGAR_KUBE_CONFIG":     c.Kubeconfig,
		"HANGAR_KUBE_NAMESPACE":  ns,
		"HANGAR_KUBE_IMAGE":      c.image,
		"HANGAR_KUBE_TOOL_IMAGE": c.image,
		"HANGAR_KUBE_NODE":       podNode,
		"HANGAR_GATEWAY_ADDR":    net.JoinHostPort(c.nodeIP, "0"),
		// The built-in local environment's pool would be pods too.
		"HANGAR_LOCAL_WARM_POOL": "0",
	}
}

// podOf returns the pod of a sandbox (by its id annotation) and whether
// there is one not being deleted.
func (c *podCluster) podOf(t testing.TB, ns, sandboxID string) (*corev1.Pod, bool) {
	t.Helper()
	list, err := c.Client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/managed-by=hangar"})
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range list.Items {
		if p.Annotations["hangar.dev/sandbox-id"] == sandboxID && p.DeletionTimestamp == nil {
			return &list.Items[i], true
		}
	}
	return nil, false
}

// applyPodEnvironment makes environment name from repo's main on the
// kubernetes driver, in the default image.
func (s *stack) applyPodEnvironment(t testing.TB, name, repo string, warmPool int32) {
	t.Helper()
	if _, err := s.sandboxes.ApplyEnvironment(context.Background(), &sandboxv1.ApplyEnvironmentRequest{Environment: &sandboxv1.Environment{
		Name: name, Repository: repo, BaseRef: "main", Egress: sandboxv1.Egress_EGRESS_FULL, WarmPoolSize: warmPool, Driver: "kubernetes",
	}}); err != nil {
		t.Fatalf("apply environment %s: %v", name, err)
	}
}

// The fork's work.
const podForkCmd = `printf 'forked\n' > fork.txt && echo fork-done`

// podTreeScript is sessionE2ETreeScript leaving out the fork's file too,
// listed last.
const podTreeScript = `git rev-parse --abbrev-ref HEAD
git log --format=%s
git ls-files -s | grep -v '	fork.txt$'
git status --porcelain=v1 -uall | grep -v ' second.txt$' | grep -v ' fork.txt$'
git ls-files -co --exclude-standard -z | sort -z | xargs -0 sha256sum | grep -v ' second.txt$' | grep -v ' fork.txt$'
[ -f second.txt ] && echo "second.txt $(sha256sum < second.txt | cut -d' ' -f1)"
[ -f fork.txt ] && echo "fork.txt $(cat fork.txt)"
true`

// TestSessionOnPods is TestSessionSurvivesSuspendAndResume and a fork,
// with Claude Code in pods on a real kubelet: a first turn that commits,
// edits, stages and creates files; a suspend that deletes the pod; a
// second turn in a new pod that resumes the agent's own conversation in
// the work tree as it was left; a fork whose pod starts from the parent's
// checkpoint and whose first request carries the parent's conversation.
func TestSessionOnPods(t *testing.T) {
	if os.Getenv(podImageClaudeEnv) == "" {
		t.Skip(podImageClaudeEnv + " is unset: the sandbox image has no Claude Code (run .ci/install-harnesses, then .ci/build-kube-image, and export what it prints)")
	}
	c := startPodCluster(t)
	ns := c.Namespace(t, "pods-e2e")
	script := sessionE2EScript()
	script.Rules = append(script.Rules, shellRules("fork task", podForkCmd)...)
	vars := c.vars(ns)
	vars["HANGAR_CLAUDE_BIN"] = os.Getenv(podImageClaudeEnv)
	s := startStack(t, stackOptions{script: &script, vars: vars})
	s.applyPodEnvironment(t, "pods", gitRepo(t, nil), 0)
	ctx := context.Background()
	const name = "on-pods"

	onNode := func(what, sandboxID string) {
		t.Helper()
		pod, ok := c.podOf(t, ns, sandboxID)
		if !ok {
			t.Fatalf("%s: no pod in %s for sandbox %s", what, ns, sandboxID)
		}
		if pod.Spec.NodeName != podNode || pod.Status.Phase != corev1.PodRunning || pod.Spec.Containers[0].Image != c.image {
			t.Errorf("%s: pod %s on node %q, phase %s, image %q", what, pod.Name, pod.Spec.NodeName, pod.Status.Phase, pod.Spec.Containers[0].Image)
		}
	}

	if _, err := s.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{
		Name: name, Environment: "pods", Harness: sessionv1.Harness_HARNESS_CLAUDE, Message: "Please do the first task.",
	}); err != nil {
		t.Fatalf("new: %v", err)
	}
	first := s.waitTurn(t, name, 1)
	if first.GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED {
		t.Fatalf("turn 1: %v (%s)", first.GetOutcome(), first.GetOutcomeReason())
	}
	if first.GetCheckpointId() == "" {
		t.Errorf("turn 1 has no checkpoint")
	}
	sess := s.get(t, name)
	if sess.GetState() != sessionv1.SessionState_SESSION_STATE_IDLE || sess.GetConversationId() == "" {
		t.Fatalf("after turn 1: state %v, conversation %q", sess.GetState(), sess.GetConversationId())
	}
	onNode("turn 1", sess.GetSandboxId())
	before := s.mustExec(t, sess.GetSandboxId(), podTreeScript)
	for _, want := range []string{"hangar/session/" + name, "first commit", "M tracked.txt", "A  staged.txt", "?? untracked.txt"} {
		if !strings.Contains(before, want) {
			t.Fatalf("turn 1's work tree lacks %q:\n%s", want, before)
		}
	}

	suspended, err := s.sessions.SuspendSession(ctx, &sessionv1.SuspendSessionRequest{Name: name})
	if err != nil {
		t.Fatalf("suspend: %v", err)
	}
	if suspended.GetSession().GetState() != sessionv1.SessionState_SESSION_STATE_SUSPENDED || suspended.GetSession().GetSandboxId() != "" {
		t.Fatalf("after suspend: %v, sandbox %q", suspended.GetSession().GetState(), suspended.GetSession().GetSandboxId())
	}
	if _, err := s.sandboxes.GetSandbox(ctx, &sandboxv1.GetSandboxRequest{SandboxId: sess.GetSandboxId()}); status.Code(err) != codes.NotFound {
		t.Errorf("the suspended session's sandbox %s still answers: %v", sess.GetSandboxId(), err)
	}
	if pod, ok := c.podOf(t, ns, sess.GetSandboxId()); ok {
		t.Errorf("the suspended session's pod %s is still there", pod.Name)
	}

	if _, err := s.sessions.SendMessage(ctx, &sessionv1.SendMessageRequest{Name: name, Message: "Now the second task."}); err != nil {
		t.Fatalf("send: %v", err)
	}
	second := s.waitTurn(t, name, 2)
	if second.GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED {
		t.Fatalf("turn 2: %v (%s)", second.GetOutcome(), second.GetOutcomeReason())
	}
	tape, err := s.gateway.GetTape(ctx, &gatewayv1.GetTapeRequest{Run: second.GetRunId()})
	if err != nil || len(tape.GetSteps()) == 0 {
		t.Fatalf("tape of turn 2: %v (%d steps)", err, len(tape.GetSteps()))
	}
	if body := string(tape.GetSteps()[0].GetRequest().GetBody()); !strings.Contains(body, "first task") || !strings.Contains(body, "first-done") {
		t.Errorf("turn 2's first model request does not carry turn 1's conversation")
	}
	resumed := s.get(t, name)
	if resumed.GetSandboxId() == "" || resumed.GetSandboxId() == sess.GetSandboxId() {
		t.Fatalf("turn 2 ran in sandbox %q (turn 1's was %q)", resumed.GetSandboxId(), sess.GetSandboxId())
	}
	onNode("turn 2", resumed.GetSandboxId())
	after := s.mustExec(t, resumed.GetSandboxId(), podTreeScript)
	if want := before + "second.txt " + sessionE2ESHA("second\n") + "\n"; after != want {
		t.Errorf("work tree after resume differs.\nbefore turn 2 (+ second.txt):\n%s\nafter:\n%s", want, after)
	}

	forked, err := s.sessions.ForkSession(ctx, &sessionv1.ForkSessionRequest{Name: name, N: 1, Message: "Please do the fork task."})
	if err != nil {
		t.Fatalf("fork: %v", err)
	}
	if len(forked.GetForks()) != 1 {
		t.Fatalf("fork answered %d forks", len(forked.GetForks()))
	}
	fname := forked.GetForks()[0].GetName()
	own := s.waitTurn(t, fname, 3)
	if own.GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_COMPLETED {
		t.Fatalf("the fork's turn: %v (%s)", own.GetOutcome(), own.GetOutcomeReason())
	}
	ftape, err := s.gateway.GetTape(ctx, &gatewayv1.GetTapeRequest{Run: own.GetRunId()})
	if err != nil || len(ftape.GetSteps()) == 0 {
		t.Fatalf("tape of the fork's turn: %v", err)
	}
	if body := string(ftape.GetSteps()[0].GetRequest().GetBody()); !strings.Contains(body, "first-done") || !strings.Contains(body, "second-done") || !strings.Contains(body, "fork task") {
		t.Errorf("the fork's first model request does not carry the parent's conversation")
	}
	fs := s.get(t, fname)
	if fs.GetConversationId() == "" || fs.GetConversationId() == resumed.GetConversationId() {
		t.Errorf("the fork continues conversation %q (parent's %q): want a fork of it", fs.GetConversationId(), resumed.GetConversationId())
	}
	if fs.GetSandboxId() == resumed.GetSandboxId() {
		t.Fatalf("the fork runs in its parent's sandbox")
	}
	onNode("the fork", fs.GetSandboxId())
	got := s.mustExec(t, fs.GetSandboxId(), podTreeScript)
	if want := strings.Replace(after, resumed.GetBranch(), fs.GetBranch(), 1) + "fork.txt forked\n"; got != want {
		t.Errorf("the fork's work tree:\n%s\nwant the parent's plus fork.txt:\n%s", got, want)
	}
	if got := s.mustExec(t, resumed.GetSandboxId(), podTreeScript); got != after {
		t.Errorf("the parent's work tree changed with the fork:\n%s\nwas:\n%s", got, after)
	}
}

// BenchmarkPodSessionResume is BenchmarkSessionResume on pods of a real
// node beside the local driver, in one run: time until a suspended
// session of a 5,000-file repository is ready for its next turn
// (OpenSession: sandbox leased, newest checkpoint restored and verified),
// cold (a new pod or sandbox) and from the warm pool. No agent CLI runs.
func BenchmarkPodSessionResume(b *testing.B) {
	c := startPodCluster(b)
	ns := c.Namespace(b, "pods-bench")
	repo := gitRepo(b, sessionMoreFiles(5000, 8<<10)) // ~40 MB
	pods := startStack(b, stackOptions{vars: c.vars(ns)})
	local := startStack(b, stackOptions{})
	for _, d := range []struct {
		name string
		s    *stack
	}{{"pod", pods}, {"local", local}} {
		for _, p := range []struct {
			name string
			pool int32
		}{{"cold", 0}, {"warm", 1}} {
			env := "bench-" + p.name
			if d.name == "pod" {
				d.s.applyPodEnvironment(b, env, repo, p.pool)
			} else {
				d.s.applyEnvironment(b, env, repo, p.pool, sandboxv1.Egress_EGRESS_FULL)
			}
			b.Run(d.name+"/"+p.name, func(b *testing.B) { benchResume(b, d.s, env, p.pool) })
		}
	}
}

var benchResumeRuns int

// benchResume times OpenSession of a suspended session of env (whose
// warm pool has pool sandboxes), with some work to restore.
func benchResume(b *testing.B, s *stack, env string, pool int32) {
	ctx := context.Background()
	benchResumeRuns++
	name := fmt.Sprintf("resume-%s-%d", env, benchResumeRuns)
	if _, err := s.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{Name: name, Environment: env}); err != nil {
		b.Fatal(err)
	}
	opened, err := s.sessions.OpenSession(ctx, &sessionv1.OpenSessionRequest{Name: name})
	if err != nil {
		b.Fatal(err)
	}
	// Some work to restore: an edit, a new file and a commit.
	if out, code := s.exec(b, opened.GetSession().GetSandboxId(), `printf 'x\n' >> d00/f0000.txt && printf 'new\n' > new.txt && git add new.txt && git -c user.name=t -c user.email=t@t commit -qm work && printf 'more\n' > more.txt`); code != 0 {
		b.Fatalf("work: %s", out)
	}
	suspend := func() {
		if _, err := s.sessions.SuspendSession(ctx, &sessionv1.SuspendSessionRequest{Name: name}); err != nil {
			b.Fatal(err)
		}
		if pool > 0 {
			sessionMoreEventually(b, 5*time.Minute, "the warm pool to be ready", func() bool {
				p, err := s.sandboxes.GetPool(ctx, &sandboxv1.GetPoolRequest{Environment: env})
				return err == nil && p.GetPool().GetReady() >= pool && p.GetPool().GetCreating() == 0
			})
		}
	}
	misses := func() int64 {
		p, err := s.sandboxes.GetPool(ctx, &sandboxv1.GetPoolRequest{Environment: env})
		if err != nil {
			b.Fatal(err)
		}
		return p.GetPool().GetMisses()
	}
	b.StopTimer()
	suspend()
	missesBefore := misses()
	b.StartTimer()
	for b.Loop() {
		if _, err := s.sessions.OpenSession(ctx, &sessionv1.OpenSessionRequest{Name: name}); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		suspend()
		b.StartTimer()
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/resume")
	if pool > 0 {
		// Every timed open was served from the warm pool.
		if n := misses() - missesBefore; n != 0 {
			b.Errorf("%d timed opens missed the warm pool", n)
		}
	}
	o, err := s.sessions.OpenSession(ctx, &sessionv1.OpenSessionRequest{Name: name})
	if err != nil {
		b.Fatal(err)
	}
	if out, _ := s.exec(b, o.GetSession().GetSandboxId(), `git log --format=%s -1; cat more.txt new.txt; tail -c 2 d00/f0000.txt`); out != "work\nmore\nnew\nx\n" {
		b.Errorf("restored tree: %q", out)
	}
}

// TestBadInputOnPods: through hangar, on the real node. An environment
// whose image no registry serves: the session's turn fails with the
// kubelet's reason from the pod's events, and no pod is left. The API
// server unreachable (its only route, a forwarder, closed): opening a
// session is Unavailable naming it, and nothing is left once it is back.
func TestBadInputOnPods(t *testing.T) {
	c := startPodCluster(t)
	ns := c.Namespace(t, "pods-bad")
	// The stack reaches the API server through a forwarder it can lose.
	fw := newTCPForwarder(t, strings.TrimPrefix(c.Host(), "https://"))
	kc, err := os.ReadFile(c.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	host := "https://" + fw.addr()
	kubeconfig := t.TempDir() + "/kubeconfig"
	if err := os.WriteFile(kubeconfig, []byte(strings.Replace(string(kc), c.Host(), host, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	vars := c.vars(ns)
	vars["HANGAR_KUBE_CONFIG"] = kubeconfig
	s := startStack(t, stackOptions{vars: vars})
	ctx := context.Background()
	const unpullable = "registry.invalid/hangar/no-such-image:1"
	if _, err := s.sandboxes.ApplyEnvironment(ctx, &sandboxv1.ApplyEnvironmentRequest{Environment: &sandboxv1.Environment{
		Name: "broken", Repository: gitRepo(t, nil), BaseRef: "main", Egress: sandboxv1.Egress_EGRESS_FULL, Driver: "kubernetes", Image: unpullable,
	}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{
		Name: "broken", Environment: "broken", Harness: sessionv1.Harness_HARNESS_CLAUDE, Message: "Please do the first task.",
	}); err != nil {
		t.Fatalf("new: %v", err)
	}
	turn := s.waitTurn(t, "broken", 1)
	if turn.GetOutcome() != sessionv1.TurnOutcome_TURN_OUTCOME_FAILED || !strings.Contains(turn.GetOutcomeReason(), `Failed to pull image "`+unpullable+`"`) {
		t.Errorf("turn in an environment whose image cannot be pulled: %v (%s), want failed with the pull's event", turn.GetOutcome(), turn.GetOutcomeReason())
	}
	t.Logf("reason: %s", turn.GetOutcomeReason())
	noPods := func(what string) {
		t.Helper()
		list, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range list.Items {
			if p.DeletionTimestamp == nil {
				t.Errorf("%s: pod %s left (phase %s)", what, p.Name, p.Status.Phase)
			}
		}
	}
	noPods("after the failed turn")

	s.applyPodEnvironment(t, "pods", gitRepo(t, nil), 0)
	if _, err := s.sessions.CreateSession(ctx, &sessionv1.CreateSessionRequest{Name: "cut", Environment: "pods"}); err != nil {
		t.Fatal(err)
	}
	fw.close()
	_, err = s.sessions.OpenSession(ctx, &sessionv1.OpenSessionRequest{Name: "cut"})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), host) {
		t.Errorf("open with the API server unreachable: %v, want Unavailable naming %s", err, host)
	}
	t.Logf("error: %v", err)
	fw.reopen(t)
	noPods("with the API server back")
}

// tcpForwarder passes connections on a loopback port to target until
// closed; reopen listens on the same port again.
type tcpForwarder struct {
	target string
	l      net.Listener
	mu     sync.Mutex
	conns  []net.Conn
}

func newTCPForwarder(t testing.TB, target string) *tcpForwarder {
	f := &tcpForwarder{target: target}
	f.listen(t, "127.0.0.1:0")
	t.Cleanup(f.close)
	return f
}

func (f *tcpForwarder) addr() string { return f.l.Addr().String() }

func (f *tcpForwarder) listen(t testing.TB, addr string) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	f.l = l
	go func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", f.target)
			if err != nil {
				in.Close()
				continue
			}
			f.mu.Lock()
			f.conns = append(f.conns, in, out)
			f.mu.Unlock()
			go func() { _, _ = io.Copy(out, in); out.Close() }()
			go func() { _, _ = io.Copy(in, out); in.Close() }()
		}
	}()
}

func (f *tcpForwarder) close() {
	f.l.Close()
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.conns {
		c.Close()
	}
	f.conns = nil
}

func (f *tcpForwarder) reopen(t testing.TB) { f.listen(t, f.addr()) }
