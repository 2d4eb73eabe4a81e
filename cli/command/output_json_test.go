package command_test

import (
	"context"
	"encoding/json"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/structpb"

	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
	"github.com/hangar-dev/hangar/api/openapi"
	"github.com/hangar-dev/hangar/platform/apijson"
)

// goldenSessions serves the golden files' sessions and events over real
// gRPC, so -o json|yaml is tested through the commands as a user runs them.
type goldenSessions struct {
	sessionv1.UnimplementedSessionServiceServer
}

func (goldenSessions) GetSession(_ context.Context, req *sessionv1.GetSessionRequest) (*sessionv1.GetSessionResponse, error) {
	if req.GetName() != "onboarding" {
		return nil, status.Error(codes.NotFound, "no such session")
	}
	return &sessionv1.GetSessionResponse{Session: sessionFull()}, nil
}

func (goldenSessions) ListSessions(context.Context, *sessionv1.ListSessionsRequest) (*sessionv1.ListSessionsResponse, error) {
	return &sessionv1.ListSessionsResponse{Sessions: []*sessionv1.Session{
		{Name: "onboarding", State: sessionv1.SessionState_SESSION_STATE_RUNNING, Harness: sessionv1.Harness_HARNESS_CLAUDE, Environment: "early-signal",
			LastActiveAt: sessionAt(-3 * time.Second), TurnCount: 3, Usage: &sessionv1.Usage{InputTokens: 9_007_199_254_740_993, CostUsd: 1.9255}},
		{Name: "fresh", State: sessionv1.SessionState_SESSION_STATE_UNSPECIFIED, Environment: "local"},
	}}, nil
}

func (goldenSessions) ListEvents(_ context.Context, req *sessionv1.ListEventsRequest) (*sessionv1.ListEventsResponse, error) {
	if req.GetAfterSeq() > 0 {
		return &sessionv1.ListEventsResponse{}, nil
	}
	data, _ := structpb.NewStruct(map[string]any{"type": "raw", "state": "SESSION_STATE_IDLE"})
	return &sessionv1.ListEventsResponse{Events: []*sessionv1.Event{
		{Seq: 1, Turn: 1, Time: sessionAt(-2 * time.Minute), Kind: sessionv1.EventKind_EVENT_KIND_STATE_CHANGE, Text: "suspended → resuming"},
		{Seq: 2, Turn: 1, Time: sessionAt(-110 * time.Second), Kind: sessionv1.EventKind_EVENT_KIND_COMMAND, Text: "go test ./...", ExitCode: 1, Data: data},
		{Seq: 3, Turn: 1, Time: sessionAt(-80 * time.Second), Kind: sessionv1.EventKind_EVENT_KIND_USAGE, Usage: &sessionv1.Usage{InputTokens: 1234, OutputTokens: 56, CostUsd: 0.012, ModelCalls: 1}},
		{Seq: 4, Turn: 1, Time: sessionAt(-70 * time.Second), Kind: sessionv1.EventKind_EVENT_KIND_HARNESS_DRIFT, Text: "model differs"},
	}}, nil
}

func goldenSessionServer(t *testing.T) map[string]string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	sessionv1.RegisterSessionServiceServer(srv, goldenSessions{})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return map[string]string{"HANGAR_URL": "http://" + lis.Addr().String(), "HANGAR_TOKEN": "t", "HANGAR_HOME": t.TempDir()}
}

