// Package sandboxtool is the protocol between the control plane and
// hangar-sandbox, the one program hangar runs inside a sandbox besides the
// agent CLI and the user's commands (sandbox-svc/cmd/hangar-sandbox). Each
// use is one exec, `hangar-sandbox COMMAND`, over the sandbox's Exec
// stream:
//
//   - stdin starts with one line, the request: a JSON Envelope whose Args
//     are the command's request type below; what follows the line is the
//     command's input (a file to stage), if it takes one;
//   - stdout is the command's result: one JSON line of its response type,
//     or a stream (a bundle, a diff, a tarball) for the commands that make
//     one;
//   - the exit code is one of the Exit constants; on failure the last line
//     of stderr is a JSON Failure.
//
// The tool refuses a request of a version it does not speak (ExitVersion):
// a checkpoint or a warm pool can bring an old sandbox back, so both sides
// say which protocol they speak, and sandbox-svc checks the tool's at
// acquire (CommandVersion).
package sandboxtool

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"unicode/utf8"
)

// Version is the protocol version this package speaks. Bump it when a
// request or response changes incompatibly.
const Version = 1

// Binary is the tool's name on a sandbox's PATH; AgentBinary is the same
// program under the name the agent calls it by (its `ask` and `artifact`
// commands).
const (
	Binary      = "hangar-sandbox"
	AgentBinary = "hangar-agent"
)

// Commands.
const (
	// CommandVersion prints a VersionResponse; it reads no request.
	CommandVersion = "version"
	// CommandProbe: ProbeRequest → ProbeResponse.
	CommandProbe = "probe"
	// CommandTreeHash: TreeHashRequest → TreeHashResponse.
	CommandTreeHash = "tree-hash"
	// CommandBundle: BundleRequest → a git bundle; ExitNothing when
	// there are no commits to bundle.
	CommandBundle = "bundle"
	// CommandDiff: DiffRequest → a patch git apply takes back exactly.
	CommandDiff = "diff"
	// CommandUntracked: UntrackedRequest → a GNU tarball.
	CommandUntracked = "untracked"
	// CommandArchive: ArchiveRequest → a GNU tarball of absolute paths.
	CommandArchive = "archive"
	// CommandStage: StageRequest, then the file's content → nothing.
	CommandStage = "stage"
	// CommandRestoreProbe: RestoreProbeRequest → RestoreProbeResponse.
	CommandRestoreProbe = "restore-probe"
	// CommandRestore: RestoreRequest → RestoreResponse.
	CommandRestore = "restore"
	// CommandRemove: RemoveRequest → nothing.
	CommandRemove = "remove"
	// CommandInitWork: InitWorkRequest → nothing.
	CommandInitWork = "init-work"
	// CommandHead: HeadRequest → HeadResponse.
	CommandHead = "head"
	// CommandWorkBundle: WorkBundleRequest → a git bundle, or nothing
	// when there are no commits past the base.
	CommandWorkBundle = "work-bundle"
	// CommandWorkDiff: WorkDiffRequest → a binary diff.
	CommandWorkDiff = "work-diff"
	// CommandCopyPrepare: CopyPrepareRequest → CopyPrepareResponse.
	CommandCopyPrepare = "copy-prepare"
	// CommandFromLocal: FromLocalRequest → nothing; ExitBaseMissing when
	// the repository lacks the local base commit.
	CommandFromLocal = "from-local"

	// The commands a driver without host access to the sandbox (a pod)
	// runs its own steps with, so the sandbox needs no shell or coreutils.

	// CommandClone: CloneRequest, then the bundle when Bundled →
	// CloneResponse; ExitBaseMissing when the ref is not found.
	CommandClone = "clone"
	// CommandFile: FileRequest, then the content for FileWrite → a
	// FileResponse line, then the content for FileRead; ExitNotFound,
	// ExitOutside, ExitIsDir, ExitNotDir or ExitTooLarge say why not.
	CommandFile = "file"

	// The commands whose request is the command line's third argument
	// (the same Envelope, not a stdin line): their stdin is not theirs
	// (Exec's belongs to the command it starts), or they have none.

	// CommandExec: ExecRequest. Starts the command, in a session of its own
	// unless Replace, and exits with its status (128+n for signal n);
	// 126: the directory is missing, 127: the command is not found.
	CommandExec = "exec"
	// CommandSignal: SignalRequest → nothing.
	CommandSignal = "signal"
	// CommandKillAll: no request. Kills every process it may but pid 1.
	CommandKillAll = "kill-all"
	// CommandHold: HoldRequest. A pod's pid 1: makes the run directory
	// and waits forever, ignoring TERM (a pod being deleted by someone
	// else stays whole through its grace period, for its destroy hooks).
	CommandHold = "hold"
	// CommandInstall: InstallRequest. Copies the tool into Dir, with the
	// agent's name beside it (an init container's job).
	CommandInstall = "install"
)

