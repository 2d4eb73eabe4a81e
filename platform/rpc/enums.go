package rpc

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/hangar-dev/hangar/platform/fault"
)

// CheckEnums returns an InvalidArgument *fault.Error for the first enum
// field of m, at any depth (lists, map values, nested messages), that holds a
// number its enum does not define. proto3 enums are open: the wire and JSON
// (a number) carry any int32, and a service that switches on the value would
// otherwise treat 99 as its zero value. The error names the field by its
// proto path (e.g. "spec.egress", "attachments[1].kind") and lists the
// allowed values.
func CheckEnums(m proto.Message) error {
	if m == nil {
		return nil
	}
	return checkEnums(m.ProtoReflect(), "")
}

func checkEnums(m protoreflect.Message, prefix string) error {
	var err error
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		name := prefix + fd.TextName()
		switch {
		case fd.IsList():
			list := v.List()
			for i := range list.Len() {
				if err = checkValue(fd, list.Get(i), fmt.Sprintf("%s[%d]", name, i)); err != nil {
					return false
				}
			}
		case fd.IsMap():
			vd := fd.MapValue()
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				err = checkValue(vd, mv, fmt.Sprintf("%s[%s]", name, strconv.Quote(k.String())))
				return err == nil
			})
		default:
			err = checkValue(fd, v, name)
		}
		return err == nil
	})
	return err
}

func checkValue(fd protoreflect.FieldDescriptor, v protoreflect.Value, name string) error {
	switch fd.Kind() {
	case protoreflect.EnumKind:
		ed := fd.Enum()
		if ed.Values().ByNumber(v.Enum()) == nil {
			return UnknownEnumValue(name, strconv.Itoa(int(v.Enum())), ed)
		}
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return checkEnums(v.Message(), name+".")
	}
	return nil
}

// UnknownEnumValue is the InvalidArgument error for field holding value
// (a name or a number, as the client sent it), which enum ed does not define.
func UnknownEnumValue(field, value string, ed protoreflect.EnumDescriptor) *fault.Error {
	return fault.InvalidArgument(field, "%s: unknown value %s; want one of %s",
		field, value, strings.Join(EnumNames(ed), ", "))
}

// EnumNames lists the values a client may send for enum ed, by name: every
// value except a zero one named *_UNSPECIFIED (which means "not set" and is
// what leaving the field out sends).
func EnumNames(ed protoreflect.EnumDescriptor) []string {
	values := ed.Values()
	names := make([]string, 0, values.Len())
	for i := range values.Len() {
		ev := values.Get(i)
		if ev.Number() == 0 && strings.HasSuffix(string(ev.Name()), "_UNSPECIFIED") {
			continue
		}
		names = append(names, string(ev.Name()))
	}
	return names
}

// checkEnumsUnary rejects a request holding an undefined enum number before
// the handler sees it.
func checkEnumsUnary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if m, ok := req.(proto.Message); ok {
			if err := CheckEnums(m); err != nil {
				return nil, err
			}
		}
		return handler(ctx, req)
	}
}

// checkEnumsStream checks every message a streaming handler receives.
func checkEnumsStream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		return handler(srv, enumCheckedStream{ss})
	}
}

type enumCheckedStream struct{ grpc.ServerStream }

func (s enumCheckedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if pm, ok := m.(proto.Message); ok {
		if err := CheckEnums(pm); err != nil {
			return fault.Status(err).Err()
		}
	}
	return nil
}
