package config_test

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hangar-dev/hangar/platform/config"
)

type pool struct {
	Size int `env:"HANGAR_POOL_SIZE" flag:"pool-size" default:"2" max:"64" help:"warm sandboxes kept ready"`
}

type serviceConfig struct {
	config.Common
	IdleMinutes int           `env:"HANGAR_SESSION_IDLE_MINUTES" flag:"session-idle-minutes" default:"30" min:"0" unit:"minutes" help:"idle time before a session stops"`
	Ratio       float64       `env:"HANGAR_RATIO" flag:"ratio" default:"0.5" min:"0" max:"1" help:"sampling ratio"`
	Timeout     time.Duration `env:"HANGAR_TIMEOUT" flag:"timeout" default:"30s" min:"1s" help:"call timeout"`
	Verbose     bool          `env:"HANGAR_VERBOSE" flag:"verbose" help:"log more"`
	MaxBytes    int64         `env:"HANGAR_MAX_BYTES" flag:"max-bytes" default:"1048576" help:"largest upload"`
	Peers       []string      `env:"HANGAR_PEERS" flag:"peers" help:"peer addresses"`
	Drivers     []string      `env:"HANGAR_DRIVERS" flag:"drivers" default:"local" oneof:"local|docker|kubernetes" help:"sandbox drivers"`
	Cache       string        `env:"HANGAR_CACHE" flag:"cache" default:"~/cache" path:"true" help:"cache directory"`
	Pool        pool
	ignored     string //nolint:unused // unexported fields are skipped
	Untagged    string
}

func env(kv ...string) func(string) (string, bool) {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) (string, bool) {
		v, ok := m[k]
		return v, ok
	}
}

