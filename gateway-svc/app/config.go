package app

import (
	"flag"
	"fmt"
	"net/url"

	"github.com/hangar-dev/hangar/platform/config"
	"github.com/hangar-dev/hangar/platform/gcsstore"
)

// Config is gateway-svc's configuration: flags and HANGAR_* variables,
// validated at start.
type Config struct {
	config.Common

	// Addr is where the service listens: the control API (gRPC and REST) and
	// the data plane (/v1/messages, /v1/responses, /v1/chat/completions).
	Addr string `env:"HANGAR_GATEWAY_ADDR" flag:"addr" default:"127.0.0.1:7404" help:"host:port for the control API and the data plane"`
	// PublicURL is the base URL harnesses in sandboxes are pointed at; empty
	// means http://<Addr>.
	PublicURL string `env:"HANGAR_GATEWAY_URL" flag:"public-url" help:"base URL sandboxes use to reach the gateway; empty means http://<addr>"`

	AnthropicURL    string `env:"HANGAR_ANTHROPIC_URL" flag:"anthropic-url" default:"https://api.anthropic.com" help:"Anthropic API base URL, without /v1"`
	AnthropicAPIKey string `env:"HANGAR_ANTHROPIC_API_KEY" flag:"anthropic-api-key" help:"Anthropic API key (prefer the environment variable)"`
	OpenAIURL       string `env:"HANGAR_OPENAI_URL" flag:"openai-url" default:"https://api.openai.com/v1" help:"OpenAI API base URL, with /v1"`
	OpenAIAPIKey    string `env:"HANGAR_OPENAI_API_KEY" flag:"openai-api-key" help:"OpenAI API key (prefer the environment variable)"`
	// FreeModel prices every call at $0.00: hangar up sets it when its
	// upstream is the offline scripted model.
	FreeModel bool `env:"HANGAR_MODEL_FREE" flag:"model-free" help:"price every model call at $0.00 (hangar up's offline scripted model)"`

	// SandboxAddr is sandbox-svc, where the work tree hash of each step is
	// taken (empty: no tree hashes on the tapes).
	SandboxAddr string `env:"HANGAR_SANDBOX_ADDR" flag:"sandbox-addr" default:"127.0.0.1:7402" help:"sandbox-svc gRPC address (work tree hashes for the tapes)"`

	// Store is where model tapes and the run journal live: empty for the
	// data directory (HANGAR_HOME/tapes, one process's own), an absolute
	// directory, or gs://bucket[/prefix]: the checkpoint store, so
	// replicas read each other's tapes (keys tapes/ and runs/, beside
	// checkpoint-svc's checkpoints/ and objects/).
	Store string `env:"HANGAR_SESSION_STORE" flag:"store" help:"store of model tapes and run records: a directory or gs://bucket[/prefix] (the checkpoint store); empty uses the data directory"`

	TapeDays            int    `env:"HANGAR_MODEL_TAPE_DAYS" flag:"model-tape-days" default:"30" min:"1" unit:"days" help:"days a run's model tape is kept"`
	Cache               string `env:"HANGAR_CACHE" flag:"cache" default:"auto" oneof:"auto|5m|1h|off" help:"prompt-cache TTL when neither the session nor its environment sets one"`
	CacheStaggerSeconds int    `env:"HANGAR_CACHE_STAGGER_SECONDS" flag:"cache-stagger-seconds" default:"15" min:"0" unit:"seconds" help:"how long forks hold back for the first sibling to answer (0 = no wait)"`
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
	for _, u := range []struct{ name, value string }{
		{"HANGAR_ANTHROPIC_URL", c.AnthropicURL},
		{"HANGAR_OPENAI_URL", c.OpenAIURL},
		{"HANGAR_GATEWAY_URL", c.PublicURL},
	} {
		if u.value == "" && u.name == "HANGAR_GATEWAY_URL" {
			continue
		}
		parsed, err := url.Parse(u.value)
		if err != nil || (parsed.Scheme != "http" && parsed.Scheme != "https") || parsed.Host == "" {
			return fmt.Errorf("%s=%q: want an http:// or https:// URL", u.name, u.value)
		}
	}
	return gcsstore.CheckStoreSetting(c.Store)
}
