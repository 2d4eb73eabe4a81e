package forks

import (
	"context"
	"strings"
	"sync"
	"testing"

	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	"github.com/hangar-dev/hangar/platform/fault"
	"google.golang.org/protobuf/proto"
)

// fakeEnvironments keeps environments by name.
type fakeEnvironments struct {
	mu   sync.Mutex
	envs map[string]*sandboxv1.Environment
}

func (f *fakeEnvironments) GetEnvironment(_ context.Context, in *sandboxv1.GetEnvironmentRequest, _ ...grpcCallOption) (*sandboxv1.GetEnvironmentResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	e, ok := f.envs[in.GetName()]
	if !ok {
		return nil, fault.NotFound("environment", in.GetName())
	}
	return &sandboxv1.GetEnvironmentResponse{Environment: proto.Clone(e).(*sandboxv1.Environment)}, nil
}

func (f *fakeEnvironments) ApplyEnvironment(_ context.Context, in *sandboxv1.ApplyEnvironmentRequest, _ ...grpcCallOption) (*sandboxv1.ApplyEnvironmentResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.envs[in.GetEnvironment().GetName()] = proto.Clone(in.GetEnvironment()).(*sandboxv1.Environment)
	return &sandboxv1.ApplyEnvironmentResponse{}, nil
}

// TestReplayEnvironmentNeverOverwritesAnOpenOne: the sealed copy of an
// environment is made (egress none, no variables, no pool) and reused; an
// environment already sealed is used as is; an open environment named
// like a sealed one gets a copy of its own; an open environment where the
// copy would go is refused and left as it was.
func TestReplayEnvironmentNeverOverwritesAnOpenOne(t *testing.T) {
	t.Parallel()
	open := func(name string) *sandboxv1.Environment {
		return &sandboxv1.Environment{Name: name, Repository: "repo-" + name, Egress: sandboxv1.Egress_EGRESS_FULL, Env: map[string]string{"TOKEN": "secret"}, WarmPoolSize: 2}
	}
	envs := &fakeEnvironments{envs: map[string]*sandboxv1.Environment{
		"dev":         open("dev"),
		"tight":       {Name: "tight", Egress: sandboxv1.Egress_EGRESS_NONE},
		"ci-replay":   open("ci-replay"), // a user's own, named like a copy
		"prod":        open("prod"),
		"prod-replay": open("prod-replay"), // a user's own where prod's copy would go
	}}
	m := New(Options{Environments: envs})
	ctx := context.Background()
	for _, c := range []struct{ env, want, refused string }{
		{"dev", "dev-replay", ""},
		{"dev", "dev-replay", ""}, // again: the copy is reused
		{"tight", "tight", ""},
		{"ci-replay", "ci-replay-replay", ""},
		{"prod", "", "prod-replay"},
	} {
		got, err := m.replayEnvironment(ctx, c.env)
		if c.refused != "" {
			if err == nil || !strings.Contains(failureReason(err), c.refused) {
				t.Errorf("%s: %q %v, want refused naming %s", c.env, got, err, c.refused)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%s: %q %v, want %s", c.env, got, err, c.want)
			continue
		}
		e := envs.envs[got]
		if !sealedEnvironment(e) {
			t.Errorf("%s's replay environment %s is not sealed: %v", c.env, got, e)
		}
	}
	if e := envs.envs["prod-replay"]; sealedEnvironment(e) || e.GetEnv()["TOKEN"] != "secret" {
		t.Errorf("the user's prod-replay was changed: %v", e)
	}
	if e := envs.envs["ci-replay"]; sealedEnvironment(e) {
		t.Errorf("the user's ci-replay was changed: %v", e)
	}
	if e := envs.envs["dev-replay"]; e.GetRepository() != "repo-dev" {
		t.Errorf("dev-replay: %v", e)
	}
}
