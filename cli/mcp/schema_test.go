package mcp

import (
	"context"
	"encoding/json"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/jsonschema-go/jsonschema"
	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	sessionv1 "github.com/hangar-dev/hangar/api/hangar/session/v1"
)

// SpecTools are the MCP tools of the spec's Commands table this façade
// serves.
var specTools = []string{
	"new_session", "list_sessions", "send_to_session", "open_session", "keep_session", "suspend_session",
	"get_session", "get_events", "wait_for_turn", "get_artifact", "get_session_patch", "fork_session",
	"steer_turn", "answer_approval", "fork_run", "get_fork",
}

// Every field set, every message filled, and every field unset: the
// schema built from a descriptor accepts what toJSON (the REST API's JSON)
// makes of it.
func TestOutputSchemasMatchJSON(t *testing.T) {
	for _, m := range []proto.Message{
		&sessionv1.CreateSessionResponse{}, &sessionv1.ListSessionsResponse{}, &sessionv1.SendMessageResponse{},
		&sessionv1.OpenSessionResponse{}, &sessionv1.KeepSessionResponse{}, &sessionv1.SuspendSessionResponse{},
		&sessionv1.GetSessionResponse{}, &sessionv1.ListEventsResponse{}, &sessionv1.Turn{},
		&sessionv1.ListArtifactsResponse{}, &sessionv1.GetArtifactResponse{}, &sessionv1.GetSessionPatchResponse{},
		&sessionv1.ForkSessionResponse{}, &sessionv1.SteerTurnResponse{}, &sessionv1.ListApprovalsResponse{},
		&sessionv1.AnswerApprovalResponse{},
	} {
		name := string(m.ProtoReflect().Descriptor().FullName())
		t.Run(name, func(t *testing.T) {
			empty, err := toJSON(m)
			if err != nil {
				t.Fatal(err)
			}
			fill(m.ProtoReflect(), 0)
			out, err := toJSON(m)
			if err != nil {
				t.Fatal(err)
			}
			resolved, err := outputSchema(m, "").Resolve(nil)
			if err != nil {
				t.Fatalf("schema does not resolve: %v", err)
			}
			var v, unset any
			if err := json.Unmarshal(out, &v); err != nil {
				t.Fatal(err)
			}
			if err := resolved.Validate(v); err != nil {
				t.Fatalf("the JSON of a full %s does not match its schema: %v\n%s", name, err, out)
			}
			if err := json.Unmarshal(empty, &unset); err != nil {
				t.Fatal(err)
			}
			if err := resolved.Validate(unset); err != nil {
				t.Fatalf("the JSON of an empty %s does not match its schema: %v\n%s", name, err, empty)
			}
			// The REST API's form: short enum names, 64-bit integers as
			// numbers.
			if protoEnumName.Match(out) || strings.Contains(string(out), `"1099511627776"`) {
				t.Errorf("%s has proto enum names or 64-bit integers as strings:\n%s", name, out)
			}
			// And the schema is not a blank check: a number where no field
			// of the message takes one is refused.
			bad := map[string]any{}
			for k := range v.(map[string]any) {
				bad[k] = 5.5
			}
			if err := resolved.Validate(bad); err == nil {
				t.Errorf("schema of %s accepts %v", name, bad)
			}
		})
	}
}

// protoEnumName is a proto enum value's name as a JSON string.
var protoEnumName = regexp.MustCompile(`"[A-Z][A-Z0-9]*_[A-Z0-9_]+"`)

// fill sets every field of m (one element for lists and maps; the last
// field of a oneof wins).
func fill(m protoreflect.Message, depth int) {
	switch m.Descriptor().FullName() {
	case "google.protobuf.Timestamp":
		proto.Merge(m.Interface(), timestamppb.New(timestamppb.Now().AsTime()))
		return
	case "google.protobuf.Struct":
		s, _ := structpb.NewStruct(map[string]any{"ok": true, "n": 2.0})
		proto.Merge(m.Interface(), s)
		return
	}
	if depth > 6 {
		return
	}
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		switch {
		case fd.IsList():
			list := m.Mutable(fd).List()
			if fd.Kind() == protoreflect.MessageKind {
				fill(list.AppendMutable().Message(), depth+1)
			} else {
				list.Append(scalar(fd))
			}
		case fd.IsMap():
			mp := m.Mutable(fd).Map()
			key := scalar(fd.MapKey()).MapKey()
			if fd.MapValue().Kind() == protoreflect.MessageKind {
				fill(mp.Mutable(key).Message(), depth+1)
			} else {
				mp.Set(key, scalar(fd.MapValue()))
			}
		case fd.Kind() == protoreflect.MessageKind:
			fill(m.Mutable(fd).Message(), depth+1)
		default:
			m.Set(fd, scalar(fd))
		}
	}
}

func scalar(fd protoreflect.FieldDescriptor) protoreflect.Value {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(true)
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return protoreflect.ValueOfInt32(7)
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return protoreflect.ValueOfUint32(7)
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return protoreflect.ValueOfInt64(1 << 40)
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return protoreflect.ValueOfUint64(1 << 40)
	case protoreflect.FloatKind:
		return protoreflect.ValueOfFloat32(1.5)
	case protoreflect.DoubleKind:
		return protoreflect.ValueOfFloat64(1.5)
	case protoreflect.StringKind:
		return protoreflect.ValueOfString("x")
	case protoreflect.BytesKind:
		return protoreflect.ValueOfBytes([]byte{0, 1, 2})
	case protoreflect.EnumKind:
		values := fd.Enum().Values()
		return protoreflect.ValueOfEnum(values.Get(values.Len() - 1).Number())
	}
	panic("unhandled kind " + fd.Kind().String())
}

// The server lists exactly the spec's tools, each with an object input
// schema, an output schema and a description for the model.
func TestServerListsTheSpecTools(t *testing.T) {
	ctx := context.Background()
	server := NewServer(Options{})
	st, ct := mcpsdk.NewInMemoryTransports()
	ss, err := server.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()
	cs, err := mcpsdk.NewClient(&mcpsdk.Implementation{Name: "test"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	res, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range res.Tools {
		names = append(names, tool.Name)
		if len(tool.Description) < 80 {
			t.Errorf("%s: description too short for a model to use: %q", tool.Name, tool.Description)
		}
		for what, schema := range map[string]any{"input": tool.InputSchema, "output": tool.OutputSchema} {
			b, _ := json.Marshal(schema)
			var s jsonschema.Schema
			if err := json.Unmarshal(b, &s); err != nil || s.Type != "object" || len(s.Properties) == 0 {
				t.Errorf("%s: %s schema is not an object with properties: %s", tool.Name, what, b)
			}
		}
	}
	slices.Sort(names)
	want := slices.Clone(specTools)
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Errorf("tools %v, want %v", names, want)
	}
}
