package apijson

import (
	"strings"
	"sync"
	"unicode"

	"google.golang.org/protobuf/reflect/protoreflect"
)

// enumNames are the JSON names of one enum's values.
type enumNames struct {
	short   map[protoreflect.EnumNumber]string // number -> JSON name
	numbers map[string]protoreflect.EnumNumber // JSON name -> number
	listed  []string                           // the names a client may send, in declaration order
}

var namesCache sync.Map // protoreflect.FullName -> *enumNames

// names derives the JSON names of ed's values from the descriptor alone:
// the value's proto name without the prefix buf's ENUM_VALUE_PREFIX rule
// gives every value (the enum's name in UPPER_SNAKE_CASE and "_"), in
// lower case: SESSION_STATE_IDLE is "idle", TURN_OUTCOME_OVER_BUDGET
// "over_budget". An enum whose values do not all carry that prefix
// (grpc.health.v1's SERVING, NOT_SERVING) keeps the whole names, in lower
// case. Two values never get one name: protoc refuses a proto3 enum whose
// names collide once that prefix is stripped.
func names(ed protoreflect.EnumDescriptor) *enumNames {
	if n, ok := namesCache.Load(ed.FullName()); ok {
		return n.(*enumNames)
	}
	values := ed.Values()
	prefix := upperSnake(string(ed.Name())) + "_"
	for i := range values.Len() {
		name := string(values.Get(i).Name())
		if !strings.HasPrefix(name, prefix) || len(name) == len(prefix) {
			prefix = ""
			break
		}
	}
	n := &enumNames{
		short:   make(map[protoreflect.EnumNumber]string, values.Len()),
		numbers: make(map[string]protoreflect.EnumNumber, values.Len()),
	}
	for i := range values.Len() {
		ev := values.Get(i)
		name := strings.ToLower(strings.TrimPrefix(string(ev.Name()), prefix))
		n.numbers[name] = ev.Number()
		if _, ok := n.short[ev.Number()]; !ok {
			n.short[ev.Number()] = name // the first of aliases names the number
		}
		if !unspecified(ev) {
			n.listed = append(n.listed, name)
		}
	}
	namesCache.Store(ed.FullName(), n)
	return n
}

// unspecified reports a zero value named *_UNSPECIFIED: "not set", which
// the JSON leaves out.
func unspecified(ev protoreflect.EnumValueDescriptor) bool {
	return ev.Number() == 0 && strings.HasSuffix(string(ev.Name()), "_UNSPECIFIED")
}

// upperSnake is buf's UPPER_SNAKE_CASE of an enum name: SessionState is
// SESSION_STATE, HTTPMethod HTTP_METHOD.
func upperSnake(s string) string {
	r := []rune(s)
	var b strings.Builder
	for i, c := range r {
		if i > 0 && unicode.IsUpper(c) {
			prev := r[i-1]
			nextLower := i+1 < len(r) && unicode.IsLower(r[i+1])
			if unicode.IsLower(prev) || unicode.IsDigit(prev) || (unicode.IsUpper(prev) && nextLower) {
				b.WriteByte('_')
			}
		}
		b.WriteRune(unicode.ToUpper(c))
	}
	return b.String()
}

// EnumName is the JSON name of enum value e ("idle" for
// SESSION_STATE_IDLE); "" for a number its enum does not define.
func EnumName(e protoreflect.Enum) string {
	return names(e.Descriptor()).short[e.Number()]
}

// ParseEnum reads a value of enum ed as a client may send it: the JSON name
// ("idle") or the proto name ("SESSION_STATE_IDLE"), exactly.
func ParseEnum(ed protoreflect.EnumDescriptor, s string) (protoreflect.EnumNumber, bool) {
	if ev := ed.Values().ByName(protoreflect.Name(s)); ev != nil {
		return ev.Number(), true
	}
	num, ok := names(ed).numbers[s]
	return num, ok
}

// EnumNames lists the JSON names a client may send for enum ed, in
// declaration order, without the *_UNSPECIFIED zero value.
func EnumNames(ed protoreflect.EnumDescriptor) []string {
	return names(ed).listed
}
