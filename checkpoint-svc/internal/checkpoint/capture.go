package checkpoint

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"path"
	"regexp"
	"slices"
	"strings"

	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/types/known/timestamppb"

	checkpointv1 "github.com/hangar-dev/hangar/api/hangar/checkpoint/v1"
	"github.com/hangar-dev/hangar/api/sandboxtool"
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

// run executes argv in the sandbox; a non-zero exit other than the allowed
// ones is an error carrying the reason the tool gave (or the end of
// stderr), for logs only.
func (e *Engine) run(ctx context.Context, sb sandbox, argv []string, env map[string]string, stdin io.Reader, stdout io.Writer, allowed ...int) (int, error) {
	var stderr tailBuffer
	code, err := e.opt.Exec.Exec(ctx, sb.id, sb.token, argv, env, "", stdin, stdout, &stderr)
	if err != nil {
		return code, err
	}
	if code != 0 && !slices.Contains(allowed, code) {
		return code, fmt.Errorf("sandbox command %q exited %d: %s", strings.Join(argv[:min(len(argv), 2)], " "), code, sandboxtool.FailureOf(stderr.b))
	}
	return code, nil
}

// toolCall is one hangar-sandbox command and its request.
type toolCall struct {
	command string
	req     any
}

// tool runs a hangar-sandbox command in the sandbox: the request line,
// then input (may be nil) on its stdin, its result to stdout.
func (e *Engine) tool(ctx context.Context, sb sandbox, c toolCall, input io.Reader, stdout io.Writer, allowed ...int) (int, error) {
	line, err := sandboxtool.Request(c.req)
	if err != nil {
		return -1, err
	}
	var in io.Reader = bytes.NewReader(line)
	if input != nil {
		in = io.MultiReader(in, input)
	}
	return e.run(ctx, sb, sandboxtool.Argv(c.command), nil, in, stdout, allowed...)
}