func TestLoad(t *testing.T) {
	t.Parallel()
	home, err := os.UserHomeDir()
	if err != nil {
		t.Fatalf("UserHomeDir: %v", err)
	}
	defaults := serviceConfig{
		Common: config.Common{
			Home:         filepath.Join(home, ".hangar"),
			LogLevel:     "info",
			LogFormat:    "text",
			MaxRequestMB: 64,
		},
		IdleMinutes: 30,
		Ratio:       0.5,
		Timeout:     30 * time.Second,
		MaxBytes:    1 << 20,
		Drivers:     []string{"local"},
		Cache:       filepath.Join(home, "cache"),
		Pool:        pool{Size: 2},
	}
	with := func(change func(c *serviceConfig)) serviceConfig {
		c := defaults
		change(&c)
		return c
	}

	tests := []struct {
		name    string
		args    []string
		env     func(string) (string, bool)
		want    serviceConfig
		wantErr string
	}{
		{
			name: "defaults",
			env:  env(),
			want: defaults,
		},
		{
			name: "env overrides defaults",
			env: env(
				"HANGAR_HOME", "/srv/hangar",
				"HANGAR_TOKEN", "s3cret",
				"HANGAR_LOG_LEVEL", "debug",
				"HANGAR_LOG_FORMAT", "json",
				"HANGAR_OTLP_ENDPOINT", "collector:4317",
				"HANGAR_REDIS_URL", "redis://127.0.0.1:6379/0",
				"HANGAR_SESSION_IDLE_MINUTES", "0",
				"HANGAR_RATIO", "1",
				"HANGAR_TIMEOUT", "2m",
				"HANGAR_VERBOSE", "true",
				"HANGAR_MAX_BYTES", "9000000000",
				"HANGAR_PEERS", "a:1, b:2,,",
				"HANGAR_DRIVERS", "docker,kubernetes",
				"HANGAR_POOL_SIZE", "64",
			),
			want: with(func(c *serviceConfig) {
				c.Home = "/srv/hangar"
				c.Token = "s3cret"
				c.LogLevel = "debug"
				c.LogFormat = "json"
				c.OTLPEndpoint = "collector:4317"
				c.RedisURL = "redis://127.0.0.1:6379/0"
				c.IdleMinutes = 0
				c.Ratio = 1
				c.Timeout = 2 * time.Minute
				c.Verbose = true
				c.MaxBytes = 9000000000
				c.Peers = []string{"a:1", "b:2"}
				c.Drivers = []string{"docker", "kubernetes"}
				c.Pool.Size = 64
			}),
		},
		{
			name: "flag overrides env",
			args: []string{"-log-level", "warn", "-session-idle-minutes=5", "-verbose", "-pool-size", "3", "-home", "~/elsewhere"},
			env:  env("HANGAR_LOG_LEVEL", "debug", "HANGAR_SESSION_IDLE_MINUTES", "10", "HANGAR_POOL_SIZE", "7"),
			want: with(func(c *serviceConfig) {
				c.LogLevel = "warn"
				c.IdleMinutes = 5
				c.Verbose = true
				c.Pool.Size = 3
				c.Home = filepath.Join(home, "elsewhere")
			}),
		},
		{
			name: "empty env counts as unset",
			env:  env("HANGAR_HOME", "", "HANGAR_LOG_LEVEL", ""),
			want: defaults,
		},
		{
			name: "empty flag sets an empty string",
			args: []string{"-cache="},
			env:  env("HANGAR_CACHE", "/tmp/cache"),
			want: with(func(c *serviceConfig) { c.Cache = "" }),
		},
		{
			name: "bool flag set false",
			args: []string{"-verbose=false"},
			env:  env("HANGAR_VERBOSE", "true"),
			want: defaults,
		},
		{
			name:    "int not a number",
			env:     env("HANGAR_SESSION_IDLE_MINUTES", "abc"),
			wantErr: `HANGAR_SESSION_IDLE_MINUTES="abc": want a whole number of minutes (>= 0)`,
		},
		{
			name:    "int below min",
			env:     env("HANGAR_SESSION_IDLE_MINUTES", "-1"),
			wantErr: `HANGAR_SESSION_IDLE_MINUTES="-1": want a whole number of minutes (>= 0)`,
		},
		{
			name:    "int from flag names the flag",
			args:    []string{"-session-idle-minutes", "1.5"},
			env:     env(),
			wantErr: `-session-idle-minutes="1.5": want a whole number of minutes (>= 0)`,
		},
		{
			name: "request cap",
			env:  env("HANGAR_MAX_REQUEST_MB", "200"),
			want: with(func(c *serviceConfig) { c.MaxRequestMB = 200 }),
		},
		{
			name:    "request cap of zero",
			env:     env("HANGAR_MAX_REQUEST_MB", "0"),
			wantErr: `HANGAR_MAX_REQUEST_MB="0": want a whole number of MB (between 1 and 2047)`,
		},
		{
			name:    "int above max",
			env:     env("HANGAR_POOL_SIZE", "65"),
			wantErr: `HANGAR_POOL_SIZE="65": want a whole number (<= 64)`,
		},
		{
			name:    "float out of range",
			env:     env("HANGAR_RATIO", "1.5"),
			wantErr: `HANGAR_RATIO="1.5": want a number (between 0 and 1)`,
		},
		{
			name:    "float NaN",
			env:     env("HANGAR_RATIO", "NaN"),
			wantErr: `HANGAR_RATIO="NaN": want a number (between 0 and 1)`,
		},
		{
			name:    "duration without unit",
			env:     env("HANGAR_TIMEOUT", "30"),
			wantErr: `HANGAR_TIMEOUT="30": want a duration such as 90s or 5m (>= 1s)`,
		},
		{
			name:    "duration below min",
			env:     env("HANGAR_TIMEOUT", "10ms"),
			wantErr: `HANGAR_TIMEOUT="10ms": want a duration such as 90s or 5m (>= 1s)`,
		},
		{
			name:    "bool",
			env:     env("HANGAR_VERBOSE", "yes"),
			wantErr: `HANGAR_VERBOSE="yes": want true or false`,
		},
		{
			name:    "oneof",
			env:     env("HANGAR_LOG_LEVEL", "loud"),
			wantErr: `HANGAR_LOG_LEVEL="loud": want one of debug|info|warn|error`,
		},
		{
			name:    "oneof list",
			env:     env("HANGAR_DRIVERS", "local,vm"),
			wantErr: `HANGAR_DRIVERS="local,vm": want a comma-separated list of local|docker|kubernetes`,
		},
		{
			name:    "unknown flag",
			args:    []string{"-nope"},
			env:     env(),
			wantErr: "flag provided but not defined: -nope",
		},
		{
			name:    "flag without value",
			args:    []string{"-home"},
			env:     env(),
			wantErr: "flag needs an argument: -home",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var got serviceConfig
			fs := flag.NewFlagSet("svc", flag.ContinueOnError)
			fs.SetOutput(new(bytes.Buffer))
			err := config.Load(&got, fs, tt.args, tt.env)
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr {
					t.Fatalf("Load error = %v, want %q", err, tt.wantErr)
				}
				if strings.Contains(err.Error(), "\n") {
					t.Errorf("error spans several lines: %q", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Load =\n%+v\nwant\n%+v", got, tt.want)
			}
		})
	}
}

