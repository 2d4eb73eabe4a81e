package apiserver_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

	gwruntime "github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/grpc-ecosystem/grpc-gateway/v2/utilities"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/hangar-dev/hangar/platform/apiserver"
	"github.com/hangar-dev/hangar/platform/rpc"
)

// echoFile is a request message with enums in every place a field can hold
// one, served by hangar.test.v1.Echo/Echo and POST /v1/echo.
const echoFile = `
name: "hangar/test/v1/echo.proto" package: "hangar.test.v1" syntax: "proto3"
enum_type { name: "Mode" value { name: "MODE_UNSPECIFIED" number: 0 } value { name: "MODE_A" number: 1 } value { name: "MODE_B" number: 2 } }
message_type { name: "Inner" field { name: "mode" number: 1 label: LABEL_OPTIONAL type: TYPE_ENUM type_name: ".hangar.test.v1.Mode" json_name: "mode" } }
message_type {
  name: "Request"
  field { name: "mode" number: 1 label: LABEL_OPTIONAL type: TYPE_ENUM type_name: ".hangar.test.v1.Mode" json_name: "mode" }
  field { name: "modes" number: 2 label: LABEL_REPEATED type: TYPE_ENUM type_name: ".hangar.test.v1.Mode" json_name: "modes" }
  field { name: "by_name" number: 3 label: LABEL_REPEATED type: TYPE_MESSAGE type_name: ".hangar.test.v1.Request.ByNameEntry" json_name: "byName" }
  field { name: "inner" number: 4 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".hangar.test.v1.Inner" json_name: "inner" }
  field { name: "payload" number: 5 label: LABEL_OPTIONAL type: TYPE_BYTES json_name: "payload" }
  field { name: "count" number: 6 label: LABEL_OPTIONAL type: TYPE_INT64 json_name: "count" }
  field { name: "size" number: 7 label: LABEL_OPTIONAL type: TYPE_UINT64 json_name: "size" }
  nested_type {
    name: "ByNameEntry" options { map_entry: true }
    field { name: "key" number: 1 label: LABEL_OPTIONAL type: TYPE_STRING json_name: "key" }
    field { name: "value" number: 2 label: LABEL_OPTIONAL type: TYPE_ENUM type_name: ".hangar.test.v1.Mode" json_name: "value" }
  }
}
service { name: "Echo" method { name: "Echo" input_type: ".hangar.test.v1.Request" output_type: ".hangar.test.v1.Request" } }`

const echoMethod = "/hangar.test.v1.Echo/Echo"

// echoDescriptor builds echoFile and registers it globally, as generated
// code registers hangar's protos (the gateway's query parser looks enums up
// there).
var echoDescriptor = sync.OnceValues(func() (protoreflect.MessageDescriptor, error) {
	var fdp descriptorpb.FileDescriptorProto
	if err := prototext.Unmarshal([]byte(echoFile), &fdp); err != nil {
		return nil, fmt.Errorf("parse test descriptor: %w", err)
	}
	fd, err := protodesc.NewFile(&fdp, nil)
	if err != nil {
		return nil, fmt.Errorf("build test descriptor: %w", err)
	}
	if err := protoregistry.GlobalFiles.RegisterFile(fd); err != nil {
		return nil, err
	}
	if err := protoregistry.GlobalTypes.RegisterEnum(dynamicpb.NewEnumType(fd.Enums().ByName("Mode"))); err != nil {
		return nil, err
	}
	return fd.Messages().ByName("Request"), nil
})

func echoRequest(t *testing.T) protoreflect.MessageDescriptor {
	t.Helper()
	md, err := echoDescriptor()
	if err != nil {
		t.Fatal(err)
	}
	return md
}