// ArgvRequest is the command line that runs an argv command (CommandExec,
// CommandSignal, CommandKillAll, CommandHold, CommandInstall) with args as
// its request, the tool at binary.
func ArgvRequest(binary, command string, args any) ([]string, error) {
	line, err := Request(args)
	if err != nil {
		return nil, err
	}
	return []string{binary, command, string(bytes.TrimSuffix(line, []byte("\n")))}, nil
}

// Exit codes.
const (
	ExitOK = 0
	// ExitFailed: the command failed; stderr's last line says why.
	ExitFailed = 1
	// ExitUsage: no such command, or a request that does not parse.
	ExitUsage = 2
	// ExitNothing: nothing to write (a bundle with no new commits).
	ExitNothing = 3
	// ExitNotARepo: the work directory is not the top of a git work tree.
	ExitNotARepo = 10
	// ExitBaseMissing: the repository lacks the base commit.
	ExitBaseMissing = 11
	// ExitVersion: the request's protocol version is not the tool's.
	ExitVersion = 12
	// ExitUnsafePath: a tarball entry would be written through a
	// symbolic link.
	ExitUnsafePath = 13
	// ExitNotFound: CommandFile's path does not exist.
	ExitNotFound = 14
	// ExitOutside: CommandFile's path leaves the root (through a link).
	ExitOutside = 15
	// ExitIsDir: CommandFile's path is a directory.
	ExitIsDir = 16
	// ExitNotDir: CommandFile's path is not a directory (list), or a
	// parent could not be made (write).
	ExitNotDir = 17
	// ExitTooLarge: CommandFile's file is over the limit.
	ExitTooLarge = 18
)

// Envelope is the request line.
type Envelope struct {
	Version int             `json:"version"`
	Args    json.RawMessage `json:"args,omitempty"`
}

// Failure is the last line of stderr when a command fails.
type Failure struct {
	Error string `json:"error"`
}

// Name is a file name: any bytes but NUL. JSON carries it as a string
// when it is UTF-8 and as {"base64": ...} otherwise (file names need not
// be text; encoding/json would replace the bytes that aren't).
type Name string

// MarshalJSON implements json.Marshaler.
func (n Name) MarshalJSON() ([]byte, error) {
	if utf8.ValidString(string(n)) {
		return json.Marshal(string(n))
	}
	return json.Marshal(struct {
		Base64 string `json:"base64"`
	}{base64.StdEncoding.EncodeToString([]byte(n))})
}

