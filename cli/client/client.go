// Package client finds a running hangar and connects to it. The endpoint
// comes from HANGAR_URL and HANGAR_TOKEN, or from the files `hangar up`
// leaves in the data directory (HANGAR_HOME, default ~/.hangar).
package client

import (
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"google.golang.org/grpc"

	"github.com/hangar-dev/hangar/platform/rpc"
)

// Endpoint is where hangar answers and the token it wants.
type Endpoint struct {
	URL   string
	Token string
}

// Resolve finds the endpoint: HANGAR_URL and HANGAR_TOKEN win; what they
// leave unset is read from the data directory.
func Resolve(lookupEnv func(string) (string, bool)) (Endpoint, error) {
	if lookupEnv == nil {
		lookupEnv = os.LookupEnv
	}
	get := func(name string) string {
		v, _ := lookupEnv(name)
		return strings.TrimSpace(v)
	}
	ep := Endpoint{URL: get("HANGAR_URL"), Token: get("HANGAR_TOKEN")}
	home := get("HANGAR_HOME")
	if home == "" {
		dir, err := os.UserHomeDir()
		if err != nil {
			return Endpoint{}, fmt.Errorf("HANGAR_HOME is unset and the home directory is unknown: set HANGAR_URL and HANGAR_TOKEN")
		}
		home = filepath.Join(dir, ".hangar")
	}
	if ep.URL == "" {
		v, err := readFile(filepath.Join(home, "endpoint"))
		if err != nil {
			return Endpoint{}, fmt.Errorf("no hangar found: HANGAR_URL is unset and %s has no endpoint file (start one with `hangar up`): %w", home, err)
		}
		ep.URL = v
	}
	if ep.Token == "" {
		v, err := readFile(filepath.Join(home, "token"))
		if err != nil {
			return Endpoint{}, fmt.Errorf("HANGAR_TOKEN is unset and %s has no token file: %w", home, err)
		}
		ep.Token = v
	}
	if _, err := ep.target(); err != nil {
		return Endpoint{}, err
	}
	return ep, nil
}

// Dial opens a gRPC connection to the endpoint (lazily: errors show on the
// first call).
func (e Endpoint) Dial() (*grpc.ClientConn, error) {
	target, err := e.target()
	if err != nil {
		return nil, err
	}
	return rpc.Dial(target, rpc.ClientOptions{Token: e.Token})
}

func (e Endpoint) target() (string, error) {
	u, err := url.Parse(e.URL)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return "", fmt.Errorf("HANGAR_URL=%q: want http://host:port", e.URL)
	}
	if u.Scheme == "https" {
		return "", fmt.Errorf("HANGAR_URL=%q: https is not supported yet; use a plaintext loopback or in-cluster URL", e.URL)
	}
	return u.Host, nil
}

func readFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			return "", pe.Err
		}
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}
