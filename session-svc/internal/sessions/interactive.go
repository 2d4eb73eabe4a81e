package sessions

import (
	"context"
	"fmt"
	"path"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	"github.com/hangar-dev/hangar/platform/fault"
	"github.com/hangar-dev/hangar/session-svc/internal/harness"
	"github.com/hangar-dev/hangar/session-svc/internal/store"
)

// Interactive is what a person needs to continue a session's conversation
// in its sandbox: the command, its environment and PATH, and the gateway
// run behind it.
type Interactive struct {
	SandboxID, Command, Run string
	Env                     map[string]string
	// PathPrepend go in front of the terminal's PATH: the agent CLI's
	// directory when turns run it by path (so resume_command as get shows
	// it, "pi --session-id ID", runs too), then what the harness puts first
	// for turns (pi's Node >= 22.19).
	PathPrepend []string
}

// interactiveRunTTL is how long an interactive run's token lives: a
// working day; EndInteractive ends it sooner.
const interactiveRunTTL = 12 * time.Hour

// StartInteractive gets an open session ready for `resume_command` in an
// attached terminal: a gateway run of its own (the session's budget and
// approvals), the harness's config files written as a turn would, and the
// command with the CLI as turns run it.
func (m *Manager) StartInteractive(ctx context.Context, name string) (*Interactive, error) {
	s, err := m.get(ctx, name)
	if err != nil {
		return nil, err
	}
	switch {
	case s.State == store.StateRunning || s.State == store.StateResuming:
		return nil, fault.FailedPrecondition("TURN_RUNNING", "session %q is running a turn: two agents on one conversation would fork it; wait for the turn", name)
	case s.SandboxID == "":
		return nil, fault.FailedPrecondition("SESSION_NOT_UP", "session %q has no sandbox: hangar session open %s first", name, name)
	case s.ConversationID == "":
		return nil, fault.FailedPrecondition("NO_CONVERSATION", "session %q has no conversation yet: send it a message first", name)
	}
	adapter, err := harness.Lookup(harness.Name(s.Harness))
	if err != nil {
		return nil, fault.FailedPrecondition("HARNESS_UNKNOWN", "session %q runs harness %q, which this hangar does not know", name, s.Harness)
	}
	sb, err := m.sandboxOf(ctx, s)
	if err != nil {
		return nil, err
	}
	cache := s.CacheTTL
	if cache == "" {
		cache = m.cfg.Cache
	}
	run, err := m.d.Gateway.CreateRun(ctx, &gatewayv1.CreateRunRequest{
		Session: name, Harness: s.Harness, Model: s.Model,
		Budget:     &gatewayv1.Budget{MaxCostUsd: s.Budget.MaxCostUSD, MaxTokens: s.Budget.MaxTokens},
		TtlSeconds: int32(interactiveRunTTL / time.Second),
		CacheTtl:   cache,
		Approvals:  s.Approvals == ApprovalsAsk,
		// The gateway hashes this work tree as each step's request arrives.
		Sandbox: &gatewayv1.RunSandbox{Id: sb.GetId(), FencingToken: s.FencingToken, WorkDir: sb.GetWorkDir()},
	})
	if err != nil {
		return nil, fmt.Errorf("interactive run of %s: %w", name, err)
	}
	runID := run.GetRun().GetId()
	inv, err := adapter.Invocation(
		harness.Sandbox{WorkDir: sb.GetWorkDir(), HomeDir: sb.GetHomeDir()},
		harness.Gateway{AnthropicBaseURL: run.GetRun().GetAnthropicBaseUrl(), OpenAIBaseURL: run.GetRun().GetOpenaiBaseUrl(), Token: run.GetToken(), Model: s.Model},
		harness.Turn{Message: "-", ConversationID: s.ConversationID}, m.cfg.Harnesses)
	if err != nil {
		m.endRun(ctx, runID)
		return nil, fmt.Errorf("harness command of %s: %w", name, err)
	}
	for _, f := range inv.Files {
		if _, err := m.d.Sandboxes.WriteFile(ctx, &sandboxv1.WriteFileRequest{
			SandboxId: sb.GetId(), FencingToken: s.FencingToken, Path: f.Path, Content: f.Content, Mode: f.Mode,
		}); err != nil {
			m.endRun(ctx, runID)
			return nil, fmt.Errorf("harness config of %s: %w", name, err)
		}
	}
	if prep, ok := adapter.(harness.InteractivePreparer); ok {
		existing := func(path string) ([]byte, error) {
			got, err := m.d.Sandboxes.ReadFile(ctx, &sandboxv1.ReadFileRequest{SandboxId: sb.GetId(), FencingToken: s.FencingToken, Path: path})
			if status.Code(err) == codes.NotFound {
				return nil, nil
			}
			if err != nil {
				return nil, fmt.Errorf("read %s: %w", path, err)
			}
			return got.GetContent(), nil
		}
		files, err := prep.InteractiveFiles(harness.Sandbox{WorkDir: sb.GetWorkDir(), HomeDir: sb.GetHomeDir()}, harness.Gateway{Token: run.GetToken()}, existing)
		if err == nil {
			for _, f := range files {
				if _, err = m.d.Sandboxes.WriteFile(ctx, &sandboxv1.WriteFileRequest{
					SandboxId: sb.GetId(), FencingToken: s.FencingToken, Path: f.Path, Content: f.Content, Mode: f.Mode,
				}); err != nil {
					break
				}
			}
		}
		if err != nil {
			m.endRun(ctx, runID)
			return nil, fmt.Errorf("interactive config of %s: %w", name, err)
		}
	}
	env := map[string]string{}
	for k, v := range inv.Env {
		env[k] = v
	}
	// The resume command names the CLI the way turns run it (a path when
	// HANGAR_CLAUDE_BIN & co. give one), so it runs without it on PATH.
	command := adapter.ResumeCommand(s.ConversationID)
	var pathPrepend []string
	if len(inv.Argv) > 0 {
		if _, rest, ok := strings.Cut(command, " "); ok {
			command = harness.ShellQuote(inv.Argv[0]) + " " + rest
		}
		if strings.Contains(inv.Argv[0], "/") {
			pathPrepend = append(pathPrepend, path.Dir(inv.Argv[0]))
		}
	}
	pathPrepend = append(pathPrepend, inv.PathPrepend...)
	return &Interactive{SandboxID: sb.GetId(), Command: command, Run: runID, Env: env, PathPrepend: pathPrepend}, nil
}

// EndInteractive ends an interactive run of the session.
func (m *Manager) EndInteractive(ctx context.Context, name, runID string) error {
	if _, err := m.get(ctx, name); err != nil {
		return err
	}
	if !strings.HasPrefix(runID, name+".") {
		return fault.InvalidArgument("run", "run %q is not one of session %q's", runID, name)
	}
	m.endRun(ctx, runID)
	return nil
}

func (m *Manager) endRun(ctx context.Context, runID string) {
	if _, err := m.d.Gateway.EndRun(context.WithoutCancel(ctx), &gatewayv1.EndRunRequest{Run: runID}); err != nil {
		m.log.WarnContext(ctx, "gateway run not ended", "run", runID, "error", err)
	}
}