// echoServer serves Echo over gRPC and POST /v1/echo over REST, the way
// generated code does (the gateway decodes the body with the mux's
// marshaler and calls the gRPC method).
func echoServer(t *testing.T, md protoreflect.MessageDescriptor, maxRequestBytes int64) *running {
	t.Helper()
	desc := &grpc.ServiceDesc{
		ServiceName: "hangar.test.v1.Echo",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{
			MethodName: "Echo",
			Handler: func(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
				in := dynamicpb.NewMessage(md)
				if err := dec(in); err != nil {
					return nil, err
				}
				info := &grpc.UnaryServerInfo{Server: srv, FullMethod: echoMethod}
				return icpt(ctx, in, info, func(_ context.Context, req any) (any, error) { return req, nil })
			},
		}},
	}
	gateway := func(_ context.Context, mux *gwruntime.ServeMux, conn *grpc.ClientConn) error {
		err := mux.HandlePath(http.MethodGet, "/v1/echo", func(w http.ResponseWriter, r *http.Request, _ map[string]string) {
			_, outbound := gwruntime.MarshalerForRequest(mux, r)
			ctx, err := gwruntime.AnnotateContext(r.Context(), mux, r, echoMethod, gwruntime.WithHTTPPathPattern("/v1/echo"))
			if err != nil {
				gwruntime.HTTPError(ctx, mux, outbound, w, r, err)
				return
			}
			in := dynamicpb.NewMessage(md)
			if err := gwruntime.PopulateQueryParameters(in, r.URL.Query(), &utilities.DoubleArray{}); err != nil {
				gwruntime.HTTPError(ctx, mux, outbound, w, r, status.Errorf(codes.InvalidArgument, "%v", err))
				return
			}
			gwruntime.ForwardResponseMessage(ctx, mux, outbound, w, r, in)
		})
		if err != nil {
			return err
		}
		return mux.HandlePath(http.MethodPost, "/v1/echo", func(w http.ResponseWriter, r *http.Request, _ map[string]string) {
			inbound, outbound := gwruntime.MarshalerForRequest(mux, r)
			ctx, err := gwruntime.AnnotateContext(r.Context(), mux, r, echoMethod, gwruntime.WithHTTPPathPattern("/v1/echo"))
			if err != nil {
				gwruntime.HTTPError(ctx, mux, outbound, w, r, err)
				return
			}
			in := dynamicpb.NewMessage(md)
			if err := inbound.NewDecoder(r.Body).Decode(in); err != nil && !errors.Is(err, io.EOF) {
				gwruntime.HTTPError(ctx, mux, outbound, w, r, status.Errorf(codes.InvalidArgument, "%v", err))
				return
			}
			out := dynamicpb.NewMessage(md)
			if err := conn.Invoke(ctx, echoMethod, in, out); err != nil {
				gwruntime.HTTPError(ctx, mux, outbound, w, r, err)
				return
			}
			gwruntime.ForwardResponseMessage(ctx, mux, outbound, w, r, out)
		})
	}
	return start(t, apiserver.Options{
		Name:            "echo",
		MaxRequestBytes: maxRequestBytes,
		Register:        func(s *grpc.Server) { s.RegisterService(desc, struct{}{}) },
		Gateways:        []func(context.Context, *gwruntime.ServeMux, *grpc.ClientConn) error{gateway},
	})
}

// letters is an endless run of 'A' that costs nothing to send.
type letters struct{}

func (letters) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'A'
	}
	return len(p), nil
}

// bigJSON is a valid start of a JSON body of n bytes, {"payload":"AAAA...,
// so that a server reading it finds nothing wrong before the end.
func bigJSON(n int64) io.Reader {
	const head = `{"payload":"`
	return io.MultiReader(strings.NewReader(head), io.LimitReader(letters{}, n-int64(len(head))))
}

// grpcFrame is one gRPC message of n bytes on the wire: uncompressed flag,
// length, payload (a bytes field 5 would need a tag; the server must not get
// that far).
func grpcFrame(n uint32) io.Reader {
	head := []byte{0, byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}
	return io.MultiReader(bytes.NewReader(head), io.LimitReader(letters{}, int64(n)))
}

// chunked hides a reader's length, so the request goes without
// Content-Length (chunked on HTTP/1.1).
type chunked struct{ io.Reader }

