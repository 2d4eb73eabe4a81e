package mcp

import (
	"encoding/json"
	"maps"

	"github.com/google/jsonschema-go/jsonschema"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// marshal is how every tool's structured output is written: the API's own
// messages as protojson with their proto field names, so a tool's output
// reads like the REST API's. outputSchema describes exactly this form: a
// change here (enum names, int64 as numbers) must change it too, which
// TestOutputSchemasMatchProtoJSON checks.
var marshal = protojson.MarshalOptions{UseProtoNames: true}

// toJSON is m in the tools' output form.
func toJSON(m proto.Message) (json.RawMessage, error) {
	b, err := marshal.Marshal(m)
	if err != nil {
		return nil, err
	}
	return json.RawMessage(b), nil
}

// outputSchema is the JSON Schema of m's protojson form (marshal): every
// field optional (protojson leaves out what is unset), enums by their
// names, int64 as decimal strings, bytes as base64, Timestamps as RFC 3339
// strings. Built from the message descriptor, so it follows the API as
// fields are added.
func outputSchema(m proto.Message, description string) *jsonschema.Schema {
	s := messageSchema(m.ProtoReflect().Descriptor(), map[protoreflect.FullName]bool{})
	s.Description = description
	return s
}

// mergedSchema is an object schema with the properties of all of parts.
func mergedSchema(description string, parts ...*jsonschema.Schema) *jsonschema.Schema {
	s := &jsonschema.Schema{Type: "object", Description: description, Properties: map[string]*jsonschema.Schema{}}
	for _, p := range parts {
		maps.Copy(s.Properties, p.Properties)
	}
	return s
}

func messageSchema(md protoreflect.MessageDescriptor, open map[protoreflect.FullName]bool) *jsonschema.Schema {
	if s, ok := wellKnownSchema(md.FullName()); ok {
		return s
	}
	if open[md.FullName()] {
		// A message that contains itself: its inner copies are objects.
		return &jsonschema.Schema{Type: "object"}
	}
	open[md.FullName()] = true
	defer delete(open, md.FullName())
	s := &jsonschema.Schema{Type: "object", Properties: map[string]*jsonschema.Schema{}}
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		s.Properties[string(fd.Name())] = fieldSchema(fd, open)
	}
	return s
}

func fieldSchema(fd protoreflect.FieldDescriptor, open map[protoreflect.FullName]bool) *jsonschema.Schema {
	if fd.IsMap() {
		return &jsonschema.Schema{Type: "object", AdditionalProperties: singularSchema(fd.MapValue(), open)}
	}
	one := singularSchema(fd, open)
	if fd.IsList() {
		return &jsonschema.Schema{Type: "array", Items: one}
	}
	return one
}

func singularSchema(fd protoreflect.FieldDescriptor, open map[protoreflect.FullName]bool) *jsonschema.Schema {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return &jsonschema.Schema{Type: "boolean"}
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind,
		protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return &jsonschema.Schema{Type: "integer"}
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind,
		protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return &jsonschema.Schema{Type: "string", Pattern: `^-?[0-9]+$`, Description: "a 64-bit integer, as a decimal string"}
	case protoreflect.FloatKind, protoreflect.DoubleKind:
		// protojson writes NaN and infinities as strings.
		return &jsonschema.Schema{Types: []string{"number", "string"}}
	case protoreflect.StringKind:
		return &jsonschema.Schema{Type: "string"}
	case protoreflect.BytesKind:
		return &jsonschema.Schema{Type: "string", Description: "base64"}
	case protoreflect.EnumKind:
		values := fd.Enum().Values()
		names := make([]any, 0, values.Len())
		for i := range values.Len() {
			names = append(names, string(values.Get(i).Name()))
		}
		return &jsonschema.Schema{Type: "string", Enum: names}
	default: // message, group
		return messageSchema(fd.Message(), open)
	}
}

// wellKnownSchema is the protojson form of the google.protobuf types the
// API uses.
func wellKnownSchema(name protoreflect.FullName) (*jsonschema.Schema, bool) {
	switch name {
	case "google.protobuf.Timestamp":
		return &jsonschema.Schema{Type: "string", Format: "date-time"}, true
	case "google.protobuf.Duration":
		return &jsonschema.Schema{Type: "string", Description: "seconds with an s suffix, e.g. 1.5s"}, true
	case "google.protobuf.Struct":
		return &jsonschema.Schema{Type: "object"}, true
	case "google.protobuf.ListValue":
		return &jsonschema.Schema{Type: "array"}, true
	case "google.protobuf.Value", "google.protobuf.Any":
		return &jsonschema.Schema{}, true
	case "google.protobuf.Empty":
		return &jsonschema.Schema{Type: "object"}, true
	}
	return nil, false
}
