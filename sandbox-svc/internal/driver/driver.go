// Package driver defines how sandbox-svc builds and runs sandboxes: the
// Driver interface every backend (local directories, kubernetes pods)
// implements, and the request and result types they share. The conformance
// suite in drivertest is the contract's executable form.
package driver

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"time"
)

// Sentinel errors a driver returns; the server maps them to fault kinds.
var (
	// ErrFileNotFound: the path does not exist in the sandbox.
	ErrFileNotFound = errors.New("file not found")
	// ErrOutsideSandbox: the path (or a symlink on it) leaves the sandbox.
	ErrOutsideSandbox = errors.New("path escapes the sandbox")
	// ErrTooLarge: a file is larger than the caller's limit.
	ErrTooLarge = errors.New("file too large")
	// ErrNotDirectory / ErrIsDirectory: the path has the wrong type.
	ErrNotDirectory = errors.New("not a directory")
	ErrIsDirectory  = errors.New("is a directory")
	// ErrDestroyed: the sandbox was destroyed.
	ErrDestroyed = errors.New("sandbox destroyed")
	// ErrInUse: the work key is held by another live sandbox.
	ErrInUse = errors.New("work key in use")
	// ErrEgressUnsupported: the driver cannot enforce egress none here.
	ErrEgressUnsupported = errors.New("egress none unsupported")
	// ErrBusy: the sandbox runs a command (it can't be copied now).
	ErrBusy = errors.New("sandbox busy")
	// ErrBackendUnavailable: the driver's backend (a cluster's API
	// server) cannot be reached; the error names it.
	ErrBackendUnavailable = errors.New("sandbox backend unavailable")
	// ErrStartFailed: the sandbox's container never became ready (its
	// image cannot be pulled, it crashed, it was never scheduled); the
	// error carries the reason, meant for the user.
	ErrStartFailed = errors.New("sandbox did not start")
	// ErrIsolationUnavailable: the driver cannot isolate sandboxes here
	// and the operator has not opted out of isolation.
	ErrIsolationUnavailable = errors.New("sandbox isolation unavailable")
)

// Egress is what a sandbox's processes may reach.
type Egress int

// Egress policies.
const (
	EgressFull Egress = iota
	// EgressNone: loopback only, plus the gateway relay.
	EgressNone
)

// Spec says how to build one sandbox.
type Spec struct {
	// ID is unique among live sandboxes.
	ID string
	// WorkKey names the sandbox's directory so its work tree path is
	// reproducible (a session name); ID when empty.
	WorkKey     string
	Environment string
	// Repository is a local path or a git URL.
	Repository string
	// BaseRef is a branch, tag or commit; the repository's HEAD when empty.
	BaseRef string
	// Setup commands run with sh -c in the work tree after the clone.
	Setup []string
	// Env is given to every process (setup included).
	Env    map[string]string
	Egress Egress
	// Image is the environment's container image (drivers that run
	// containers; the driver's default when empty).
	Image string
	// Resources the environment asks for (0: the driver's default).
	CPUMillis, MemoryMB, DiskGB int
	// Pool, when set, makes the sandbox a warm one of that pool (an id of
	// what the environment builds): a WarmClaimer's acquire may claim it
	// from any replica. Empty: made for a lease, never handed out warm.
	Pool string
}

// Info describes a created sandbox.
type Info struct {
	ID         string
	WorkKey    string
	WorkDir    string
	HomeDir    string
	BaseCommit string
	Egress     Egress
	CreatedAt  time.Time
	// Layered: the work tree and home are overlays of a read-only layer
	// shared with other sandboxes (a Copier's copy that shares the
	// source's files, or a source that has been copied so).
	Layered bool
	// ToolVersion is the protocol version of the hangar-sandbox the
	// driver placed in the sandbox (api/sandboxtool); 0: none.
	ToolVersion int
}

// ExecRequest runs one command. Argv is run directly, not through a shell.
type ExecRequest struct {
	Argv []string
	Env  map[string]string
	// PathPrepend are directories put in front of the sandbox's PATH (Env's
	// PATH when it sets one).
	PathPrepend []string
	// Dir is relative to the work tree (or absolute inside the sandbox).
	Dir string
	// Stdin may be nil (empty stdin). The driver reads it in its own
	// goroutine; Wait does not wait for it to reach EOF.
	Stdin io.Reader
	// Stdout and Stderr receive the output as it is produced, in chunks of
	// at most 32 KiB; nil discards. Writes block the process (backpressure).
	Stdout, Stderr io.Writer
}

// ExitStatus is how a process ended.
type ExitStatus struct {
	Code int
	// Signal is set ("KILL", "TERM", ...) when a signal ended the process.
	Signal string
}

// Process is a running exec. Cancelling the context given to Exec kills its
// whole process group.
type Process interface {
	// Signal sends sig to the process group.
	Signal(sig os.Signal) error
	// Wait returns when the process has exited and its output is delivered.
	Wait() (ExitStatus, error)
}

// TerminalRequest starts a process on a pty.
type TerminalRequest struct {
	// Argv; the user's shell when empty.
	Argv []string
	Env  map[string]string
	// PathPrepend are directories put in front of the sandbox's PATH, as
	// ExecRequest's.
	PathPrepend []string
	Rows, Cols  uint16
}

// Terminal is a process on a pty. Reads return its output; writes are its
// input. Closing the reader side is not detaching: detach is the caller
// simply stopping to read (the server keeps draining it).
type Terminal interface {
	io.ReadWriter
	Resize(rows, cols uint16) error
	// Wait returns when the process has exited.
	Wait() (ExitStatus, error)
	// Kill ends the process group and closes the pty.
	Kill() error
}

