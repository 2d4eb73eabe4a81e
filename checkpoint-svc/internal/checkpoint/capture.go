package checkpoint

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"

	"google.golang.org/protobuf/types/known/timestamppb"

	checkpointv1 "github.com/hangar-dev/hangar/api/hangar/checkpoint/v1"
	"github.com/hangar-dev/hangar/platform/fault"
)

// maxChain bounds how many incremental bundles a checkpoint builds on;
// past it the next checkpoint bundles everything since the base again.
const maxChain = 16

var commitRE = regexp.MustCompile(`^[0-9a-f]{40}([0-9a-f]{24})?$`)

type sandbox struct {
	id    string
	token uint64
}

// gitEnv keeps git from writing the index as a side effect of reading and
// makes its messages stable.
var gitEnv = map[string]string{"LC_ALL": "C", "GIT_OPTIONAL_LOCKS": "0", "GIT_TERMINAL_PROMPT": "0"}

// diffArgs make a patch git apply takes back exactly, whatever the
// sandbox's git configuration says (no renames, full hashes, binary).
var diffArgs = []string{"-c", "core.quotePath=true", "diff", "--binary", "--full-index", "--no-renames", "--no-ext-diff",
	"--no-textconv", "--no-color", "--ignore-submodules=none", "--src-prefix=a/", "--dst-prefix=b/"}

func shArgv(script string, args ...string) []string {
	return append([]string{"sh", "-c", script, "sh"}, args...)
}

// run executes argv in the sandbox; a non-zero exit other than the allowed
// ones is an error carrying the end of stderr (for logs only).
func (e *Engine) run(ctx context.Context, sb sandbox, argv []string, env map[string]string, stdin io.Reader, stdout io.Writer, allowed ...int) (int, error) {
	var stderr tailBuffer
	code, err := e.opt.Exec.Exec(ctx, sb.id, sb.token, argv, env, "", stdin, stdout, &stderr)
	if err != nil {
		return code, err
	}
	if code != 0 && !slices.Contains(allowed, code) {
		name := argv[0]
		if name == "sh" && len(argv) > 2 {
			name = "sh: " + strings.SplitN(strings.TrimPrefix(argv[2], "set -e\n"), "\n", 2)[0]
		} else if len(argv) > 3 {
			name = strings.Join(argv[:4], " ")
		}
		return code, fmt.Errorf("sandbox command %q exited %d: %s", name, code, stderr.String())
	}
	return code, nil
}

// tailBuffer keeps the last 4 KiB written to it.
type tailBuffer struct{ b []byte }

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > 4096 {
		t.b = t.b[len(t.b)-4096:]
	}
	return len(p), nil
}

func (t *tailBuffer) String() string { return strings.TrimSpace(string(t.b)) }

type probe struct {
	head, branch, base, gitdir string
	refs                       []ref
	// tree is the full work tree's; itree the index's ("-": it has none).
	tree, itree string
	// ancestor: the previous checkpoint's HEAD is an ancestor of HEAD.
	ancestor bool
	// changes are the tree diffs by pair ("HI", "HW", "IW"); untracked is
	// the scan's untracked files and directories (these end in "/"). Both
	// only when itree is a tree.
	changes   map[string][]change
	untracked []string
	// emptyBlobs are the index entries of the empty blob: the
	// intent-to-add entries are among them.
	emptyBlobs []string
}

// parseProbe reads probeScript's output: "key value" lines, then, after a
// line "changes", the tree diffs and the untracked scan.
func parseProbe(out []byte) (probe, error) {
	var p probe
	rest := out
	for len(rest) > 0 {
		line, after, _ := bytes.Cut(rest, []byte("\n"))
		rest = after
		if string(line) == "changes" {
			changes, untracked, empty, err := parseChanges(rest)
			if err != nil {
				return p, err
			}
			p.changes, p.untracked, p.emptyBlobs = changes, untracked, empty
			break
		}
		k, v, _ := strings.Cut(string(line), " ")
		switch k {
		case "head":
			p.head = v
		case "base":
			p.base = v
		case "gitdir":
			p.gitdir = v
		case "ref":
			f := strings.Fields(v)
			if len(f) < 2 {
				continue
			}
			name := strings.TrimPrefix(f[1], "refs/heads/")
			p.refs = append(p.refs, ref{Name: name, Commit: f[0]})
			if len(f) == 3 && f[2] == "*" {
				p.branch = name
			}
		case "itree":
			p.itree = v
		case "ancestor":
			p.ancestor = v == "yes"
		case "tree":
			p.tree = v
		}
	}
	return p, nil
}

