package gcsstore_test

import (
	"strings"
	"testing"

	"github.com/hangar-dev/hangar/platform/gcsstore"
)

func TestCheckStoreSetting(t *testing.T) {
	for _, tc := range []struct{ value, err string }{
		{"", ""},
		{"/var/hangar/store", ""},
		{"gs://bucket", ""},
		{"gs://bucket/prefix/", ""},
		{"gs://", "want gs://bucket[/prefix] with a bucket name"},
		{"gs:///prefix", "want gs://bucket[/prefix] with a bucket name"},
		{"relative/dir", "want an absolute directory or gs://bucket[/prefix]"},
		{"s3://bucket", "want an absolute directory or gs://bucket[/prefix]"},
	} {
		err := gcsstore.CheckStoreSetting(tc.value)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%q: %v, want no error", tc.value, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "HANGAR_SESSION_STORE")):
			t.Errorf("%q: %v, want an error naming HANGAR_SESSION_STORE and %q", tc.value, err, tc.err)
		}
	}
}