// sized sends its length as Content-Length.
type sized struct {
	io.Reader
	n int64
}

func post(t *testing.T, c *http.Client, url, bearer, contentType string, body io.Reader) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, body)
	if err != nil {
		t.Fatalf("NewRequest: %v", err)
	}
	if s, ok := body.(sized); ok {
		req.ContentLength = s.n
	}
	req.Header.Set("Content-Type", contentType)
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read %s: %v", url, err)
	}
	// Trailers (gRPC's status) are complete once the body is read.
	for k, v := range resp.Trailer {
		resp.Header[k] = v
	}
	return resp.StatusCode, string(b), resp.Header
}

// h2cClient speaks HTTP/2 with prior knowledge, as gRPC clients do.
func h2cClient(t *testing.T) *http.Client {
	t.Helper()
	var protocols http.Protocols
	protocols.SetUnencryptedHTTP2(true)
	tr := &http.Transport{Protocols: &protocols, TLSClientConfig: &tls.Config{}}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// rssBytes is the process's resident set (VmRSS in /proc/self/status).
func rssBytes(t *testing.T) int64 {
	t.Helper()
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Skipf("no /proc/self/status: %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("VmRSS %q: %v", rest, err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmRSS in /proc/self/status")
	return 0
}

// TestUnauthenticatedBodyIsNotRead sends 100 MB bodies without a token to a
// REST route (with and without Content-Length, HTTP/1.1 and h2), and a 60 MB
// gRPC message (under the cap) to a known and an unknown service: each is
// refused from its headers, and the server neither reads nor keeps the body
// (heap allocations and RSS grow by less than 20 MB; reading it would cost
// 100 MB or more).
func TestUnauthenticatedBodyIsNotRead(t *testing.T) {
	md := echoRequest(t)
	r := echoServer(t, md, 0) // the default cap (64 MB) is below the body
	base := "http://" + r.addr
	const bodySize = 100 << 20
	// A gRPC message under the cap, which a server checking the token
	// after receiving the message would read whole.
	const grpcSize = 60 << 20
	const budget = 20 << 20

	tests := []struct {
		name        string
		client      *http.Client
		path        string
		contentType string
		body        func() io.Reader
		wantCode    int
		wantGRPC    string // Grpc-Status, for gRPC
	}{
		{"rest, Content-Length", httpClient(t), "/v1/echo", "application/json",
			func() io.Reader { return sized{bigJSON(bodySize), bodySize} }, http.StatusUnauthorized, ""},
		{"rest, chunked", httpClient(t), "/v1/echo", "application/json",
			func() io.Reader { return chunked{bigJSON(bodySize)} }, http.StatusUnauthorized, ""},
		{"rest, h2", h2cClient(t), "/v1/echo", "application/json",
			func() io.Reader { return chunked{bigJSON(bodySize)} }, http.StatusUnauthorized, ""},
		{"grpc, known method", h2cClient(t), echoMethod, "application/grpc",
			func() io.Reader { return chunked{grpcFrame(grpcSize)} }, http.StatusOK, "16"},
		{"grpc, unknown service", h2cClient(t), "/hangar.nope.v1.Nope/Call", "application/grpc+proto",
			func() io.Reader { return chunked{grpcFrame(grpcSize)} }, http.StatusOK, "16"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			rssBefore := rssBytes(t)

			code, body, header := post(t, tt.client, base+tt.path, "", tt.contentType, tt.body())

			runtime.ReadMemStats(&after)
			rssGrowth := rssBytes(t) - rssBefore
			allocated := int64(after.TotalAlloc - before.TotalAlloc)
			t.Logf("%s: %d, allocated %.1f MB, RSS %+.1f MB", tt.name, code, float64(allocated)/(1<<20), float64(rssGrowth)/(1<<20))
			if code != tt.wantCode {
				t.Errorf("status = %d %q, want %d", code, body, tt.wantCode)
			}
			if tt.wantGRPC != "" && (header.Get("Grpc-Status") != tt.wantGRPC || header.Get("Grpc-Message") != "missing or invalid bearer token") {
				t.Errorf("grpc status = %q %q, want %s (Unauthenticated)", header.Get("Grpc-Status"), header.Get("Grpc-Message"), tt.wantGRPC)
			}
			if tt.wantGRPC == "" && !strings.Contains(body, `"code":"UNAUTHENTICATED"`) {
				t.Errorf("body = %q, want the Unauthenticated error", body)
			}
			if allocated >= budget {
				t.Errorf("allocated %d bytes answering an unauthenticated 100 MB body, want < %d", allocated, budget)
			}
			if rssGrowth >= budget {
				t.Errorf("RSS grew %d bytes answering an unauthenticated 100 MB body, want < %d", rssGrowth, budget)
			}
		})
	}
}

