package sessions

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/hangar-dev/hangar/api/sandboxexec"
	"github.com/hangar-dev/hangar/api/sandboxtool"
)

// toolError: a hangar-sandbox command exited non-zero.
type toolError struct {
	command string
	code    int
	reason  string
}

func (e *toolError) Error() string {
	return fmt.Sprintf("%s %s exited %d: %s", sandboxtool.Binary, e.command, e.code, e.reason)
}

// tool runs a hangar-sandbox command in a sandbox's work tree (see
// api/sandboxtool): the request on stdin, its result to stdout (may be
// nil). A non-zero exit is a *toolError.
func (m *Manager) tool(ctx context.Context, sandboxID string, token uint64, command string, req any, stdout io.Writer) error {
	line, err := sandboxtool.Request(req)
	if err != nil {
		return err
	}
	if stdout == nil {
		stdout = io.Discard
	}
	var stderr bytes.Buffer
	code, err := sandboxexec.New(m.d.Sandboxes).Exec(ctx, sandboxID, token, sandboxtool.Argv(command), nil, "", bytes.NewReader(line), stdout, &stderr)
	if err != nil {
		return err
	}
	if code != 0 {
		return &toolError{command: command, code: code, reason: sandboxtool.FailureOf(stderr.Bytes())}
	}
	return nil
}

// toolJSON runs a command whose result is one JSON response.
func (m *Manager) toolJSON(ctx context.Context, sandboxID string, token uint64, command string, req, resp any) error {
	var out bytes.Buffer
	if err := m.tool(ctx, sandboxID, token, command, req, &out); err != nil {
		return err
	}
	if err := json.Unmarshal(out.Bytes(), resp); err != nil {
		return fmt.Errorf("%s %s: bad response: %w", sandboxtool.Binary, command, err)
	}
	return nil
}
