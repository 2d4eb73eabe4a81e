package apiserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/grpc-ecosystem/grpc-gateway/v2/utilities"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/hangar-dev/hangar/platform/fault"
	"github.com/hangar-dev/hangar/platform/rpc"
)

// enumCheckingJSON is the gateway's JSON marshaler with one more check on
// request bodies: an enum field given a name its enum does not have is
// refused. protojson's DiscardUnknown (kept so that unknown fields are
// ignored) also drops unknown enum names, which left the field at its zero
// value: {"harness": "codex"} made a Claude session. Undefined numbers pass
// protojson (proto3 enums are open) and are refused by the gRPC edge
// (rpc.CheckEnums), which every REST call passes through.
type enumCheckingJSON struct {
	runtime.JSONPb
}

// NewDecoder implements runtime.Marshaler.
func (j *enumCheckingJSON) NewDecoder(r io.Reader) runtime.Decoder {
	return runtime.DecoderFunc(func(v any) error {
		m, ok := v.(proto.Message)
		if !ok || !hasEnums(m.ProtoReflect().Descriptor()) {
			return j.JSONPb.NewDecoder(r).Decode(v)
		}
		var raw json.RawMessage
		if err := json.NewDecoder(r).Decode(&raw); err != nil {
			return err
		}
		if ferr := checkJSONEnums(raw, m.ProtoReflect().Descriptor(), ""); ferr != nil {
			// The gateway turns the error into a bare InvalidArgument;
			// gatewayError gives it the edge's reason and field instead.
			if body, ok := r.(*cappedBody); ok {
				body.decodeFault.Store(ferr)
			}
			return errors.New(ferr.Message)
		}
		return j.JSONPb.Unmarshal(raw, v)
	})
}

// enumCheckingQuery is the gateway's query parameter parser with the same
// check for enum fields given in the query (GET /api/sessions?states=...):
// the default parser refuses an unknown value but names neither the field
// nor the values it takes.
type enumCheckingQuery struct {
	runtime.DefaultQueryParser
}

// The gateway keeps its query parser in a package variable that a mux option
// sets; setting it here, once, before any mux serves, keeps that write from
// racing with requests being served by another server of the process.
func init() {
	runtime.NewServeMux(runtime.SetQueryParameterParser(&enumCheckingQuery{}))
}

// Parse implements runtime.QueryParameterParser.
func (q *enumCheckingQuery) Parse(msg proto.Message, values url.Values, filter *utilities.DoubleArray) error {
	if ferr := checkQueryEnums(msg.ProtoReflect().Descriptor(), values); ferr != nil {
		// The gateway makes this a bare InvalidArgument with our text;
		// gatewayError finds the field again and adds reason and field.
		return errors.New(ferr.Message)
	}
	return q.DefaultQueryParser.Parse(msg, values, filter)
}

// checkQueryEnums checks the values of every query parameter that names an
// enum field (by its proto or JSON name, dotted for nested fields).
func checkQueryEnums(md protoreflect.MessageDescriptor, values url.Values) *fault.Error {
	if !hasEnums(md) {
		return nil
	}
	for _, key := range slices.Sorted(maps.Keys(values)) {
		fd, path := queryField(md, key)
		if fd == nil || fd.Kind() != protoreflect.EnumKind {
			continue
		}
		ed := fd.Enum()
		for _, v := range values[key] {
			if ed.Values().ByName(protoreflect.Name(v)) != nil {
				continue
			}
			if n, err := strconv.ParseInt(v, 10, 32); err == nil && ed.Values().ByNumber(protoreflect.EnumNumber(n)) != nil {
				continue
			}
			return rpc.UnknownEnumValue(path, strconv.Quote(v), ed)
		}
	}
	return nil
}

// queryField resolves a dotted query key to its field and the field's proto
// path; nil when the key names no field.
func queryField(md protoreflect.MessageDescriptor, key string) (protoreflect.FieldDescriptor, string) {
	var fd protoreflect.FieldDescriptor
	var path []string
	for i, part := range strings.Split(key, ".") {
		if i > 0 {
			if fd.Kind() != protoreflect.MessageKind || fd.IsList() || fd.IsMap() {
				return nil, ""
			}
			md = fd.Message()
		}
		fields := md.Fields()
		if fd = fields.ByTextName(part); fd == nil {
			if fd = fields.ByJSONName(part); fd == nil {
				return nil, ""
			}
		}
		path = append(path, fd.TextName())
	}
	return fd, strings.Join(path, ".")
}

