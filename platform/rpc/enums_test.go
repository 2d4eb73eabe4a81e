package rpc_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/hangar-dev/hangar/platform/fault"
	"github.com/hangar-dev/hangar/platform/rpc"
)

// enumFile declares, as a request message would, an enum in every place a
// field can hold one: singular, repeated, map value, nested, repeated nested.
const enumFile = `
name: "hangar/test/v1/enums.proto" package: "hangar.test.v1" syntax: "proto3"
enum_type { name: "Mode" value { name: "MODE_UNSPECIFIED" number: 0 } value { name: "MODE_A" number: 1 } value { name: "MODE_B" number: 2 } }
message_type { name: "Inner" field { name: "mode" number: 1 label: LABEL_OPTIONAL type: TYPE_ENUM type_name: ".hangar.test.v1.Mode" json_name: "mode" } }
message_type {
  name: "Request"
  field { name: "mode" number: 1 label: LABEL_OPTIONAL type: TYPE_ENUM type_name: ".hangar.test.v1.Mode" json_name: "mode" }
  field { name: "modes" number: 2 label: LABEL_REPEATED type: TYPE_ENUM type_name: ".hangar.test.v1.Mode" json_name: "modes" }
  field { name: "by_name" number: 3 label: LABEL_REPEATED type: TYPE_MESSAGE type_name: ".hangar.test.v1.Request.ByNameEntry" json_name: "byName" }
  field { name: "inner" number: 4 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".hangar.test.v1.Inner" json_name: "inner" }
  field { name: "inners" number: 5 label: LABEL_REPEATED type: TYPE_MESSAGE type_name: ".hangar.test.v1.Inner" json_name: "inners" }
  field { name: "name" number: 6 label: LABEL_OPTIONAL type: TYPE_STRING json_name: "name" }
  nested_type {
    name: "ByNameEntry" options { map_entry: true }
    field { name: "key" number: 1 label: LABEL_OPTIONAL type: TYPE_STRING json_name: "key" }
    field { name: "value" number: 2 label: LABEL_OPTIONAL type: TYPE_ENUM type_name: ".hangar.test.v1.Mode" json_name: "value" }
  }
}`

func requestDescriptor(t *testing.T) protoreflect.MessageDescriptor {
	t.Helper()
	var fdp descriptorpb.FileDescriptorProto
	if err := prototext.Unmarshal([]byte(enumFile), &fdp); err != nil {
		t.Fatalf("parse test descriptor: %v", err)
	}
	fd, err := protodesc.NewFile(&fdp, nil)
	if err != nil {
		t.Fatalf("build test descriptor: %v", err)
	}
	return fd.Messages().ByName("Request")
}

// request builds a Request from its text form.
func request(t *testing.T, md protoreflect.MessageDescriptor, text string) *dynamicpb.Message {
	t.Helper()
	m := dynamicpb.NewMessage(md)
	if err := prototext.Unmarshal([]byte(text), m); err != nil {
		t.Fatalf("parse %q: %v", text, err)
	}
	return m
}

