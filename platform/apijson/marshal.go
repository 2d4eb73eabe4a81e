// Package apijson is hangar's JSON for API messages, the one form REST
// (grpc-gateway) and the CLI's -o json|yaml write and read:
//
//   - fields by their proto names (snake_case), every field, set or not,
//     as protojson's EmitUnpopulated writes them;
//   - enum values as the product docs write them: the value's name without
//     its enum's prefix, in lower case ("status": "forked", "state": "idle",
//     "outcome": "over_budget"). A singular enum field at its
//     *_UNSPECIFIED zero value is left out; in a list or map that value is
//     "unspecified". A number the enum does not define stays a number;
//   - 64-bit integers (int64, uint64, their fixed/sint forms and the
//     Int64Value/UInt64Value wrappers) as JSON numbers, written exactly:
//     9007199254740993 is those digits, not a rounded float. JavaScript's
//     JSON.parse rounds integers past 2^53; hangar's 64-bit fields (bytes,
//     tokens, milliseconds, sequence numbers) stay far below it;
//   - everything else as protojson writes it (Timestamp and Duration as
//     strings, bytes as base64, Struct as its JSON).
//
// Reading, an enum value may be the JSON name, the proto name or the
// number, and a 64-bit integer a number or a string. An enum name the enum
// does not have is an InvalidArgument *fault.Error naming the field (where
// protojson would quietly drop it or fail without the field's path).
//
// protojson has no option for enum names (only numbers) and writes 64-bit
// integers as strings (the proto3 JSON mapping), so this package rewrites
// protojson's output, walking it beside the message's descriptor, rather
// than reimplementing the mapping of well-known types.
package apijson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

var marshalOptions = protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}

// Marshal returns m as hangar's JSON, compact.
func Marshal(m proto.Message) ([]byte, error) {
	raw, err := marshalOptions.Marshal(m)
	if err != nil {
		return nil, err
	}
	return rewrite(raw, m.ProtoReflect().Descriptor())
}

// MarshalIndent returns m as hangar's JSON indented by two spaces, for
// people (the CLI's -o json).
func MarshalIndent(m proto.Message) ([]byte, error) {
	b, err := Marshal(m)
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	if err := json.Indent(&out, b, "", "  "); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// rewrite turns protojson's JSON of a message of type md into hangar's.
func rewrite(raw []byte, md protoreflect.MessageDescriptor) ([]byte, error) {
	w := &rewriter{dec: json.NewDecoder(bytes.NewReader(raw))}
	w.dec.UseNumber()
	w.out.Grow(len(raw))
	if err := w.message(md); err != nil {
		return nil, fmt.Errorf("apijson: rewriting %s: %w", md.FullName(), err)
	}
	return w.out.Bytes(), nil
}

type rewriter struct {
	dec *json.Decoder
	out bytes.Buffer
}

var errShape = errors.New("JSON does not have the message's shape")

func (w *rewriter) message(md protoreflect.MessageDescriptor) error {
	switch md.FullName() {
	case "google.protobuf.Int64Value", "google.protobuf.UInt64Value":
		tok, err := w.dec.Token()
		if err != nil {
			return err
		}
		return w.integer(tok)
	}
	if wellKnown(md) {
		return w.copyValue()
	}
	tok, err := w.dec.Token()
	if err != nil {
		return err
	}
	if tok == nil {
		w.out.WriteString("null")
		return nil
	}
	if tok != json.Delim('{') {
		return errShape
	}
	w.out.WriteByte('{')
	fields := md.Fields()
	first := true
	key := func(k string) {
		if !first {
			w.out.WriteByte(',')
		}
		first = false
		w.str(k)
		w.out.WriteByte(':')
	}
	for w.dec.More() {
		tok, err := w.dec.Token()
		if err != nil {
			return err
		}
		k, _ := tok.(string)
		fd := fields.ByTextName(k)
		if fd == nil {
			fd = fields.ByJSONName(k)
		}
		switch {
		case fd == nil:
			key(k)
			err = w.copyValue()
		case fd.IsList():
			key(k)
			err = w.list(fd)
		case fd.IsMap():
			key(k)
			err = w.mapValue(fd)
		case fd.Kind() == protoreflect.EnumKind:
			var v json.Token
			if v, err = w.dec.Token(); err != nil {
				return err
			}
			if s, ok := v.(string); ok && !fd.HasPresence() {
				if ev := fd.Enum().Values().ByName(protoreflect.Name(s)); ev != nil && unspecified(ev) {
					continue // not set: left out
				}
			}
			key(k)
			err = w.enum(fd.Enum(), v)
		default:
			key(k)
			err = w.value(fd)
		}
		if err != nil {
			return err
		}
	}
	if _, err := w.dec.Token(); err != nil { // '}'
		return err
	}
	w.out.WriteByte('}')
	return nil
}

func (w *rewriter) list(fd protoreflect.FieldDescriptor) error {
	tok, err := w.dec.Token()
	if err != nil {
		return err
	}
	if tok == nil {
		w.out.WriteString("null")
		return nil
	}
	if tok != json.Delim('[') {
		return errShape
	}
	w.out.WriteByte('[')
	for i := 0; w.dec.More(); i++ {
		if i > 0 {
			w.out.WriteByte(',')
		}
		if err := w.value(fd); err != nil {
			return err
		}
	}
	if _, err := w.dec.Token(); err != nil { // ']'
		return err
	}
	w.out.WriteByte(']')
	return nil
}

func (w *rewriter) mapValue(fd protoreflect.FieldDescriptor) error {
	tok, err := w.dec.Token()
	if err != nil {
		return err
	}
	if tok == nil {
		w.out.WriteString("null")
		return nil
	}
	if tok != json.Delim('{') {
		return errShape
	}
	w.out.WriteByte('{')
	for i := 0; w.dec.More(); i++ {
		if i > 0 {
			w.out.WriteByte(',')
		}
		k, err := w.dec.Token()
		if err != nil {
			return err
		}
		s, _ := k.(string)
		w.str(s)
		w.out.WriteByte(':')
		if err := w.value(fd.MapValue()); err != nil {
			return err
		}
	}
	if _, err := w.dec.Token(); err != nil { // '}'
		return err
	}
	w.out.WriteByte('}')
	return nil
}

// value rewrites one value of field fd (an element, for lists and maps).
func (w *rewriter) value(fd protoreflect.FieldDescriptor) error {
	switch fd.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return w.message(fd.Message())
	case protoreflect.EnumKind:
		tok, err := w.dec.Token()
		if err != nil {
			return err
		}
		return w.enum(fd.Enum(), tok)
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind,
		protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		tok, err := w.dec.Token()
		if err != nil {
			return err
		}
		return w.integer(tok)
	}
	return w.copyValue()
}