func checkCapture(req *checkpointv1.CaptureCheckpointRequest) error {
	if err := checkSession("session", req.GetSession()); err != nil {
		return err
	}
	if req.GetSandboxId() == "" {
		return fault.InvalidArgument("sandbox_id", "sandbox_id is required")
	}
	if err := checkAbs("work_dir", req.GetWorkDir()); err != nil {
		return err
	}
	if !commitRE.MatchString(req.GetBaseCommit()) {
		return fault.InvalidArgument("base_commit", "base_commit must be a full commit hash")
	}
	for _, p := range req.GetConversationPaths() {
		if err := checkAbs("conversation_paths", p); err != nil {
			return err
		}
	}
	return nil
}

func checkAbs(field, p string) error {
	if !path.IsAbs(p) || path.Clean(p) != p || p == "/" || strings.ContainsRune(p, 0) {
		return fault.InvalidArgument(field, "%s %q must be a clean absolute path", field, p)
	}
	return nil
}

// CaptureResult is what Capture made.
type CaptureResult struct {
	Checkpoint *checkpointv1.Checkpoint
	Warnings   []*checkpointv1.Warning
	// Created is false when nothing changed since the previous checkpoint,
	// which is returned instead.
	Created bool
}

// Capture checkpoints a sandbox's work tree and conversation files. Parts
// stream from the sandbox into the store chunk by chunk; the manifest is
// written last, so a failed capture leaves no checkpoint and the previous
// one intact.
func (e *Engine) Capture(ctx context.Context, req *checkpointv1.CaptureCheckpointRequest) (*CaptureResult, error) {
	if err := checkCapture(req); err != nil {
		return nil, err
	}
	session := req.GetSession()
	defer e.lockSession(session)()
	res, err := e.capture(ctx, req)
	if err != nil {
		return nil, e.captureFailed(ctx, session, err)
	}
	if res.Created {
		if err := e.prune(ctx, session); err != nil {
			// The checkpoint is written; retention catches up next time.
			e.opt.Logger.LogAttrs(ctx, slog.LevelWarn, "checkpoint retention failed",
				slog.String("session", session), slog.Any("error", err))
		}
	}
	return res, nil
}

