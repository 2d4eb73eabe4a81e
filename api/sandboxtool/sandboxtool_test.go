package sandboxtool_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/hangar-dev/hangar/api/sandboxtool"
)

// File names go through JSON byte for byte, text or not.
func TestNameRoundTrip(t *testing.T) {
	for _, n := range []sandboxtool.Name{"plain.txt", "späce and\ttab\n", "\xff\xfe latin1 \xe9", ""} {
		b, err := json.Marshal(n)
		if err != nil {
			t.Fatal(err)
		}
		var got sandboxtool.Name
		if err := json.Unmarshal(b, &got); err != nil || got != n {
			t.Errorf("%q -> %s -> %q, %v", n, b, got, err)
		}
	}
}

func TestRequestVersion(t *testing.T) {
	line, err := sandboxtool.Request(sandboxtool.StageRequest{Path: "/x"})
	if err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(bytes.NewReader(append(line, "payload"...)))
	var got sandboxtool.StageRequest
	if err := sandboxtool.ReadRequest(r, &got); err != nil || got.Path != "/x" {
		t.Fatalf("ReadRequest = %+v, %v", got, err)
	}
	if rest, _ := r.ReadString(0); rest != "payload" {
		t.Errorf("after the request: %q", rest)
	}
	// A request of another version is refused by name.
	r = bufio.NewReader(strings.NewReader(`{"version":2,"args":{"path":"/x"}}` + "\n"))
	err = sandboxtool.ReadRequest(r, &got)
	var ve *sandboxtool.VersionError
	if !errors.As(err, &ve) || ve.Got != 2 || !strings.Contains(err.Error(), "speaks protocol version 1, the request is version 2") {
		t.Fatalf("version 2: %v", err)
	}
	// Unknown fields are refused, not ignored.
	r = bufio.NewReader(strings.NewReader(`{"version":1,"args":{"path":"/x","force":true}}` + "\n"))
	if err := sandboxtool.ReadRequest(r, &got); err == nil {
		t.Error("unknown field accepted")
	}
}

func TestFailureOf(t *testing.T) {
	if got := sandboxtool.FailureOf([]byte("warning: x\n{\"error\":\"not a git work tree\"}\n")); got != "not a git work tree" {
		t.Errorf("FailureOf = %q", got)
	}
	if got := sandboxtool.FailureOf([]byte("sh: 1: hangar-sandbox: not found\n")); got != "sh: 1: hangar-sandbox: not found" {
		t.Errorf("FailureOf = %q", got)
	}
}