func (w *rewriter) enum(ed protoreflect.EnumDescriptor, tok json.Token) error {
	s, ok := tok.(string)
	if !ok || ed.FullName() == "google.protobuf.NullValue" {
		return w.token(tok)
	}
	ev := ed.Values().ByName(protoreflect.Name(s))
	if ev == nil {
		return w.token(tok)
	}
	w.str(names(ed).short[ev.Number()])
	return nil
}

// integer writes a 64-bit integer protojson wrote as a string as a number.
func (w *rewriter) integer(tok json.Token) error {
	if s, ok := tok.(string); ok {
		if _, err := strconv.ParseInt(s, 10, 64); err == nil {
			w.out.WriteString(s)
			return nil
		}
		if _, err := strconv.ParseUint(s, 10, 64); err == nil {
			w.out.WriteString(s)
			return nil
		}
	}
	return w.token(tok)
}

// token writes a scalar token as it was.
func (w *rewriter) token(tok json.Token) error {
	switch v := tok.(type) {
	case nil:
		w.out.WriteString("null")
	case string:
		w.str(v)
	case json.Number:
		w.out.WriteString(v.String())
	case bool:
		w.out.WriteString(strconv.FormatBool(v))
	default:
		return errShape
	}
	return nil
}

func (w *rewriter) copyValue() error {
	var raw json.RawMessage
	if err := w.dec.Decode(&raw); err != nil {
		return err
	}
	// protojson varies its whitespace from build to build on purpose; the
	// output is compact, the same every time.
	return json.Compact(&w.out, raw)
}

// str writes s as a JSON string without HTML escapes (protojson writes
// none either).
func (w *rewriter) str(s string) {
	plain := true
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' || c >= 0x80 {
			plain = false
			break
		}
	}
	if plain {
		w.out.WriteByte('"')
		w.out.WriteString(s)
		w.out.WriteByte('"')
		return
	}
	enc := json.NewEncoder(&w.out)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)
	w.out.Truncate(w.out.Len() - 1) // Encode's newline
}

// wellKnown reports the google.protobuf types, whose JSON forms are not
// objects of their fields (Timestamp, Duration, Struct, wrappers...).
func wellKnown(md protoreflect.MessageDescriptor) bool {
	return strings.HasPrefix(string(md.FullName()), "google.protobuf.")
}