func (e *Engine) capture(ctx context.Context, req *checkpointv1.CaptureCheckpointRequest) (*CaptureResult, error) {
	e.gc.RLock()
	defer e.gc.RUnlock()
	sb := sandbox{req.GetSandboxId(), req.GetFencingToken()}
	wd := req.GetWorkDir()

	prev := e.previous(ctx, req.GetSession())
	prevHead := ""
	if prev != nil && commitRE.MatchString(prev.cp.GetHeadCommit()) {
		prevHead = prev.cp.GetHeadCommit()
	}
	var nonce [6]byte
	rand.Read(nonce[:])
	var out bytes.Buffer
	code, err := e.run(ctx, sb, shArgv(probeScript, wd, req.GetBaseCommit(), hex.EncodeToString(nonce[:]), prevHead), gitEnv, nil, &out, 10)
	if err != nil {
		return nil, fmt.Errorf("capture probe: %w", err)
	}
	if code == 10 {
		return nil, fault.FailedPrecondition(ReasonNotARepo, "work_dir %s is not the top of a git work tree", wd)
	}
	pr, err := parseProbe(out.Bytes())
	if err != nil {
		return nil, err
	}
	switch {
	case pr.base == "missing" || pr.base == "":
		return nil, fault.FailedPrecondition(ReasonBaseMissing, "base commit %s is not in the sandbox's repository", req.GetBaseCommit())
	case !commitRE.MatchString(pr.head):
		return nil, fault.FailedPrecondition(ReasonNotARepo, "the repository in %s has no commit checked out", wd)
	case !commitRE.MatchString(pr.tree) || (pr.itree != "-" && !commitRE.MatchString(pr.itree)):
		return nil, fmt.Errorf("capture probe: unexpected output %q", out.String())
	}

	dk, err := e.opt.Keys.NewDataKey()
	if err != nil {
		return nil, err
	}
	// The parts are captured concurrently, each its own exec stream: most
	// of a small capture is waiting on git in the sandbox and on the store.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var warnings []*checkpointv1.Warning
	// capturePart runs argvs one after the other into one part (none: the
	// part is empty); a command exiting with one of allowed yields no part.
	// pw receives the part; its stored bytes count whatever happened.
	capturePart := func(pw *partWriter, kind checkpointv1.PartKind, limit int64, env map[string]string, stdin []byte, argvs [][]string, allowed ...int) (*checkpointv1.Part, *checkpointv1.Warning, error) {
		var (
			code int
			err  error
		)
		for i, argv := range argvs {
			var in io.Reader
			if i == 0 && stdin != nil {
				in = bytes.NewReader(stdin)
			}
			if code, err = e.run(ctx, sb, argv, env, in, pw, allowed...); err != nil || code != 0 {
				break
			}
		}
		if errors.Is(err, errPartTooLarge) {
			w := &checkpointv1.Warning{Code: "PART_TOO_LARGE", Part: kind,
				Message: fmt.Sprintf("%s part is over the %d MB limit and was not kept", partName(kind), limit>>20)}
			switch kind {
			case checkpointv1.PartKind_PART_KIND_UNTRACKED:
				w.Code = "UNTRACKED_TOO_LARGE"
				w.Message = fmt.Sprintf("untracked files are over the %d MB limit and were not kept", limit>>20)
			case checkpointv1.PartKind_PART_KIND_BUNDLE:
				w.Message = fmt.Sprintf("the commits' bundle is over the %d MB limit and was not kept; this checkpoint cannot be restored", limit>>20)
			}
			return &checkpointv1.Part{Kind: kind, Skipped: true, SizeBytes: pw.size}, w, nil
		}
		if err != nil {
			return nil, nil, fmt.Errorf("capture %s: %w", partName(kind), err)
		}
		if code != 0 {
			return nil, nil, nil
		}
		if err := pw.Close(); err != nil {
			return nil, nil, fmt.Errorf("capture %s: %w", partName(kind), err)
		}
		return &checkpointv1.Part{Kind: kind, SizeBytes: pw.size, Sha256: pw.sha(), Objects: pw.objects}, nil, nil
	}

	// Bundle: incremental on the previous checkpoint while its chain holds.
	exclude := []string{pr.base}
	var chain []*checkpointv1.Part
	prevID := ""
	if prev != nil && continuesChain(prev, pr) {
		prevID = prev.cp.GetId()
		for _, p := range prev.cp.GetParts() {
			if p.GetKind() == checkpointv1.PartKind_PART_KIND_BUNDLE {
				chain = append(chain, p)
			}
		}
		exclude = append(exclude, prev.cp.GetHeadCommit())
		for _, r := range prev.Refs {
			exclude = append(exclude, r.Commit)
		}
	}
	positive := []string{"HEAD"}
	for _, r := range pr.refs {
		positive = append(positive, "refs/heads/"+r.Name)
	}
	bundleEnv := withGitEnv(map[string]string{"HANGAR_EXCLUDE": strings.Join(exclude, " ")})

	git := func(args ...string) []string {
		return append(append([]string{"git", "-C", wd}, diffArgs...), args...)
	}
	type step struct {
		kind    checkpointv1.PartKind
		limit   int64
		argvs   [][]string
		env     map[string]string
		stdin   []byte // the first command's
		allowed []int  // exit codes meaning "no part" (the bundle's 3: no commits)
	}
	// Nothing to bundle when the chain goes on and HEAD and the branches
	// are where the previous checkpoint had them.
	var steps []step
	if prevID == "" || prev.cp.GetHeadCommit() != pr.head || !slices.Equal(prev.Refs, pr.refs) {
		steps = append(steps, step{kind: checkpointv1.PartKind_PART_KIND_BUNDLE, limit: e.opt.MaxPartBytes,
			argvs: [][]string{shArgv(bundleScript, append([]string{wd}, positive...)...)}, env: bundleEnv, allowed: []int{3}})
	}
	// With the index's tree (it lacks one only with unmerged entries) the
	// parts are diffs between trees, which cost what changed rather than
	// what the tree holds; otherwise they come from git diff over the index
	// and the work tree.
	untrackedLimit := minLimit(e.opt.MaxUntrackedBytes, e.opt.MaxPartBytes)
	if pr.itree != "-" {
		diff, files, args := treeParts(pr, wd, git)
		var index [][]string
		if len(pr.changes["HI"]) > 0 {
			index = [][]string{git(pr.head, pr.itree)}
		}
		steps = append(steps,
			step{kind: checkpointv1.PartKind_PART_KIND_DIFF, limit: e.opt.MaxPartBytes, argvs: diff, env: literalEnv},
			step{kind: checkpointv1.PartKind_PART_KIND_INDEX, limit: e.opt.MaxPartBytes, argvs: index, env: gitEnv},
			step{kind: checkpointv1.PartKind_PART_KIND_UNTRACKED, limit: untrackedLimit, env: gitEnv, stdin: files,
				argvs: [][]string{shArgv(untrackedTreeScript, args...)}},
		)
	} else {
		steps = append(steps,
			step{kind: checkpointv1.PartKind_PART_KIND_DIFF, limit: e.opt.MaxPartBytes, argvs: [][]string{git("HEAD")}, env: gitEnv},
			step{kind: checkpointv1.PartKind_PART_KIND_INDEX, limit: e.opt.MaxPartBytes, argvs: [][]string{git("--cached", "HEAD")}, env: gitEnv},
			step{kind: checkpointv1.PartKind_PART_KIND_UNTRACKED, limit: untrackedLimit, argvs: [][]string{shArgv(untrackedScript, wd)}, env: gitEnv},
		)
	}
	// The whole work against the base, from the work tree's tree:
	// GetCheckpointPatch needs no sandbox.
	steps = append(steps, step{kind: checkpointv1.PartKind_PART_KIND_PATCH, limit: e.opt.MaxPartBytes, argvs: [][]string{git(pr.base, pr.tree)}, env: gitEnv})
	if paths := req.GetConversationPaths(); len(paths) > 0 {
		argv := append([]string{"tar", "-c", "-f", "-", "--format=gnu", "-P", "--ignore-failed-read", "--"}, paths...)
		steps = append(steps, step{kind: checkpointv1.PartKind_PART_KIND_CONVERSATION, limit: e.opt.MaxPartBytes, argvs: [][]string{argv}, env: gitEnv})
	}
	got := make([]*checkpointv1.Part, len(steps))
	warned := make([]*checkpointv1.Warning, len(steps))
	errs := make([]error, len(steps))
	writers := make([]*partWriter, len(steps))
	var wg sync.WaitGroup
	for i, st := range steps {
		writers[i] = newPartWriter(ctx, e.opt.Store, dk, e.idKey, st.kind, st.limit, e.known)
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i], warned[i], errs[i] = capturePart(writers[i], st.kind, st.limit, st.env, st.stdin, st.argvs, st.allowed...)
			if errs[i] != nil {
				cancel()
			}
		}()
	}
	wg.Wait()
	if err := firstCause(errs); err != nil {
		return nil, err
	}
	var stored int64
	for _, pw := range writers {
		stored += pw.stored
	}
	// The chain first, oldest bundle first, then this capture's own.
	parts := append([]*checkpointv1.Part(nil), chain...)
	untrackedSkipped := false
	for i, p := range got {
		if warned[i] != nil {
			warnings = append(warnings, warned[i])
		}
		if p == nil {
			continue // no new commits: no bundle of its own
		}
		if p.GetKind() == checkpointv1.PartKind_PART_KIND_UNTRACKED && p.GetSkipped() {
			untrackedSkipped = true
		}
		parts = append(parts, p)
	}
	// A restore without the untracked files verifies the tracked ones.
	tracked := ""
	if untrackedSkipped {
		var tout bytes.Buffer
		if _, err := e.run(ctx, sb, shArgv(treeScript, wd, "-u"), gitEnv, nil, &tout); err != nil {
			return nil, fmt.Errorf("capture tracked tree: %w", err)
		}
		tracked = strings.TrimSpace(tout.String())
	}

	if req.GetVerifySettled() {
		var sout bytes.Buffer
		if _, err := e.run(ctx, sb, shArgv(treeScript, wd, "-A"), gitEnv, nil, &sout); err != nil {
			return nil, fmt.Errorf("capture settled tree: %w", err)
		}
		if strings.TrimSpace(sout.String()) != pr.tree {
			return nil, fault.Aborted(ReasonTreeChanged, "the work tree changed while it was captured: no checkpoint was kept; take one again later")
		}
	}

	cp := &checkpointv1.Checkpoint{
		Session: req.GetSession(), Reason: req.GetReason(), Turn: req.GetTurn(),
		Harness: req.GetHarness(), ConversationId: req.GetConversationId(),
		Branch: pr.branch, BaseCommit: pr.base, HeadCommit: pr.head, TreeHash: pr.tree,
		Parts: parts, Warnings: warnings, PreviousCheckpoint: prevID, KeyId: dk.KeyID,
		ConversationPaths: req.GetConversationPaths(),
	}
	for _, p := range parts {
		cp.SizeBytes += p.GetSizeBytes()
	}
	m := &manifest{cp: cp, Refs: pr.refs, TrackedTreeHash: tracked, IntentToAdd: intentToAdd(pr)}
	if prev != nil && sameContent(prev, m) {
		return &CaptureResult{Checkpoint: prev.cp, Warnings: prev.cp.GetWarnings(), Created: false}, nil
	}
	newest := ""
	if prev != nil {
		newest = prev.cp.GetId()
	}
	cp.Id = e.newID(req.GetSession(), newest)
	cp.CreatedAt = timestamppb.New(e.opt.Now())
	n, err := e.writeManifest(ctx, m)
	if err != nil {
		return nil, fmt.Errorf("capture: write manifest: %w", err)
	}
	cp.StoredBytes = stored + n
	e.opt.Logger.LogAttrs(ctx, slog.LevelInfo, "checkpoint captured", slog.String("checkpoint", cp.GetId()),
		slog.Int64("size_bytes", cp.GetSizeBytes()), slog.Int64("stored_bytes", cp.GetStoredBytes()), slog.Int("warnings", len(warnings)))
	return &CaptureResult{Checkpoint: cp, Warnings: warnings, Created: true}, nil
}

