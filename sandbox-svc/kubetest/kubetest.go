// Package kubetest starts a real Kubernetes control plane for tests (the
// kubernetes driver's, and the deploy module's: it is not internal): etcd
// and kube-apiserver (built from the Go module proxy by .ci/build-kube)
// and, optionally, kwok as a node that runs pod lifecycles. The binaries
// come from $HANGAR_KUBE_ASSETS; tests skip, saying so, when it is unset
// or lacks them.
package kubetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// AssetsEnv names the directory holding etcd, kube-apiserver and kwok.
const AssetsEnv = "HANGAR_KUBE_ASSETS"

// Cluster is a running control plane.
type Cluster struct {
	Config     *rest.Config
	Client     k8s.Interface
	Kubeconfig string
	dir        string
	procs      []proc
	mu         sync.Mutex
	kwokNode   string
	// nodeSock is the real node's containerd socket, once it runs.
	nodeSock string
	// before[i] runs before procs[i] is stopped; after, once all are.
	before map[int][]func()
	after  []func()
}

func (c *Cluster) beforeStop(i int, fn func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.before == nil {
		c.before = map[int][]func(){}
	}
	c.before[i] = append(c.before[i], fn)
}

func (c *Cluster) afterStop(fn func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.after = append(c.after, fn)
}