func TestLoadRequired(t *testing.T) {
	t.Parallel()
	type cfg struct {
		Token string   `env:"HANGAR_TOKEN" flag:"token" required:"true"`
		Peers []string `flag:"peers" required:"true"`
		Port  int      `env:"HANGAR_PORT" required:"true"`
	}
	tests := []struct {
		name    string
		args    []string
		env     func(string) (string, bool)
		wantErr string
	}{
		{name: "token missing", args: []string{"-peers=a"}, env: env("HANGAR_PORT", "1"), wantErr: "HANGAR_TOKEN is required"},
		{name: "token empty", args: []string{"-peers=a"}, env: env("HANGAR_TOKEN", "", "HANGAR_PORT", "1"), wantErr: "HANGAR_TOKEN is required"},
		{name: "token empty flag", args: []string{"-token=", "-peers=a"}, env: env("HANGAR_TOKEN", "x", "HANGAR_PORT", "1"), wantErr: "HANGAR_TOKEN is required"},
		{name: "flag-only list blank", args: []string{"-peers", " , "}, env: env("HANGAR_TOKEN", "t", "HANGAR_PORT", "1"), wantErr: "-peers is required"},
		{name: "int missing", args: []string{"-peers=a"}, env: env("HANGAR_TOKEN", "t"), wantErr: "HANGAR_PORT is required"},
		{name: "all set", args: []string{"-peers=a"}, env: env("HANGAR_TOKEN", "t", "HANGAR_PORT", "0")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var c cfg
			err := config.Load(&c, nil, tt.args, tt.env)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Load: %v", err)
				}
				return
			}
			if err == nil || err.Error() != tt.wantErr {
				t.Fatalf("Load error = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

func TestLoadHelp(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	fs := flag.NewFlagSet("svc", flag.ContinueOnError)
	fs.SetOutput(&out)
	var c serviceConfig
	err := config.Load(&c, fs, []string{"-h"}, env())
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("Load -h error = %v, want flag.ErrHelp", err)
	}
	for _, want := range []string{
		"-home string",
		"data directory (string, env HANGAR_HOME)",
		"(default ~/.hangar)",
		"-log-level string",
		"one of debug|info|warn|error, env HANGAR_LOG_LEVEL",
		"-session-idle-minutes minutes",
		">= 0, env HANGAR_SESSION_IDLE_MINUTES",
		"-timeout duration",
		"-verbose\n",
		"-peers list",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("usage lacks %q:\n%s", want, out.String())
		}
	}
}

func TestLoadProgrammerErrors(t *testing.T) {
	t.Parallel()
	type badMin struct {
		N int `env:"HANGAR_N" min:"zero"`
	}
	type badType struct {
		M map[string]string `env:"HANGAR_M"`
	}
	type minOnString struct {
		S string `env:"HANGAR_S" min:"1"`
	}
	type tagWithoutSource struct {
		S string `default:"x"`
	}
	type badDefault struct {
		L string `env:"HANGAR_L" default:"loud" oneof:"quiet|normal"`
	}
	type dupFlag struct {
		A string `flag:"x"`
		B string `flag:"x"`
	}
	tests := []struct {
		name    string
		dst     any
		wantErr string
	}{
		{"not a pointer", badMin{}, "config: Load wants a non-nil pointer to a struct, got config_test.badMin"},
		{"bad min tag", &badMin{}, `config: field N: bad min tag "zero": strconv.ParseInt: parsing "zero": invalid syntax`},
		{"unsupported type", &badType{}, "config: field M has unsupported type map[string]string"},
		{"min on string", &minOnString{}, "config: field S: min is only for numbers and durations"},
		{"tag without source", &tagWithoutSource{}, "config: field S has a default tag but neither an env nor a flag tag"},
		{"bad default", &badDefault{}, `config: field L: default "loud": want one of quiet|normal`},
		{"duplicate flag", &dupFlag{}, "config: field B: flag -x is already defined"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := config.Load(tt.dst, nil, nil, env())
			if err == nil || err.Error() != tt.wantErr {
				t.Fatalf("Load error = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

func TestLoadKeepsPresetValueWithoutSource(t *testing.T) {
	t.Parallel()
	type cfg struct {
		Addr string `env:"HANGAR_ADDR"`
	}
	c := cfg{Addr: "127.0.0.1:7000"}
	if err := config.Load(&c, nil, nil, env()); err != nil {
		t.Fatalf("Load: %v", err)
	}
	if c.Addr != "127.0.0.1:7000" {
		t.Errorf("Addr = %q, want the preset value kept", c.Addr)
	}
}