// firstCause is the first error that is not another goroutine's
// cancellation (which the first error caused).
func firstCause(errs []error) error {
	var canceled error
	for _, err := range errs {
		switch {
		case err == nil:
		case errors.Is(err, context.Canceled):
			if canceled == nil {
				canceled = err
			}
		default:
			return err
		}
	}
	return canceled
}

func minLimit(a, b int64) int64 {
	switch {
	case a <= 0:
		return b
	case b <= 0:
		return a
	}
	return min(a, b)
}

func partName(k checkpointv1.PartKind) string {
	return strings.ToLower(strings.TrimPrefix(k.String(), "PART_KIND_"))
}

// previous returns the session's newest readable checkpoint, or nil.
func (e *Engine) previous(ctx context.Context, session string) *manifest {
	keys, err := e.sessionKeys(ctx, session)
	if err != nil || len(keys) == 0 {
		return nil
	}
	m, err := e.readManifestKey(ctx, keys[0])
	if err != nil {
		e.opt.Logger.LogAttrs(ctx, slog.LevelWarn, "previous checkpoint unreadable; capturing in full",
			slog.String("session", session), slog.Any("error", err))
		return nil
	}
	return m
}

// continuesChain reports whether a capture may bundle only what prev lacks:
// same base, prev's bundles all kept, the chain not too long, and prev's
// HEAD still an ancestor of HEAD (otherwise history was rewritten and the
// old chain would carry dead commits forever).
func continuesChain(prev *manifest, pr probe) bool {
	if prev.cp.GetBaseCommit() != pr.base {
		return false
	}
	n := 0
	for _, p := range prev.cp.GetParts() {
		if p.GetKind() == checkpointv1.PartKind_PART_KIND_BUNDLE {
			if p.GetSkipped() {
				return false
			}
			n++
		}
	}
	return n < maxChain && (prev.cp.GetHeadCommit() == pr.head || pr.ancestor)
}