func TestCheckEnums(t *testing.T) {
	md := requestDescriptor(t)
	const allowed = "want one of MODE_A, MODE_B"
	tests := []struct {
		name      string
		text      string
		wantField string // "" means valid
	}{
		{"empty", ``, ""},
		{"defined values everywhere", `mode: MODE_A modes: [MODE_A, MODE_B] by_name { key: "x" value: MODE_B } inner { mode: MODE_B } inners { mode: MODE_A } name: "n"`, ""},
		{"zero is unset", `mode: MODE_UNSPECIFIED inner {}`, ""},
		{"singular", `mode: 99`, "mode"},
		{"negative", `mode: -1`, "mode"},
		{"repeated", `modes: [MODE_A, 7]`, "modes[1]"},
		{"map value", `by_name { key: "a" value: MODE_A } by_name { key: "b" value: 5 }`, `by_name["b"]`},
		{"nested", `inner { mode: 3 }`, "inner.mode"},
		{"repeated nested", `inners { mode: MODE_A } inners { mode: 42 }`, "inners[1].mode"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := rpc.CheckEnums(request(t, md, tt.text))
			if tt.wantField == "" {
				if err != nil {
					t.Fatalf("CheckEnums = %v, want nil", err)
				}
				return
			}
			st := fault.Status(err)
			if st.Code() != codes.InvalidArgument || fault.Reason(st) != "INVALID_ARGUMENT" {
				t.Fatalf("CheckEnums = %v (%v), want InvalidArgument", err, st)
			}
			if !strings.HasPrefix(st.Message(), tt.wantField+": unknown value ") || !strings.HasSuffix(st.Message(), allowed) {
				t.Errorf("message = %q, want %q: unknown value ...; %s", st.Message(), tt.wantField, allowed)
			}
			var fe *fault.Error
			if !errors.As(err, &fe) || fe.Field != tt.wantField {
				t.Errorf("field = %+v, want %q", fe, tt.wantField)
			}
		})
	}
}

// TestServerRejectsUnknownEnums sends undefined enum numbers through a real
// server, unary and streaming: the handler never sees them.
func TestServerRejectsUnknownEnums(t *testing.T) {
	md := requestDescriptor(t)
	var reached []string
	desc := &grpc.ServiceDesc{
		ServiceName: "hangar.test.v1.Enums",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{
			MethodName: "Echo",
			Handler: func(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
				in := dynamicpb.NewMessage(md)
				if err := dec(in); err != nil {
					return nil, err
				}
				info := &grpc.UnaryServerInfo{Server: srv, FullMethod: "/hangar.test.v1.Enums/Echo"}
				return icpt(ctx, in, info, func(_ context.Context, req any) (any, error) {
					reached = append(reached, "Echo")
					return req, nil
				})
			},
		}},
		Streams: []grpc.StreamDesc{{
			StreamName:    "Collect",
			ClientStreams: true,
			Handler: func(_ any, ss grpc.ServerStream) error {
				for {
					in := dynamicpb.NewMessage(md)
					if err := ss.RecvMsg(in); err != nil {
						return err
					}
					reached = append(reached, "Collect")
				}
			},
		}},
	}
	srv := rpc.NewServer(rpc.ServerOptions{Token: token})
	srv.RegisterService(desc, struct{}{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn := dial(t, lis.Addr().String(), rpc.ClientOptions{Token: token})

	out := dynamicpb.NewMessage(md)
	if err := conn.Invoke(t.Context(), "/hangar.test.v1.Enums/Echo", request(t, md, `mode: MODE_B`), out); err != nil {
		t.Fatalf("Echo(MODE_B) = %v", err)
	}
	err = conn.Invoke(t.Context(), "/hangar.test.v1.Enums/Echo", request(t, md, `inner { mode: 99 }`), out)
	if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "inner.mode: unknown value 99; want one of MODE_A, MODE_B") {
		t.Errorf("Echo(inner.mode 99) = %v, want InvalidArgument naming inner.mode", err)
	}

	stream, err := conn.NewStream(t.Context(), &desc.Streams[0], "/hangar.test.v1.Enums/Collect")
	if err != nil {
		t.Fatalf("NewStream: %v", err)
	}
	for _, text := range []string{`mode: MODE_A`, `modes: [9]`} {
		if err := stream.SendMsg(request(t, md, text)); err != nil {
			break // the server ended the call; RecvMsg says why
		}
	}
	_ = stream.CloseSend()
	err = stream.RecvMsg(out)
	if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "modes[0]: unknown value 9") {
		t.Errorf("Collect with modes [9] = %v, want InvalidArgument naming modes[0]", err)
	}
	if got := strings.Join(reached, ","); got != "Echo,Collect" {
		t.Errorf("handlers reached = %q, want Echo,Collect (the bad messages stopped at the edge)", got)
	}
}
