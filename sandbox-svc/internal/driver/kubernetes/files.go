package kubernetes

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/hangar-dev/hangar/sandbox-svc/internal/driver"
)

// File access runs small POSIX sh scripts in the pod (GNU coreutils and
// findutils, as in the Debian images): the path is resolved there with
// realpath, so a symlink that leaves the sandbox directory is refused as
// the local driver's os.Root refuses it. Exit codes say what went wrong.
const filePrelude = `root=$1; p=$2; shift 2
inside() { case "$1" in "$root"|"$root"/*) return 0;; esac; return 1; }
statline() { if [ -L "$1" ]; then l=$(readlink -- "$1"); else l=; fi; printf '%s\t%s\n' "$(stat -c '%f %s %Y' -- "$1")" "$l"; }
`

const (
	fileNotFound = 2
	fileOutside  = 3
	fileIsDir    = 4
	fileNotDir   = 5
	fileTooLarge = 6
)

// statScript: the final component is not followed.
const statScript = filePrelude + `parent=$(realpath -m -- "$(dirname -- "$p")"); inside "$parent" || exit 3
f="$parent/$(basename -- "$p")"; [ "$p" = "$root" ] && f=$root
[ -e "$f" ] || [ -L "$f" ] || exit 2
statline "$f"`

const readScript = filePrelude + `limit=$1
r=$(realpath -m -- "$p"); inside "$r" || exit 3
[ -e "$r" ] || exit 2
[ -d "$r" ] && exit 4
s=$(stat -c %s -- "$r"); [ "$s" -gt "$limit" ] && exit 6
statline "$r" >&2
cat -- "$r"`

const writeScript = filePrelude + `mode=$1
parent=$(realpath -m -- "$(dirname -- "$p")"); inside "$parent" || exit 3
f="$parent/$(basename -- "$p")"
if [ -L "$f" ]; then f=$(realpath -m -- "$f"); inside "$f" || exit 3; parent=$(dirname -- "$f"); fi
[ -d "$f" ] && exit 4
mkdir -p -- "$parent" 2>/dev/null || exit 5
t="$parent/.hangar-write.$$"
cat > "$t" && chmod "$mode" "$t" && mv -f -- "$t" "$f" || { rm -f -- "$t"; exit 1; }
statline "$f"`

const listScript = filePrelude + `r=$(realpath -m -- "$p"); inside "$r" || exit 3
[ -e "$r" ] || exit 2
[ -d "$r" ] || exit 5
cd "$r" || exit 1
for f in * .[!.]* ..?*; do
  [ -e "$f" ] || [ -L "$f" ] || continue
  printf '%s\0' "$f"; statline "$f"
done`

// fileOp runs a file script; the exit code maps to the driver's errors.
func (sb *Sandbox) fileOp(ctx context.Context, script, p string, stdin []byte, args ...string) (string, string, error) {
	abs, err := sb.resolve(p)
	if err != nil {
		return "", "", err
	}
	argv := append([]string{"sh", "-c", script, "hangar-file", sb.dir(), abs}, args...)
	var in *bytes.Reader
	req := driver.ExecRequest{Argv: argv}
	if stdin != nil {
		in = bytes.NewReader(stdin)
		req.Stdin = in
	}
	var out bytes.Buffer
	var errOut limitedBuffer
	req.Stdout, req.Stderr = &out, &errOut
	proc, err := sb.start(ctx, req, "/")
	if err != nil {
		return "", "", err
	}
	st, err := proc.Wait()
	if err != nil {
		return "", "", err
	}
	switch st.Code {
	case 0:
		return out.String(), errOut.String(), nil
	case fileNotFound:
		return "", "", fmt.Errorf("%w: %s", driver.ErrFileNotFound, p)
	case fileOutside:
		return "", "", fmt.Errorf("%w: %s", driver.ErrOutsideSandbox, p)
	case fileIsDir:
		return "", "", fmt.Errorf("%w: %s", driver.ErrIsDirectory, p)
	case fileNotDir:
		return "", "", fmt.Errorf("%w: %s", driver.ErrNotDirectory, p)
	case fileTooLarge:
		return "", "", fmt.Errorf("%w: %s", driver.ErrTooLarge, p)
	}
	return "", "", fmt.Errorf("%s in pod %s: exit %d%s: %s", p, sb.pod, st.Code, st.Signal, strings.TrimSpace(errOut.String()))
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

// parseStat reads a statline: "<raw mode hex> <size> <mtime>\t<link>".
func parseStat(line, display string) (driver.FileInfo, error) {
	fields, link, _ := strings.Cut(strings.TrimRight(line, "\n"), "\t")
	f := strings.Fields(fields)
	if len(f) != 3 {
		return driver.FileInfo{}, fmt.Errorf("unexpected stat output %q", line)
	}
	raw, err1 := strconv.ParseUint(f[0], 16, 32)
	size, err2 := strconv.ParseInt(f[1], 10, 64)
	mtime, err3 := strconv.ParseInt(f[2], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return driver.FileInfo{}, fmt.Errorf("unexpected stat output %q", line)
	}
	return driver.FileInfo{Path: display, Mode: fileMode(uint32(raw)), Size: size, ModTime: time.Unix(mtime, 0), LinkTarget: link}, nil
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
	out, errOut, err := sb.fileOp(ctx, readScript, p, nil, strconv.FormatInt(limit, 10))
	if err != nil {
		return nil, driver.FileInfo{}, err
	}
	fi, err := parseStat(errOut, sb.display(abs))
	if err != nil {
		return nil, driver.FileInfo{}, err
	}
	return []byte(out), fi, nil
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
	if content == nil {
		content = []byte{}
	}
	out, _, err := sb.fileOp(ctx, writeScript, p, content, strconv.FormatUint(uint64(mode.Perm()), 8))
	if err != nil {
		return driver.FileInfo{}, err
	}
	return parseStat(out, sb.display(abs))
}

// Stat does not follow a final symlink.
func (sb *Sandbox) Stat(ctx context.Context, p string) (driver.FileInfo, error) {
	abs, err := sb.resolve(p)
	if err != nil {
		return driver.FileInfo{}, err
	}
	out, _, err := sb.fileOp(ctx, statScript, p, nil)
	if err != nil {
		return driver.FileInfo{}, err
	}
	return parseStat(out, sb.display(abs))
}

// List returns a directory's entries sorted by name.
func (sb *Sandbox) List(ctx context.Context, dir string) ([]driver.FileInfo, error) {
	abs, err := sb.resolve(dir)
	if err != nil {
		return nil, err
	}
	out, _, err := sb.fileOp(ctx, listScript, dir, nil)
	if err != nil {
		return nil, err
	}
	var list []driver.FileInfo
	for rest := out; rest != ""; {
		name, after, ok := strings.Cut(rest, "\x00")
		if !ok {
			break
		}
		line, next, _ := strings.Cut(after, "\n")
		rest = next
		fi, err := parseStat(line, sb.display(path.Join(abs, name)))
		if err != nil {
			return nil, err
		}
		list = append(list, fi)
	}
	sort.Slice(list, func(i, j int) bool { return list[i].Path < list[j].Path })
	return list, nil
}
