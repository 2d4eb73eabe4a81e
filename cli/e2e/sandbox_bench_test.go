package e2e_test

import (
	"context"
	"fmt"
	"testing"

	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
)

// The exec path a client sees: the CLI's gRPC client, the front door, the
// sandbox service's HTTP/2 server (platform/apiserver), the local driver.

func BenchmarkSandboxExecRoundTripFrontDoor(b *testing.B) {
	s := sandboxStart(b)
	s.apply(b, fmt.Sprintf("name: bench\nrepository: %s\n", gitRepo(b, map[string]string{"a": "b"})))
	id := s.acquire(b, "bench").GetSandbox().GetId()
	for b.Loop() {
		if _, _, err := s.run(b, "", "sb", "exec", id, "--", "true"); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkSandboxExecThroughput512MBFrontDoor(b *testing.B) {
	s := sandboxStart(b)
	s.apply(b, fmt.Sprintf("name: bench\nrepository: %s\n", gitRepo(b, map[string]string{"a": "b"})))
	id := s.acquire(b, "bench").GetSandbox().GetId()
	const size = 512 << 20
	b.SetBytes(size)
	for b.Loop() {
		stream, err := s.sandboxes.Exec(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		if err := stream.Send(&sandboxv1.ExecRequest{Msg: &sandboxv1.ExecRequest_Start{Start: &sandboxv1.ExecStart{
			SandboxId: id, Command: []string{"head", "-c", fmt.Sprint(size), "/dev/zero"}}}}); err != nil {
			b.Fatal(err)
		}
		if err := stream.CloseSend(); err != nil {
			b.Fatal(err)
		}
		got := 0
		for {
			msg, err := stream.Recv()
			if err != nil {
				b.Fatal(err)
			}
			got += len(msg.GetStdout())
			if msg.GetExit() != nil {
				break
			}
		}
		if got != size {
			b.Fatalf("got %d bytes", got)
		}
	}
}
