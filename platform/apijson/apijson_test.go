package apijson_test

import (
	"encoding/json"
	"errors"
	"math"
	"strconv"
	"strings"
	"sync"
	"testing"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/hangar-dev/hangar/platform/apijson"
	"github.com/hangar-dev/hangar/platform/fault"
)

// testFile has an enum in every place a field can hold one, every 64-bit
// integer kind, well-known types, and enums whose names do not follow the
// prefix rule.
const testFile = `
name: "hangar/apijsontest/v1/t.proto" package: "hangar.apijsontest.v1" syntax: "proto3"
dependency: "google/protobuf/timestamp.proto" dependency: "google/protobuf/struct.proto" dependency: "google/protobuf/wrappers.proto"
enum_type { name: "RunState" value { name: "RUN_STATE_UNSPECIFIED" number: 0 } value { name: "RUN_STATE_ACTIVE" number: 1 } value { name: "RUN_STATE_OVER_BUDGET" number: 2 } }
enum_type { name: "Color" value { name: "NONE" number: 0 } value { name: "RED" number: 1 } value { name: "DARK_RED" number: 2 } }
enum_type { name: "HTTPMethod" value { name: "HTTP_METHOD_UNSPECIFIED" number: 0 } value { name: "HTTP_METHOD_GET" number: 1 } }
message_type { name: "Inner" field { name: "state" number: 1 label: LABEL_OPTIONAL type: TYPE_ENUM type_name: ".hangar.apijsontest.v1.RunState" json_name: "state" } }
message_type {
  name: "All"
  field { name: "state" number: 1 label: LABEL_OPTIONAL type: TYPE_ENUM type_name: ".hangar.apijsontest.v1.RunState" json_name: "state" }
  field { name: "states" number: 2 label: LABEL_REPEATED type: TYPE_ENUM type_name: ".hangar.apijsontest.v1.RunState" json_name: "states" }
  field { name: "by_name" number: 3 label: LABEL_REPEATED type: TYPE_MESSAGE type_name: ".hangar.apijsontest.v1.All.ByNameEntry" json_name: "byName" }
  field { name: "inner" number: 4 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".hangar.apijsontest.v1.Inner" json_name: "inner" }
  field { name: "inners" number: 5 label: LABEL_REPEATED type: TYPE_MESSAGE type_name: ".hangar.apijsontest.v1.Inner" json_name: "inners" }
  field { name: "color" number: 6 label: LABEL_OPTIONAL type: TYPE_ENUM type_name: ".hangar.apijsontest.v1.Color" json_name: "color" }
  field { name: "method" number: 7 label: LABEL_OPTIONAL type: TYPE_ENUM type_name: ".hangar.apijsontest.v1.HTTPMethod" json_name: "method" }
  field { name: "picked" number: 9 label: LABEL_OPTIONAL type: TYPE_ENUM type_name: ".hangar.apijsontest.v1.RunState" json_name: "picked" proto3_optional: true oneof_index: 0 }
  field { name: "i64" number: 10 label: LABEL_OPTIONAL type: TYPE_INT64 json_name: "i64" }
  field { name: "u64" number: 11 label: LABEL_OPTIONAL type: TYPE_UINT64 json_name: "u64" }
  field { name: "s64" number: 12 label: LABEL_OPTIONAL type: TYPE_SINT64 json_name: "s64" }
  field { name: "f64" number: 13 label: LABEL_OPTIONAL type: TYPE_FIXED64 json_name: "f64" }
  field { name: "sf64" number: 14 label: LABEL_OPTIONAL type: TYPE_SFIXED64 json_name: "sf64" }
  field { name: "i64s" number: 15 label: LABEL_REPEATED type: TYPE_INT64 json_name: "i64s" }
  field { name: "sizes" number: 16 label: LABEL_REPEATED type: TYPE_MESSAGE type_name: ".hangar.apijsontest.v1.All.SizesEntry" json_name: "sizes" }
  field { name: "i32" number: 17 label: LABEL_OPTIONAL type: TYPE_INT32 json_name: "i32" }
  field { name: "wrapped" number: 18 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".google.protobuf.Int64Value" json_name: "wrapped" }
  field { name: "at" number: 19 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".google.protobuf.Timestamp" json_name: "at" }
  field { name: "data" number: 20 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".google.protobuf.Struct" json_name: "data" }
  field { name: "text" number: 21 label: LABEL_OPTIONAL type: TYPE_STRING json_name: "text" }
  field { name: "raw" number: 22 label: LABEL_OPTIONAL type: TYPE_BYTES json_name: "raw" }
  field { name: "ratio" number: 23 label: LABEL_OPTIONAL type: TYPE_DOUBLE json_name: "ratio" }
  nested_type {
    name: "ByNameEntry" options { map_entry: true }
    field { name: "key" number: 1 label: LABEL_OPTIONAL type: TYPE_STRING json_name: "key" }
    field { name: "value" number: 2 label: LABEL_OPTIONAL type: TYPE_ENUM type_name: ".hangar.apijsontest.v1.RunState" json_name: "value" }
  }
  nested_type {
    name: "SizesEntry" options { map_entry: true }
    field { name: "key" number: 1 label: LABEL_OPTIONAL type: TYPE_INT64 json_name: "key" }
    field { name: "value" number: 2 label: LABEL_OPTIONAL type: TYPE_UINT64 json_name: "value" }
  }
  oneof_decl { name: "_picked" }
}`