// sameContent reports whether m holds exactly what prev holds.
func sameContent(prev, m *manifest) bool {
	a, b := prev.cp, m.cp
	if a.GetHeadCommit() != b.GetHeadCommit() || a.GetBranch() != b.GetBranch() || a.GetTreeHash() != b.GetTreeHash() ||
		a.GetBaseCommit() != b.GetBaseCommit() || !slices.Equal(prev.Refs, m.Refs) ||
		!slices.Equal(a.GetConversationPaths(), b.GetConversationPaths()) || len(a.GetParts()) != len(b.GetParts()) ||
		!slices.EqualFunc(prev.IntentToAdd, m.IntentToAdd, bytes.Equal) ||
		a.GetHarness() != b.GetHarness() || a.GetConversationId() != b.GetConversationId() {
		return false
	}
	for i, p := range a.GetParts() {
		q := b.GetParts()[i]
		if p.GetKind() != q.GetKind() || p.GetSkipped() != q.GetSkipped() || p.GetSha256() != q.GetSha256() || p.GetSizeBytes() != q.GetSizeBytes() {
			return false
		}
	}
	return true
}

// intentToAdd are the index's intent-to-add entries: empty-blob entries
// the index's tree lacks (write-tree leaves them out) and the work tree's
// adds, so they travel with the untracked files.
func intentToAdd(pr probe) [][]byte {
	if len(pr.emptyBlobs) == 0 {
		return nil
	}
	added := map[string]bool{}
	for _, c := range pr.changes["IW"] {
		if c.status == "A" {
			added[c.path] = true
		}
	}
	var out [][]byte
	for _, p := range pr.emptyBlobs {
		if added[p] {
			out = append(out, []byte(p))
		}
	}
	return out
}

