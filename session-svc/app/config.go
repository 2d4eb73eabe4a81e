package app

import (
	"flag"
	"fmt"
	"time"

	"github.com/hangar-dev/hangar/platform/config"
)

// Config is session-svc's configuration: flags and HANGAR_* variables,
// validated at start. The settings table of spec/sessions.md lives here.
type Config struct {
	config.Common

	// Addr is where the service listens for gRPC and REST.
	Addr string `env:"HANGAR_SESSION_ADDR" flag:"addr" default:"127.0.0.1:7401" help:"host:port for gRPC and REST"`
	// DatabaseURL selects PostgreSQL; empty means SQLite under HANGAR_HOME.
	DatabaseURL string `env:"HANGAR_DATABASE_URL" flag:"database-url" help:"postgres:// URL; empty uses SQLite in the data directory"`

	SandboxAddr    string `env:"HANGAR_SANDBOX_ADDR" flag:"sandbox-addr" default:"127.0.0.1:7402" help:"sandbox-svc gRPC address"`
	CheckpointAddr string `env:"HANGAR_CHECKPOINT_ADDR" flag:"checkpoint-addr" default:"127.0.0.1:7403" help:"checkpoint-svc gRPC address"`
	GatewayAddr    string `env:"HANGAR_GATEWAY_ADDR" flag:"gateway-addr" default:"127.0.0.1:7404" help:"gateway-svc gRPC address"`

	ForkMax             int    `env:"HANGAR_FORK_MAX" flag:"fork-max" default:"8" min:"1" max:"64" unit:"forks" help:"most forks per fork_session call"`
	Cache               string `env:"HANGAR_CACHE" flag:"cache" default:"auto" oneof:"auto|5m|1h|off" help:"prompt-cache TTL when neither the session nor its environment sets one"`
	CacheStaggerSeconds int    `env:"HANGAR_CACHE_STAGGER_SECONDS" flag:"cache-stagger-seconds" default:"15" min:"0" unit:"seconds" help:"how long forks hold back for the first sibling to answer (0 = no wait)"`
	IdleMinutes         int    `env:"HANGAR_SESSION_IDLE_MINUTES" flag:"session-idle-minutes" default:"30" min:"0" unit:"minutes" help:"suspend after this long idle (0 = never)"`
	CheckpointMinutes   int    `env:"HANGAR_SESSION_CHECKPOINT_MINUTES" flag:"session-checkpoint-minutes" default:"10" min:"1" unit:"minutes" help:"periodic checkpoint while changed"`
	SweepSeconds        int    `env:"HANGAR_SESSION_SWEEP_SECONDS" flag:"session-sweep-seconds" default:"30" min:"1" max:"3600" unit:"seconds" help:"how often the idle clock, periodic checkpoints and recovery of stopped replicas' sessions run"`
	TurnTimeoutMinutes  int    `env:"HANGAR_SESSION_TURN_TIMEOUT_MINUTES" flag:"session-turn-timeout-minutes" default:"120" min:"1" unit:"minutes" help:"longest a turn may run"`
	HarnessRepo         string `env:"HANGAR_HARNESS_REPO" flag:"harness-repo" help:"repository of harness locks (harnesses.lock.yaml)"`
	HarnessDrift        string `env:"HANGAR_HARNESS_DRIFT" flag:"harness-drift" default:"warn" oneof:"warn|fail" help:"what a thawed session's turn 1 does on drift"`

	// Where the agent CLIs are, as a sandbox sees them (the local driver
	// shares the host's filesystem; .ci/install-harnesses prints these).
	ClaudeBin    string `env:"HANGAR_CLAUDE_BIN" flag:"claude-bin" default:"claude" help:"Claude Code binary in sandboxes"`
	CodexBin     string `env:"HANGAR_CODEX_BIN" flag:"codex-bin" default:"codex" help:"Codex binary in sandboxes"`
	PiBin        string `env:"HANGAR_PI_BIN" flag:"pi-bin" default:"pi" help:"pi binary in sandboxes"`
	PiNodeBinDir string `env:"HANGAR_PI_NODE_BIN_DIR" flag:"pi-node-bin-dir" help:"directory of a Node >= 22.19 for pi, put first on its PATH"`

	// Clock drives the idle clock; zero means real time. Not a setting:
	// tests set it.
	Clock Clock
	// SoleReplica says this is the only session-svc on its records (hangar
	// up with its embedded Redis): at start, a session found resuming or
	// suspending was left so by this service's own previous process. Not a
	// setting: hangar up sets it.
	SoleReplica bool
}

// Clock is the time the session lifecycle sees: Now for the idle clock and
// holds, Tick for its sweeps (idle suspension, periodic checkpoints).
type Clock struct {
	Now  func() time.Time
	Tick <-chan time.Time
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
	return nil
}
