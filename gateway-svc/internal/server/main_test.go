package server_test

import (
	"net/http"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no goroutine outlives the tests (the sweeper, held
// answers, stagger waits); idle keep-alive connections of the shared HTTP
// client are closed first.
func TestMain(m *testing.M) {
	code := m.Run()
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			os.Stderr.WriteString("goleak: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}
