package apijson

import (
	"bytes"
	"encoding/json"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/hangar-dev/hangar/platform/fault"
)

// Unmarshal reads hangar's JSON (or protojson's: proto or JSON field names,
// long enum names, 64-bit integers as strings) into m. A field m does not
// have is an error, and so is an enum value its enum does not define (an
// InvalidArgument *fault.Error naming the field).
func Unmarshal(b []byte, m proto.Message) error {
	return unmarshal(b, m, protojson.UnmarshalOptions{})
}

func unmarshal(b []byte, m proto.Message, opts protojson.UnmarshalOptions) error {
	md := m.ProtoReflect().Descriptor()
	if hasEnums(md) {
		normalized, ferr := normalize(b, md, "")
		if ferr != nil {
			return ferr
		}
		b = normalized
	}
	return opts.Unmarshal(b, m)
}

// UnknownValue is the InvalidArgument error for field holding value (as the
// client sent it, quoted if it was a string), which enum ed does not define;
// it lists the JSON names ed takes.
func UnknownValue(field, value string, ed protoreflect.EnumDescriptor) *fault.Error {
	return fault.InvalidArgument(field, "%s: unknown value %s; want one of %s",
		field, value, strings.Join(EnumNames(ed), ", "))
}

// NormalizeQuery returns values with every query parameter that names an
// enum field of md (by its proto or JSON name, dotted for nested fields)
// given by its JSON name rewritten to the proto name, which grpc-gateway's
// query parser reads; a value the enum does not define is an error.
func NormalizeQuery(md protoreflect.MessageDescriptor, values url.Values) (url.Values, error) {
	if !hasEnums(md) {
		return values, nil
	}
	var out url.Values
	for _, key := range slices.Sorted(maps.Keys(values)) {
		fd, path := queryField(md, key)
		if fd == nil || fd.Kind() != protoreflect.EnumKind {
			continue
		}
		ed := fd.Enum()
		cloned := false
		for i, v := range values[key] {
			if ed.Values().ByName(protoreflect.Name(v)) != nil {
				continue
			}
			if n, err := strconv.ParseInt(v, 10, 32); err == nil {
				if ed.Values().ByNumber(protoreflect.EnumNumber(n)) != nil {
					continue
				}
				return nil, UnknownValue(path, strconv.Quote(v), ed)
			}
			num, ok := ParseEnum(ed, v)
			if !ok {
				return nil, UnknownValue(path, strconv.Quote(v), ed)
			}
			if out == nil {
				out = maps.Clone(values)
			}
			if !cloned {
				out[key], cloned = slices.Clone(values[key]), true
			}
			out[key][i] = string(ed.Values().ByNumber(num).Name())
		}
	}
	if out == nil {
		return values, nil
	}
	return out, nil
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

// normalize walks a JSON object as protojson reads it into a message of
// type md, rewrites every enum value given by its JSON name to the proto
// name, and returns the error for the first enum field (by key order) whose
// value is a name, or a number, its enum does not define. Anything else
// malformed is left to protojson. prefix is the path of the object.
func normalize(raw []byte, md protoreflect.MessageDescriptor, prefix string) ([]byte, *fault.Error) {
	if wellKnown(md) {
		return raw, nil
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal(raw, &obj) != nil {
		return raw, nil
	}
	fields := md.Fields()
	changed := false
	for _, key := range slices.Sorted(maps.Keys(obj)) {
		fd := fields.ByJSONName(key)
		if fd == nil {
			fd = fields.ByTextName(key)
		}
		if fd == nil {
			continue // an unknown field: protojson's to judge
		}
		name := prefix + fd.TextName()
		val := obj[key]
		var out json.RawMessage
		var ferr *fault.Error
		switch {
		case fd.IsMap():
			var entries map[string]json.RawMessage
			if json.Unmarshal(val, &entries) != nil {
				continue
			}
			entryChanged := false
			for _, k := range slices.Sorted(maps.Keys(entries)) {
				v, err := normalizeValue(fd.MapValue(), entries[k], name+"["+strconv.Quote(k)+"]")
				if err != nil {
					return nil, err
				}
				if v != nil {
					entries[k], entryChanged = v, true
				}
			}
			if entryChanged {
				out, _ = json.Marshal(entries)
			}
		case fd.IsList():
			var items []json.RawMessage
			if json.Unmarshal(val, &items) != nil {
				continue
			}
			itemChanged := false
			for i, item := range items {
				v, err := normalizeValue(fd, item, name+"["+strconv.Itoa(i)+"]")
				if err != nil {
					return nil, err
				}
				if v != nil {
					items[i], itemChanged = v, true
				}
			}
			if itemChanged {
				out, _ = json.Marshal(items)
			}
		default:
			out, ferr = normalizeValue(fd, val, name)
		}
		if ferr != nil {
			return nil, ferr
		}
		if out != nil {
			obj[key], changed = out, true
		}
	}
	if !changed {
		return raw, nil
	}
	b, err := json.Marshal(obj)
	if err != nil {
		return raw, nil
	}
	return b, nil
}

// normalizeValue returns val rewritten, or nil when it stays as it is.
func normalizeValue(fd protoreflect.FieldDescriptor, val json.RawMessage, name string) (json.RawMessage, *fault.Error) {
	if bytes.Equal(bytes.TrimSpace(val), []byte("null")) {
		return nil, nil // the field's default, as protojson reads it
	}
	switch fd.Kind() {
	case protoreflect.EnumKind:
		ed := fd.Enum()
		if ed.FullName() == "google.protobuf.NullValue" {
			return nil, nil
		}
		var s string
		if json.Unmarshal(val, &s) == nil {
			if ed.Values().ByName(protoreflect.Name(s)) != nil {
				return nil, nil
			}
			num, ok := ParseEnum(ed, s)
			if !ok {
				return nil, UnknownValue(name, strconv.Quote(s), ed)
			}
			b, _ := json.Marshal(string(ed.Values().ByNumber(num).Name()))
			return b, nil
		}
		var n int32
		if json.Unmarshal(val, &n) == nil && ed.Values().ByNumber(protoreflect.EnumNumber(n)) == nil {
			return nil, UnknownValue(name, strconv.Itoa(int(n)), ed)
		}
	case protoreflect.MessageKind, protoreflect.GroupKind:
		if hasEnums(fd.Message()) {
			out, err := normalize(val, fd.Message(), name+".")
			if err != nil {
				return nil, err
			}
			if !bytes.Equal(out, val) {
				return out, nil
			}
		}
	}
	return nil, nil
}

// enumFields caches, per message type, whether it has an enum field at any
// depth: most request bodies have none and skip the walk.
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