var testFiles = sync.OnceValues(func() (*protoregistry.Files, error) {
	var fdp descriptorpb.FileDescriptorProto
	if err := prototext.Unmarshal([]byte(testFile), &fdp); err != nil {
		return nil, err
	}
	fd, err := protodesc.NewFile(&fdp, protoregistry.GlobalFiles)
	if err != nil {
		return nil, err
	}
	files := new(protoregistry.Files)
	return files, files.RegisterFile(fd)
})

func descriptor(t *testing.T, name string) protoreflect.MessageDescriptor {
	t.Helper()
	files, err := testFiles()
	if err != nil {
		t.Fatal(err)
	}
	d, err := files.FindDescriptorByName(protoreflect.FullName("hangar.apijsontest.v1." + name))
	if err != nil {
		t.Fatal(err)
	}
	return d.(protoreflect.MessageDescriptor)
}

// newAll is an All built from its protojson form (long names, as protojson
// reads them), so the tests state messages compactly.
func newAll(t *testing.T, js string) *dynamicpb.Message {
	t.Helper()
	m := dynamicpb.NewMessage(descriptor(t, "All"))
	if err := protojson.Unmarshal([]byte(js), m); err != nil {
		t.Fatalf("test message %s: %v", js, err)
	}
	return m
}

func TestEnumNames(t *testing.T) {
	md := descriptor(t, "All")
	enum := func(field string) protoreflect.EnumDescriptor {
		return md.Fields().ByName(protoreflect.Name(field)).Enum()
	}
	for _, tt := range []struct {
		ed   protoreflect.EnumDescriptor
		want []string
	}{
		{enum("state"), []string{"active", "over_budget"}},
		// No value has the prefix COLOR_: whole names, lower case.
		{enum("color"), []string{"none", "red", "dark_red"}},
		// Acronyms: HTTPMethod's prefix is HTTP_METHOD_, as buf's lint has it.
		{enum("method"), []string{"get"}},
		{healthpb.HealthCheckResponse_SERVING.Descriptor(), []string{"unknown", "serving", "not_serving", "service_unknown"}},
	} {
		if got := apijson.EnumNames(tt.ed); strings.Join(got, ",") != strings.Join(tt.want, ",") {
			t.Errorf("EnumNames(%s) = %q, want %q", tt.ed.FullName(), got, tt.want)
		}
		values := tt.ed.Values()
		for i := range values.Len() {
			ev := values.Get(i)
			name := apijson.EnumName(dynamicpb.NewEnumType(tt.ed).New(ev.Number()))
			for _, s := range []string{name, string(ev.Name())} {
				if num, ok := apijson.ParseEnum(tt.ed, s); !ok || num != ev.Number() {
					t.Errorf("ParseEnum(%s, %q) = %d, %v; want %d", tt.ed.Name(), s, num, ok, ev.Number())
				}
			}
		}
		if _, ok := apijson.ParseEnum(tt.ed, "NOPE"); ok {
			t.Errorf("ParseEnum(%s, NOPE) succeeded", tt.ed.Name())
		}
	}
	if got := apijson.EnumName(healthpb.HealthCheckResponse_NOT_SERVING); got != "not_serving" {
		t.Errorf("EnumName(NOT_SERVING) = %q", got)
	}
	if got := apijson.EnumName(healthpb.HealthCheckResponse_ServingStatus(42)); got != "" {
		t.Errorf("EnumName(42) = %q, want empty", got)
	}
}