// TestRequestBodyCap checks the cap on authenticated requests: REST bodies
// over it are a 413 (before reading when Content-Length says so, at the cap
// otherwise), gRPC messages over it ResourceExhausted, and both under it
// pass.
func TestRequestBodyCap(t *testing.T) {
	md := echoRequest(t)
	const limit = 1 << 20
	r := echoServer(t, md, limit)
	base := "http://" + r.addr
	c := httpClient(t)

	jsonBody := func(payloadBytes int) []byte {
		// base64 of n bytes is 4n/3 characters.
		return []byte(`{"mode":"a","payload":"` + strings.Repeat("A", payloadBytes/3*4) + `"}`)
	}
	const tooLarge = `{"code":"RESOURCE_EXHAUSTED","reason":"REQUEST_TOO_LARGE","message":"request body over the 1 MB limit (HANGAR_MAX_REQUEST_MB)"}`
	tests := []struct {
		name     string
		body     io.Reader
		wantCode int
		wantBody string
	}{
		{"under the cap", bytes.NewReader(jsonBody(600 << 10)), http.StatusOK, `"mode":"a"`},
		{"over, Content-Length", bytes.NewReader(jsonBody(900 << 10)), http.StatusRequestEntityTooLarge, tooLarge},
		{"over, chunked", chunked{bytes.NewReader(jsonBody(900 << 10))}, http.StatusRequestEntityTooLarge, tooLarge},
		{"100 MB, Content-Length", sized{bigJSON(100 << 20), 100 << 20}, http.StatusRequestEntityTooLarge, tooLarge},
		{"100 MB, chunked", chunked{bigJSON(100 << 20)}, http.StatusRequestEntityTooLarge, tooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body, _ := post(t, c, base+"/v1/echo", token, "application/json", tt.body)
			if code != tt.wantCode || !strings.Contains(body, tt.wantBody) {
				t.Errorf("POST = %d %.200q, want %d containing %q", code, body, tt.wantCode, tt.wantBody)
			}
		})
	}
	t.Run("over, h2", func(t *testing.T) {
		code, body, _ := post(t, h2cClient(t), base+"/v1/echo", token, "application/json", chunked{bigJSON(100 << 20)})
		if code != http.StatusRequestEntityTooLarge || !strings.Contains(body, tooLarge) {
			t.Errorf("POST over h2 = %d %.200q, want 413", code, body)
		}
	})

	conn, err := rpc.Dial(r.addr, rpc.ClientOptions{Token: token})
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	msg := func(n int) *dynamicpb.Message {
		m := dynamicpb.NewMessage(md)
		m.Set(md.Fields().ByName("payload"), protoreflect.ValueOfBytes(make([]byte, n)))
		return m
	}
	if err := conn.Invoke(t.Context(), echoMethod, msg(limit-1024), dynamicpb.NewMessage(md)); err != nil {
		t.Errorf("gRPC message under the cap: %v", err)
	}
	err = conn.Invoke(t.Context(), echoMethod, msg(limit+1024), dynamicpb.NewMessage(md))
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("gRPC message over the cap = %v, want ResourceExhausted", err)
	}
}

