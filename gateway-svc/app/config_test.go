package app

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
)

// TestStoreSetting: HANGAR_SESSION_STORE is a directory or gs://, and the
// tapes go where it says (the data directory's tapes/ without it).
func TestStoreSetting(t *testing.T) {
	t.Parallel()
	base := Config{AnthropicURL: "https://api.anthropic.com", OpenAIURL: "https://api.openai.com/v1"}
	base.Token = "t"
	for _, tc := range []struct {
		store, wantErr string
	}{
		{"", ""},
		{"/var/lib/hangar/store", ""},
		{"gs://bucket", ""},
		{"gs://bucket/prefix", ""},
		{"gs://", "HANGAR_SESSION_STORE=\"gs://\": want gs://bucket[/prefix] with a bucket name"},
		{"relative/dir", "HANGAR_SESSION_STORE=\"relative/dir\": want an absolute directory or gs://bucket[/prefix]"},
	} {
		c := base
		c.Store = tc.store
		err := c.Validate()
		if (err == nil) != (tc.wantErr == "") || (err != nil && err.Error() != tc.wantErr) {
			t.Errorf("Store %q: %v, want %q", tc.store, err, tc.wantErr)
		}
	}

	ctx := context.Background()
	for _, tc := range []struct{ name, store, want string }{
		{"data directory", "", "tapes"},
		{"shared directory", "store", "store"},
	} {
		c := base
		c.Home = t.TempDir()
		if tc.store != "" {
			c.Store = filepath.Join(c.Home, tc.store)
		}
		st, closeStore, err := openStore(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Put(ctx, "tapes/run-1/00000001.step", strings.NewReader("x")); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Stat(ctx, "tapes/run-1/00000001.step"); err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
		if got := st.(interface{ Root() string }).Root(); got != filepath.Join(c.Home, tc.want) {
			t.Errorf("%s: tapes in %s, want %s", tc.name, got, filepath.Join(c.Home, tc.want))
		}
		_ = closeStore()
	}
}