// literalEnv is gitEnv with pathspecs taken literally: the paths a tree
// diff names are file names, whatever bytes they hold.
var literalEnv = withGitEnv(map[string]string{"GIT_LITERAL_PATHSPECS": "1"})

// withGitEnv adds gitEnv to env and returns it.
func withGitEnv(env map[string]string) map[string]string {
	maps.Copy(env, gitEnv)
	return env
}

// maxPathspecBytes bounds the paths a tree diff names on its command line;
// past it the work tree's diff is git diff's over the index and the work
// tree (the same patch, at the cost of a scan of the work tree).
const maxPathspecBytes = 256 << 10

// treeParts returns, from the probe's tree diffs, the commands that write
// the DIFF part, the tracked files' uncommitted changes against HEAD (what
// `git diff HEAD` prints): HEAD against the work tree's tree on the paths
// that changed and are tracked (the index has them, or HEAD has them and
// the work tree does not), plus HEAD against the index's tree on the staged
// deletions whose files are still there (untracked now); none when nothing
// changed. And the untracked part's input: the untracked files (stdin) and
// untrackedTreeScript's arguments.
func treeParts(pr probe, wd string, git func(...string) []string) (diff [][]string, stdin []byte, untrackedArgs []string) {
	// What the work tree's tree has and the index's lacks is untracked;
	// gitlinks there are repositories.
	untracked := map[string]bool{}
	repos := map[string]bool{}
	var files bytes.Buffer
	emptied := map[string]bool{}
	for _, c := range pr.changes["IW"] {
		switch c.status {
		case "A":
			untracked[c.path] = true
			if c.newMode == "160000" {
				repos[c.path] = true
				continue
			}
			files.WriteString(c.path)
			files.WriteByte(0)
		case "D":
			for d := path.Dir(c.path); d != "." && d != "/" && !emptied[d]; d = path.Dir(d) {
				emptied[d] = true
			}
		}
	}
	var changed, stagedDeleted []string
	size := 0
	for _, c := range pr.changes["HW"] {
		if !untracked[c.path] {
			changed = append(changed, c.path)
			size += len(c.path) + 1
		}
	}
	for _, c := range pr.changes["HI"] {
		if c.status == "D" && untracked[c.path] {
			stagedDeleted = append(stagedDeleted, c.path)
			size += len(c.path) + 1
		}
	}
	switch {
	case size > maxPathspecBytes:
		diff = append(diff, git("HEAD"))
	default:
		if len(changed) > 0 {
			diff = append(diff, git(append([]string{pr.head, pr.tree, "--"}, changed...)...))
		}
		if len(stagedDeleted) > 0 {
			diff = append(diff, git(append([]string{pr.head, pr.itree, "--"}, stagedDeleted...)...))
		}
	}

	dot := func(set map[string]bool) []string {
		out := make([]string, 0, len(set))
		for p := range set {
			out = append(out, "./"+p)
		}
		slices.Sort(out)
		return out
	}
	dirs := map[string]bool{}
	for _, n := range pr.untracked {
		if d, ok := strings.CutSuffix(n, "/"); ok && !repos[d] {
			dirs[d] = true
		}
	}
	untrackedArgs = []string{wd, strconv.Itoa(len(emptied)), strconv.Itoa(len(repos))}
	untrackedArgs = append(untrackedArgs, dot(emptied)...)
	untrackedArgs = append(untrackedArgs, dot(repos)...)
	untrackedArgs = append(untrackedArgs, dot(dirs)...)
	return diff, files.Bytes(), untrackedArgs
}

