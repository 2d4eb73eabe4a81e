package app

import (
	"flag"
	"fmt"

	"github.com/hangar-dev/hangar/platform/config"
	"github.com/hangar-dev/hangar/platform/gcsstore"
)

// Config is checkpoint-svc's configuration: flags and HANGAR_* variables,
// validated at start.
type Config struct {
	config.Common

	// Addr is where the service listens for gRPC and REST.
	Addr string `env:"HANGAR_CHECKPOINT_ADDR" flag:"addr" default:"127.0.0.1:7403" help:"host:port for gRPC and REST"`
	// Store is where checkpoints live: empty for the data directory
	// (HANGAR_HOME/checkpoints), an absolute path, or gs://bucket[/prefix].
	Store string `env:"HANGAR_SESSION_STORE" flag:"store" help:"checkpoint store (the gateway keeps its tapes there too): a directory or gs://bucket[/prefix]; empty uses the data directory"`
	// VaultKeyFile holds the vault key that wraps every checkpoint's data key.
	VaultKeyFile string `env:"HANGAR_VAULT_KEY_FILE" flag:"vault-key-file" default:"~/.hangar/vault.key" path:"true" help:"file holding the vault key (created with mode 0600 by hangar up)"`

	KeepCheckpoints int `env:"HANGAR_SESSION_KEEP_CHECKPOINTS" flag:"keep-checkpoints" default:"5" min:"1" unit:"checkpoints" help:"checkpoints kept per session"`
	MaxUntrackedMB  int `env:"HANGAR_SESSION_MAX_UNTRACKED_MB" flag:"max-untracked-mb" default:"20" min:"0" unit:"MB" help:"larger untracked tarballs are skipped with a warning"`
	MaxPartMB       int `env:"HANGAR_SESSION_MAX_PART_MB" flag:"max-part-mb" default:"100" min:"1" unit:"MB" help:"larger parts are skipped with a warning"`

	SandboxAddr string `env:"HANGAR_SANDBOX_ADDR" flag:"sandbox-addr" default:"127.0.0.1:7402" help:"sandbox-svc gRPC address"`
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
	return gcsstore.CheckStoreSetting(c.Store)
}
