package kubernetes

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/hangar-dev/hangar/api/sandboxtool"
	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver"
)

// File access runs the tool's file command in the pod: the path is
// resolved there, so a symlink that leaves the sandbox directory is
// refused as the local driver's os.Root refuses it. Its exit code says
// what went wrong.

// fileOp runs one file operation on p; content follows the request for
// a write. It returns the response and what follows it (a read's content).
func (sb *Sandbox) fileOp(ctx context.Context, req sandboxtool.FileRequest, p string, content []byte) (sandboxtool.FileResponse, []byte, error) {
	abs, err := sb.resolve(p)
	if err != nil {
		return sandboxtool.FileResponse{}, nil, err
	}
	req.Root, req.Path = sb.dir(), abs
	line, err := sandboxtool.Request(req)
	if err != nil {
		return sandboxtool.FileResponse{}, nil, err
	}
	var out bytes.Buffer
	var errOut limitedBuffer
	proc, err := sb.start(ctx, driver.ExecRequest{Argv: []string{toolBin, sandboxtool.CommandFile},
		Stdin: io.MultiReader(bytes.NewReader(line), bytes.NewReader(content)), Stdout: &out, Stderr: &errOut}, "/")
	if err != nil {
		return sandboxtool.FileResponse{}, nil, err
	}
	st, err := proc.Wait()
	if err != nil {
		return sandboxtool.FileResponse{}, nil, err
	}
	switch st.Code {
	case 0:
		head, rest, _ := bytes.Cut(out.Bytes(), []byte("\n"))
		var resp sandboxtool.FileResponse
		if err := json.Unmarshal(head, &resp); err != nil {
			return sandboxtool.FileResponse{}, nil, fmt.Errorf("%s in pod %s: unexpected answer: %w", p, sb.pod, err)
		}
		return resp, rest, nil
	case sandboxtool.ExitNotFound:
		return sandboxtool.FileResponse{}, nil, fmt.Errorf("%w: %s", driver.ErrFileNotFound, p)
	case sandboxtool.ExitOutside:
		return sandboxtool.FileResponse{}, nil, fmt.Errorf("%w: %s", driver.ErrOutsideSandbox, p)
	case sandboxtool.ExitIsDir:
		return sandboxtool.FileResponse{}, nil, fmt.Errorf("%w: %s", driver.ErrIsDirectory, p)
	case sandboxtool.ExitNotDir:
		return sandboxtool.FileResponse{}, nil, fmt.Errorf("%w: %s", driver.ErrNotDirectory, p)
	case sandboxtool.ExitTooLarge:
		return sandboxtool.FileResponse{}, nil, fmt.Errorf("%w: %s", driver.ErrTooLarge, p)
	}
	return sandboxtool.FileResponse{}, nil, fmt.Errorf("%s in pod %s: exit %d%s: %s", p, sb.pod, st.Code, st.Signal, sandboxtool.FailureOf([]byte(errOut.String())))
}

// display is the path shown to clients: relative to the work tree when
// inside it, absolute otherwise.
func (sb *Sandbox) display(abs string) string {
	work := path.Join(sb.dir(), "work")
	if abs == work {
		return "."
	}
	if r, ok := strings.CutPrefix(abs, work+"/"); ok {
		return r
	}
	return abs
}

// info is a FileInfo of the tool's status of a file.
func info(st *sandboxtool.FileStatus, display string) (driver.FileInfo, error) {
	if st == nil {
		return driver.FileInfo{}, errors.New("the tool's answer has no file status")
	}
	return driver.FileInfo{Path: display, Mode: fileMode(st.Mode), Size: st.Size, ModTime: time.Unix(st.MTime, 0), LinkTarget: string(st.Link)}, nil
}

// fileMode converts a raw st_mode.
func fileMode(raw uint32) fs.FileMode {
	m := fs.FileMode(raw & 0o777)
	switch raw & 0o170000 {
	case 0o040000:
		m |= fs.ModeDir
	case 0o120000:
		m |= fs.ModeSymlink
	case 0o010000:
		m |= fs.ModeNamedPipe
	case 0o140000:
		m |= fs.ModeSocket
	case 0o020000:
		m |= fs.ModeDevice | fs.ModeCharDevice
	case 0o060000:
		m |= fs.ModeDevice
	}
	if raw&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if raw&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if raw&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	return m
}

// ReadFile returns at most limit bytes; a larger file is ErrTooLarge.
func (sb *Sandbox) ReadFile(ctx context.Context, p string, limit int64) ([]byte, driver.FileInfo, error) {
	abs, err := sb.resolve(p)
	if err != nil {
		return nil, driver.FileInfo{}, err
	}
	resp, content, err := sb.fileOp(ctx, sandboxtool.FileRequest{Op: sandboxtool.FileRead, Limit: limit}, p, nil)
	if err != nil {
		return nil, driver.FileInfo{}, err
	}
	fi, err := info(resp.File, sb.display(abs))
	if err != nil {
		return nil, driver.FileInfo{}, err
	}
	return content, fi, nil
}

// WriteFile creates or replaces a file (parents created).
func (sb *Sandbox) WriteFile(ctx context.Context, p string, content []byte, mode fs.FileMode) (driver.FileInfo, error) {
	abs, err := sb.resolve(p)
	if err != nil {
		return driver.FileInfo{}, err
	}
	if mode.Perm() == 0 {
		mode = 0o644
	}
	resp, _, err := sb.fileOp(ctx, sandboxtool.FileRequest{Op: sandboxtool.FileWrite, Mode: uint32(mode.Perm())}, p, content)
	if err != nil {
		return driver.FileInfo{}, err
	}
	return info(resp.File, sb.display(abs))
}

// Stat does not follow a final symlink.
func (sb *Sandbox) Stat(ctx context.Context, p string) (driver.FileInfo, error) {
	abs, err := sb.resolve(p)
	if err != nil {
		return driver.FileInfo{}, err
	}
	resp, _, err := sb.fileOp(ctx, sandboxtool.FileRequest{Op: sandboxtool.FileStat}, p, nil)
	if err != nil {
		return driver.FileInfo{}, err
	}
	return info(resp.File, sb.display(abs))
}

// List returns a directory's entries sorted by name.
func (sb *Sandbox) List(ctx context.Context, dir string) ([]driver.FileInfo, error) {
	abs, err := sb.resolve(dir)
	if err != nil {
		return nil, err
	}
	resp, _, err := sb.fileOp(ctx, sandboxtool.FileRequest{Op: sandboxtool.FileList}, dir, nil)
	if err != nil {
		return nil, err
	}
	list := make([]driver.FileInfo, 0, len(resp.Entries))
	for i := range resp.Entries {
		fi, err := info(&resp.Entries[i], sb.display(path.Join(abs, string(resp.Entries[i].Name))))
		if err != nil {
			return nil, err
		}
		list = append(list, fi)
	}
	sort.Slice(list, func(i, j int) bool { return list[i].Path < list[j].Path })
	return list, nil
}
