// Package images builds hangar's container images without a registry or a
// container daemon (github.com/google/go-containerregistry): one per service
// (its static binary on an otherwise empty filesystem, run as uid 65532)
// and the sandbox base image (a Debian rootfs with git, Node, the pinned
// agent CLIs and hangar-sandbox). Each is written as an image tarball
// (`docker save` layout: `docker load`, `ctr images import`, `crane push`
// and `tarball.ImageFromPath` read it).
package images

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Services are the five service binaries, each at <name>/cmd/<name>.
var Services = []string{"session-svc", "sandbox-svc", "checkpoint-svc", "gateway-svc", "replay-svc"}

// NonRoot is the uid and gid the service images run as.
const NonRoot = 65532

// BinDir is where the binaries are in every image.
const BinDir = "/usr/local/bin"

// epoch is every file's and image's timestamp, so that the same inputs make
// the same image digest.
var epoch = time.Unix(0, 0).UTC()

// file is one entry of a layer.
type file struct {
	path     string // absolute, in the image
	mode     int64  // permission bits; with dir or link set, the entry's kind
	uid, gid int
	dir      bool
	link     string // symlink target
	data     []byte // in memory, or
	src      string // read from this host file
}

// layer writes files (sorted by path, parents first) as an uncompressed tar.
func writeTar(w io.Writer, files []file) error {
	sort.Slice(files, func(i, j int) bool { return files[i].path < files[j].path })
	tw := tar.NewWriter(w)
	for _, f := range files {
		h := &tar.Header{Name: strings.TrimPrefix(f.path, "/"), Mode: f.mode, Uid: f.uid, Gid: f.gid, ModTime: epoch, Format: tar.FormatPAX}
		switch {
		case f.dir:
			h.Typeflag, h.Name = tar.TypeDir, h.Name+"/"
		case f.link != "":
			h.Typeflag, h.Linkname = tar.TypeSymlink, f.link
		default:
			h.Typeflag = tar.TypeReg
			if f.src != "" {
				st, err := os.Stat(f.src)
				if err != nil {
					return err
				}
				h.Size = st.Size()
			} else {
				h.Size = int64(len(f.data))
			}
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		if f.src != "" {
			r, err := os.Open(f.src)
			if err != nil {
				return err
			}
			_, err = io.Copy(tw, r)
			r.Close()
			if err != nil {
				return err
			}
		} else if _, err := tw.Write(f.data); err != nil {
			return err
		}
	}
	return tw.Close()
}

func memLayer(files []file) (v1.Layer, error) {
	var buf bytes.Buffer
	if err := writeTar(&buf, files); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil },
		tarball.WithCompressionLevel(gzip.BestSpeed), tarball.WithCompressedCaching)
}

// CACerts is the host's CA bundle the service images carry (the services
// call GCS and the model providers over TLS).
var CACerts = "/etc/ssl/certs/ca-certificates.crt"