// requestDescriptor is the request message type of the call the gateway
// made (or tried to make) for this request, from the method name in ctx; nil
// when the method is not in the global registry.
func requestDescriptor(ctx context.Context) protoreflect.MessageDescriptor {
	method, ok := runtime.RPCMethod(ctx)
	if !ok {
		return nil
	}
	service, name, ok := strings.Cut(strings.TrimPrefix(method, "/"), "/")
	if !ok {
		return nil
	}
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(service))
	if err != nil {
		return nil
	}
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		return nil
	}
	if m := sd.Methods().ByName(protoreflect.Name(name)); m != nil {
		return m.Input()
	}
	return nil
}

// enumFields caches, per message type, whether it has an enum field at any
// depth: most request bodies have none and skip the second parse.
var enumFields sync.Map // protoreflect.FullName -> bool

func hasEnums(md protoreflect.MessageDescriptor) bool {
	if v, ok := enumFields.Load(md.FullName()); ok {
		return v.(bool)
	}
	found := findEnums(md, map[protoreflect.FullName]bool{})
	enumFields.Store(md.FullName(), found)
	return found
}

func findEnums(md protoreflect.MessageDescriptor, seen map[protoreflect.FullName]bool) bool {
	if seen[md.FullName()] || wellKnown(md) {
		return false
	}
	seen[md.FullName()] = true
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if fd.IsMap() {
			fd = fd.MapValue()
		}
		switch fd.Kind() {
		case protoreflect.EnumKind:
			return true
		case protoreflect.MessageKind, protoreflect.GroupKind:
			if findEnums(fd.Message(), seen) {
				return true
			}
		}
	}
	return false
}

// wellKnown reports the google.protobuf types, whose JSON forms are not
// objects of their fields (Timestamp, Duration, Struct, wrappers...).
func wellKnown(md protoreflect.MessageDescriptor) bool {
	return strings.HasPrefix(string(md.FullName()), "google.protobuf.")
}

// checkJSONEnums walks a JSON object as protojson reads it into a message of
// type md and returns the error for the first enum field (by key order)
// whose value is a name, or a number, its enum does not define. Anything
// else malformed is left to protojson. prefix is the path of the object.
func checkJSONEnums(raw []byte, md protoreflect.MessageDescriptor, prefix string) *fault.Error {
	if wellKnown(md) {
		return nil
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal(raw, &obj) != nil {
		return nil
	}
	fields := md.Fields()
	for _, key := range slices.Sorted(maps.Keys(obj)) {
		fd := fields.ByJSONName(key)
		if fd == nil {
			fd = fields.ByTextName(key)
		}
		if fd == nil {
			continue // an unknown field: ignored
		}
		name := prefix + fd.TextName()
		val := obj[key]
		switch {
		case fd.IsMap():
			var entries map[string]json.RawMessage
			if json.Unmarshal(val, &entries) != nil {
				continue
			}
			for _, k := range slices.Sorted(maps.Keys(entries)) {
				if err := checkJSONValue(fd.MapValue(), entries[k], name+"["+strconv.Quote(k)+"]"); err != nil {
					return err
				}
			}
		case fd.IsList():
			var items []json.RawMessage
			if json.Unmarshal(val, &items) != nil {
				continue
			}
			for i, item := range items {
				if err := checkJSONValue(fd, item, name+"["+strconv.Itoa(i)+"]"); err != nil {
					return err
				}
			}
		default:
			if err := checkJSONValue(fd, val, name); err != nil {
				return err
			}
		}
	}
	return nil
}

func checkJSONValue(fd protoreflect.FieldDescriptor, val json.RawMessage, name string) *fault.Error {
	if bytes.Equal(bytes.TrimSpace(val), []byte("null")) {
		return nil // the field's default, as protojson reads it
	}
	switch fd.Kind() {
	case protoreflect.EnumKind:
		ed := fd.Enum()
		if ed.FullName() == "google.protobuf.NullValue" {
			return nil
		}
		var s string
		if json.Unmarshal(val, &s) == nil {
			if ed.Values().ByName(protoreflect.Name(s)) == nil {
				return rpc.UnknownEnumValue(name, strconv.Quote(s), ed)
			}
			return nil
		}
		var n int32
		if json.Unmarshal(val, &n) == nil && ed.Values().ByNumber(protoreflect.EnumNumber(n)) == nil {
			return rpc.UnknownEnumValue(name, strconv.Itoa(int(n)), ed)
		}
	case protoreflect.MessageKind, protoreflect.GroupKind:
		if hasEnums(fd.Message()) {
			return checkJSONEnums(val, fd.Message(), name+".")
		}
	}
	return nil
}
