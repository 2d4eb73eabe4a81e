package app

import (
	"flag"
	"fmt"

	"github.com/hangar-dev/hangar/platform/config"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver/kubernetes"
)

// Config is sandbox-svc's configuration: flags and HANGAR_* variables,
// validated at start.
type Config struct {
	config.Common

	// Addr is where the service listens for gRPC and REST.
	Addr string `env:"HANGAR_SANDBOX_ADDR" flag:"addr" default:"127.0.0.1:7402" help:"host:port for gRPC and REST"`
	// Driver runs sandboxes: local (directories and processes) or
	// kubernetes (pods; the Kube* settings below).
	// PeerAddr makes this one of several replicas (see internal/peers):
	// the address the others reach it at. Empty: the only one.
	PeerAddr string `env:"HANGAR_SANDBOX_PEER_ADDR" flag:"peer-addr" help:"host:port other sandbox-svc replicas reach this one at; set on every replica of several (each with its own HANGAR_SANDBOX_ROOT)"`
	// Root is where the local driver keeps sandboxes (its sandboxes/
	// directory, locked by one process); HANGAR_HOME when empty.
	Root   string `env:"HANGAR_SANDBOX_ROOT" flag:"root" path:"true" help:"directory the local driver keeps sandboxes under (default HANGAR_HOME); one per replica"`
	Driver string `env:"HANGAR_SANDBOX_DRIVER" flag:"driver" default:"local" oneof:"local|kubernetes" help:"sandbox driver: local or kubernetes"`
	// The kubernetes driver's settings.
	KubeConfig    string `env:"HANGAR_KUBE_CONFIG" flag:"kube-config" path:"true" help:"kubeconfig of the cluster sandboxes run in (empty: the in-cluster service account)"`
	KubeNamespace string `env:"HANGAR_KUBE_NAMESPACE" flag:"kube-namespace" default:"hangar" help:"namespace of the sandbox pods"`
	KubeImage     string `env:"HANGAR_KUBE_IMAGE" flag:"kube-image" help:"sandbox image for environments that name none"`
	KubeToolImage string `env:"HANGAR_KUBE_TOOL_IMAGE" flag:"kube-tool-image" help:"hangar's image: an init container copies hangar-sandbox from it into every pod"`
	KubeToolPath  string `env:"HANGAR_KUBE_TOOL_PATH" flag:"kube-tool-path" default:"/usr/local/bin/hangar-sandbox" help:"path of hangar-sandbox in the tool image"`
	KubeNode      string `env:"HANGAR_KUBE_NODE" flag:"kube-node" help:"node to place pods on directly (a cluster without a scheduler); empty: the scheduler picks"`
	// KubeNodeSelector and KubeTolerations place the sandbox pods on a
	// node pool of their own (kubernetes.ParseNodeSelector, ParseTolerations).
	KubeNodeSelector []string `env:"HANGAR_KUBE_NODE_SELECTOR" flag:"kube-node-selector" help:"comma-separated label=value a node must carry for sandbox pods (e.g. hangar.dev/pool=sandbox); empty: any node"`
	KubeTolerations  []string `env:"HANGAR_KUBE_TOLERATIONS" flag:"kube-tolerations" help:"comma-separated node taints sandbox pods tolerate, as kubectl taint writes them: key=value:effect, key:effect or key"`
	// GatewayAddr is the model gateway's address, the one path out of a
	// sandbox with egress none.
	GatewayAddr string `env:"HANGAR_GATEWAY_ADDR" flag:"gateway-addr" default:"127.0.0.1:7404" help:"gateway-svc address reachable from sandboxes"`
	// Tool is the hangar-sandbox binary the driver places in every
	// sandbox. Empty: the one beside this program's executable, else one
	// built from the source tree with the go command into
	// HANGAR_HOME/bin (see app.findTool).
	Tool string `env:"HANGAR_SANDBOX_TOOL" flag:"tool" path:"true" help:"path of the hangar-sandbox binary placed in sandboxes"`
	// Copies is how the local driver copies a sandbox (forks): overlay
	// shares the files until one is written (needs root and overlayfs; it
	// copies files where it can't mount), files copies every file.
	Copies string `env:"HANGAR_SANDBOX_COPIES" flag:"copies" default:"overlay" oneof:"overlay|files" help:"how a sandbox is copied for forks: overlay or files"`
	// Cache is how many released sandboxes (suspended sessions') are kept
	// with their files for their session's resume, which verifies one
	// against its checkpoint before use; 0: none.
	Cache int `env:"HANGAR_SANDBOX_CACHE" flag:"cache" default:"8" min:"0" max:"1024" help:"released sandboxes kept for their session's resume (0: none)"`
	// CacheMB bounds the disk the cached sandboxes take.
	CacheMB int `env:"HANGAR_SANDBOX_CACHE_MB" flag:"cache-mb" default:"20480" min:"1" unit:"MB" help:"disk the cached sandboxes may take, in MB"`
	// BaseLayers is how many base layers the local driver keeps: a create
	// mounts an overlay of a clone shared per (repository, base commit)
	// instead of cloning (needs root and overlayfs; it clones where it
	// can't mount); 0, or HANGAR_SANDBOX_COPIES=files: every create clones.
	BaseLayers int `env:"HANGAR_SANDBOX_BASE_LAYERS" flag:"base-layers" default:"4" min:"0" max:"64" help:"base layers (a shared clone per repository and base commit) the local driver keeps so a create mounts one instead of cloning (0: every create clones)"`
	// LocalWarmPool is how many ready sandboxes the built-in local
	// environment keeps for each of the repositories acquired most
	// recently, so a resume whose sandbox is not cached skips the clone;
	// 0: none.
	LocalWarmPool int `env:"HANGAR_LOCAL_WARM_POOL" flag:"local-warm-pool" default:"1" min:"0" max:"8" help:"ready sandboxes the built-in local environment keeps per recent repository (0: none)"`
	// Isolation is how the local driver isolates sandboxes: bwrap
	// (bubblewrap namespaces; without it no sandbox starts) or none (the
	// operator's explicit opt-out: sandboxes see this machine as the
	// service's user does).
	Isolation string `env:"HANGAR_SANDBOX_ISOLATION" flag:"isolation" default:"bwrap" oneof:"bwrap|none" help:"sandbox isolation: bwrap, or none to run sandboxes unisolated"`
	// ReadOnlyPaths are more host paths sandboxes see read-only (besides
	// the system and the agent CLIs' install directories).
	ReadOnlyPaths []string `env:"HANGAR_SANDBOX_READONLY_PATHS" flag:"readonly-paths" help:"comma-separated host paths sandboxes see read-only"`
	// The agent CLIs sandboxes run (session-svc's settings of the same
	// names): their install directories are bound read-only into every
	// sandbox.
	ClaudeBin    string `env:"HANGAR_CLAUDE_BIN" flag:"claude-bin" default:"claude" help:"Claude Code binary in sandboxes (its install directory is bound read-only)"`
	CodexBin     string `env:"HANGAR_CODEX_BIN" flag:"codex-bin" default:"codex" help:"Codex binary in sandboxes (its install directory is bound read-only)"`
	PiBin        string `env:"HANGAR_PI_BIN" flag:"pi-bin" default:"pi" help:"pi binary in sandboxes (its install directory is bound read-only)"`
	PiNodeBinDir string `env:"HANGAR_PI_NODE_BIN_DIR" flag:"pi-node-bin-dir" help:"directory of the Node for pi (bound read-only)"`
}

// LoadConfig reads the configuration from args and the environment.
func LoadConfig(fs *flag.FlagSet, args []string, lookupEnv func(string) (string, bool)) (Config, error) {
	var cfg Config
	if err := config.Load(&cfg, fs, args, lookupEnv); err != nil {
		return Config{}, err
	}
	return cfg, cfg.Validate()
}

// Validate checks what the tags cannot.
func (c Config) Validate() error {
	if c.Token == "" {
		return fmt.Errorf("HANGAR_TOKEN is required: set it to the API bearer token")
	}
	if c.Driver == "kubernetes" && c.KubeToolImage == "" {
		return fmt.Errorf("HANGAR_KUBE_TOOL_IMAGE is required with HANGAR_SANDBOX_DRIVER=kubernetes: set it to hangar's image (the source of hangar-sandbox)")
	}
	if _, err := kubernetes.ParseNodeSelector(c.KubeNodeSelector); err != nil {
		return fmt.Errorf("HANGAR_KUBE_NODE_SELECTOR: %w", err)
	}
	if _, err := kubernetes.ParseTolerations(c.KubeTolerations); err != nil {
		return fmt.Errorf("HANGAR_KUBE_TOLERATIONS: %w", err)
	}
	return nil
}