// ServiceImage is a service's image: a base layer (a passwd and group
// naming the non-root user, the CA bundle, /tmp and the user's home) and a
// layer with the binary at /usr/local/bin/<name> (and extras, name to host
// path, beside it), after any more layers given (GitLayer). The entrypoint
// is the binary; the user is 65532.
func ServiceImage(name, binary string, extras map[string]string, more ...v1.Layer) (v1.Image, error) {
	ca, err := os.ReadFile(CACerts)
	if err != nil {
		return nil, fmt.Errorf("CA bundle for the images: %w", err)
	}
	base, err := memLayer([]file{
		{path: "/etc", dir: true, mode: 0o755},
		{path: "/etc/passwd", mode: 0o644, data: []byte(fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", NonRoot, NonRoot))},
		{path: "/etc/group", mode: 0o644, data: []byte(fmt.Sprintf("root:x:0:\nnonroot:x:%d:\n", NonRoot))},
		{path: "/etc/ssl", dir: true, mode: 0o755},
		{path: "/etc/ssl/certs", dir: true, mode: 0o755},
		{path: "/etc/ssl/certs/ca-certificates.crt", mode: 0o644, data: ca},
		{path: "/tmp", dir: true, mode: 0o1777},
		{path: "/home", dir: true, mode: 0o755},
		{path: "/home/nonroot", dir: true, mode: 0o700, uid: NonRoot, gid: NonRoot},
		{path: "/usr", dir: true, mode: 0o755},
		{path: "/usr/local", dir: true, mode: 0o755},
		{path: BinDir, dir: true, mode: 0o755},
	})
	if err != nil {
		return nil, err
	}
	bin := []file{{path: path.Join(BinDir, name), mode: 0o755, src: binary}}
	for n, src := range extras {
		bin = append(bin, file{path: path.Join(BinDir, n), mode: 0o755, src: src})
	}
	binLayer, err := memLayer(bin)
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(empty.Image, append(append([]v1.Layer{base}, more...), binLayer)...)
	if err != nil {
		return nil, err
	}
	return configure(img, v1.Config{
		Entrypoint: []string{path.Join(BinDir, name)},
		User:       fmt.Sprintf("%d:%d", NonRoot, NonRoot),
		Env:        []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/home/nonroot"},
		WorkingDir: "/home/nonroot",
		Labels:     map[string]string{"org.opencontainers.image.title": name, "org.opencontainers.image.source": "https://github.com/hangar-dev/hangar"},
	})
}

func configure(img v1.Image, cfg v1.Config) (v1.Image, error) {
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = "amd64", "linux"
	cf.Created = v1.Time{Time: epoch}
	cf.Config = cfg
	return mutate.ConfigFile(img, cf)
}

// Write writes img to path as an image tarball tagged ref, through a
// temporary file (a reader never sees half an image).
func Write(path, ref string, img v1.Image) error {
	tag, err := name.NewTag(ref)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := tarball.WriteToFile(tmp, tag, img); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	return os.Rename(tmp, path)
}

// Check loads the image tarball at path and reports what does not match:
// the entrypoint and user it should have.
func Check(path string, entrypoint []string, user string) error {
	img, err := tarball.ImageFromPath(path, nil)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return fmt.Errorf("%s: config: %w", path, err)
	}
	if strings.Join(cf.Config.Entrypoint, " ") != strings.Join(entrypoint, " ") {
		return fmt.Errorf("%s: entrypoint %q, want %q", path, cf.Config.Entrypoint, entrypoint)
	}
	if cf.Config.User != user {
		return fmt.Errorf("%s: user %q, want %q", path, cf.Config.User, user)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) == 0 {
		return fmt.Errorf("%s: no layers (%v)", path, err)
	}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			return fmt.Errorf("%s: layer: %w", path, err)
		}
		_, err = io.Copy(io.Discard, rc)
		rc.Close()
		if err != nil {
			return fmt.Errorf("%s: layer: %w", path, err)
		}
	}
	return nil
}

// FileSHA256 is the hex SHA-256 of a file's contents.
func FileSHA256(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Harness is one pinned agent CLI (or Node) install directory of
// .ci/install-harnesses, and the commands it provides on the PATH.
type Harness struct {
	Dir   string            // host directory, e.g. <cache>/claude-2.1.332
	Links map[string]string // command name -> path below Dir
}

// SandboxUser is the uid the sandbox image runs as: the agent CLIs refuse
// some modes as root.
const SandboxUser = 1000

// SandboxImage is the sandbox base image: rootfs (an uncompressed tar of a
// Debian root filesystem with git), a layer with the harness install
// directories under /opt/hangar/harnesses and their commands linked into
// /usr/local/bin (gzipped once into cacheDir, keyed by the directories'
// names, which carry their pinned versions), and hangar-sandbox at
// /usr/local/bin/hangar-sandbox. The default command sleeps (the
// kubernetes driver runs its own). The same image is the driver's tool
// image: it has sh and cp.
func SandboxImage(rootfs string, harnesses []Harness, tool, cacheDir string) (v1.Image, error) {
	base, err := tarball.LayerFromFile(rootfs, tarball.WithCompressionLevel(gzip.BestSpeed), tarball.WithCompressedCaching)
	if err != nil {
		return nil, err
	}
	passwd, group, err := rootfsAccounts(rootfs)
	if err != nil {
		return nil, err
	}
	hl, err := harnessLayer(harnesses, cacheDir)
	if err != nil {
		return nil, err
	}
	user, err := memLayer([]file{
		{path: "/etc", dir: true, mode: 0o755},
		{path: "/etc/passwd", mode: 0o644, data: append(passwd, []byte(fmt.Sprintf("hangar:x:%d:%d:hangar:/home/hangar:/bin/sh\n", SandboxUser, SandboxUser))...)},
		{path: "/etc/group", mode: 0o644, data: append(group, []byte(fmt.Sprintf("hangar:x:%d:\n", SandboxUser))...)},
		{path: "/home", dir: true, mode: 0o755},
		{path: "/home/hangar", dir: true, mode: 0o755, uid: SandboxUser, gid: SandboxUser},
		{path: "/hangar", dir: true, mode: 0o777},
		{path: "/usr", dir: true, mode: 0o755},
		{path: "/usr/local", dir: true, mode: 0o755},
		{path: BinDir, dir: true, mode: 0o755},
		{path: path.Join(BinDir, "hangar-sandbox"), mode: 0o755, src: tool},
	})
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(empty.Image, base, hl, user)
	if err != nil {
		return nil, err
	}
	return configure(img, v1.Config{
		Cmd:        []string{"sleep", "infinity"},
		User:       fmt.Sprintf("%d:%d", SandboxUser, SandboxUser),
		Env:        []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/home/hangar"},
		WorkingDir: "/home/hangar",
		Labels:     map[string]string{"org.opencontainers.image.title": "hangar-sandbox", "org.opencontainers.image.source": "https://github.com/hangar-dev/hangar"},
	})
}

// rootfsAccounts reads /etc/passwd and /etc/group from a rootfs tar.
func rootfsAccounts(rootfs string) (passwd, group []byte, err error) {
	f, err := os.Open(rootfs)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	tr := tar.NewReader(bufio.NewReaderSize(f, 1<<20))
	for passwd == nil || group == nil {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", rootfs, err)
		}
		switch path.Clean("/" + h.Name) {
		case "/etc/passwd":
			passwd, err = io.ReadAll(tr)
		case "/etc/group":
			group, err = io.ReadAll(tr)
		}
		if err != nil {
			return nil, nil, err
		}
	}
	if passwd == nil || group == nil {
		return nil, nil, fmt.Errorf("%s: no /etc/passwd or /etc/group: not a root filesystem", rootfs)
	}
	return passwd, group, nil
}