// toolJSON runs a command whose result is one JSON response; resp is not
// set when the command exits with one of allowed.
func (e *Engine) toolJSON(ctx context.Context, sb sandbox, c toolCall, resp any, allowed ...int) (int, error) {
	var out bytes.Buffer
	code, err := e.tool(ctx, sb, c, nil, &out, allowed...)
	if err != nil || code != 0 {
		return code, err
	}
	if err := json.Unmarshal(out.Bytes(), resp); err != nil {
		return code, fmt.Errorf("%s %s: bad response: %w", sandboxtool.Binary, c.command, err)
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

// probeFrom reads the tool's probe response.
func probeFrom(r sandboxtool.ProbeResponse) probe {
	p := probe{head: r.Head, base: r.Base, gitdir: r.GitDir, branch: r.Branch, tree: r.Tree, itree: r.ITree, ancestor: r.Ancestor}
	for _, f := range r.Refs {
		p.refs = append(p.refs, ref{Name: f.Name, Commit: f.Commit})
	}
	if r.ITree == "-" || r.ITree == "" {
		return p
	}
	p.changes = map[string][]change{}
	for pair, list := range map[string][]sandboxtool.Change{"HI": r.HeadIndex, "HW": r.HeadWorkTree, "IW": r.IndexWorkTree} {
		for _, c := range list {
			p.changes[pair] = append(p.changes[pair], change{newMode: c.NewMode, status: c.Status, path: string(c.Path)})
		}
	}
	for _, n := range r.Untracked {
		p.untracked = append(p.untracked, string(n))
	}
	for _, n := range r.EmptyBlobs {
		p.emptyBlobs = append(p.emptyBlobs, string(n))
	}
	return p
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
	res, err := e.capture(ctx, req, nil)
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

// capture takes a checkpoint; with against, it is a check instead: nothing
// is stored, and the result is against's checkpoint when the sandbox holds
// exactly what against holds (errCachedDiffers otherwise).
func (e *Engine) capture(ctx context.Context, req *checkpointv1.CaptureCheckpointRequest, against *manifest) (*CaptureResult, error) {
	e.gc.RLock()
	defer e.gc.RUnlock()
	sb := sandbox{req.GetSandboxId(), req.GetFencingToken()}
	wd := req.GetWorkDir()

	prev := e.previous(ctx, req.GetSession())
	prevHead := ""
	if prev != nil && commitRE.MatchString(prev.cp.GetHeadCommit()) {
		prevHead = prev.cp.GetHeadCommit()
	}
	var resp sandboxtool.ProbeResponse
	code, err := e.toolJSON(ctx, sb, toolCall{sandboxtool.CommandProbe, sandboxtool.ProbeRequest{WorkDir: wd, Base: req.GetBaseCommit(), PreviousHead: prevHead}},
		&resp, sandboxtool.ExitNotARepo)
	if err != nil {
		return nil, fmt.Errorf("capture probe: %w", err)
	}
	if code == sandboxtool.ExitNotARepo {
		return nil, fault.FailedPrecondition(ReasonNotARepo, "work_dir %s is not the top of a git work tree", wd)
	}
	pr := probeFrom(resp)
	switch {
	case pr.base == "missing" || pr.base == "":
		return nil, fault.FailedPrecondition(ReasonBaseMissing, "base commit %s is not in the sandbox's repository", req.GetBaseCommit())
	case !commitRE.MatchString(pr.head):
		return nil, fault.FailedPrecondition(ReasonNotARepo, "the repository in %s has no commit checked out", wd)
	case !commitRE.MatchString(pr.tree) || (pr.itree != "-" && !commitRE.MatchString(pr.itree)):
		return nil, fmt.Errorf("capture probe: unexpected trees %q, %q", pr.tree, pr.itree)
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
	capturePart := func(pw *partWriter, kind checkpointv1.PartKind, limit int64, calls []toolCall, allowed ...int) (*checkpointv1.Part, *checkpointv1.Warning, error) {
		var (
			code int
			err  error
		)
		for _, c := range calls {
			if code, err = e.tool(ctx, sb, c, nil, pw, allowed...); err != nil || code != 0 {
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

	plan := planCapture(pr, prev, wd, req.GetConversationPaths(), planLimits{part: e.opt.MaxPartBytes, untracked: e.opt.MaxUntrackedBytes})
	steps, chain, prevID := plan.steps, plan.chain, plan.prevID
	got := make([]*checkpointv1.Part, len(steps))
	warned := make([]*checkpointv1.Warning, len(steps))
	errs := make([]error, len(steps))
	writers := make([]*partWriter, len(steps))
	// Each part reports its error on its own (not through the group):
	// the first cause wins over the cancellations it caused.
	var g errgroup.Group
	for i, st := range steps {
		writers[i] = newPartWriter(ctx, e.opt.Store, dk, e.idKey, st.kind, st.limit, e.known)
		writers[i].dry = against != nil
		g.Go(func() error {
			got[i], warned[i], errs[i] = capturePart(writers[i], st.kind, st.limit, st.calls, st.allowed...)
			if errs[i] != nil {
				cancel()
			}
			return nil
		})
	}
	_ = g.Wait()
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
	if untrackedSkipped && against != nil {
		return nil, errCachedDiffers // skipped files can't be compared
	}
	if untrackedSkipped {
		var th sandboxtool.TreeHashResponse
		if _, err := e.toolJSON(ctx, sb, toolCall{sandboxtool.CommandTreeHash, sandboxtool.TreeHashRequest{WorkDir: wd, TrackedOnly: true}}, &th); err != nil {
			return nil, fmt.Errorf("capture tracked tree: %w", err)
		}
		tracked = th.Tree
	}

	if req.GetVerifySettled() {
		var th sandboxtool.TreeHashResponse
		if _, err := e.toolJSON(ctx, sb, toolCall{sandboxtool.CommandTreeHash, sandboxtool.TreeHashRequest{WorkDir: wd}}, &th); err != nil {
			return nil, fmt.Errorf("capture settled tree: %w", err)
		}
		if th.Tree != pr.tree {
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
	if plan.untracked != nil {
		if b, err := json.Marshal(plan.untracked); err == nil && len(b) <= maxRecordedUntracked {
			m.IndexTree, m.UntrackedRequest = pr.itree, b
		}
	}
	if against != nil {
		if !sameContent(against, m) {
			return nil, errCachedDiffers
		}
		return &CaptureResult{Checkpoint: against.cp, Created: false}, nil
	}
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

// maxPathspecBytes bounds the paths a tree diff names on its command line;
// past it the work tree's diff is git diff's over the index and the work
// tree (the same patch, at the cost of a scan of the work tree).
const maxPathspecBytes = 256 << 10

// step is one part of a capture: the commands that write it, one after
// the other.
type step struct {
	kind  checkpointv1.PartKind
	limit int64
	calls []toolCall
	// allowed are exit codes meaning "no part" (the bundle's: no commits).
	allowed []int
}

// planLimits are the engine's part size limits.
type planLimits struct{ part, untracked int64 }

// capturePlan is what a capture writes.
type capturePlan struct {
	// prevID is the previous checkpoint this one's bundle builds on ("":
	// the bundle holds everything since the base), chain that one's
	// bundles.
	prevID string
	chain  []*checkpointv1.Part
	steps  []step
	// untracked is the untracked part's request when it comes from the
	// probe's trees (nil: from git's own scan).
	untracked *sandboxtool.UntrackedRequest
}

// planCapture decides, from the probe and the previous checkpoint (nil:
// none), which parts a capture writes and with which commands. It only
// decides: capture does the work.
func planCapture(pr probe, prev *manifest, wd string, conversation []string, lim planLimits) capturePlan {
	var plan capturePlan
	// Bundle: incremental on the previous checkpoint while its chain holds.
	exclude := []string{pr.base}
	if prev != nil && continuesChain(prev, pr) {
		plan.prevID = prev.cp.GetId()
		for _, p := range prev.cp.GetParts() {
			if p.GetKind() == checkpointv1.PartKind_PART_KIND_BUNDLE {
				plan.chain = append(plan.chain, p)
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
	// Nothing to bundle when the chain goes on and HEAD and the branches
	// are where the previous checkpoint had them.
	if plan.prevID == "" || prev.cp.GetHeadCommit() != pr.head || !slices.Equal(prev.Refs, pr.refs) {
		plan.steps = append(plan.steps, step{kind: checkpointv1.PartKind_PART_KIND_BUNDLE, limit: lim.part,
			calls:   []toolCall{{sandboxtool.CommandBundle, sandboxtool.BundleRequest{WorkDir: wd, Positive: positive, Exclude: exclude}}},
			allowed: []int{sandboxtool.ExitNothing}})
	}
	diff := func(cached bool, revs []string, paths []string) toolCall {
		req := sandboxtool.DiffRequest{WorkDir: wd, Cached: cached, Revs: revs}
		for _, p := range paths {
			req.Paths = append(req.Paths, sandboxtool.Name(p))
		}
		return toolCall{sandboxtool.CommandDiff, req}
	}
	// With the index's tree (it lacks one only with unmerged entries) the
	// parts are diffs between trees, which cost what changed rather than
	// what the tree holds; otherwise they come from git diff over the index
	// and the work tree.
	untrackedLimit := minLimit(lim.untracked, lim.part)
	if pr.itree != "-" {
		worktree, untracked := treeParts(pr, wd, diff)
		plan.untracked = &untracked
		var index []toolCall
		if len(pr.changes["HI"]) > 0 {
			index = []toolCall{diff(false, []string{pr.head, pr.itree}, nil)}
		}
		plan.steps = append(plan.steps,
			step{kind: checkpointv1.PartKind_PART_KIND_DIFF, limit: lim.part, calls: worktree},
			step{kind: checkpointv1.PartKind_PART_KIND_INDEX, limit: lim.part, calls: index},
			step{kind: checkpointv1.PartKind_PART_KIND_UNTRACKED, limit: untrackedLimit, calls: []toolCall{{sandboxtool.CommandUntracked, untracked}}},
		)
	} else {
		plan.steps = append(plan.steps,
			step{kind: checkpointv1.PartKind_PART_KIND_DIFF, limit: lim.part, calls: []toolCall{diff(false, []string{"HEAD"}, nil)}},
			step{kind: checkpointv1.PartKind_PART_KIND_INDEX, limit: lim.part, calls: []toolCall{diff(true, []string{"HEAD"}, nil)}},
			step{kind: checkpointv1.PartKind_PART_KIND_UNTRACKED, limit: untrackedLimit,
				calls: []toolCall{{sandboxtool.CommandUntracked, sandboxtool.UntrackedRequest{WorkDir: wd, Scan: true}}}},
		)
	}
	// The whole work against the base, from the work tree's tree:
	// GetCheckpointPatch needs no sandbox.
	plan.steps = append(plan.steps, step{kind: checkpointv1.PartKind_PART_KIND_PATCH, limit: lim.part, calls: []toolCall{diff(false, []string{pr.base, pr.tree}, nil)}})
	if len(conversation) > 0 {
		plan.steps = append(plan.steps, step{kind: checkpointv1.PartKind_PART_KIND_CONVERSATION, limit: lim.part,
			calls: []toolCall{{sandboxtool.CommandArchive, sandboxtool.ArchiveRequest{Paths: conversation}}}})
	}
	return plan
}

// treeParts returns, from the probe's tree diffs, the commands that write
// the DIFF part, the tracked files' uncommitted changes against HEAD (what
// `git diff HEAD` prints): HEAD against the work tree's tree on the paths
// that changed and are tracked (the index has them, or HEAD has them and
// the work tree does not), plus HEAD against the index's tree on the staged
// deletions whose files are still there (untracked now); none when nothing
// changed. And the untracked part's request: the untracked files, the
// directories that lost tracked files, the untracked repositories and
// directories.
func treeParts(pr probe, wd string, diff func(cached bool, revs, paths []string) toolCall) ([]toolCall, sandboxtool.UntrackedRequest) {
	// What the work tree's tree has and the index's lacks is untracked;
	// gitlinks there are repositories.
	untracked := map[string]bool{}
	repos := map[string]bool{}
	req := sandboxtool.UntrackedRequest{WorkDir: wd}
	emptied := map[string]bool{}
	for _, c := range pr.changes["IW"] {
		switch c.status {
		case "A":
			untracked[c.path] = true
			if c.newMode == "160000" {
				repos[c.path] = true
				continue
			}
			req.Files = append(req.Files, sandboxtool.Name(c.path))
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
	var calls []toolCall
	switch {
	case size > maxPathspecBytes:
		calls = append(calls, diff(false, []string{"HEAD"}, nil))
	default:
		if len(changed) > 0 {
			calls = append(calls, diff(false, []string{pr.head, pr.tree}, changed))
		}
		if len(stagedDeleted) > 0 {
			calls = append(calls, diff(false, []string{pr.head, pr.itree}, stagedDeleted))
		}
	}

	sorted := func(set map[string]bool) []sandboxtool.Name {
		out := make([]sandboxtool.Name, 0, len(set))
		for _, p := range slices.Sorted(maps.Keys(set)) {
			out = append(out, sandboxtool.Name(p))
		}
		return out
	}
	dirs := map[string]bool{}
	for _, n := range pr.untracked {
		if d, ok := strings.CutSuffix(n, "/"); ok && !repos[d] {
			dirs[d] = true
		}
	}
	req.Emptied, req.Repos, req.Dirs = sorted(emptied), sorted(repos), sorted(dirs)
	return calls, req
}

type change struct{ newMode, status, path string }
