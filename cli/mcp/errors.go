package mcp

import (
	"errors"
	"strings"
	"unicode"

	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hangar-dev/hangar/platform/fault"
)

// ErrorMetaKey is the _meta key of a tool error's parts (code, reason,
// message, field), for programs; the text says the same for a model.
const ErrorMetaKey = "hangar.dev/error"

// toolError is err as an MCP tool error: "CODE REASON: message" as its
// text (the reason left out when it is the code), the same parts under
// ErrorMetaKey. err is a status from the API (its message is what hangar
// lets a client see) or the façade's own *fault.Error about the input.
func toolError(err error) *mcpsdk.CallToolResult {
	var st *status.Status
	var fe *fault.Error
	if errors.As(err, &fe) {
		st = fault.Status(fe)
	} else if s, ok := status.FromError(err); ok {
		st = s
	} else {
		st = status.New(codes.Unknown, err.Error())
	}
	code := codeName(st.Code())
	reason := fault.Reason(st)
	if reason == "" && st.Code() == codes.Unauthenticated {
		reason = "UNAUTHENTICATED"
	}
	field := ""
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok && len(br.GetFieldViolations()) > 0 {
			field = br.GetFieldViolations()[0].GetField()
		}
	}
	head := code
	if reason != "" && reason != code {
		head += " " + reason
	}
	parts := map[string]any{"code": code, "message": st.Message()}
	if reason != "" {
		parts["reason"] = reason
	}
	if field != "" {
		parts["field"] = field
	}
	return &mcpsdk.CallToolResult{
		IsError: true,
		Content: []mcpsdk.Content{&mcpsdk.TextContent{Text: head + ": " + st.Message()}},
		Meta:    mcpsdk.Meta{ErrorMetaKey: parts},
	}
}

// codeName is a gRPC code's canonical name: NOT_FOUND, FAILED_PRECONDITION.
func codeName(c codes.Code) string {
	switch c {
	case codes.OK:
		return "OK"
	case codes.Canceled:
		return "CANCELLED"
	}
	var b strings.Builder
	for i, r := range c.String() {
		if i > 0 && unicode.IsUpper(r) {
			b.WriteByte('_')
		}
		b.WriteRune(unicode.ToUpper(r))
	}
	return b.String()
}
