// Package checkpoint captures a sandbox's work (commits, uncommitted and
// untracked changes, conversation files) into a blob store, sealed with the
// vault key, and restores it exactly into a fresh sandbox. It reaches a
// sandbox only through an Executor (the sandbox service's exec stream).
//
// Store layout:
//
//	objects/<hh>/<hmac>            a sealed chunk of a part, shared by every
//	                               checkpoint (of any session) holding it
//	checkpoints/<session>/<stamp>  a sealed manifest; written last, so a
//	                               checkpoint exists once its manifest does
//
// Objects are never referenced before they are complete, and are removed
// only by a mark-and-sweep collection that runs while no capture is in
// flight in this process (one checkpoint-svc per store).
package checkpoint

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	checkpointv1 "github.com/hangar-dev/hangar/api/hangar/checkpoint/v1"
	"github.com/hangar-dev/hangar/checkpoint-svc/internal/vault"
	"github.com/hangar-dev/hangar/platform/blob"
	"github.com/hangar-dev/hangar/platform/fault"
)

// Executor runs one command in a sandbox: stdin (nil for none) is fed to
// it and its output streamed to stdout and stderr (nil discards) as it is
// produced. A writer error must stop the command and be returned. A
// non-zero exit is not an error.
type Executor interface {
	Exec(ctx context.Context, sandboxID string, fencingToken uint64, argv []string, env map[string]string, cwd string,
		stdin io.Reader, stdout, stderr io.Writer) (exitCode int, err error)
}

// Options configure an Engine.
type Options struct {
	Store  blob.Store
	Exec   Executor
	Keys   *vault.Keyring
	Logger *slog.Logger
	Now    func() time.Time
	// KeepCheckpoints is how many checkpoints a session keeps (newest).
	KeepCheckpoints int
	// MaxUntrackedBytes and MaxPartBytes: larger parts are skipped with a
	// warning (0: no limit).
	MaxUntrackedBytes, MaxPartBytes int64
}

// Engine captures, restores and manages checkpoints.
type Engine struct {
	opt   Options
	idKey []byte

	// gc is held shared by captures and exclusively by collections.
	gc sync.RWMutex

	mu        sync.Mutex
	sessions  map[string]*sync.Mutex
	manifests map[string][]string // manifest key -> objects (manifests never change)

	// known holds objects known to be in the store (captures skip their
	// Stat); collect forgets what it deletes.
	known *objectSet
}

// maxKnownObjects bounds the known-object cache (~100 bytes an entry).
const maxKnownObjects = 200_000

