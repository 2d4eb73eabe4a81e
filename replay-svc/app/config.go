package app

import (
	"flag"
	"fmt"

	"github.com/hangar-dev/hangar/platform/config"
)

// Config is replay-svc's configuration: flags and HANGAR_* variables,
// validated at start.
type Config struct {
	config.Common

	// Addr is where the service listens for gRPC and REST.
	Addr string `env:"HANGAR_REPLAY_ADDR" flag:"addr" default:"127.0.0.1:7405" help:"host:port for gRPC and REST"`
	// DatabaseURL selects PostgreSQL for fork records; empty means SQLite
	// under HANGAR_HOME.
	DatabaseURL string `env:"HANGAR_DATABASE_URL" flag:"database-url" help:"postgres:// URL; empty uses SQLite in the data directory"`

	SessionAddr    string `env:"HANGAR_SESSION_ADDR" flag:"session-addr" default:"127.0.0.1:7401" help:"session-svc gRPC address"`
	SandboxAddr    string `env:"HANGAR_SANDBOX_ADDR" flag:"sandbox-addr" default:"127.0.0.1:7402" help:"sandbox-svc gRPC address"`
	CheckpointAddr string `env:"HANGAR_CHECKPOINT_ADDR" flag:"checkpoint-addr" default:"127.0.0.1:7403" help:"checkpoint-svc gRPC address"`
	GatewayAddr    string `env:"HANGAR_GATEWAY_ADDR" flag:"gateway-addr" default:"127.0.0.1:7404" help:"gateway-svc gRPC address"`
	// ContinuationsMax bounds a fork's live continuations (spec: at most 10).
	ContinuationsMax int `env:"HANGAR_REPLAY_MAX_CONTINUATIONS" flag:"max-continuations" default:"10" min:"0" max:"10" unit:"continuations" help:"most live continuations per fork"`
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
