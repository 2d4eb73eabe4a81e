package command

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/yaml"

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
	var output *outputFormat
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Check that every hangar service answers",
		Example: `  hangar status
  hangar status -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := output.check(); err != nil {
				return err
			}
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
			report := statusReport{URL: ep.URL}
			for _, svc := range services {
				ctx, cancel := context.WithTimeout(cmd.Context(), 5*time.Second)
				resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: svc.grpcName})
				cancel()
				st := statusService{Name: svc.name, Status: strings.ToLower(resp.GetStatus().String())}
				if err != nil {
					st.Status, st.Error = "unreachable", status.Convert(err).Message()
				}
				if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
					down++
				}
				report.Services = append(report.Services, st)
			}
			if err := report.write(streams.Out, output); err != nil {
				return err
			}
			if down > 0 {
				return fmt.Errorf("%d of %d services are not serving", down, len(services))
			}
			return nil
		},
	}
	output = addOutputFlag(cmd)
	return cmd
}

// statusReport is what status prints; -o json/yaml prints it as it is.
type statusReport struct {
	URL      string          `json:"url"`
	Services []statusService `json:"services"`
}

type statusService struct {
	Name string `json:"name"`
	// Status is serving, not_serving, unknown or unreachable.
	Status string `json:"status"`
	Error  string `json:"error,omitempty"`
}

func (r statusReport) write(w io.Writer, o *outputFormat) error {
	if o.table() {
		fmt.Fprintf(w, "hangar at %s\n", r.URL)
		for _, s := range r.Services {
			state := strings.ToUpper(s.Status)
			if s.Error != "" {
				state = "unreachable: " + s.Error
			}
			fmt.Fprintf(w, "  %-15s %s\n", s.Name, state)
		}
		return nil
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if o.value == "yaml" {
		if b, err = yaml.JSONToYAML(b); err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}
