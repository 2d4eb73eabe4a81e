package apijson

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// OpenAPI rewrites an OpenAPI document protoc-gen-openapiv2 wrote (it
// knows only protojson's mapping) to describe this package's JSON, for the
// enums of files' packages under pkgPrefix ("hangar."):
//
//   - each "enum" list holds the values' JSON names, without *_UNSPECIFIED;
//   - a "default" that was *_UNSPECIFIED goes;
//   - the " - NAME: comment" lines of descriptions name the JSON names;
//   - a 64-bit integer ("type": "string" with "format": "int64" or
//     "uint64") is "type": "integer".
//
// Everything else stays, in its order; the result is indented by two
// spaces. Rewriting a rewritten document changes nothing.
func OpenAPI(doc []byte, files *protoregistry.Files, pkgPrefix string) ([]byte, error) {
	short := map[string]string{}
	unset := map[string]bool{}
	var conflict error
	files.RangeFiles(func(fd protoreflect.FileDescriptor) bool {
		if !strings.HasPrefix(string(fd.Package()), pkgPrefix) {
			return true
		}
		conflict = rangeEnums(fd.Enums(), fd.Messages(), func(ed protoreflect.EnumDescriptor) error {
			n := names(ed)
			values := ed.Values()
			for i := range values.Len() {
				ev := values.Get(i)
				long, name := string(ev.Name()), n.short[ev.Number()]
				if was, ok := short[long]; ok && was != name {
					return fmt.Errorf("apijson: %s is %q in one enum and %q in another", long, was, name)
				}
				short[long] = name
				if unspecified(ev) {
					unset[long] = true
				}
			}
			return nil
		})
		return conflict == nil
	})
	if conflict != nil {
		return nil, conflict
	}
	var v ordered
	if err := json.Unmarshal(doc, &v); err != nil {
		return nil, fmt.Errorf("apijson: not a JSON document: %w", err)
	}
	o := &openAPIRewrite{short: short, unset: unset}
	v = o.value(v)
	compact, err := v.MarshalJSON()
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	if err := json.Indent(&out, compact, "", "  "); err != nil {
		return nil, err
	}
	out.WriteByte('\n')
	return out.Bytes(), nil
}

func rangeEnums(enums protoreflect.EnumDescriptors, msgs protoreflect.MessageDescriptors, f func(protoreflect.EnumDescriptor) error) error {
	for i := range enums.Len() {
		if err := f(enums.Get(i)); err != nil {
			return err
		}
	}
	for i := range msgs.Len() {
		md := msgs.Get(i)
		if err := rangeEnums(md.Enums(), md.Messages(), f); err != nil {
			return err
		}
	}
	return nil
}

type openAPIRewrite struct {
	short map[string]string
	unset map[string]bool
}

// enumLine is a value's line in a description protoc-gen-openapiv2 wrote.
var enumLine = regexp.MustCompile(`(?m)^ - ([A-Z][A-Z0-9_]*):`)

func (o *openAPIRewrite) value(v ordered) ordered {
	switch {
	case v.object != nil:
		obj := v.object
		var typ, format string
		for _, kv := range obj {
			switch kv.key {
			case "type":
				_ = json.Unmarshal(kv.value.raw, &typ)
			case "format":
				_ = json.Unmarshal(kv.value.raw, &format)
			}
		}
		out := obj[:0:0]
		for _, kv := range obj {
			switch kv.key {
			case "enum":
				kv.value = o.enum(kv.value)
			case "default":
				var s string
				if json.Unmarshal(kv.value.raw, &s) == nil && o.unset[s] {
					continue
				}
				if name, ok := o.short[s]; ok {
					kv.value = ordered{raw: mustJSON(name)}
				}
			case "description":
				var s string
				if json.Unmarshal(kv.value.raw, &s) == nil {
					s = enumLine.ReplaceAllStringFunc(s, func(line string) string {
						long := strings.TrimSuffix(strings.TrimPrefix(line, " - "), ":")
						if name, ok := o.short[long]; ok {
							return " - " + name + ":"
						}
						return line
					})
					kv.value = ordered{raw: mustJSON(s)}
				}
			case "type":
				if typ == "string" && (format == "int64" || format == "uint64") {
					kv.value = ordered{raw: mustJSON("integer")}
				}
			default:
				kv.value = o.value(kv.value)
			}
			out = append(out, kv)
		}
		return ordered{object: out}
	case v.array != nil:
		for i := range v.array {
			v.array[i] = o.value(v.array[i])
		}
	}
	return v
}

func (o *openAPIRewrite) enum(v ordered) ordered {
	if v.array == nil {
		return v
	}
	out := make([]ordered, 0, len(v.array))
	for _, item := range v.array {
		var s string
		if json.Unmarshal(item.raw, &s) == nil {
			if o.unset[s] {
				continue
			}
			if name, ok := o.short[s]; ok {
				item = ordered{raw: mustJSON(name)}
			}
		}
		out = append(out, item)
	}
	return ordered{array: out}
}

func mustJSON(s string) json.RawMessage {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

// ordered is a JSON value that keeps its objects' keys in order.
type ordered struct {
	object []keyValue // nil unless an object (empty objects are non-nil)
	array  []ordered  // nil unless an array (empty arrays are non-nil)
	raw    json.RawMessage
}

type keyValue struct {
	key   string
	value ordered
}

func (v *ordered) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	switch {
	case len(b) > 0 && b[0] == '{':
		dec := json.NewDecoder(bytes.NewReader(b))
		if _, err := dec.Token(); err != nil {
			return err
		}
		v.object = []keyValue{}
		for dec.More() {
			tok, err := dec.Token()
			if err != nil {
				return err
			}
			key, _ := tok.(string)
			var val ordered
			if err := dec.Decode(&val); err != nil {
				return err
			}
			v.object = append(v.object, keyValue{key: key, value: val})
		}
	case len(b) > 0 && b[0] == '[':
		var items []ordered
		if err := json.Unmarshal(b, &items); err != nil {
			return err
		}
		v.array = append([]ordered{}, items...)
	default:
		v.raw = append(json.RawMessage(nil), b...)
	}
	return nil
}

func (v ordered) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	switch {
	case v.object != nil:
		b.WriteByte('{')
		for i, kv := range v.object {
			if i > 0 {
				b.WriteByte(',')
			}
			b.Write(mustJSON(kv.key))
			b.WriteByte(':')
			vb, err := kv.value.MarshalJSON()
			if err != nil {
				return nil, err
			}
			b.Write(vb)
		}
		b.WriteByte('}')
	case v.array != nil:
		b.WriteByte('[')
		for i, item := range v.array {
			if i > 0 {
				b.WriteByte(',')
			}
			vb, err := item.MarshalJSON()
			if err != nil {
				return nil, err
			}
			b.Write(vb)
		}
		b.WriteByte(']')
	default:
		return v.raw, nil
	}
	return b.Bytes(), nil
}