// UnmarshalJSON implements json.Unmarshaler.
func (n *Name) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		*n = Name(s)
		return nil
	}
	var raw struct {
		Base64 string `json:"base64"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	dec, err := base64.StdEncoding.DecodeString(raw.Base64)
	if err != nil {
		return fmt.Errorf("name: %w", err)
	}
	*n = Name(dec)
	return nil
}

// Argv is the command line that runs command in a sandbox.
func Argv(command string) []string { return []string{Binary, command} }

// Request encodes args as the request line (newline included).
func Request(args any) ([]byte, error) {
	raw, err := json.Marshal(args)
	if err != nil {
		return nil, fmt.Errorf("sandbox tool request: %w", err)
	}
	line, err := json.Marshal(Envelope{Version: Version, Args: raw})
	if err != nil {
		return nil, fmt.Errorf("sandbox tool request: %w", err)
	}
	return append(line, '\n'), nil
}

// VersionError: a request of a protocol version the tool does not speak.
type VersionError struct{ Got int }

func (e *VersionError) Error() string {
	return fmt.Sprintf("%s speaks protocol version %d, the request is version %d: the control plane and the sandbox's tool are of different releases", Binary, Version, e.Got)
}

// ReadRequest reads the request line from r into args (the tool's side).
// What follows the line stays in r.
func ReadRequest(r *bufio.Reader, args any) error {
	line, err := r.ReadBytes('\n')
	if err != nil && !(errors.Is(err, io.EOF) && len(line) > 0) {
		return fmt.Errorf("read the request line: %w", err)
	}
	var env Envelope
	if err := json.Unmarshal(line, &env); err != nil {
		return fmt.Errorf("parse the request line: %w", err)
	}
	if env.Version != Version {
		return &VersionError{Got: env.Version}
	}
	if len(env.Args) == 0 {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(env.Args))
	dec.DisallowUnknownFields()
	if err := dec.Decode(args); err != nil {
		return fmt.Errorf("parse the request's args: %w", err)
	}
	return nil
}

// FailureOf returns the reason in a failed command's stderr (its last
// JSON line), or the stderr's last line when it has none.
func FailureOf(stderr []byte) string {
	lines := bytes.Split(bytes.TrimSpace(stderr), []byte("\n"))
	last := lines[len(lines)-1]
	var f Failure
	if json.Unmarshal(last, &f) == nil && f.Error != "" {
		return f.Error
	}
	return string(last)
}

// VersionResponse is what `hangar-sandbox version` prints.
type VersionResponse struct {
	// Protocol is the protocol version the tool speaks.
	Protocol int `json:"protocol"`
}

// ProbeRequest asks for a work tree's state, the first step of a capture.
type ProbeRequest struct {
	WorkDir string `json:"work_dir"`
	// Base is the session's base commit.
	Base string `json:"base"`
	// PreviousHead is the previous checkpoint's HEAD (empty: none); the
	// response says whether it is an ancestor of HEAD.
	PreviousHead string `json:"previous_head,omitempty"`
}

// Ref is a branch and its commit.
type Ref struct {
	Name   string `json:"name"`
	Commit string `json:"commit"`
}

// Change is one entry of a raw tree diff.
type Change struct {
	NewMode string `json:"new_mode"`
	// Status is git's: A, D, M, T.
	Status string `json:"status"`
	Path   Name   `json:"path"`
}

// ProbeResponse is a work tree's state.
type ProbeResponse struct {
	// Head is HEAD's commit ("none": no commit checked out).
	Head string `json:"head"`
	// Base is the base commit ("missing": not in the repository).
	Base   string `json:"base"`
	GitDir string `json:"git_dir"`
	Refs   []Ref  `json:"refs,omitempty"`
	// Branch is the branch checked out (empty: detached).
	Branch string `json:"branch,omitempty"`
	// Tree is the full work tree's (tracked and untracked files
	// .gitignore does not ignore); ITree the index's ("-": it has none,
	// e.g. unmerged entries). Empty when Head or Base is not there.
	Tree  string `json:"tree,omitempty"`
	ITree string `json:"itree,omitempty"`
	// Ancestor: PreviousHead is HEAD or an ancestor of it.
	Ancestor bool `json:"ancestor,omitempty"`
	// The raw tree diffs HEAD→index, HEAD→work tree, index→work tree,
	// the untracked scan (directories end in "/") and the index's
	// entries of the empty blob (intent-to-add ones are among them): only
	// when ITree is a tree.
	HeadIndex     []Change `json:"head_index,omitempty"`
	HeadWorkTree  []Change `json:"head_work_tree,omitempty"`
	IndexWorkTree []Change `json:"index_work_tree,omitempty"`
	Untracked     []Name   `json:"untracked,omitempty"`
	EmptyBlobs    []Name   `json:"empty_blobs,omitempty"`
}

// TreeHashRequest asks for the hash of the work tree as `git add` into a
// copy of the index sees it.
type TreeHashRequest struct {
	WorkDir string `json:"work_dir"`
	// TrackedOnly: `add -u` (the tracked files only); else `add -A`.
	TrackedOnly bool `json:"tracked_only,omitempty"`
}

// TreeHashResponse is a tree's hash.
type TreeHashResponse struct {
	Tree string `json:"tree"`
}

// BundleRequest asks for a bundle of Positive minus what Exclude reaches
// (commits the repository lacks are left out of Exclude).
type BundleRequest struct {
	WorkDir  string   `json:"work_dir"`
	Positive []string `json:"positive"`
	Exclude  []string `json:"exclude,omitempty"`
}

// DiffRequest asks for `git diff` with the options that make a patch git
// apply takes back exactly, whatever the repository's configuration.
type DiffRequest struct {
	WorkDir string `json:"work_dir"`
	Cached  bool   `json:"cached,omitempty"`
	// Revs are one or two commits or trees.
	Revs []string `json:"revs"`
	// Paths limit the diff, taken literally; none: the whole tree.
	Paths []Name `json:"paths,omitempty"`
}

// UntrackedRequest asks for a tarball of the untracked files .gitignore
// does not ignore (symlinks as links), names relative to the work tree.
type UntrackedRequest struct {
	WorkDir string `json:"work_dir"`
	// Scan: find them with git's own scan. Otherwise they are the lists
	// below, from the probe: Files; Emptied, directories that lost
	// tracked files (kept if now empty: applying the diff would remove
	// them); Repos, untracked repositories (kept whole); Dirs, untracked
	// directories (for their modes, with the empty directories under
	// them).
	Scan    bool   `json:"scan,omitempty"`
	Files   []Name `json:"files,omitempty"`
	Emptied []Name `json:"emptied,omitempty"`
	Repos   []Name `json:"repos,omitempty"`
	Dirs    []Name `json:"dirs,omitempty"`
}

// ArchiveRequest asks for a tarball of absolute paths, recursively; paths
// that are missing or unreadable are left out.
type ArchiveRequest struct {
	Paths []string `json:"paths"`
}

// StageRequest writes the rest of stdin to Path (its directory is made,
// private, when missing).
type StageRequest struct {
	Path string `json:"path"`
}

// RemoveRequest removes Path and everything under it.
type RemoveRequest struct {
	Path string `json:"path"`
}

// RestoreProbeRequest checks that a work tree can take a restore.
type RestoreProbeRequest struct {
	WorkDir string `json:"work_dir"`
	Base    string `json:"base"`
}

// RestoreProbeResponse says where to stage the parts.
type RestoreProbeResponse struct {
	GitDir string `json:"git_dir"`
}

// RestoreRequest rebuilds the repository state in WorkDir from the parts
// staged in Staging: bundle-* (in name order), refs ("commit ref" lines),
// index.diff, worktree.diff, untracked.tar, conversation.tar.
type RestoreRequest struct {
	WorkDir string `json:"work_dir"`
	Staging string `json:"staging"`
	// Branch to check out at Head (empty: a detached HEAD).
	Branch string `json:"branch,omitempty"`
	Head   string `json:"head"`
	// Untracked: untracked.tar is staged; nothing in it may be written
	// through a symbolic link.
	Untracked bool `json:"untracked,omitempty"`
	// IntentToAdd are files of untracked.tar to mark `git add -N`.
	IntentToAdd []Name `json:"intent_to_add,omitempty"`
	// TrackedOnly: the tree to compare is of the tracked files only.
	TrackedOnly bool `json:"tracked_only,omitempty"`
	// WantTree: conversation.tar (when staged) is unpacked only when the
	// restored tree is this one.
	WantTree     string `json:"want_tree"`
	Conversation bool   `json:"conversation,omitempty"`
}

// RestoreResponse is the restored work tree's hash.
type RestoreResponse struct {
	Tree string `json:"tree"`
}

// InitWorkRequest gives a work tree a committer identity unless it has
// one and, with Branch, checks that branch out at HEAD (created or reset).
type InitWorkRequest struct {
	WorkDir string `json:"work_dir"`
	Branch  string `json:"branch,omitempty"`
	// Base is where the branch starts (fetched from origin when the clone
	// lacks it); HEAD when empty.
	Base string `json:"base,omitempty"`
}

// HeadRequest asks for HEAD and the branch checked out.
type HeadRequest struct {
	WorkDir string `json:"work_dir"`
}

// HeadResponse is HEAD's commit and branch ("" when detached).
type HeadResponse struct {
	Head   string `json:"head"`
	Branch string `json:"branch,omitempty"`
}

// WorkBundleRequest asks for a bundle of Rev's commits that Base (when the
// repository has it) does not reach.
type WorkBundleRequest struct {
	WorkDir string `json:"work_dir"`
	Base    string `json:"base"`
	Rev     string `json:"rev"`
}

// WorkDiffRequest asks for the work tree (tracked and untracked files
// .gitignore does not exclude) against Against, as a binary diff; the
// real index is left alone.
type WorkDiffRequest struct {
	WorkDir string `json:"work_dir"`
	Against string `json:"against"`
}

// Move is a path to move to another.
type Move struct {
	From string `json:"from"`
	To   string `json:"to"`
}

// CopyPrepareRequest turns a copy of a sibling fork's sandbox into this
// fork's: rename the branch checked out, move each path (one that is not
// there is skipped; one whose target exists fails), then, with Verify,
// hash the work tree again from its files (a copy's stat data is not the
// index's, so every file is read: the copy is checked byte for byte).
type CopyPrepareRequest struct {
	WorkDir    string `json:"work_dir"`
	FromBranch string `json:"from_branch"`
	ToBranch   string `json:"to_branch"`
	Moves      []Move `json:"moves,omitempty"`
	Verify     bool   `json:"verify,omitempty"`
}

// CopyPrepareResponse has the work tree's hash when asked to verify.
type CopyPrepareResponse struct {
	Tree string `json:"tree,omitempty"`
}

// FromLocalRequest applies a local checkout's work (`--from-local`) from
// files in Dir (bundle, diff, untracked.tar; each optional): Branch moves
// to the bundle's tip (Base without one), the diff goes to the index and
// the work tree, the untracked files are unpacked, and Dir is removed.
type FromLocalRequest struct {
	WorkDir string `json:"work_dir"`
	Dir     string `json:"dir"`
	Branch  string `json:"branch"`
	Base    string `json:"base"`
}

// CloneRequest: clone Repository into WorkDir (which must be empty or
// missing) and check out Ref detached; WorkDir and HomeDir are made
// first. Bundled: the repository comes as a git bundle after the request
// line (it is a path the sandbox cannot see); origin is then set to
// Repository.
type CloneRequest struct {
	Repository string `json:"repository"`
	Ref        string `json:"ref"`
	WorkDir    string `json:"work_dir"`
	HomeDir    string `json:"home_dir,omitempty"`
	Bundled    bool   `json:"bundled,omitempty"`
}

// CloneResponse is the commit checked out.
type CloneResponse struct {
	Commit string `json:"commit"`
}

// File operations.
const (
	// FileStat: the path, its final component not followed.
	FileStat = "stat"
	// FileRead: the file's content, links followed.
	FileRead = "read"
	// FileWrite: create or replace the file (parents made) with Mode.
	FileWrite = "write"
	// FileList: the directory's entries.
	FileList = "list"
)

// FileRequest is one file operation on Path, an absolute path that, with
// every link resolved, must stay under Root.
type FileRequest struct {
	Op    string `json:"op"`
	Root  string `json:"root"`
	Path  string `json:"path"`
	Limit int64  `json:"limit,omitempty"`
	Mode  uint32 `json:"mode,omitempty"`
}

// FileStatus is one file's lstat: Mode is the raw st_mode.
type FileStatus struct {
	Name  Name   `json:"name,omitempty"`
	Mode  uint32 `json:"mode"`
	Size  int64  `json:"size"`
	MTime int64  `json:"mtime"`
	Link  Name   `json:"link,omitempty"`
}

// FileResponse: File for stat, read and write; Entries for list.
type FileResponse struct {
	File    *FileStatus  `json:"file,omitempty"`
	Entries []FileStatus `json:"entries,omitempty"`
}

// ExecRequest starts Argv in Dir with exactly Env. RunFile receives the
// pid of the process (the id of its process group) while it runs.
// Replace: the tool becomes the command (exec), writing its own pid, and
// a missing Dir is not an error (a terminal starts anyway).
type ExecRequest struct {
	RunFile string   `json:"run_file"`
	Dir     string   `json:"dir"`
	Env     []string `json:"env"`
	Argv    []string `json:"argv"`
	Replace bool     `json:"replace,omitempty"`
}

// SignalRequest sends Signal (a name: TERM, KILL, ...) to the process
// group in RunFile, waiting up to 5 s for the file to be written; none
// by then: nothing to signal.
type SignalRequest struct {
	Signal  string `json:"signal"`
	RunFile string `json:"run_file"`
}

// HoldRequest names the run directory CommandHold makes.
type HoldRequest struct {
	RunDir string `json:"run_dir"`
}

// InstallRequest names the directory CommandInstall copies the tool into.
type InstallRequest struct {
	Dir string `json:"dir"`
}
