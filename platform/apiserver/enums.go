package apiserver

import (
	"context"
	"errors"
	"io"
	"net/url"
	"strings"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/grpc-ecosystem/grpc-gateway/v2/utilities"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/hangar-dev/hangar/platform/apijson"
	"github.com/hangar-dev/hangar/platform/fault"
)

// enumCheckingJSON is the gateway's marshaler: hangar's JSON
// (apijson.Gateway: enums by the names the docs use, 64-bit integers as
// numbers), with the error for an enum value its enum does not define kept
// for gatewayError. protojson's DiscardUnknown (kept so that unknown fields
// are ignored) would drop unknown enum names, leaving the field at its zero
// value: {"harness": "codex"} made a Claude session. Undefined numbers are
// refused here too, and by the gRPC edge (rpc.CheckEnums), which every REST
// call passes through.
type enumCheckingJSON struct {
	apijson.Gateway
}

// NewDecoder implements runtime.Marshaler.
func (j *enumCheckingJSON) NewDecoder(r io.Reader) runtime.Decoder {
	dec := j.Gateway.NewDecoder(r)
	return runtime.DecoderFunc(func(v any) error {
		err := dec.Decode(v)
		var ferr *fault.Error
		if errors.As(err, &ferr) {
			// The gateway turns the error into a bare InvalidArgument;
			// gatewayError gives it the edge's reason and field instead.
			if body, ok := r.(*cappedBody); ok {
				body.decodeFault.Store(ferr)
			}
			return errors.New(ferr.Message)
		}
		return err
	})
}

// enumCheckingQuery is the gateway's query parameter parser reading enum
// fields given in the query (GET /api/sessions?states=idle) by the JSON
// names too, with the same check: the default parser knows only the proto
// names and, refusing an unknown value, names neither the field nor the
// values it takes.
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
	values, err := apijson.NormalizeQuery(msg.ProtoReflect().Descriptor(), values)
	var ferr *fault.Error
	if errors.As(err, &ferr) {
		// The gateway makes this a bare InvalidArgument with our text;
		// gatewayError finds the field again and adds reason and field.
		return errors.New(ferr.Message)
	}
	if err != nil {
		return err
	}
	return q.DefaultQueryParser.Parse(msg, values, filter)
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
