package server

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/hangar-dev/hangar/platform/fault"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver"
)

func TestCreateErr(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		err  error
		want string // reason; "" for the error passed on
	}{
		{"work key in use", fmt.Errorf("create: %w", driver.ErrInUse), "WORK_KEY_IN_USE"},
		{"egress", driver.ErrEgressUnsupported, "EGRESS_UNSUPPORTED"},
		{"canceled", fmt.Errorf("clone: %w", context.Canceled), ""},
		{"clone out of space", errors.New("git clone exited 128: fatal: write error: No space left on device"), fault.ReasonNoSpace},
		{"mkdir out of space", fmt.Errorf("mkdir: %w", syscall.ENOSPC), fault.ReasonNoSpace},
		{"setup failed", errors.New("setup exited 1: npm ERR!"), "SANDBOX_CREATE_FAILED"},
		{"backend unreachable", fmt.Errorf("create pod: %w: https://10.0.0.1:6443: connection refused", driver.ErrBackendUnavailable), "SANDBOX_BACKEND_UNAVAILABLE"},
		{"pod never started", fmt.Errorf("%w: pod ns/hangar-sb-1: ErrImagePull", driver.ErrStartFailed), "SANDBOX_START_FAILED"},
	}
	for _, tt := range tests {
		got := fault.Reason(fault.Status(createErr("e", tt.err)))
		if got != tt.want {
			t.Errorf("%s: reason %q, want %q", tt.name, got, tt.want)
		}
	}
	st := fault.Status(createErr("web", fmt.Errorf("%w: pod ns/hangar-sb-1 (image x:1): container sandbox: ErrImagePull: no such host", driver.ErrStartFailed)))
	if msg := st.Message(); !strings.Contains(msg, `environment "web"`) || !strings.Contains(msg, "ErrImagePull: no such host") {
		t.Errorf("start failure message %q, want the environment and the pod's reason", msg)
	}
	if st := fault.Status(createErr("web", fmt.Errorf("%w: https://10.0.0.1:6443", driver.ErrBackendUnavailable))); st.Code() != codes.Unavailable || !strings.Contains(st.Message(), "https://10.0.0.1:6443") {
		t.Errorf("backend unavailable: %v %q", st.Code(), st.Message())
	}
}
