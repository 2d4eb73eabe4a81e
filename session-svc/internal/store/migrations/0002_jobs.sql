-- Jobs (best-of-N): what was asked, where it stands and what it delivered.
-- Times are Unix nanoseconds (UTC) like 0001's; ended_at is NULL until the
-- job ends. budget_json is NULL when the job sets no budget of its own;
-- attempts_json is the attempts as a JSON array, "" before there are any.

CREATE TABLE jobs (
    id            TEXT PRIMARY KEY,
    strategy      TEXT NOT NULL DEFAULT '',
    state         TEXT NOT NULL DEFAULT '',
    session       TEXT NOT NULL DEFAULT '',
    message       TEXT NOT NULL DEFAULT '',
    n             INTEGER NOT NULL DEFAULT 0,
    check_command TEXT NOT NULL DEFAULT '',
    budget_json   TEXT,
    winner        TEXT NOT NULL DEFAULT '',
    patch         TEXT NOT NULL DEFAULT '',
    branch        TEXT NOT NULL DEFAULT '',
    error         TEXT NOT NULL DEFAULT '',
    attempts_json TEXT NOT NULL DEFAULT '',
    created_at    BIGINT NOT NULL DEFAULT 0,
    ended_at      BIGINT
);

CREATE INDEX jobs_by_creation ON jobs (created_at DESC, id DESC);

CREATE INDEX jobs_by_state ON jobs (state);
