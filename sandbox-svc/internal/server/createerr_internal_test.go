package server

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"testing"

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
	}
	for _, tt := range tests {
		got := fault.Reason(fault.Status(createErr("e", tt.err)))
		if got != tt.want {
			t.Errorf("%s: reason %q, want %q", tt.name, got, tt.want)
		}
	}
}