// TestEnumsOverREST checks that enum fields are read by their JSON names
// (as the docs write them) and their proto names, and written by their JSON
// names; that a name or a number their enum lacks is InvalidArgument naming
// the field and the allowed values, with the edge's reason and field
// violation; and that unknown fields are still ignored.
func TestEnumsOverREST(t *testing.T) {
	md := echoRequest(t)
	r := echoServer(t, md, 0)
	base := "http://" + r.addr
	c := httpClient(t)
	const allowed = "; want one of a, b"
	tests := []struct {
		name      string
		body      string
		wantCode  int
		wantField string
		wantMsg   string // for 200, the answer's enum fields
	}{
		{"JSON name", `{"mode":"b"}`, 200, "", `{"mode":"b","modes":[],"by_name":{},"inner":null`},
		{"proto name", `{"mode":"MODE_B"}`, 200, "", `{"mode":"b","modes":[],"by_name":{},"inner":null`},
		{"known number", `{"mode":2}`, 200, "", `{"mode":"b",`},
		{"not set is left out", `{}`, 200, "", `{"modes":[],"by_name":{},"inner":null`},
		{"unspecified by name", `{"mode":"unspecified","modes":["MODE_UNSPECIFIED","unspecified","a"]}`, 200, "", `{"modes":["unspecified","unspecified","a"],`},
		{"every place, JSON names", `{"mode":"a","modes":["b","MODE_A"],"byName":{"x":"b"},"inner":{"mode":"a"}}`, 200, "",
			`{"mode":"a","modes":["b","a"],"by_name":{"x":"b"},"inner":{"mode":"a"}`},
		{"unknown fields are ignored", `{"mode":"a","harness_of_the_future":"x"}`, 200, "", `{"mode":"a",`},
		{"null", `{"mode":null,"inner":null}`, 200, "", `{"modes":[]`},
		{"unknown name", `{"mode":"codex"}`, 400, "mode", `mode: unknown value "codex"` + allowed},
		{"unknown number", `{"mode":99}`, 400, "mode", `mode: unknown value 99` + allowed},
		{"lower-case proto name", `{"mode":"mode_a"}`, 400, "mode", `mode: unknown value "mode_a"` + allowed},
		{"upper-case JSON name", `{"mode":"A"}`, 400, "mode", `mode: unknown value "A"` + allowed},
		{"in a list", `{"modes":["a","MODE_C"]}`, 400, "modes[1]", `modes[1]: unknown value "MODE_C"` + allowed},
		{"in a map, JSON name", `{"byName":{"x":"a","y":"nope"}}`, 400, `by_name["y"]`, `by_name["y"]: unknown value "nope"` + allowed},
		{"nested", `{"inner":{"mode":"MODE_Z"}}`, 400, "inner.mode", `inner.mode: unknown value "MODE_Z"` + allowed},
		{"nested number", `{"inner":{"mode":7}}`, 400, "inner.mode", `inner.mode: unknown value 7` + allowed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body, _ := post(t, c, base+"/v1/echo", token, "application/json", strings.NewReader(tt.body))
			if code != tt.wantCode {
				t.Fatalf("POST %s = %d %s, want %d", tt.body, code, body, tt.wantCode)
			}
			if tt.wantCode == 200 {
				if !strings.HasPrefix(body, tt.wantMsg) {
					t.Errorf("POST %s = %s, want it to start %s", tt.body, body, tt.wantMsg)
				}
				return
			}
			var got struct {
				Code    string `json:"code"`
				Reason  string `json:"reason"`
				Message string `json:"message"`
				Field   string `json:"field"`
			}
			if err := json.Unmarshal([]byte(body), &got); err != nil {
				t.Fatalf("body %q: %v", body, err)
			}
			if got.Code != "INVALID_ARGUMENT" || got.Message != tt.wantMsg {
				t.Errorf("error = %s %q, want INVALID_ARGUMENT %q", got.Code, got.Message, tt.wantMsg)
			}
			reason, field := got.Reason, got.Field
			if reason != "INVALID_ARGUMENT" || field != tt.wantField {
				t.Errorf("details: reason %q field %q, want INVALID_ARGUMENT %q (%s)", reason, field, tt.wantField, body)
			}
		})
	}
}

