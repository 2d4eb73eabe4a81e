package store

import "time"

// Session states.
const (
	StateRunning    = "running"
	StateIdle       = "idle"
	StateSuspending = "suspending"
	StateSuspended  = "suspended"
	StateResuming   = "resuming"
	StateNeedsInput = "needs_input"
	StateArchived   = "archived"
	StateFailed     = "failed"
)

// Turn outcomes; a running turn has Outcome "".
const (
	OutcomeCompleted   = "completed"
	OutcomeFailed      = "failed"
	OutcomeOverBudget  = "over_budget"
	OutcomeNeedsInput  = "needs_input"
	OutcomeInterrupted = "interrupted"
)

// Event kinds.
const (
	EventMessage      = "message"
	EventCommand      = "command"
	EventFileChange   = "file_change"
	EventError        = "error"
	EventUsage        = "usage"
	EventToolCall     = "tool_call"
	EventStateChange  = "state_change"
	EventQuestion     = "question"
	EventCheckpoint   = "checkpoint"
	EventHarnessDrift = "harness_drift"
	EventSteer        = "steer"
	EventApproval     = "approval"
)

// Session is a session record.
type Session struct {
	Name        string
	Environment string
	Repo        string
	Harness     string
	Branch      string
	// State is one of the State constants; change it with Store.Transition.
	State          string
	StateReason    string
	StateChangedAt time.Time
	// IdleMinutes is the session's own idle limit (keep --idle); nil means
	// the service default, 0 never suspends.
	IdleMinutes          *int
	ParentID             string
	ForkedFromCheckpoint string
	ConversationID       string
	CreatedAt            time.Time
	LastActiveAt         time.Time
	SandboxID            string
	FencingToken         uint64
	BaseCommit           string
	Budget               Budget
	Approvals            string
	HarnessLock          string
	CacheTTL             string
	Model                string
	// Question is the open question when State is needs_input.
	Question *Question
	// Version is bumped by every write; set by the store.
	Version int64
}

// Budget is a turn's (or a session's default) limits; zero is no limit.
type Budget struct {
	MaxCostUSD float64
	MaxTokens  int64
	MaxMinutes int
}

// Question is what an agent asked (hangar-agent ask).
type Question struct {
	ID      string
	Text    string
	Turn    int
	AskedAt time.Time
}

// Usage is model usage.
type Usage struct {
	InputTokens      int64
	OutputTokens     int64
	CacheReadTokens  int64
	CacheWriteTokens int64
	CostUSD          float64
	ModelCalls       int
}

// Drift is one difference between a harness lock and what ran.
type Drift struct {
	Field  string `json:"field"`
	Locked string `json:"locked"`
	Actual string `json:"actual"`
}

// Turn is one message to the agent and what came of it.
type Turn struct {
	Session string
	// Number is assigned by CreateTurn: 1, 2, ... per session.
	Number  int
	Message string
	Harness string
	Command string
	// Outcome is "" while the turn runs, then one of the Outcome constants.
	Outcome              string
	OutcomeReason        string
	Summary              string
	Result               string
	StructuredResultJSON string
	Usage                Usage
	CheckpointID         string
	StartedAt            time.Time
	EndedAt              *time.Time
	Warnings             []string
	// Inherited marks a fork's copy of its parent's turn.
	Inherited bool
	RunID     string
	Budget    Budget
	Drift     []Drift
}

// Event is one thing that happened in a session, in order.
type Event struct {
	Session string
	// Seq is assigned by AppendEvents: 1, 2, ... per session.
	Seq      int64
	Turn     int
	Time     time.Time
	Kind     string
	Text     string
	ExitCode int
	Path     string
	Usage    *Usage
	DataJSON string
}

// Checkpoint is a checkpoint as the session records it.
type Checkpoint struct {
	ID        string
	Session   string
	CreatedAt time.Time
	Reason    string
	Turn      int
	SizeBytes int64
	Warnings  []string
}

// Artifact is a file an agent handed back.
type Artifact struct {
	Session     string
	Turn        int
	Path        string
	SizeBytes   int64
	ContentType string
	SHA256      string
	BlobKey     string
}

// Transition is one recorded state change.
type Transition struct {
	Session string
	From    string
	To      string
	Reason  string
	At      time.Time
}

// Job states.
const (
	JobPending   = "pending"
	JobRunning   = "running"
	JobDelivered = "delivered"
	JobFailed    = "failed"
)

// Job is a job record (best-of-N): what was asked, its attempts and what it
// delivered.
type Job struct {
	ID       string
	Strategy string
	// State is one of the Job constants.
	State   string
	Session string
	Message string
	N       int
	// Check is the command that scores each attempt.
	Check string
	// Budget overrides the session's for the attempts; nil keeps it.
	Budget   *Budget
	Attempts []Attempt
	Winner   string
	Patch    string
	Branch   string
	Error    string
	// CreatedAt defaults to now in CreateJob.
	CreatedAt time.Time
	// EndedAt is nil until the job is delivered or fails.
	EndedAt *time.Time
}

// Attempt is one attempt of a job and its check result.
type Attempt struct {
	Session       string
	Branch        string
	Outcome       string
	CheckExitCode int
	// Score is the last number the check printed; nil when it printed none.
	Score       *float64
	CheckOutput string
	Usage       Usage
	// Checked says the attempt is done (its turn ended and, if it
	// completed, the check ran): a job picked up again skips it.
	Checked bool
	// Resends counts the times its turn was sent again because the
	// control plane stopped while it ran.
	Resends int
}
