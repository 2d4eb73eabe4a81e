// Package kubernetes is the sandbox driver that runs each sandbox as a pod
// (k8s.io/client-go): the environment's image in a configured namespace,
// labelled with its environment and sandbox id, the work tree and home on
// an emptyDir, hangar-sandbox copied in by an init container from hangar's
// own image. Exec, terminals and file access go through the API server
// (remotecommand over WebSocket, SPDY when the server refuses the upgrade).
//
// Pods outlive the process that made them: each driver holds a
// coordination.k8s.io Lease named after its replica, renewed while it runs;
// pods whose owner's Lease has run out are leftovers (LeftoverCleaner). A
// pod deleted or evicted by someone else is reported from a pod watch while
// its grace period keeps it whole, so its destroy hooks (checkpoint) run.
// Warm pods are claimed by a label update carrying the resourceVersion the
// claimer read: of two replicas claiming one pod, the API server lets one
// write win and the other gets a Conflict.
package kubernetes

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver"
)

// Labels and annotations on the objects this driver makes.
const (
	LabelManagedBy   = "app.kubernetes.io/managed-by"
	managedBy        = "hangar"
	LabelSandbox     = "hangar.dev/sandbox"
	LabelEnvironment = "hangar.dev/environment"
	// LabelOwner is the replica whose driver owns the pod.
	LabelOwner = "hangar.dev/owner"
	// LabelState is warm (made for a pool, unclaimed) or claimed.
	LabelState = "hangar.dev/state"
	// LabelPool is a warm pod's pool (driver.Spec.Pool).
	LabelPool = "hangar.dev/pool"
	// LabelWorkKey is a hash of the work key (labels hold 63 characters,
	// work keys 128); the key itself is in AnnotationWorkKey.
	LabelWorkKey      = "hangar.dev/work-key-hash"
	AnnotationWorkKey = "hangar.dev/work-key"
	AnnotationID      = "hangar.dev/sandbox-id"
	AnnotationEnv     = "hangar.dev/environment"

	StateWarm    = "warm"
	StateClaimed = "claimed"
)

// Paths inside a sandbox pod.
const (
	// SandboxesDir is the emptyDir holding <work key>/work and <work key>/home.
	SandboxesDir = "/hangar/sandboxes"
	// ToolDir is the emptyDir the init container copies hangar-sandbox into.
	ToolDir = "/hangar/bin"
	// RunDir holds the process-group files of running execs.
	RunDir = "/hangar/run"
	// container is the sandbox's container in its pod.
	container = "sandbox"
	// DefaultToolPath is hangar-sandbox's path in hangar's image.
	DefaultToolPath = "/usr/local/bin/hangar-sandbox"
)

// Options configure the driver.
type Options struct {
	// Config reaches the API server; see ConfigFrom.
	Config *rest.Config
	// Namespace holds the sandbox pods.
	Namespace string
	// Image is the sandbox image for environments that name none.
	Image string
	// ToolImage is hangar's image: the init container copies ToolPath
	// (DefaultToolPath when empty) from it into every pod. It needs sh and cp.
	ToolImage string
	ToolPath  string
	// NodeName, when set, places pods on that node directly (a cluster
	// without a scheduler, as in the tests); the scheduler picks otherwise.
	NodeName string
	// NodeSelector and Tolerations place the sandbox pods: the labels
	// their nodes must carry and the taints they tolerate (a sandbox node
	// pool kept apart from the control plane's).
	NodeSelector map[string]string
	Tolerations  []corev1.Toleration
	// Gateway is the model gateway's IP:port, or a Service's name:port
	// (name, name.namespace): a pod with egress none may reach only it (a
	// NetworkPolicy: the IP, or the Service's pods on its target port), and
	// HANGAR_GATEWAY_ADDR names it (a Service by its cluster IP).
	Gateway string
	// ReadyTimeout bounds a pod's start (pull, init, ready); 3 min when 0.
	ReadyTimeout time.Duration
	// DeleteGrace is how long a pod deleted by someone else stays whole for
	// its destroy hooks (terminationGracePeriodSeconds); 60 s when 0.
	DeleteGrace time.Duration
	// Replica names this driver's process (the owner of its pods and of
	// its Lease); random when empty.
	Replica string
	// LeaseDuration is how long a replica's Lease lasts without renewal;
	// 30 s when 0 (renewed every third of it).
	LeaseDuration time.Duration
	Logger        *slog.Logger
	Now           func() time.Time
}