// FileInfo describes a file in a sandbox.
type FileInfo struct {
	// Path is relative to the work tree, or absolute when outside it.
	Path       string
	Mode       fs.FileMode
	Size       int64
	ModTime    time.Time
	LinkTarget string
}

// DestroyHook runs before a sandbox is torn down, while it is still whole
// (exec and files work). Hooks run in order; an error is reported but does
// not stop the destruction.
type DestroyHook func(ctx context.Context, sb Sandbox) error

// Sandbox is one live sandbox.
type Sandbox interface {
	Info() Info
	// Exec starts a command. A command that cannot be started (missing
	// binary) is not an error: it exits 127 with a message on stderr.
	Exec(ctx context.Context, req ExecRequest) (Process, error)
	Terminal(ctx context.Context, req TerminalRequest) (Terminal, error)
	// ReadFile returns at most limit bytes; a larger file is ErrTooLarge.
	ReadFile(ctx context.Context, path string, limit int64) ([]byte, FileInfo, error)
	// WriteFile creates or replaces a file (parents created).
	WriteFile(ctx context.Context, path string, content []byte, mode fs.FileMode) (FileInfo, error)
	// Stat does not follow a final symlink.
	Stat(ctx context.Context, path string) (FileInfo, error)
	List(ctx context.Context, dir string) ([]FileInfo, error)
	// Relocate moves an idle sandbox (a warm one) to the directory of
	// workKey so its work tree path is the session's. Nothing may run.
	Relocate(ctx context.Context, workKey string) error
	// Destroy runs hooks, kills every process and removes the sandbox.
	// Destroying twice is not an error.
	Destroy(ctx context.Context, hooks ...DestroyHook) error
}

// ProcessKiller is a Sandbox that can end every process running in it
// (whatever they started, detached or not) and stay usable.
type ProcessKiller interface {
	KillProcesses(ctx context.Context) error
}

// Claimer is a Sandbox whose driver shares warm sandboxes between
// replicas (pods): the server claims one it takes from its pool, and a
// sandbox another replica claimed first is ErrInUse.
type Claimer interface {
	Claim(ctx context.Context) error
}

// WarmClaimer is a Driver whose warm sandboxes any replica can take (pods
// another replica's pool made): the server claims one of the pool, moved
// to workKey (left at its key when empty), when its own pool has none,
// before it creates one. nil, nil when there is none.
type WarmClaimer interface {
	ClaimWarm(ctx context.Context, pool, workKey string) (Sandbox, error)
}

// GoneNotifier is a Driver whose sandboxes can be removed by someone else
// (a pod deleted or evicted): fn hears the id of such a sandbox while it
// is still whole, so the server can destroy it with its hooks.
type GoneNotifier interface {
	NotifyGone(fn func(id string))
}

// Driver builds sandboxes.
type Driver interface {
	Name() string
	// Create clones the repository at the base ref, runs setup and returns
	// a ready sandbox. On error nothing is left behind.
	Create(ctx context.Context, spec Spec) (Sandbox, error)
}

// Copier is a Driver that can make a sandbox as a copy of another of its
// own: a fork restores a checkpoint once and copies the result, instead of
// cloning and restoring N times.
type Copier interface {
	// Copy returns a new sandbox for spec (ID, WorkKey, Egress) whose work
	// tree and home hold what src's hold now, at the new sandbox's paths.
	// src must be idle: ErrBusy while one of its commands or file
	// operations runs; those started on src during the copy wait for it. Setup is not run again.
	// On error nothing is left behind.
	Copy(ctx context.Context, src Sandbox, spec Spec) (Sandbox, error)
}

// Leftover is a sandbox an earlier process of this service left behind (it
// crashed, or was killed before its shutdown destroyed it) that no live
// sandbox of this driver owns.
type Leftover struct {
	// Key names it (the work key, or the sandbox id).
	Key string
	// ID and Environment are the sandbox's, when the driver recorded them
	// (empty when the process ended before it could).
	ID          string
	Environment string
	// Where is for logs: a directory, a pod name.
	Where string
}

// LeftoverCleaner is a Driver whose sandboxes can outlive the process that
// made them. The server lists the leftovers at start and on each reap, and
// removes those whose lease is gone.
type LeftoverCleaner interface {
	Leftovers(ctx context.Context) ([]Leftover, error)
	// RemoveLeftover removes lo unless a live sandbox has taken its key
	// since it was listed (then it reports false).
	RemoveLeftover(ctx context.Context, lo Leftover) (bool, error)
}

// Cacher is a Driver whose released sandboxes the server may keep, files
// and all, for the next lease of their work key (a suspended session's
// resume), instead of destroying them. It reports the disk they take so
// the cache stays within its limits.
type Cacher interface {
	// DiskUsage is the bytes sb's files take on disk.
	DiskUsage(ctx context.Context, sb Sandbox) (int64, error)
	// FreeDisk is the bytes free where the driver keeps its sandboxes.
	FreeDisk() (int64, error)
}

// LeftoverReviver is a LeftoverCleaner that can make a leftover live again
// after a crash: Revive returns a Sandbox over the files it left (work
// tree and home as they were; none of its processes, which ended with the
// process that ran them or were killed at start), so what is in it can be
// taken (a checkpoint for its session) before it goes. Destroying the
// revived sandbox removes the leftover. A leftover that cannot be revived
// (no id recorded, its files gone) is an error; remove it instead.
type LeftoverReviver interface {
	LeftoverCleaner
	Revive(ctx context.Context, lo Leftover) (Sandbox, error)
}