// TestOutputJSONGolden checks -o json and -o yaml of session get, list and
// events against golden files: the REST API's JSON (apijson), with enums as
// the docs write them ("state": "needs_input", "outcome": "over_budget"),
// unspecified enums left out, and 64-bit integers as numbers.
func TestOutputJSONGolden(t *testing.T) {
	env := goldenSessionServer(t)
	for _, tc := range []struct {
		golden string
		args   []string
	}{
		{"session_get.json", []string{"session", "get", "onboarding", "-o", "json"}},
		{"session_get.yaml", []string{"session", "get", "onboarding", "-o", "yaml"}},
		{"session_list.json", []string{"session", "list", "-o", "json"}},
		{"session_list.yaml", []string{"session", "list", "-o", "yaml"}},
		{"session_events.json", []string{"session", "events", "onboarding", "-o", "json"}},
	} {
		t.Run(tc.golden, func(t *testing.T) {
			out, err := run(t, env, tc.args...)
			if err != nil {
				t.Fatalf("hangar %s: %v", strings.Join(tc.args, " "), err)
			}
			sessionGolden(t, tc.golden, out)
			if strings.HasSuffix(tc.golden, ".json") {
				for _, long := range []string{"SESSION_STATE_", "HARNESS_", "TURN_OUTCOME_", "EVENT_KIND_", "HOLD_KIND_", "_UNSPECIFIED"} {
					// The event's free-form data keeps what the agent wrote.
					if strings.Contains(strings.ReplaceAll(out, `"state": "SESSION_STATE_IDLE"`, ""), long) {
						t.Errorf("hangar %s has a proto enum name (%s):\n%s", strings.Join(tc.args, " "), long, out)
					}
				}
			}
		})
	}
	// What -o json prints reads back as the message the server sent.
	out, err := run(t, env, "session", "get", "onboarding", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var got sessionv1.Session
	if err := apijson.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("session get -o json does not read back: %v", err)
	}
	if want := sessionFull(); !proto.Equal(&got, want) {
		t.Errorf("session get -o json read back as\n%v\nwant\n%v", &got, want)
	}
	// The events' numbers are numbers, their kinds the docs' names.
	out, err = run(t, env, "session", "events", "onboarding", "-o", "json", "--turn", "1")
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Events []map[string]any `json:"events"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list.Events) != 4 || list.Events[3]["kind"] != "harness_drift" || list.Events[0]["seq"] != 1.0 {
		t.Errorf("events -o json = %v (%v)", list.Events, err)
	}
}

// TestEveryHangarEnumRoundTrips: every value of every enum of the contract
// is written by a name of its own and read back, alone and in a message
// field, and the served OpenAPI document can be rewritten (no proto name
// stands for two JSON names).
func TestEveryHangarEnumRoundTrips(t *testing.T) {
	var enums, fields int
	protoregistry.GlobalFiles.RangeFiles(func(fd protoreflect.FileDescriptor) bool {
		if !strings.HasPrefix(string(fd.Package()), "hangar.") {
			return true
		}
		var messages func(protoreflect.MessageDescriptors)
		checkEnums := func(eds protoreflect.EnumDescriptors) {
			for i := range eds.Len() {
				ed := eds.Get(i)
				enums++
				seen := map[string]protoreflect.EnumNumber{}
				values := ed.Values()
				for j := range values.Len() {
					ev := values.Get(j)
					name := apijson.EnumName(dynamicpb.NewEnumType(ed).New(ev.Number()))
					if name == "" || strings.ToLower(name) != name {
						t.Errorf("%s: JSON name %q", ev.FullName(), name)
					}
					if num, dup := seen[name]; dup && num != ev.Number() {
						t.Errorf("%s: %q names %d and %d", ed.FullName(), name, num, ev.Number())
					}
					seen[name] = ev.Number()
					for _, s := range []string{name, string(ev.Name())} {
						if num, ok := apijson.ParseEnum(ed, s); !ok || num != ev.Number() {
							t.Errorf("ParseEnum(%s, %q) = %d, %v; want %d", ed.FullName(), s, num, ok, ev.Number())
						}
					}
				}
			}
		}
		messages = func(mds protoreflect.MessageDescriptors) {
			for i := range mds.Len() {
				md := mds.Get(i)
				checkEnums(md.Enums())
				messages(md.Messages())
				for j := range md.Fields().Len() {
					f := md.Fields().Get(j)
					if f.Kind() != protoreflect.EnumKind || f.IsList() || f.IsMap() {
						continue
					}
					fields++
					values := f.Enum().Values()
					for k := range values.Len() {
						in := dynamicpb.NewMessage(md)
						in.Set(f, protoreflect.ValueOfEnum(values.Get(k).Number()))
						b, err := apijson.Marshal(in)
						if err != nil {
							t.Fatalf("Marshal %s=%s: %v", f.FullName(), values.Get(k).Name(), err)
						}
						out := dynamicpb.NewMessage(md)
						if err := apijson.Unmarshal(b, out); err != nil || !proto.Equal(in, out) {
							t.Errorf("%s=%s: wrote %s, read back %v (%v)", f.FullName(), values.Get(k).Name(), b, out, err)
						}
						if strings.Contains(string(b), `"`+string(values.Get(k).Name())+`"`) {
							t.Errorf("%s=%s: wrote the proto name: %s", f.FullName(), values.Get(k).Name(), b)
						}
					}
				}
			}
		}
		checkEnums(fd.Enums())
		messages(fd.Messages())
		return true
	})
	if enums < 20 || fields < 20 {
		t.Fatalf("checked %d enums and %d enum fields: the contract's packages are not registered", enums, fields)
	}
	if _, err := apijson.OpenAPI(openapi.Document, protoregistry.GlobalFiles, "hangar."); err != nil {
		t.Errorf("OpenAPI: %v", err)
	}
}