func TestMarshal(t *testing.T) {
	for _, tt := range []struct {
		name string
		in   string // protojson
		want string
	}{
		{"empty: unspecified enums left out, 64-bit zeros numbers", `{}`,
			`{"states":[],"by_name":{},"inner":null,"inners":[],"color":"none","i64":0,"u64":0,"s64":0,"f64":0,"sf64":0,"i64s":[],"sizes":{},"i32":0,"wrapped":null,"at":null,"data":null,"text":"","raw":"","ratio":0}`},
		{"enums in every place",
			`{"state":"RUN_STATE_ACTIVE","states":["RUN_STATE_OVER_BUDGET","RUN_STATE_UNSPECIFIED"],"byName":{"x":"RUN_STATE_ACTIVE","y":"RUN_STATE_UNSPECIFIED"},"inner":{"state":"RUN_STATE_OVER_BUDGET"},"inners":[{"state":"RUN_STATE_ACTIVE"},{}],"color":"DARK_RED","method":"HTTP_METHOD_GET"}`,
			`{"state":"active","states":["over_budget","unspecified"],"by_name":{"x":"active","y":"unspecified"},"inner":{"state":"over_budget"},"inners":[{"state":"active"},{}],"color":"dark_red","method":"get",`},
		{"an optional enum set to zero is kept", `{"picked":"RUN_STATE_UNSPECIFIED"}`, `{"states":[],"by_name":{},"inner":null,"inners":[],"color":"none","picked":"unspecified",`},
		{"a number the enum lacks stays a number", `{"state":7,"states":[8]}`, `{"state":7,"states":[8],`},
		{"64-bit integers past 2^53, exactly",
			`{"i64":"9223372036854775807","u64":"18446744073709551615","s64":"-9223372036854775808","f64":"9007199254740993","sf64":"-9007199254740993","i64s":["1","-2"],"sizes":{"-3":"4"},"wrapped":"9007199254740993"}`,
			`"i64":9223372036854775807,"u64":18446744073709551615,"s64":-9223372036854775808,"f64":9007199254740993,"sf64":-9007199254740993,"i64s":[1,-2],"sizes":{"-3":4},"i32":0,"wrapped":9007199254740993,`},
		{"well-known types and strings as protojson writes them",
			`{"at":"2026-12-01T08:00:00Z","data":{"k":["SESSION_STATE_IDLE",1,{"x":"9007199254740993"}]},"text":"<a href=\"x\">\u00e9\n","raw":"AQI=","ratio":0.5}`,
			`"at":"2026-12-01T08:00:00Z","data":{"k":["SESSION_STATE_IDLE",1,{"x":"9007199254740993"}]},"text":"<a href=\"x\">é\n","raw":"AQI=","ratio":0.5}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b, err := apijson.Marshal(newAll(t, tt.in))
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(b), tt.want) {
				t.Errorf("Marshal = %s\nwant it to contain %s", b, tt.want)
			}
			if !json.Valid(b) {
				t.Errorf("Marshal = %s: not JSON", b)
			}
		})
	}
	t.Run("indented", func(t *testing.T) {
		b, err := apijson.MarshalIndent(newAll(t, `{"state":"RUN_STATE_ACTIVE","i64":"5"}`))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(string(b), "{\n  \"state\": \"active\",\n  \"states\": [],") || !strings.Contains(string(b), "\n  \"i64\": 5,\n") {
			t.Errorf("MarshalIndent = %s", b)
		}
	})
	t.Run("health", func(t *testing.T) {
		b, err := apijson.Marshal(&healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING})
		if err != nil || string(b) != `{"status":"serving"}` {
			t.Errorf("Marshal(health) = %s, %v", b, err)
		}
		b, err = apijson.Marshal(&healthpb.HealthCheckResponse{})
		if err != nil || string(b) != `{"status":"unknown"}` {
			t.Errorf("Marshal(health unknown) = %s, %v; a zero value not named *_UNSPECIFIED is written", b, err)
		}
	})
}

// TestRoundTrip reads back what Marshal wrote, for every value of every
// enum of the test file and the 64-bit integers' edges.
func TestRoundTrip(t *testing.T) {
	md := descriptor(t, "All")
	var cases []string
	for _, field := range []string{"state", "color", "method"} {
		values := md.Fields().ByName(protoreflect.Name(field)).Enum().Values()
		for i := range values.Len() {
			name := string(values.Get(i).Name())
			cases = append(cases, `{"`+field+`":"`+name+`"}`)
			if field == "state" {
				cases = append(cases, `{"states":["`+name+`"],"byName":{"k":"`+name+`"},"inners":[{"state":"`+name+`"}],"picked":"`+name+`"}`)
			}
		}
	}
	for _, n := range []string{"0", "1", "-1", strconv.Itoa(1<<53 + 1), strconv.FormatInt(math.MaxInt64, 10), strconv.FormatInt(math.MinInt64, 10)} {
		cases = append(cases, `{"i64":"`+n+`","s64":"`+n+`","sf64":"`+n+`","i64s":["`+n+`"],"wrapped":"`+n+`"}`)
	}
	for _, n := range []string{"0", strconv.FormatUint(1<<53+1, 10), strconv.FormatUint(math.MaxUint64, 10)} {
		cases = append(cases, `{"u64":"`+n+`","f64":"`+n+`","sizes":{"5":"`+n+`"}}`)
	}
	for _, js := range cases {
		in := newAll(t, js)
		b, err := apijson.Marshal(in)
		if err != nil {
			t.Fatalf("Marshal(%s): %v", js, err)
		}
		out := dynamicpb.NewMessage(md)
		if err := apijson.Unmarshal(b, out); err != nil {
			t.Fatalf("Unmarshal(%s): %v", b, err)
		}
		if !proto.Equal(in, out) {
			t.Errorf("%s: wrote %s, read back %v", js, b, out)
		}
	}
}

func TestUnmarshal(t *testing.T) {
	md := descriptor(t, "All")
	for _, tt := range []struct {
		name, in string
		want     string // protojson of the message read; "" for an error
		field    string // the error's field
		msg      string // the error's message
	}{
		{"JSON names", `{"state":"over_budget","states":["active"],"by_name":{"x":"active"},"inner":{"state":"active"},"inners":[{"state":"over_budget"}],"color":"dark_red","method":"get"}`,
			`{"state":"RUN_STATE_OVER_BUDGET","states":["RUN_STATE_ACTIVE"],"byName":{"x":"RUN_STATE_ACTIVE"},"inner":{"state":"RUN_STATE_ACTIVE"},"inners":[{"state":"RUN_STATE_OVER_BUDGET"}],"color":"DARK_RED","method":"HTTP_METHOD_GET"}`, "", ""},
		{"proto names and numbers", `{"state":"RUN_STATE_ACTIVE","states":[2],"byName":{"x":"RUN_STATE_OVER_BUDGET"}}`,
			`{"state":"RUN_STATE_ACTIVE","states":["RUN_STATE_OVER_BUDGET"],"byName":{"x":"RUN_STATE_OVER_BUDGET"}}`, "", ""},
		{"64-bit integers as numbers or strings", `{"i64":9007199254740993,"u64":"18446744073709551615","i64s":[1,"2"],"wrapped":9007199254740993}`,
			`{"i64":"9007199254740993","u64":"18446744073709551615","i64s":["1","2"],"wrapped":"9007199254740993"}`, "", ""},
		{"unknown name", `{"state":"idle"}`, "", "state", `state: unknown value "idle"; want one of active, over_budget`},
		{"unknown number", `{"state":9}`, "", "state", `state: unknown value 9; want one of active, over_budget`},
		{"unknown in a list", `{"states":["active","nope"]}`, "", "states[1]", `states[1]: unknown value "nope"; want one of active, over_budget`},
		{"unknown in a map", `{"byName":{"k":"NOPE"}}`, "", `by_name["k"]`, `by_name["k"]: unknown value "NOPE"; want one of active, over_budget`},
		{"unknown nested", `{"inners":[{"state":"x"}]}`, "", "inners[0].state", `inners[0].state: unknown value "x"; want one of active, over_budget`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := dynamicpb.NewMessage(md)
			err := apijson.Unmarshal([]byte(tt.in), m)
			if tt.want == "" {
				var ferr *fault.Error
				if !errors.As(err, &ferr) || ferr.Field != tt.field || ferr.Message != tt.msg || ferr.Kind != fault.KindInvalidArgument {
					t.Fatalf("Unmarshal(%s) = %#v, want InvalidArgument %q on %s", tt.in, err, tt.msg, tt.field)
				}
				return
			}
			if err != nil {
				t.Fatalf("Unmarshal(%s): %v", tt.in, err)
			}
			if want := newAll(t, tt.want); !proto.Equal(m, want) {
				t.Errorf("Unmarshal(%s) = %v, want %v", tt.in, m, want)
			}
		})
	}
	if err := apijson.Unmarshal([]byte(`{"nope":1}`), dynamicpb.NewMessage(md)); err == nil {
		t.Error("Unmarshal of an unknown field succeeded; want an error")
	}
	// The gateway ignores unknown fields, as REST always did.
	if err := (apijson.Gateway{}).Unmarshal([]byte(`{"nope":1,"state":"active"}`), dynamicpb.NewMessage(md)); err != nil {
		t.Errorf("Gateway.Unmarshal with an unknown field: %v", err)
	}
}

// TestGatewayStreamChunks checks the {"result": ...} and {"error": ...}
// chunks grpc-gateway writes for a streamed response.
func TestGatewayStreamChunks(t *testing.T) {
	g := apijson.Gateway{}
	b, err := g.Marshal(map[string]any{"result": newAll(t, `{"state":"RUN_STATE_ACTIVE","i64":"3"}`)})
	if err != nil || !strings.HasPrefix(string(b), `{"result":{"state":"active",`) || !strings.Contains(string(b), `"i64":3,`) {
		t.Errorf("result chunk = %s, %v", b, err)
	}
	b, err = g.Marshal(map[string]proto.Message{"error": wrapperspb.Int64(5)})
	if err != nil || string(b) != `{"error":5}` {
		t.Errorf("error chunk = %s, %v", b, err)
	}
	var buf strings.Builder
	if err := g.NewEncoder(&buf).Encode(timestamppb.New(timestamppb.Now().AsTime().Truncate(1e9))); err != nil || !strings.HasSuffix(buf.String(), "Z\"\n") {
		t.Errorf("Encode = %q, %v", buf.String(), err)
	}
	dec := g.NewDecoder(strings.NewReader(`{"state":"active"} {"state":"over_budget"}`))
	for _, want := range []string{"RUN_STATE_ACTIVE", "RUN_STATE_OVER_BUDGET"} {
		m := dynamicpb.NewMessage(descriptor(t, "All"))
		if err := dec.Decode(m); err != nil {
			t.Fatal(err)
		}
		if got := m.Get(m.Descriptor().Fields().ByName("state")).Enum(); string(m.Descriptor().Fields().ByName("state").Enum().Values().ByNumber(got).Name()) != want {
			t.Errorf("decoded state %d, want %s", got, want)
		}
	}
	s, _ := structpb.NewStruct(map[string]any{"a": "RUN_STATE_ACTIVE"})
	if b, err := g.Marshal(s); err != nil || string(b) != `{"a":"RUN_STATE_ACTIVE"}` {
		t.Errorf("Struct = %s, %v: free-form JSON is not rewritten", b, err)
	}
}

func TestOpenAPI(t *testing.T) {
	files, err := testFiles()
	if err != nil {
		t.Fatal(err)
	}
	doc := `{
  "swagger": "2.0",
  "definitions": {
    "v1RunState": {
      "type": "string",
      "enum": [
        "RUN_STATE_UNSPECIFIED",
        "RUN_STATE_ACTIVE",
        "RUN_STATE_OVER_BUDGET"
      ],
      "default": "RUN_STATE_UNSPECIFIED",
      "description": "RunState <is>.\n\n - RUN_STATE_ACTIVE: Its token works.\n - RUN_STATE_OVER_BUDGET: Over.\n - NOT_A_VALUE: x"
    },
    "v1All": {
      "type": "object",
      "properties": {
        "i64": {
          "type": "string",
          "format": "int64"
        },
        "u64": {
          "format": "uint64",
          "type": "string"
        },
        "i32": {
          "type": "integer",
          "format": "int32"
        },
        "empty": {},
        "list": []
      }
    }
  }
}
`
	want := `{
  "swagger": "2.0",
  "definitions": {
    "v1RunState": {
      "type": "string",
      "enum": [
        "active",
        "over_budget"
      ],
      "description": "RunState <is>.\n\n - active: Its token works.\n - over_budget: Over.\n - NOT_A_VALUE: x"
    },
    "v1All": {
      "type": "object",
      "properties": {
        "i64": {
          "type": "integer",
          "format": "int64"
        },
        "u64": {
          "format": "uint64",
          "type": "integer"
        },
        "i32": {
          "type": "integer",
          "format": "int32"
        },
        "empty": {},
        "list": []
      }
    }
  }
}
`
	got, err := apijson.OpenAPI([]byte(doc), files, "hangar.")
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Errorf("OpenAPI =\n%s\nwant\n%s", got, want)
	}
	again, err := apijson.OpenAPI(got, files, "hangar.")
	if err != nil || string(again) != want {
		t.Errorf("OpenAPI of its own output changed it:\n%s (%v)", again, err)
	}
}

// BenchmarkMarshal compares Marshal with the protojson it rewrites, on a
// message of 200 nested enums and 64-bit integers.
func BenchmarkMarshal(b *testing.B) {
	var items []string
	for range 200 {
		items = append(items, `{"state":"RUN_STATE_ACTIVE"}`)
	}
	js := `{"state":"RUN_STATE_ACTIVE","inners":[` + strings.Join(items, ",") + `],"i64s":["1","2","3"],"text":"some text to copy"}`
	t := &testing.T{}
	m := newAll(t, js)
	b.Run("protojson", func(b *testing.B) {
		for b.Loop() {
			if _, err := (protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}).Marshal(m); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("apijson", func(b *testing.B) {
		for b.Loop() {
			if _, err := apijson.Marshal(m); err != nil {
				b.Fatal(err)
			}
		}
	})
}
