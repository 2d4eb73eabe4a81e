package kubetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Environment variables .ci/build-kube-image prints: the sandbox image as
// a docker archive, and its name.
const (
	ImageArchiveEnv = "HANGAR_KUBE_IMAGE_ARCHIVE"
	ImageEnv        = "HANGAR_KUBE_IMAGE"
)

// PodSubnet is the real node's pod network (the bridge CNI plugin's); the
// node reaches this machine at its first address, 10.244.0.1.
const PodSubnet = "10.244.0.0/24"

// NodeSkip says why a real node (kubelet, containerd, runc, CNI) cannot
// start here, or "" when it can be tried.
func NodeSkip(assets string) string {
	if os.Geteuid() != 0 {
		return "a real node needs root (kubelet, containerd)"
	}
	for _, b := range []string{"containerd", "ctr", "runc"} {
		if _, err := exec.LookPath(b); err != nil {
			return b + " not found: apt-get install containerd runc containernetworking-plugins"
		}
	}
	if _, err := os.Stat("/usr/lib/cni/bridge"); err != nil {
		return "CNI plugins not found in /usr/lib/cni: apt-get install containernetworking-plugins"
	}
	if _, err := os.Stat(filepath.Join(assets, "kubelet")); err != nil {
		return "no kubelet in " + assets + ": run .ci/build-kube (without --no-kubelet)"
	}
	if a := os.Getenv(ImageArchiveEnv); a == "" || os.Getenv(ImageEnv) == "" {
		return ImageArchiveEnv + "/" + ImageEnv + " unset: run .ci/build-kube-image and export what it prints"
	}
	return ""
}

// StartNode runs containerd (with runc and the bridge CNI plugin) and a
// kubelet registering the node name, imports the sandbox image and waits
// for the node to be Ready.
func (c *Cluster) StartNode(ctx context.Context, assets, name string) error {
	dir := filepath.Join(c.dir, "node-"+name)
	image := os.Getenv(ImageEnv)
	sock := filepath.Join(dir, "containerd.sock")
	for _, d := range []string{"root", "state", "cni", "kubelet"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	containerd := fmt.Sprintf(`version = 2
root = %q
state = %q
[grpc]
  address = %q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  # Without CAP_SYS_RESOURCE (a container or VM sandbox) runc cannot lower
  # oom_score_adj; the kubelet asks -998 for every pod sandbox.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = %q
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      Root = %q
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), sock, image, filepath.Join(dir, "cni"), filepath.Join(dir, "runc"))
	if err := os.WriteFile(filepath.Join(dir, "containerd.toml"), []byte(containerd), 0o644); err != nil {
		return err
	}
	cni := `{"cniVersion": "1.0.0", "name": "hangar-test", "plugins": [
  {"type": "bridge", "bridge": "hangar-cni0", "isGateway": true, "ipMasq": false,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.0.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "loopback"}]}`
	if err := os.WriteFile(filepath.Join(dir, "cni", "10-hangar.conflist"), []byte(cni), 0o644); err != nil {
		return err
	}
	if err := c.run("containerd", "containerd-"+name, "--config", filepath.Join(dir, "containerd.toml")); err != nil {
		return err
	}
	// Before containerd stops (the kubelet stopped first): its containers
	// killed. After: whatever is left of them (shims, mounts, the bridge).
	c.beforeStop(len(c.procs)-1, func() { killTasks(sock) })
	c.afterStop(func() { cleanNode(dir, "hangar-cni0") })
	if err := waitSocket(ctx, sock); err != nil {
		return fmt.Errorf("containerd: %w (log %s)", err, filepath.Join(c.dir, "containerd-"+name+".log"))
	}
	c.mu.Lock()
	c.nodeSock = sock
	c.mu.Unlock()
	if err := c.ImportImage(ctx, os.Getenv(ImageArchiveEnv)); err != nil {
		return err
	}
	ip, err := hostIP()
	if err != nil {
		return err
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	kubelet := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %s
port: %d
readOnlyPort: 0
healthzPort: 0
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
cgroupsPerQOS: false
enforceNodeAllocatable: []
localStorageCapacityIsolation: false
containerRuntimeEndpoint: unix://%s
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "1Mi", nodefs.available: "1%%", imagefs.available: "1%%", nodefs.inodesFree: "1%%"}
serializeImagePulls: false
registerNode: true
resolvConf: ""
oomScoreAdj: 0
`, ip, port, sock)
	if err := os.WriteFile(filepath.Join(dir, "kubelet.yaml"), []byte(kubelet), 0o644); err != nil {
		return err
	}
	if err := c.run(filepath.Join(assets, "kubelet"), "kubelet-"+name, "--kubeconfig", c.Kubeconfig, "--config", filepath.Join(dir, "kubelet.yaml"),
		"--root-dir", filepath.Join(dir, "kubelet"), "--hostname-override", name, "--node-ip", ip, "--v", "1"); err != nil {
		return err
	}
	if !c.awaitNodeReady(ctx, name, 3*time.Minute, 200*time.Millisecond) {
		return fmt.Errorf("kubelet node %s not ready (log %s)", name, filepath.Join(c.dir, "kubelet-"+name+".log"))
	}
	return nil
}

// hostIP is this machine's first global IPv4 address outside the pods'
// bridge: the kubelet refuses a loopback node IP (the node then has no
// address, and the API server cannot reach it for exec).
func hostIP() (string, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return "", fmt.Errorf("host address: %w", err)
	}
	_, pods, _ := net.ParseCIDR(PodSubnet)
	for _, a := range addrs {
		n, ok := a.(*net.IPNet)
		if !ok || n.IP.To4() == nil || !n.IP.IsGlobalUnicast() || pods.Contains(n.IP) {
			continue
		}
		return n.IP.String(), nil
	}
	return "", errors.New("no global IPv4 address on this machine for the kubelet's node IP")
}

