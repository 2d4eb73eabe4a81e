package tool

import (
	"context"
	"io"
	"strings"

	"github.com/hangar-dev/hangar/api/sandboxtool"
)

// bundle writes a bundle of the positive refs minus what the excluded
// commits reach (those the repository lacks are dropped); ExitNothing
// when that is no commit.
func bundle(ctx context.Context, req *sandboxtool.BundleRequest, _ io.Reader, out io.Writer) error {
	r := repo{dir: req.WorkDir}
	args := append([]string(nil), req.Positive...)
	if len(req.Exclude) > 0 {
		names := make([]string, len(req.Exclude))
		for i, c := range req.Exclude {
			names[i] = c + "^{commit}"
		}
		types, err := r.objectTypes(ctx, names...)
		if err != nil {
			return err
		}
		for _, t := range types {
			if t[1] == "commit" {
				args = append(args, "^"+t[0])
			}
		}
	}
	first, err := r.git(ctx, append([]string{"rev-list", "-n", "1"}, args...)...)
	if err != nil {
		return err
	}
	if first == "" {
		return fail(sandboxtool.ExitNothing, "no commits to bundle")
	}
	_, _, err = r.run(ctx, gitCmd{args: append([]string{"bundle", "create", "-q", "-"}, args...), stdout: out})
	return err
}

// diffArgs make a patch git apply takes back exactly, whatever the
// repository's configuration says (no renames, full hashes, binary).
var diffArgs = []string{"-c", "core.quotePath=true", "diff", "--binary", "--full-index", "--no-renames", "--no-ext-diff",
	"--no-textconv", "--no-color", "--ignore-submodules=none", "--src-prefix=a/", "--dst-prefix=b/"}

func diff(ctx context.Context, req *sandboxtool.DiffRequest, _ io.Reader, out io.Writer) error {
	args := append([]string(nil), diffArgs...)
	if req.Cached {
		args = append(args, "--cached")
	}
	for _, rev := range req.Revs {
		if strings.HasPrefix(rev, "-") {
			return fail(sandboxtool.ExitUsage, "diff: bad revision %q", rev)
		}
	}
	args = append(args, req.Revs...)
	var env []string
	if req.Paths != nil {
		// The paths are file names, whatever bytes they hold.
		env = []string{"GIT_LITERAL_PATHSPECS=1"}
		args = append(args, "--")
		for _, p := range req.Paths {
			args = append(args, string(p))
		}
	}
	_, _, err := repo{dir: req.WorkDir}.run(ctx, gitCmd{args: args, env: env, stdout: out})
	return err
}