// New returns an Engine.
func New(opt Options) (*Engine, error) {
	if opt.Store == nil || opt.Exec == nil || opt.Keys == nil {
		return nil, errors.New("checkpoint: Store, Exec and Keys are required")
	}
	if opt.Logger == nil {
		opt.Logger = slog.New(slog.DiscardHandler)
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	if opt.KeepCheckpoints < 1 {
		opt.KeepCheckpoints = 5
	}
	return &Engine{
		opt: opt, idKey: opt.Keys.Derive("checkpoint object id"),
		sessions: map[string]*sync.Mutex{}, manifests: map[string][]string{}, known: newObjectSet(maxKnownObjects),
	}, nil
}

// Stable reasons of the errors this package returns.
const (
	ReasonNotFound     = "CHECKPOINT_NOT_FOUND"
	ReasonTampered     = "CHECKPOINT_TAMPERED"
	ReasonUnknownKey   = "CHECKPOINT_KEY_UNKNOWN"
	ReasonUnsafePath   = "CHECKPOINT_UNSAFE_PATH"
	ReasonIncomplete   = "CHECKPOINT_INCOMPLETE"
	ReasonTreeMismatch = "CHECKPOINT_TREE_MISMATCH"
	ReasonNotARepo     = "WORK_DIR_NOT_A_REPOSITORY"
	ReasonBaseMissing  = "BASE_COMMIT_MISSING"
	ReasonTreeChanged  = "TREE_CHANGED"
	// ReasonCachedDiffers: a restore with reuse_sandbox found the sandbox
	// holding something other than the checkpoint (it was left untouched).
	ReasonCachedDiffers = "CACHED_SANDBOX_DIFFERS"
)

// domainErr turns an internal error about checkpoint id into a fault with a
// client-safe message; other errors pass through (they become Internal).
func domainErr(id string, err error) error {
	var fe *fault.Error
	switch {
	case err == nil:
		return nil
	case errors.As(err, &fe):
		return err
	case errors.Is(err, vault.ErrUnknownKey):
		return fault.Wrap(fault.KindFailedPrecondition, ReasonUnknownKey,
			fmt.Sprintf("checkpoint %s was sealed with a vault key this service does not have", id), err)
	case errors.Is(err, errDamaged):
		return fault.Wrap(fault.KindFailedPrecondition, ReasonTampered,
			fmt.Sprintf("checkpoint %s is damaged: its data was modified, truncated or lost", id), err)
	case errors.Is(err, errUnsafePath):
		return fault.Wrap(fault.KindFailedPrecondition, ReasonUnsafePath,
			fmt.Sprintf("checkpoint %s holds a path that would escape the work tree; nothing was restored from it", id), err)
	}
	return err
}

var sessionRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

func checkSession(field, s string) error {
	if !sessionRE.MatchString(s) {
		return fault.InvalidArgument(field, "%s must be 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit", field)
	}
	return nil
}

const stampLayout = "20060102T150405.000000000Z"

// A checkpoint id is "<session>~<stamp>-<random>": it names its manifest.
func manifestKey(id string) (session, key string, err error) {
	i := strings.LastIndexByte(id, '~')
	if i < 0 || checkSession("checkpoint_id", id[:i]) != nil || !regexp.MustCompile(`^[0-9TZ.]{26}-[0-9a-f]{8}$`).MatchString(id[i+1:]) {
		return "", "", fault.InvalidArgument("checkpoint_id", "checkpoint_id %q is not a checkpoint id", id)
	}
	return id[:i], "checkpoints/" + id[:i] + "/" + id[i+1:], nil
}

func idFromKey(key string) string {
	rest := strings.TrimPrefix(key, "checkpoints/")
	i := strings.LastIndexByte(rest, '/')
	return rest[:i] + "~" + rest[i+1:]
}

// manifest is the stored form of a checkpoint.
type manifest struct {
	Version    int             `json:"version"`
	Checkpoint json.RawMessage `json:"checkpoint"`
	// Refs are the local branches at capture (name -> commit).
	Refs []ref `json:"refs,omitempty"`
	// TrackedTreeHash is the tree of tracked files only: what a restore
	// verifies against when the untracked part was skipped.
	TrackedTreeHash string `json:"tracked_tree_hash,omitempty"`
	// IntentToAdd are the index's intent-to-add entries (git add -N):
	// their files are in the untracked part, and a restore adds them
	// again with -N. Bytes (base64 in JSON): a path may hold any byte, and
	// a JSON string only UTF-8.
	IntentToAdd [][]byte `json:"intent_to_add,omitempty"`
	// IndexTree is the index's tree at capture and UntrackedRequest the
	// untracked part's request (JSON; left out past
	// maxRecordedUntracked): with them a reuse check needs one round of
	// commands (checkReuseByTrees). Both empty in checkpoints taken
	// before they were recorded, or of an index with no tree.
	IndexTree        string          `json:"index_tree,omitempty"`
	UntrackedRequest json.RawMessage `json:"untracked_request,omitempty"`

	cp *checkpointv1.Checkpoint
}

type ref struct {
	Name   string `json:"name"`
	Commit string `json:"commit"`
}

func (m *manifest) objects() []string {
	var out []string
	for _, p := range m.cp.GetParts() {
		out = append(out, p.GetObjects()...)
	}
	return out
}

func (e *Engine) writeManifest(ctx context.Context, m *manifest) (int64, error) {
	b, err := protojson.Marshal(m.cp)
	if err != nil {
		return 0, err
	}
	m.Version, m.Checkpoint = 1, b
	body, err := json.Marshal(m)
	if err != nil {
		return 0, err
	}
	_, key, err := manifestKey(m.cp.GetId())
	if err != nil {
		return 0, err
	}
	dk, err := e.opt.Keys.NewDataKey()
	if err != nil {
		return 0, err
	}
	return putSealed(ctx, e.opt.Store, key, dk, bytes.NewReader(body))
}

func (e *Engine) readManifest(ctx context.Context, id string) (*manifest, error) {
	_, key, err := manifestKey(id)
	if err != nil {
		return nil, err
	}
	return e.readManifestKey(ctx, key)
}

func (e *Engine) readManifestKey(ctx context.Context, key string) (*manifest, error) {
	id := idFromKey(key)
	rc, err := e.opt.Store.Get(ctx, key)
	if errors.Is(err, blob.ErrNotFound) {
		return nil, fault.NotFound(ReasonNotFound, "checkpoint %s not found", id)
	}
	if err != nil {
		return nil, fmt.Errorf("get manifest: %w", err)
	}
	defer rc.Close()
	body, err := io.ReadAll(io.LimitReader(vault.NewReader(rc, e.opt.Keys), 64<<20))
	if err != nil {
		return nil, domainErr(id, mapOpenErr(err))
	}
	m, err := parseManifest(id, body)
	if err != nil {
		return nil, domainErr(id, err)
	}
	e.mu.Lock()
	e.manifests[key] = m.objects()
	e.mu.Unlock()
	return m, nil
}

// parseManifest reads a manifest's plaintext: it must be version 1 and
// name checkpoint id.
func parseManifest(id string, body []byte) (*manifest, error) {
	var m manifest
	if err := json.Unmarshal(body, &m); err != nil || m.Version != 1 {
		return nil, fmt.Errorf("%w: manifest does not parse", errDamaged)
	}
	m.cp = &checkpointv1.Checkpoint{}
	if err := protojson.Unmarshal(m.Checkpoint, m.cp); err != nil || m.cp.GetId() != id {
		return nil, fmt.Errorf("%w: manifest does not match its name", errDamaged)
	}
	return &m, nil
}

// sessionKeys lists a session's manifest keys, newest first.
func (e *Engine) sessionKeys(ctx context.Context, session string) ([]string, error) {
	infos, err := e.opt.Store.List(ctx, "checkpoints/"+session+"/")
	if err != nil {
		return nil, fmt.Errorf("list checkpoints: %w", err)
	}
	var keys []string
	for _, in := range infos {
		rest := strings.TrimPrefix(in.Key, "checkpoints/"+session+"/")
		if rest != "" && !strings.Contains(rest, "/") {
			keys = append(keys, in.Key)
		}
	}
	slices.Sort(keys)
	slices.Reverse(keys)
	return keys, nil
}

func (e *Engine) lockSession(s string) func() {
	e.mu.Lock()
	m, ok := e.sessions[s]
	if !ok {
		m = &sync.Mutex{}
		e.sessions[s] = m
	}
	e.mu.Unlock()
	m.Lock()
	return m.Unlock
}

// newID returns an id newer than every existing checkpoint of the session.
func (e *Engine) newID(session string, newest string) string {
	t := e.opt.Now().UTC()
	if newest != "" {
		if i := strings.LastIndexByte(newest, '~'); i >= 0 && len(newest) > i+27 {
			if prev, err := time.Parse(stampLayout, newest[i+1:i+27]); err == nil && !t.After(prev) {
				t = prev.Add(time.Nanosecond)
			}
		}
	}
	var r [4]byte
	rand.Read(r[:])
	return session + "~" + t.Format(stampLayout) + "-" + hex.EncodeToString(r[:])
}

// Get returns a checkpoint.
func (e *Engine) Get(ctx context.Context, id string) (*checkpointv1.Checkpoint, error) {
	m, err := e.readManifest(ctx, id)
	if err != nil {
		return nil, err
	}
	return m.cp, nil
}

// List returns a session's checkpoints, newest first, from offset on (at
// most limit; 0: all), and the offset of the next page (0: none).
func (e *Engine) List(ctx context.Context, session string, offset, limit int) ([]*checkpointv1.Checkpoint, int, error) {
	if err := checkSession("session", session); err != nil {
		return nil, 0, err
	}
	keys, err := e.sessionKeys(ctx, session)
	if err != nil {
		return nil, 0, err
	}
	if offset > len(keys) {
		offset = len(keys)
	}
	keys = keys[offset:]
	next := 0
	if limit > 0 && len(keys) > limit {
		keys, next = keys[:limit], offset+limit
	}
	out := make([]*checkpointv1.Checkpoint, 0, len(keys))
	for _, k := range keys {
		cp, err := e.listEntry(ctx, k)
		if err != nil {
			return nil, 0, err
		}
		if cp != nil {
			out = append(out, cp)
		}
	}
	return out, next, nil
}

// listEntry reads one manifest for a list: a damaged one is listed as such
// (its damage stays with it, the session's other checkpoints are listed
// as usual), one deleted since the listing is left out (nil), and only a
// failure to reach the store is an error.
func (e *Engine) listEntry(ctx context.Context, key string) (*checkpointv1.Checkpoint, error) {
	m, err := e.readManifestKey(ctx, key)
	switch {
	case err == nil:
		return m.cp, nil
	case fault.Is(err, fault.KindNotFound):
		return nil, nil
	case fault.Is(err, fault.KindFailedPrecondition):
		id := idFromKey(key)
		e.opt.Logger.LogAttrs(ctx, slog.LevelWarn, "checkpoint manifest damaged",
			slog.String("checkpoint", id), slog.Any("error", err))
		var fe *fault.Error
		errors.As(err, &fe)
		return damagedEntry(id, fe.Message), nil
	}
	return nil, err
}

// damagedEntry is the list entry of a checkpoint whose manifest cannot be
// read: its id, session and the time in its id.
func damagedEntry(id, problem string) *checkpointv1.Checkpoint {
	cp := &checkpointv1.Checkpoint{Id: id, Damaged: problem}
	if i := strings.LastIndexByte(id, '~'); i >= 0 {
		cp.Session = id[:i]
		if len(id) >= i+27 {
			if t, err := time.Parse(stampLayout, id[i+1:i+27]); err == nil {
				cp.CreatedAt = timestamppb.New(t)
			}
		}
	}
	return cp
}

// Delete removes a checkpoint; objects no other checkpoint holds go too.
func (e *Engine) Delete(ctx context.Context, id string) error {
	session, key, err := manifestKey(id)
	if err != nil {
		return err
	}
	defer e.lockSession(session)()
	if err := e.opt.Store.Delete(ctx, key); errors.Is(err, blob.ErrNotFound) {
		return fault.NotFound(ReasonNotFound, "checkpoint %s not found", id)
	} else if err != nil {
		return fmt.Errorf("delete manifest: %w", err)
	}
	e.collectLater(ctx)
	return nil
}

// Archive removes every checkpoint of a session and returns how many.
//
// It is all or nothing for the session: manifests are deleted oldest first,
// so a failure part way leaves the newest ones (the one a resume restores
// among them) whole, and the error says to try again; a retry deletes the
// rest (deleting is idempotent). Unused data is collected afterwards, and
// a collection that fails (another session's damaged manifest, the store)
// is logged and retried by the next one, never the archive's failure.
func (e *Engine) Archive(ctx context.Context, session string) (int, error) {
	if err := checkSession("session", session); err != nil {
		return 0, err
	}
	defer e.lockSession(session)()
	keys, err := e.sessionKeys(ctx, session)
	if err != nil {
		return 0, err
	}
	slices.Reverse(keys) // oldest first
	for i, k := range keys {
		if err := deleteKey(ctx, e.opt.Store, k); err != nil {
			return i, fmt.Errorf("archive %s: %d of %d checkpoints deleted, the newest %d kept: %w", session, i, len(keys), len(keys)-i, err)
		}
	}
	e.collectLater(ctx)
	return len(keys), nil
}

// collectLater collects unused objects now; a failure is logged and left
// to the next collection (objects nobody uses cost space, not correctness).
func (e *Engine) collectLater(ctx context.Context) {
	if err := e.collect(ctx); err != nil {
		e.opt.Logger.LogAttrs(ctx, slog.LevelWarn, "checkpoint collection failed; the next one retries",
			slog.Any("error", err))
	}
}

func deleteKey(ctx context.Context, s blob.Store, key string) error {
	if err := s.Delete(ctx, key); err != nil && !errors.Is(err, blob.ErrNotFound) {
		return fmt.Errorf("delete %s: %w", key, err)
	}
	return nil
}

// prune keeps a session's newest KeepCheckpoints. Called with the session
// locked.
func (e *Engine) prune(ctx context.Context, session string) error {
	keys, err := e.sessionKeys(ctx, session)
	if err != nil || len(keys) <= e.opt.KeepCheckpoints {
		return err
	}
	for _, k := range keys[e.opt.KeepCheckpoints:] {
		if err := deleteKey(ctx, e.opt.Store, k); err != nil {
			return err
		}
	}
	return e.collect(ctx)
}

// collect deletes every object no manifest references (mark and sweep).
// It waits for captures in flight, so none can be relying on an object it
// found but has not referenced yet. A damaged manifest (it does not
// authenticate or parse) references nothing anyone can restore, so it is
// passed over; if any other manifest cannot be read (the store failed, or
// it is sealed with a key this service lacks: a misconfigured key must not
// cost the data) it deletes nothing.
func (e *Engine) collect(ctx context.Context) error {
	e.gc.Lock()
	defer e.gc.Unlock()
	infos, err := e.opt.Store.List(ctx, "checkpoints/")
	if err != nil {
		return fmt.Errorf("collect: list manifests: %w", err)
	}
	live := map[string]bool{}
	present := map[string]bool{}
	for _, in := range infos {
		present[in.Key] = true
		e.mu.Lock()
		objs, ok := e.manifests[in.Key]
		e.mu.Unlock()
		if !ok {
			m, err := e.readManifestKey(ctx, in.Key)
			switch {
			case err == nil:
				objs = m.objects()
			case fault.ReasonOf(err) == ReasonTampered:
				e.opt.Logger.LogAttrs(ctx, slog.LevelWarn, "collect: damaged manifest passed over",
					slog.String("checkpoint", idFromKey(in.Key)), slog.Any("error", err))
			case fault.Is(err, fault.KindNotFound):
				// Deleted since the listing.
			default:
				return fmt.Errorf("collect: manifest %s unreadable, nothing deleted: %w", in.Key, err)
			}
		}
		for _, o := range objs {
			live[o] = true
		}
	}
	e.mu.Lock()
	for k := range e.manifests {
		if !present[k] {
			delete(e.manifests, k)
		}
	}
	e.mu.Unlock()
	objs, err := e.opt.Store.List(ctx, "objects/")
	if err != nil {
		return fmt.Errorf("collect: list objects: %w", err)
	}
	deleted := 0
	for _, in := range objs {
		id := in.Key[strings.LastIndexByte(in.Key, '/')+1:]
		if !live[id] {
			e.known.forget(id)
			if err := deleteKey(ctx, e.opt.Store, in.Key); err != nil {
				return err
			}
			deleted++
		}
	}
	e.opt.Logger.LogAttrs(ctx, slog.LevelDebug, "checkpoint objects collected",
		slog.Int("deleted", deleted), slog.Int("live", len(live)))
	return nil
}

// Fork makes a checkpoint of newSession holding the same data as id (no
// bytes copied), on branch (the source's branch when empty).
func (e *Engine) Fork(ctx context.Context, id, newSession, branch string) (*checkpointv1.Checkpoint, error) {
	if err := checkSession("new_session", newSession); err != nil {
		return nil, err
	}
	if branch != "" {
		if err := checkBranch("branch", branch); err != nil {
			return nil, err
		}
	}
	src, err := e.readManifest(ctx, id)
	if err != nil {
		return nil, err
	}
	defer e.lockSession(newSession)()
	e.gc.RLock()
	defer e.gc.RUnlock()
	// The source may have been deleted between reading and locking.
	if _, err := e.readManifest(ctx, id); err != nil {
		return nil, err
	}
	keys, err := e.sessionKeys(ctx, newSession)
	if err != nil {
		return nil, err
	}
	newest := ""
	if len(keys) > 0 {
		newest = idFromKey(keys[0])
	}
	cp := proto.Clone(src.cp).(*checkpointv1.Checkpoint)
	cp.Id = e.newID(newSession, newest)
	cp.Session = newSession
	cp.CreatedAt = timestamppb.New(e.opt.Now())
	cp.Reason = checkpointv1.CheckpointReason_CHECKPOINT_REASON_FORK
	cp.SharedFrom = src.cp.GetId()
	cp.PreviousCheckpoint = ""
	cp.StoredBytes = 0
	m := &manifest{cp: cp, TrackedTreeHash: src.TrackedTreeHash}
	old := src.cp.GetBranch()
	for _, r := range src.Refs {
		if branch != "" && old != "" && r.Name == old {
			r.Name = branch
		}
		m.Refs = append(m.Refs, r)
	}
	if branch != "" && old != "" {
		cp.Branch = branch
	}
	n, err := e.writeManifest(ctx, m)
	if err != nil {
		return nil, err
	}
	cp.StoredBytes = n
	return cp, nil
}

// Verify reads and authenticates every part of a checkpoint.
func (e *Engine) Verify(ctx context.Context, id string) (*checkpointv1.Checkpoint, error) {
	m, err := e.readManifest(ctx, id)
	if err != nil {
		return nil, err
	}
	for _, p := range m.cp.GetParts() {
		if p.GetSkipped() {
			continue
		}
		r := openPart(ctx, e.opt.Store, e.opt.Keys, p.GetObjects(), p.GetSizeBytes(), p.GetSha256())
		_, err := io.Copy(io.Discard, r)
		r.Close()
		if err != nil {
			return m.cp, domainErr(id, err)
		}
	}
	return m.cp, nil
}

// ReadPart streams a part's plaintext into w (for the bundle, the newest
// kept bundle of the checkpoint's chain; ReadBundle reads any of them).
func (e *Engine) ReadPart(ctx context.Context, id string, kind checkpointv1.PartKind, w io.Writer) error {
	m, err := e.readManifest(ctx, id)
	if err != nil {
		return err
	}
	var part *checkpointv1.Part
	for _, p := range m.cp.GetParts() {
		if p.GetKind() == kind && !p.GetSkipped() {
			part = p
		}
	}
	if part == nil {
		return fault.NotFound("PART_NOT_FOUND", "checkpoint %s has no %s part", id, kind)
	}
	return e.copyPart(ctx, id, part, w)
}

// ReadBundle streams bundle index of a checkpoint's chain into w: its
// BUNDLE parts in manifest order, 0 the oldest. Each bundle's
// prerequisites are in the ones before it (the first's in the base).
func (e *Engine) ReadBundle(ctx context.Context, id string, index int, w io.Writer) error {
	m, err := e.readManifest(ctx, id)
	if err != nil {
		return err
	}
	var chain []*checkpointv1.Part
	for _, p := range m.cp.GetParts() {
		if p.GetKind() == checkpointv1.PartKind_PART_KIND_BUNDLE {
			chain = append(chain, p)
		}
	}
	switch {
	case len(chain) == 0:
		return fault.InvalidArgument("bundle_index", "checkpoint %s has no bundle: bundle_index %d is out of range", id, index)
	case index < 0 || index >= len(chain):
		return fault.InvalidArgument("bundle_index", "checkpoint %s has %d bundles: bundle_index %d is out of range (0-%d)", id, len(chain), index, len(chain)-1)
	case chain[index].GetSkipped():
		return fault.FailedPrecondition("PART_NOT_KEPT", "bundle %d of checkpoint %s was over the size limit and not kept", index, id)
	}
	return e.copyPart(ctx, id, chain[index], w)
}

func (e *Engine) copyPart(ctx context.Context, id string, part *checkpointv1.Part, w io.Writer) error {
	r := openPart(ctx, e.opt.Store, e.opt.Keys, part.GetObjects(), part.GetSizeBytes(), part.GetSha256())
	defer r.Close()
	_, err := io.Copy(w, r)
	return domainErr(id, err)
}

var branchRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._/-]*$`)

func checkBranch(field, b string) error {
	if !branchRE.MatchString(b) || strings.Contains(b, "..") || strings.Contains(b, "//") ||
		strings.HasSuffix(b, "/") || strings.HasSuffix(b, ".lock") || strings.HasSuffix(b, ".") || len(b) > 200 {
		return fault.InvalidArgument(field, "%s %q is not a usable branch name", field, b)
	}
	return nil
}
