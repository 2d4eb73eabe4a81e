package command

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	checkpointv1 "github.com/hangar-dev/hangar/api/hangar/checkpoint/v1"
	gatewayv1 "github.com/hangar-dev/hangar/api/hangar/gateway/v1"
	replayv1 "github.com/hangar-dev/hangar/api/hangar/replay/v1"
	sandboxv1 "github.com/hangar-dev/hangar/api/hangar/sandbox/v1"
	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/cli/client"
)

// services are the gRPC services `hangar status` checks, by the name a user
// knows them by.
var services = []struct{ name, grpcName string }{
	{"session-svc", sessionv1.SessionService_ServiceDesc.ServiceName},
	{"sandbox-svc", sandboxv1.SandboxService_ServiceDesc.ServiceName},
	{"checkpoint-svc", checkpointv1.CheckpointService_ServiceDesc.ServiceName},
	{"gateway-svc", gatewayv1.GatewayService_ServiceDesc.ServiceName},
	{"replay-svc", replayv1.ReplayService_ServiceDesc.ServiceName},
}

func statusCommand(streams Streams, lookupEnv func(string) (string, bool)) *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Check that every hangar service answers",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ep, err := client.Resolve(lookupEnv)
			if err != nil {
				return err
			}
			conn, err := ep.Dial()
			if err != nil {
				return err
			}
			defer conn.Close()
			health := healthpb.NewHealthClient(conn)
			down := 0
			fmt.Fprintf(streams.Out, "hangar at %s\n", ep.URL)
			for _, svc := range services {
				ctx, cancel := context.WithTimeout(cmd.Context(), 5*time.Second)
				resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: svc.grpcName})
				cancel()
				state := resp.GetStatus().String()
				if err != nil {
					state = "unreachable: " + status.Convert(err).Message()
				}
				if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
					down++
				}
				fmt.Fprintf(streams.Out, "  %-15s %s\n", svc.name, state)
			}
			if down > 0 {
				return fmt.Errorf("%d of %d services are not serving", down, len(services))
			}
			return nil
		},
	}
}
