package checkpoint_test

import (
	"testing"

	"go.uber.org/goleak"
)

// The engine starts goroutines (sealing pipes, staging streams): none may
// outlive a test. The GCS client's OpenCensus worker and idle HTTP
// connections are the libraries' own, started once per process.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreAnyFunction("internal/poll.runtime_pollWait"),
	)
}