// Log returns a started process's log (for test failures).
func (c *Cluster) Log(name string) string {
	b, _ := os.ReadFile(filepath.Join(c.dir, name+".log"))
	return string(b)
}

func waitSocket(ctx context.Context, sock string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		if conn, err := net.Dial("unix", sock); err == nil {
			conn.Close()
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s did not open", sock)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// killTasks kills every container task containerd at sock runs.
func killTasks(sock string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ctr", "--address", sock, "-n", "k8s.io", "tasks", "ls", "-q").Output()
	if err != nil {
		return
	}
	for _, id := range strings.Fields(string(out)) {
		_ = exec.CommandContext(ctx, "ctr", "--address", sock, "-n", "k8s.io", "tasks", "kill", "-a", "-s", "SIGKILL", id).Run()
	}
	for _, id := range strings.Fields(string(out)) {
		_ = exec.CommandContext(ctx, "ctr", "--address", sock, "-n", "k8s.io", "tasks", "delete", "-f", id).Run()
	}
}

// cleanNode ends the processes still naming the node's directory (the
// containerd shims), unmounts what is mounted under it and deletes the
// CNI bridge.
func cleanNode(dir, bridge string) {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, f := range procs {
		b, err := os.ReadFile(f)
		if err != nil || !bytes.Contains(b, []byte(dir)) {
			continue
		}
		if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(f))); err == nil && pid != os.Getpid() {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	mounts, _ := os.ReadFile("/proc/self/mounts")
	lines := strings.Split(string(mounts), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if f := strings.Fields(lines[i]); len(f) > 1 && strings.HasPrefix(f[1], dir+"/") {
			_ = syscall.Unmount(f[1], syscall.MNT_DETACH)
		}
	}
	_ = exec.Command("ip", "link", "delete", bridge).Run()
}

// ImportImage loads an image archive (docker or OCI) into the real node's
// containerd.
func (c *Cluster) ImportImage(ctx context.Context, archive string) error {
	c.mu.Lock()
	sock := c.nodeSock
	c.mu.Unlock()
	if sock == "" {
		return errors.New("no real node runs")
	}
	imp := exec.CommandContext(ctx, "ctr", "--address", sock, "-n", "k8s.io", "images", "import", archive)
	if out, err := imp.CombinedOutput(); err != nil {
		return fmt.Errorf("ctr images import: %w: %s", err, out)
	}
	return nil
}