// TestEnumsInQuery checks enum fields given as query parameters (GET): by
// JSON or proto name or number; an unknown name or number is
// InvalidArgument naming the field and the allowed values, with the edge's
// reason and field.
func TestEnumsInQuery(t *testing.T) {
	md := echoRequest(t)
	r := echoServer(t, md, 0)
	c := httpClient(t)
	const allowed = "; want one of a, b"
	for _, tt := range []struct {
		query     string
		wantCode  int
		wantBody  string // for 200, a substring
		wantField string // for 400
	}{
		{"mode=MODE_B", 200, `"mode":"b"`, ""},
		{"mode=b", 200, `"mode":"b"`, ""},
		{"mode=2&modes=MODE_A&modes=1&modes=b", 200, `"mode":"b","modes":["a","a","b"]`, ""},
		{"inner.mode=MODE_A", 200, `"inner":{"mode":"a"}`, ""},
		{"inner.mode=a", 200, `"inner":{"mode":"a"}`, ""},
		{"count=9007199254740993&size=18446744073709551615", 200, `"count":9007199254740993,"size":18446744073709551615`, ""},
		{"mode=codex", 400, `mode: unknown value "codex"` + allowed, "mode"},
		{"mode=99", 400, `mode: unknown value "99"` + allowed, "mode"},
		{"modes=MODE_A&modes=MODE_C", 400, `modes: unknown value "MODE_C"` + allowed, "modes"},
		{"inner.mode=x", 400, `inner.mode: unknown value "x"` + allowed, "inner.mode"},
	} {
		code, body, _ := get(t, c, "http://"+r.addr+"/v1/echo?"+tt.query, token)
		if code != tt.wantCode {
			t.Errorf("GET ?%s = %d %s, want %d", tt.query, code, body, tt.wantCode)
			continue
		}
		if code == 200 {
			if !strings.Contains(body, tt.wantBody) {
				t.Errorf("GET ?%s = %s, want it to contain %s", tt.query, body, tt.wantBody)
			}
			continue
		}
		if msg, reason, field := restError(t, body); msg != tt.wantBody || reason != "INVALID_ARGUMENT" || field != tt.wantField {
			t.Errorf("GET ?%s = %q %q %q, want %q INVALID_ARGUMENT %q", tt.query, msg, reason, field, tt.wantBody, tt.wantField)
		}
	}
}

// restError reads a gateway error body: its message, ErrorInfo reason and
// first BadRequest field.
func restError(t *testing.T, body string) (message, reason, field string) {
	t.Helper()
	var got struct {
		Message string `json:"message"`
		Reason  string `json:"reason"`
		Field   string `json:"field"`
	}
	if err := json.Unmarshal([]byte(body), &got); err != nil {
		t.Fatalf("error body %q: %v", body, err)
	}
	return got.Message, got.Reason, got.Field
}

// TestIntegersOverREST checks that 64-bit integers are answered as JSON
// numbers, exactly (past 2^53 too), and read as numbers or strings.
func TestIntegersOverREST(t *testing.T) {
	md := echoRequest(t)
	r := echoServer(t, md, 0)
	c := httpClient(t)
	for _, tt := range []struct{ body, want string }{
		{`{}`, `"count":0,"size":0`},
		{`{"count":9007199254740993,"size":18446744073709551615}`, `"count":9007199254740993,"size":18446744073709551615`},
		{`{"count":"-9223372036854775808","size":"42"}`, `"count":-9223372036854775808,"size":42`},
	} {
		code, body, _ := post(t, c, "http://"+r.addr+"/v1/echo", token, "application/json", strings.NewReader(tt.body))
		if code != 200 || !strings.Contains(body, tt.want) {
			t.Errorf("POST %s = %d %s, want 200 containing %s", tt.body, code, body, tt.want)
		}
	}
}
