// Package trees takes the hash of a run's work tree in its sandbox, for the
// tape (a replay compares it: the tree divergence).
package trees

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"

	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	"github.com/hangar-dev/hangar/api/sandboxexec"
	"github.com/hangar-dev/hangar/api/sandboxtool"
)

// Hasher runs `hangar-sandbox tree-hash` in a sandbox: the tree `git add -A`
// into a copy of the index makes (the index itself is not touched, so the
// harness and the user's git state are unchanged).
type Hasher struct {
	exec *sandboxexec.Client
}

// New returns a Hasher over sandbox-svc's client.
func New(c sandboxv1.SandboxServiceClient) *Hasher { return &Hasher{exec: sandboxexec.New(c)} }

// TreeHash returns the work tree hash of sb.
func (h *Hasher) TreeHash(ctx context.Context, sb *gatewayv1.RunSandbox) (string, error) {
	line, err := sandboxtool.Request(sandboxtool.TreeHashRequest{WorkDir: sb.GetWorkDir()})
	if err != nil {
		return "", err
	}
	var out, stderr bytes.Buffer
	code, err := h.exec.Exec(ctx, sb.GetId(), sb.GetFencingToken(), sandboxtool.Argv(sandboxtool.CommandTreeHash), nil, "", bytes.NewReader(line), &out, &stderr)
	if err != nil {
		return "", fmt.Errorf("trees: exec in %s: %w", sb.GetId(), err)
	}
	if code != 0 {
		return "", fmt.Errorf("trees: %s exited %d: %s", sandboxtool.CommandTreeHash, code, sandboxtool.FailureOf(stderr.Bytes()))
	}
	var resp sandboxtool.TreeHashResponse
	if err := json.Unmarshal(bytes.TrimSpace(out.Bytes()), &resp); err != nil || strings.TrimSpace(resp.Tree) == "" {
		return "", fmt.Errorf("trees: bad %s response %q", sandboxtool.CommandTreeHash, out.String())
	}
	return resp.Tree, nil
}
