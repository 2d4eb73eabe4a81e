package mcp

import (
	"encoding/json"
	"maps"
	"slices"

	"github.com/google/jsonschema-go/jsonschema"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/hangar-dev/hangar/platform/apijson"
)

// toJSON is how every tool's structured output is written: the API's own
// messages as the REST API writes them (platform/apijson: proto field
// names, every field, enums by the docs' short names such as "idle",
// 64-bit integers as numbers). outputSchema describes exactly this form: a
// change here must change it too, which TestOutputSchemasMatchJSON checks.
func toJSON(m proto.Message) (json.RawMessage, error) {
	b, err := apijson.Marshal(m)
	if err != nil {
		return nil, err
	}
	return json.RawMessage(b), nil
}

// outputSchema is the JSON Schema of m's JSON (toJSON): every field
// optional (an unset enum and an unset oneof are left out), an unset
// message null, enums by their short names, int64 as integers, bytes as
// base64, Timestamps as RFC 3339 strings. Built from the message descriptor, so it follows the API as
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
	if fd.Kind() == protoreflect.MessageKind || fd.Kind() == protoreflect.GroupKind {
		// An unset message is null (apijson writes every field).
		return nullable(one)
	}
	return one
}

// nullable is s that also takes null.
func nullable(s *jsonschema.Schema) *jsonschema.Schema {
	c := *s
	switch {
	case c.Type != "":
		c.Types, c.Type = []string{c.Type, "null"}, ""
	case len(c.Types) > 0:
		c.Types = append(append([]string(nil), c.Types...), "null")
	}
	return &c
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
		return &jsonschema.Schema{Type: "integer"}
	case protoreflect.FloatKind, protoreflect.DoubleKind:
		// protojson writes NaN and infinities as strings.
		return &jsonschema.Schema{Types: []string{"number", "string"}}
	case protoreflect.StringKind:
		return &jsonschema.Schema{Type: "string"}
	case protoreflect.BytesKind:
		return &jsonschema.Schema{Type: "string", Description: "base64"}
	case protoreflect.EnumKind:
		// The short names ("idle"); "unspecified" too, as a list or map
		// writes the zero value.
		ed := fd.Enum()
		values := ed.Values()
		enum := dynamicpb.NewEnumType(ed)
		names := make([]any, 0, values.Len())
		for i := range values.Len() {
			if name := apijson.EnumName(enum.New(values.Get(i).Number())); name != "" && !slices.Contains(names, any(name)) {
				names = append(names, name)
			}
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
