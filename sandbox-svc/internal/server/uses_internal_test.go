package server

import (
	"context"
	"testing"

	"google.golang.org/grpc/metadata"

	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	"github.com/hangar-dev/hangar/api/sandboxexec"
)

// A caller's call is a use while it runs and sets last_used_at when it
// ends; a call a service marks as its own is not one.
func TestUses(t *testing.T) {
	e := &entry{}
	read := func() *sandboxv1.Sandbox {
		p := &sandboxv1.Sandbox{}
		e.uses.fill(p)
		return p
	}
	service := metadata.NewIncomingContext(context.Background(), metadata.Pairs(sandboxexec.ServiceCallKey, "1"))
	endService := trackUse(service, e, useExec, "git status")
	if p := read(); len(p.GetUses()) != 0 || p.GetLastUsedAt() != nil {
		t.Fatalf("a service's call counted as a use: %v", p)
	}
	endService()
	if p := read(); p.GetLastUsedAt() != nil {
		t.Fatalf("a service's call set last_used_at: %v", p)
	}

	endExec := trackUse(context.Background(), e, useExec, "sh -c work")
	endRead := trackUse(context.Background(), e, useReadFile, "notes.txt")
	if p := read(); len(p.GetUses()) != 2 || p.GetUses()[0].GetKind() != useExec || p.GetUses()[1].GetDescription() != "notes.txt" || p.GetLastUsedAt() != nil {
		t.Fatalf("two calls running: %v", p)
	}
	endExec()
	endExec() // ending twice is harmless
	p := read()
	if len(p.GetUses()) != 1 || p.GetUses()[0].GetKind() != useReadFile || p.GetLastUsedAt() == nil {
		t.Fatalf("after the exec ended: %v", p)
	}
	endRead()
	if p := read(); len(p.GetUses()) != 0 || p.GetLastUsedAt() == nil {
		t.Fatalf("after both ended: %v", p)
	}
}
