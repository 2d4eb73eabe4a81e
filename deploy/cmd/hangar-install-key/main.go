// Command hangar-install-key copies a key file to a path readable by the
// current user only (mode 0600), for a Kubernetes init container: a Secret
// volume's files are group-readable under the pod's fsGroup, which
// checkpoint-svc's vault refuses.
//
//	hangar-install-key SRC DST
package main

import (
	"fmt"
	"os"
	"path/filepath"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: hangar-install-key SRC DST")
		os.Exit(2)
	}
	if err := install(os.Args[1], os.Args[2]); err != nil {
		fmt.Fprintf(os.Stderr, "hangar-install-key: %v\n", err)
		os.Exit(1)
	}
}

func install(src, dst string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	if len(data) == 0 {
		return fmt.Errorf("%s is empty", src)
	}
	tmp, err := os.CreateTemp(filepath.Dir(dst), ".key-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), dst)
}
