package apijson

import (
	"bytes"
	"encoding/json"
	"io"
	"maps"
	"slices"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// Gateway is grpc-gateway's runtime.Marshaler for hangar's JSON: responses
// as Marshal writes them (a streamed response's {"result": ...} and
// {"error": ...} chunks too), request bodies as Unmarshal reads them except
// that unknown fields are ignored, as REST always did.
type Gateway struct{}

var _ runtime.Marshaler = Gateway{}

// fallback marshals what is not a message (grpc-gateway hands a marshaler
// bare field values for a response_body that is not a message).
var fallback = &runtime.JSONPb{
	MarshalOptions:   marshalOptions,
	UnmarshalOptions: protojson.UnmarshalOptions{DiscardUnknown: true},
}

// ContentType implements runtime.Marshaler.
func (Gateway) ContentType(any) string { return "application/json" }

// Marshal implements runtime.Marshaler.
func (g Gateway) Marshal(v any) ([]byte, error) {
	switch v := v.(type) {
	case proto.Message:
		return Marshal(v)
	case map[string]proto.Message: // an error chunk of a stream
		return marshalChunk(v)
	case map[string]any: // a result chunk of a stream
		return marshalChunk(v)
	}
	return fallback.Marshal(v)
}

func marshalChunk[V any](chunk map[string]V) ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, k := range slices.Sorted(maps.Keys(chunk)) {
		if i > 0 {
			b.WriteByte(',')
		}
		kb, _ := json.Marshal(k)
		b.Write(kb)
		b.WriteByte(':')
		vb, err := Gateway{}.Marshal(chunk[k])
		if err != nil {
			return nil, err
		}
		b.Write(vb)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// Unmarshal implements runtime.Marshaler.
func (Gateway) Unmarshal(data []byte, v any) error {
	if m, ok := v.(proto.Message); ok {
		return unmarshal(data, m, protojson.UnmarshalOptions{DiscardUnknown: true})
	}
	return fallback.Unmarshal(data, v)
}

// NewDecoder implements runtime.Marshaler: each Decode reads the next JSON
// value of r.
func (g Gateway) NewDecoder(r io.Reader) runtime.Decoder {
	dec := json.NewDecoder(r)
	return runtime.DecoderFunc(func(v any) error {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return err
		}
		return g.Unmarshal(raw, v)
	})
}

// NewEncoder implements runtime.Marshaler: each Encode writes one value and
// a newline.
func (g Gateway) NewEncoder(w io.Writer) runtime.Encoder {
	return runtime.EncoderFunc(func(v any) error {
		b, err := g.Marshal(v)
		if err != nil {
			return err
		}
		_, err = w.Write(append(b, '\n'))
		return err
	})
}
