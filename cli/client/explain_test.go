package client

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Only a failure to reach hangar itself becomes "hangar is not running":
// a running hangar's Unavailable about a backend it cannot reach (the
// Kubernetes API server, refused too) keeps its own message.
func TestExplainUnavailable(t *testing.T) {
	e := Endpoint{URL: "http://127.0.0.1:7400"}
	for _, c := range []struct {
		name, msg string
		rewritten bool
	}{
		{"hangar refused", `connection error: desc = "transport: Error while dialing: dial tcp 127.0.0.1:7400: connect: connection refused"`, true},
		{"hangar on localhost refused", `connection error: desc = "transport: Error while dialing: dial tcp [::1]:7400: connect: connection refused"`, true},
		{"backend refused", `list pods in hangar: sandbox backend unavailable: kubernetes API server: https://10.0.0.1:6443: Get "https://10.0.0.1:6443/api/v1/pods": dial tcp 10.0.0.1:6443: connect: connection refused`, false},
		{"other unavailable", "the checkpoint store is unavailable", false},
	} {
		err := e.explain(status.Error(codes.Unavailable, c.msg))
		got := strings.Contains(status.Convert(err).Message(), "is not running")
		if got != c.rewritten || status.Code(err) != codes.Unavailable {
			t.Errorf("%s: %v (rewritten %v, want %v)", c.name, err, got, c.rewritten)
		}
	}
	named := Endpoint{URL: "http://hangar.example:7400"}
	if err := named.explain(status.Error(codes.Unavailable, `dial tcp: lookup hangar.example: no such host`)); !strings.Contains(err.Error(), "is not running") {
		t.Errorf("hangar's host unknown: %v", err)
	}
}