// ConfigFrom loads a client configuration: the kubeconfig at path, or the
// in-cluster service account when path is empty.
func ConfigFrom(path string) (*rest.Config, error) {
	if path == "" {
		cfg, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("no kubeconfig given and not running in a cluster: %w", err)
		}
		return cfg, nil
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	return cfg, nil
}

// ErrUnavailable: the API server cannot be reached (a
// driver.ErrBackendUnavailable).
var ErrUnavailable = fmt.Errorf("%w: kubernetes API server", driver.ErrBackendUnavailable)

// Driver runs sandboxes as pods.
type Driver struct {
	opts   Options
	client k8s.Interface
	log    *slog.Logger
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	live    map[string]*Sandbox // by pod name
	keys    map[string]string   // work key -> pod name
	onGone  func(id string)
	closed  bool
	watchOK chan struct{}
	// route is the resolved gateway (gateway.go), once a create needed it.
	route *gatewayRoute
}

// New connects to the API server (Unavailable naming it when it cannot be
// reached), takes this replica's Lease and starts the pod watch.
func New(ctx context.Context, opts Options) (*Driver, error) {
	if opts.Config == nil {
		return nil, errors.New("kubernetes driver: Config is required")
	}
	if opts.Namespace == "" {
		return nil, errors.New("kubernetes driver: Namespace is required")
	}
	if opts.ToolImage == "" {
		return nil, errors.New("kubernetes driver: ToolImage (hangar's image, the source of hangar-sandbox) is required")
	}
	if opts.ToolPath == "" {
		opts.ToolPath = DefaultToolPath
	}
	if opts.ReadyTimeout <= 0 {
		opts.ReadyTimeout = 3 * time.Minute
	}
	if opts.DeleteGrace <= 0 {
		opts.DeleteGrace = time.Minute
	}
	if opts.LeaseDuration <= 0 {
		opts.LeaseDuration = 30 * time.Second
	}
	if opts.Replica == "" {
		opts.Replica = "r-" + randomHex(5)
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	cfg := rest.CopyConfig(opts.Config)
	if cfg.Timeout == 0 {
		cfg.Timeout = 30 * time.Second
	}
	opts.Config = cfg
	client, err := k8s.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client for %s: %w", cfg.Host, err)
	}
	d := &Driver{opts: opts, client: client, log: opts.Logger.With("driver", "kubernetes"),
		live: map[string]*Sandbox{}, keys: map[string]string{}, watchOK: make(chan struct{})}
	if _, err := client.Discovery().ServerVersion(); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrUnavailable, cfg.Host, err)
	}
	if err := d.renewLease(ctx); err != nil {
		return nil, fmt.Errorf("replica lease in namespace %s: %w", opts.Namespace, d.mapErr(err))
	}
	d.ctx, d.cancel = context.WithCancel(context.WithoutCancel(ctx))
	d.wg.Add(2)
	go d.leaseLoop()
	go d.watchLoop()
	return d, nil
}

// Name is "kubernetes".
func (d *Driver) Name() string { return "kubernetes" }

// Replica is the name this driver owns its pods and Lease under.
func (d *Driver) Replica() string { return d.opts.Replica }

// Client is the driver's API client (for tests and tools).
func (d *Driver) Client() k8s.Interface { return d.client }

// Close stops the lease renewal and the watch and deletes the replica's
// Lease (its pods are the server's to destroy first). Pods still alive
// then become leftovers for the next replica.
func (d *Driver) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	d.mu.Unlock()
	d.cancel()
	d.wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := d.client.CoordinationV1().Leases(d.opts.Namespace).Delete(ctx, d.leaseName(), metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return d.mapErr(err)
	}
	return nil
}