// Assets returns the binaries' directory, or why tests must skip.
func Assets() (string, string) {
	dir := os.Getenv(AssetsEnv)
	if dir == "" {
		return "", AssetsEnv + " is unset: run .ci/build-kube (it builds etcd, kube-apiserver and kwok from the Go module proxy) and export what it prints"
	}
	for _, b := range []string{"etcd", "kube-apiserver"} {
		if st, err := os.Stat(filepath.Join(dir, b)); err != nil || st.Mode()&0o111 == 0 {
			return "", fmt.Sprintf("%s=%s has no %s: run .ci/build-kube", AssetsEnv, dir, b)
		}
	}
	return dir, ""
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Start runs etcd and kube-apiserver in dir (a directory the caller
// removes) and waits until the API server is ready. Stop ends them.
func Start(ctx context.Context, assets, dir string) (*Cluster, error) {
	c := &Cluster{dir: dir}
	ok := false
	defer func() {
		if !ok {
			c.Stop()
		}
	}()
	etcdPort, err := freePort()
	if err != nil {
		return nil, err
	}
	peerPort, err := freePort()
	if err != nil {
		return nil, err
	}
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(etcdPort)
	if err := c.run(filepath.Join(assets, "etcd"), "etcd",
		"--data-dir", filepath.Join(dir, "etcd"), "--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", "http://127.0.0.1:"+strconv.Itoa(peerPort), "--initial-advertise-peer-urls", "http://127.0.0.1:"+strconv.Itoa(peerPort),
		"--initial-cluster", "default=http://127.0.0.1:"+strconv.Itoa(peerPort), "--log-level", "warn", "--unsafe-no-fsync"); err != nil {
		return nil, err
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	keyFile := filepath.Join(dir, "sa.key")
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600); err != nil {
		return nil, err
	}
	token := "hangar-test-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if err := os.WriteFile(filepath.Join(dir, "tokens.csv"), []byte(token+",admin,admin,system:masters\n"), 0o600); err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	if err := c.run(filepath.Join(assets, "kube-apiserver"), "kube-apiserver",
		"--etcd-servers", etcdURL, "--bind-address", "127.0.0.1", "--secure-port", strconv.Itoa(port),
		"--cert-dir", filepath.Join(dir, "certs"), "--token-auth-file", filepath.Join(dir, "tokens.csv"),
		"--authorization-mode", "RBAC", "--service-account-issuer", "https://hangar.test",
		"--service-account-key-file", keyFile, "--service-account-signing-key-file", keyFile,
		"--service-cluster-ip-range", "10.0.0.0/24", "--disable-admission-plugins", "ServiceAccount",
		"--enable-priority-and-fairness=false",
		// A real node registers its name (not resolvable here) and
		// this machine's address: exec and logs reach its kubelet there.
		"--kubelet-preferred-address-types=InternalIP", "--v=0"); err != nil {
		return nil, err
	}
	c.Config = &rest.Config{
		Host: "https://127.0.0.1:" + strconv.Itoa(port), BearerToken: token,
		TLSClientConfig: rest.TLSClientConfig{Insecure: true}, QPS: 200, Burst: 400,
	}
	if c.Client, err = k8s.NewForConfig(c.Config); err != nil {
		return nil, err
	}
	if err := c.waitReady(ctx); err != nil {
		return nil, err
	}
	c.Kubeconfig = filepath.Join(dir, "kubeconfig")
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: test, cluster: {server: %q, insecure-skip-tls-verify: true}}]
users: [{name: admin, user: {token: %q}}]
contexts: [{name: test, context: {cluster: test, user: admin}}]
current-context: test
`, c.Config.Host, token)
	if err := os.WriteFile(c.Kubeconfig, []byte(kc), 0o600); err != nil {
		return nil, err
	}
	ok = true
	return c, nil
}

func (c *Cluster) run(bin, name string, args ...string) error {
	log, err := os.Create(filepath.Join(c.dir, name+".log"))
	if err != nil {
		return err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("start %s: %w", name, err)
	}
	done := make(chan struct{})
	c.mu.Lock()
	c.procs = append(c.procs, proc{cmd: cmd, done: done})
	c.mu.Unlock()
	go func() { _ = cmd.Wait(); log.Close(); close(done) }()
	return nil
}

type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// waitReady polls /readyz until it answers ok.
func (c *Cluster) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	var last string
	for {
		body, err := c.Client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err == nil && bytes.Equal(bytes.TrimSpace(body), []byte("ok")) {
			break
		}
		if err != nil {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kube-apiserver not ready: %s (logs in %s)", last, c.dir)
		case <-time.After(200 * time.Millisecond):
		}
	}
	// The default service account namespace objects are made by a
	// controller that does not run here; namespaces work without them.
	return nil
}

// Host is the API server's URL.
func (c *Cluster) Host() string { return c.Config.Host }

// Namespace creates a namespace for one test.
func (c *Cluster) Namespace(t testing.TB, name string) string {
	t.Helper()
	_, err := c.Client.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
	return name
}

// StartKwok runs kwok as the node named node: it marks the node ready and
// moves pods bound to it through their lifecycle (Running and Ready in a
// fraction of a second; deleted when asked). Extra stage files (YAML) add
// behaviour, such as failing some pods.
func (c *Cluster) StartKwok(ctx context.Context, assets, node string, extraStages ...string) error {
	bin := filepath.Join(assets, "kwok")
	if _, err := os.Stat(bin); err != nil {
		return fmt.Errorf("%s has no kwok: run .ci/build-kube", assets)
	}
	stages := filepath.Join(assets, "kwok-stages")
	var docs []string
	for _, f := range []string{"node/fast/node-initialize.yaml", "node/heartbeat/node-heartbeat.yaml",
		"pod/fast/pod-ready.yaml", "pod/fast/pod-complete.yaml", "pod/fast/pod-delete.yaml"} {
		b, err := os.ReadFile(filepath.Join(stages, f))
		if err != nil {
			return fmt.Errorf("kwok stage: %w", err)
		}
		docs = append(docs, string(b))
	}
	docs = append(docs, extraStages...)
	cfg := filepath.Join(c.dir, "kwok-"+node+".yaml")
	if err := os.WriteFile(cfg, []byte(strings.Join(docs, "\n---\n")), 0o600); err != nil {
		return err
	}
	if _, err := c.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name: node, Labels: map[string]string{"type": "kwok", "kubernetes.io/hostname": node},
		Annotations: map[string]string{"kwok.x-k8s.io/node": "fake"}}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create node %s: %w", node, err)
	}
	if err := c.run(bin, "kwok-"+node, "--kubeconfig", c.Kubeconfig, "--config", cfg,
		"--manage-all-nodes=false", "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
		"--node-lease-duration-seconds=40", "--server-address=127.0.0.1:0"); err != nil {
		return err
	}
	if !c.awaitNodeReady(ctx, node, 2*time.Minute, 100*time.Millisecond) {
		return fmt.Errorf("kwok node %s not ready (logs in %s)", node, c.dir)
	}
	return nil
}

// awaitNodeReady polls node every interval until it is Ready (true) or
// timeout has passed (false).
func (c *Cluster) awaitNodeReady(ctx context.Context, node string, timeout, interval time.Duration) bool {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err == nil {
			for _, cond := range n.Status.Conditions {
				if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
					return true
				}
			}
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(interval):
		}
	}
}

// Stop ends the processes it started, the last started first.
func (c *Cluster) Stop() {
	c.mu.Lock()
	procs, before, after := c.procs, c.before, c.after
	c.procs, c.before, c.after = nil, nil, nil
	c.mu.Unlock()
	defer func() {
		for _, fn := range after {
			fn()
		}
	}()
	for i := len(procs) - 1; i >= 0; i-- {
		for _, fn := range before[i] {
			fn()
		}
		p := procs[i]
		_ = p.cmd.Process.Signal(os.Interrupt)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
}