// harnessLayer is the harnesses' layer, from cacheDir when built before.
func harnessLayer(harnesses []Harness, cacheDir string) (v1.Layer, error) {
	var names []string
	for _, h := range harnesses {
		names = append(names, filepath.Base(h.Dir))
	}
	sort.Strings(names)
	sum := sha256.Sum256([]byte("harness-layer-v1\x00" + strings.Join(names, "\x00")))
	cached := filepath.Join(cacheDir, "harnesses-"+hex.EncodeToString(sum[:8])+".tar.gz")
	if _, err := os.Stat(cached); err != nil {
		if err := os.MkdirAll(cacheDir, 0o755); err != nil {
			return nil, err
		}
		files := []file{
			{path: "/opt", dir: true, mode: 0o755}, {path: "/opt/hangar", dir: true, mode: 0o755},
			{path: "/opt/hangar/harnesses", dir: true, mode: 0o755},
			{path: "/usr", dir: true, mode: 0o755}, {path: "/usr/local", dir: true, mode: 0o755}, {path: BinDir, dir: true, mode: 0o755},
		}
		for _, h := range harnesses {
			dst := "/opt/hangar/harnesses/" + filepath.Base(h.Dir)
			tree, err := hostTree(h.Dir, dst)
			if err != nil {
				return nil, err
			}
			files = append(files, tree...)
			for cmd, rel := range h.Links {
				files = append(files, file{path: path.Join(BinDir, cmd), link: path.Join(dst, rel), mode: 0o777})
			}
		}
		tmp := cached + ".tmp"
		out, err := os.Create(tmp)
		if err != nil {
			return nil, err
		}
		zw, _ := gzip.NewWriterLevel(out, gzip.BestSpeed)
		err = writeTar(zw, files)
		if cerr := zw.Close(); err == nil {
			err = cerr
		}
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			os.Remove(tmp)
			return nil, fmt.Errorf("harness layer: %w", err)
		}
		if err := os.Rename(tmp, cached); err != nil {
			return nil, err
		}
	}
	return tarball.LayerFromFile(cached)
}

// hostTree lists the host directory dir as layer entries below dst
// (root-owned, modes kept, symlinks as symlinks).
func hostTree(dir, dst string) ([]file, error) {
	var out []file
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		target := path.Join(dst, filepath.ToSlash(rel))
		mode := int64(fi.Mode().Perm())
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			l, err := os.Readlink(p)
			if err != nil {
				return err
			}
			out = append(out, file{path: target, link: l, mode: 0o777})
		case fi.IsDir():
			out = append(out, file{path: target, dir: true, mode: mode})
		case fi.Mode().IsRegular():
			out = append(out, file{path: target, mode: mode, src: p})
		}
		return nil
	})
	return out, err
}