// NotifyGone registers fn, called (once, in its own goroutine) with the
// id of a live sandbox whose pod someone else deleted or evicted, while
// the pod's grace period still keeps it whole.
func (d *Driver) NotifyGone(fn func(id string)) {
	d.mu.Lock()
	d.onGone = fn
	d.mu.Unlock()
}

func (d *Driver) leaseName() string { return "hangar-sandbox-svc-" + d.opts.Replica }

// renewLease creates or renews this replica's Lease.
func (d *Driver) renewLease(ctx context.Context) error {
	leases := d.client.CoordinationV1().Leases(d.opts.Namespace)
	now := metav1.NewMicroTime(d.opts.Now())
	secs := int32(d.opts.LeaseDuration / time.Second)
	holder := d.opts.Replica
	l, err := leases.Get(ctx, d.leaseName(), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: d.leaseName(), Labels: map[string]string{LabelManagedBy: managedBy}},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &secs, AcquireTime: &now, RenewTime: &now},
		}, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	l.Spec.RenewTime, l.Spec.LeaseDurationSeconds, l.Spec.HolderIdentity = &now, &secs, &holder
	_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
	return err
}

func (d *Driver) leaseLoop() {
	defer d.wg.Done()
	t := time.NewTicker(d.opts.LeaseDuration / 3)
	defer t.Stop()
	for {
		select {
		case <-d.ctx.Done():
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(d.ctx, d.opts.LeaseDuration/3)
			if err := d.renewLease(ctx); err != nil && d.ctx.Err() == nil {
				d.log.Warn("replica lease not renewed", slog.String("replica", d.opts.Replica), slog.Any("error", err))
			}
			cancel()
		}
	}
}

// watchLoop watches this replica's pods and reports the ones someone
// else deletes (deletionTimestamp set, or the pod gone) while they are
// live sandboxes here.
func (d *Driver) watchLoop() {
	defer d.wg.Done()
	sel := LabelManagedBy + "=" + managedBy + "," + LabelOwner + "=" + d.opts.Replica
	first := true
	for d.ctx.Err() == nil {
		w, err := d.client.CoreV1().Pods(d.opts.Namespace).Watch(d.ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			if d.ctx.Err() == nil {
				d.log.Warn("pod watch failed", slog.Any("error", err))
			}
			select {
			case <-d.ctx.Done():
				return
			case <-time.After(time.Second):
			}
			continue
		}
		if first {
			close(d.watchOK)
			first = false
		}
		for ev := range w.ResultChan() {
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			if ev.Type == watch.Deleted || (ev.Type == watch.Modified && pod.DeletionTimestamp != nil) {
				d.podGoing(pod.Name)
			}
		}
		w.Stop()
	}
}

// podGoing reports a live sandbox whose pod is being deleted by someone
// other than its Destroy.
func (d *Driver) podGoing(name string) {
	d.mu.Lock()
	sb := d.live[name]
	fn := d.onGone
	d.mu.Unlock()
	if sb == nil || fn == nil || !sb.markGone() {
		return
	}
	d.log.Info("sandbox pod deleted by someone else", slog.String("sandbox", sb.spec.ID), slog.String("pod", name))
	go fn(sb.spec.ID)
}

// mapErr turns a failure to reach the API server into ErrUnavailable
// naming it.
func (d *Driver) mapErr(err error) error {
	if err == nil {
		return nil
	}
	var netErr net.Error
	if errors.As(err, &netErr) || apierrors.IsServiceUnavailable(err) || apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err) {
		return fmt.Errorf("%w: %s: %v", ErrUnavailable, d.opts.Config.Host, err)
	}
	return err
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// gatewayHostPort splits the gateway address; ok is false when it is not
// an IP with a port (a NetworkPolicy names IPs).
func gatewayHostPort(addr string) (net.IP, int32, bool) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, 0, false
	}
	ip := net.ParseIP(host)
	p, err := strconv.Atoi(port)
	if ip == nil || err != nil || p <= 0 || p > 65535 {
		return nil, 0, false
	}
	return ip, int32(p), true
}
