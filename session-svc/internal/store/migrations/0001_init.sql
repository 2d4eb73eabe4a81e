-- Sessions, turns, events, checkpoints, artifacts and state transitions.
-- Times are Unix nanoseconds (UTC), 0 for "not set". {{autoid}} is the one
-- dialect difference: an auto-incrementing integer primary key.

CREATE TABLE sessions (
    name                   TEXT PRIMARY KEY,
    environment            TEXT NOT NULL DEFAULT '',
    repo                   TEXT NOT NULL DEFAULT '',
    harness                TEXT NOT NULL DEFAULT '',
    branch                 TEXT NOT NULL DEFAULT '',
    state                  TEXT NOT NULL DEFAULT '',
    state_reason           TEXT NOT NULL DEFAULT '',
    state_changed_at       BIGINT NOT NULL DEFAULT 0,
    idle_minutes           INTEGER,
    parent_id              TEXT NOT NULL DEFAULT '',
    forked_from_checkpoint TEXT NOT NULL DEFAULT '',
    conversation_id        TEXT NOT NULL DEFAULT '',
    created_at             BIGINT NOT NULL DEFAULT 0,
    last_active_at         BIGINT NOT NULL DEFAULT 0,
    sandbox_id             TEXT NOT NULL DEFAULT '',
    fencing_token          BIGINT NOT NULL DEFAULT 0,
    base_commit            TEXT NOT NULL DEFAULT '',
    budget_max_cost_usd    DOUBLE PRECISION NOT NULL DEFAULT 0,
    budget_max_tokens      BIGINT NOT NULL DEFAULT 0,
    budget_max_minutes     INTEGER NOT NULL DEFAULT 0,
    approvals              TEXT NOT NULL DEFAULT '',
    harness_lock           TEXT NOT NULL DEFAULT '',
    cache_ttl              TEXT NOT NULL DEFAULT '',
    model                  TEXT NOT NULL DEFAULT '',
    question_json          TEXT,
    version                BIGINT NOT NULL DEFAULT 1,
    last_turn              INTEGER NOT NULL DEFAULT 0,
    last_event_seq         BIGINT NOT NULL DEFAULT 0
);

CREATE INDEX sessions_by_activity ON sessions (last_active_at DESC, name);

CREATE INDEX sessions_by_state ON sessions (state);

CREATE INDEX sessions_by_parent ON sessions (parent_id);

CREATE TABLE session_transitions (
    id         {{autoid}},
    session    TEXT NOT NULL REFERENCES sessions (name) ON DELETE CASCADE,
    from_state TEXT NOT NULL,
    to_state   TEXT NOT NULL,
    reason     TEXT NOT NULL DEFAULT '',
    at         BIGINT NOT NULL
);

CREATE INDEX session_transitions_by_session ON session_transitions (session, id);

CREATE TABLE turns (
    session                TEXT NOT NULL REFERENCES sessions (name) ON DELETE CASCADE,
    number                 INTEGER NOT NULL,
    message                TEXT NOT NULL DEFAULT '',
    harness                TEXT NOT NULL DEFAULT '',
    command                TEXT NOT NULL DEFAULT '',
    outcome                TEXT NOT NULL DEFAULT '',
    outcome_reason         TEXT NOT NULL DEFAULT '',
    summary                TEXT NOT NULL DEFAULT '',
    result                 TEXT NOT NULL DEFAULT '',
    structured_result_json TEXT NOT NULL DEFAULT '',
    input_tokens           BIGINT NOT NULL DEFAULT 0,
    output_tokens          BIGINT NOT NULL DEFAULT 0,
    cache_read_tokens      BIGINT NOT NULL DEFAULT 0,
    cache_write_tokens     BIGINT NOT NULL DEFAULT 0,
    cost_usd               DOUBLE PRECISION NOT NULL DEFAULT 0,
    model_calls            INTEGER NOT NULL DEFAULT 0,
    checkpoint_id          TEXT NOT NULL DEFAULT '',
    started_at             BIGINT NOT NULL DEFAULT 0,
    ended_at               BIGINT,
    warnings_json          TEXT NOT NULL DEFAULT '',
    inherited              BOOLEAN NOT NULL DEFAULT FALSE,
    run_id                 TEXT NOT NULL DEFAULT '',
    budget_max_cost_usd    DOUBLE PRECISION NOT NULL DEFAULT 0,
    budget_max_tokens      BIGINT NOT NULL DEFAULT 0,
    budget_max_minutes     INTEGER NOT NULL DEFAULT 0,
    drift_json             TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (session, number)
);

CREATE TABLE events (
    session    TEXT NOT NULL REFERENCES sessions (name) ON DELETE CASCADE,
    seq        BIGINT NOT NULL,
    turn       INTEGER NOT NULL DEFAULT 0,
    at         BIGINT NOT NULL DEFAULT 0,
    kind       TEXT NOT NULL DEFAULT '',
    text       TEXT NOT NULL DEFAULT '',
    exit_code  INTEGER NOT NULL DEFAULT 0,
    path       TEXT NOT NULL DEFAULT '',
    usage_json TEXT,
    data_json  TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (session, seq)
);

CREATE INDEX events_by_turn ON events (session, turn, seq);

CREATE TABLE checkpoints (
    session       TEXT NOT NULL REFERENCES sessions (name) ON DELETE CASCADE,
    id            TEXT NOT NULL,
    created_at    BIGINT NOT NULL DEFAULT 0,
    reason        TEXT NOT NULL DEFAULT '',
    turn          INTEGER NOT NULL DEFAULT 0,
    size_bytes    BIGINT NOT NULL DEFAULT 0,
    warnings_json TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (session, id)
);

CREATE TABLE artifacts (
    session      TEXT NOT NULL REFERENCES sessions (name) ON DELETE CASCADE,
    turn         INTEGER NOT NULL,
    path         TEXT NOT NULL,
    size_bytes   BIGINT NOT NULL DEFAULT 0,
    content_type TEXT NOT NULL DEFAULT '',
    sha256       TEXT NOT NULL DEFAULT '',
    blob_key     TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (session, turn, path)
);

CREATE INDEX artifacts_by_path ON artifacts (session, path, turn);