type change struct{ newMode, status, path string }

var changePairs = []string{"HI", "HW", "IW"}

// parseChanges reads the probe's output after "changes": `git diff-tree
// --stdin --always -z --raw` of three tree pairs (each a header line "a
// b\n", then entries ":modes hashes status\0path\0"), then
// "\0untracked\0" and the untracked scan's NUL-separated names, then
// "/ita\0" and the paths of the index's empty-blob entries.
func parseChanges(data []byte) (map[string][]change, []string, []string, error) {
	bad := func(what string) error { return fmt.Errorf("capture probe: unexpected changes output (%s)", what) }
	marker := []byte("\x00untracked\x00")
	res := map[string][]change{}
	sec := -1
	diffs := data
	for {
		// Header lines start with a hash, entries with ':', the marker
		// (after the last entry or header) with NUL.
		for len(diffs) > 0 && diffs[0] != ':' && diffs[0] != 0 {
			nl := bytes.IndexByte(diffs, '\n')
			if nl < 0 {
				return nil, nil, nil, bad("header")
			}
			sec++
			diffs = diffs[nl+1:]
		}
		if bytes.HasPrefix(diffs, marker) {
			diffs = diffs[len(marker):]
			break
		}
		meta, after, ok1 := bytes.Cut(diffs, []byte{0})
		path, after, ok2 := bytes.Cut(after, []byte{0})
		f := strings.Fields(string(meta))
		if !ok1 || !ok2 || len(f) != 5 || !strings.HasPrefix(f[0], ":") || sec < 0 || sec >= len(changePairs) {
			return nil, nil, nil, bad("entry")
		}
		res[changePairs[sec]] = append(res[changePairs[sec]], change{newMode: f[1], status: f[4], path: string(path)})
		diffs = after
	}
	if sec != len(changePairs)-1 {
		return nil, nil, nil, bad("pairs")
	}
	var untracked, empty []string
	list := &untracked
	for _, n := range bytes.Split(diffs, []byte{0}) {
		switch {
		case len(n) == 0:
		case list == &untracked && string(n) == "/ita":
			list = &empty
		case list == &empty:
			// "mode hash stage\tpath"
			if _, p, ok := bytes.Cut(n, []byte("\t")); ok && len(p) > 0 {
				empty = append(empty, string(p))
			}
		default:
			untracked = append(untracked, string(n))
		}
	}
	return res, untracked, empty, nil
}
