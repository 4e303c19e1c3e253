-- orderflow PostgreSQL schema. `{schema}` is the task hub's name; `orderflow init` applies this
-- file and it is idempotent (every statement is IF NOT EXISTS).
CREATE SCHEMA IF NOT EXISTS "{schema}";

CREATE TABLE IF NOT EXISTS "{schema}".orders (
    order_id        text PRIMARY KEY,
    data            jsonb NOT NULL,
    fingerprint     text NOT NULL,
    received_at     timestamptz NOT NULL,
    schema_version  integer NOT NULL
);

CREATE TABLE IF NOT EXISTS "{schema}".state (
    order_id          text PRIMARY KEY,
    process_state     text NOT NULL,
    locked_by         text,
    owner             text,
    complete_by       timestamptz,
    failure_count     integer NOT NULL DEFAULT 0,
    attempt           integer NOT NULL DEFAULT 0,
    workflow          text NOT NULL,
    workflow_version  integer NOT NULL,
    schema_version    integer NOT NULL,
    steps             jsonb NOT NULL,
    retry_budget      jsonb NOT NULL,
    reply_to          text,
    next_attempt_at   timestamptz NOT NULL,
    error             jsonb,
    created_at        timestamptz NOT NULL,
    updated_at        timestamptz NOT NULL
);
-- The scheduler's claim: due, unlocked Pending records, oldest due first.
CREATE INDEX IF NOT EXISTS state_claimable ON "{schema}".state (next_attempt_at)
    WHERE process_state = 'Pending' AND locked_by IS NULL;
-- Compensations waiting for a compensator (after an operator's request or a recovery).
CREATE INDEX IF NOT EXISTS state_compensation_claimable ON "{schema}".state (next_attempt_at)
    WHERE process_state = 'Compensating' AND locked_by IS NULL;
-- The supervisor's scan: expired deadlines of running attempts, paged by (complete_by, order_id).
CREATE INDEX IF NOT EXISTS state_deadlines ON "{schema}".state (complete_by, order_id)
    WHERE process_state IN ('Processing', 'Compensating');
-- Counts and operator listings by state, most recently changed first.
CREATE INDEX IF NOT EXISTS state_by_state ON "{schema}".state (process_state, updated_at DESC);

CREATE TABLE IF NOT EXISTS "{schema}".history (
    seq          bigserial PRIMARY KEY,
    order_id     text NOT NULL,
    type         text NOT NULL,
    at           timestamptz NOT NULL,
    attempt      integer,
    instance_id  text,
    step         text,
    data         jsonb NOT NULL
);
CREATE INDEX IF NOT EXISTS history_by_order ON "{schema}".history (order_id, seq);

CREATE TABLE IF NOT EXISTS "{schema}".compensation_log (
    seq              bigserial,
    order_id         text NOT NULL,
    step             text NOT NULL,
    undo             text NOT NULL,
    idempotency_key  text NOT NULL,
    recorded_at      timestamptz NOT NULL,
    status           text NOT NULL,
    done_at          timestamptz,
    error            text,
    PRIMARY KEY (order_id, step)
);
CREATE INDEX IF NOT EXISTS compensation_by_order ON "{schema}".compensation_log (order_id, seq);

CREATE TABLE IF NOT EXISTS "{schema}".inbox (
    queue       text NOT NULL,
    message_id  text NOT NULL,
    state       text NOT NULL,
    holder      text NOT NULL,
    expires_at  timestamptz NOT NULL,
    PRIMARY KEY (queue, message_id)
);
CREATE INDEX IF NOT EXISTS inbox_expiry ON "{schema}".inbox (expires_at);

CREATE TABLE IF NOT EXISTS "{schema}".lease (
    name         text PRIMARY KEY,
    holder       text NOT NULL,
    expires_at   timestamptz NOT NULL,
    acquired_at  timestamptz NOT NULL
);

CREATE TABLE IF NOT EXISTS "{schema}".alerts (
    alert_id  text PRIMARY KEY,
    kind      text NOT NULL,
    severity  text NOT NULL,
    message   text NOT NULL,
    at        timestamptz NOT NULL,
    order_id  text,
    source    text,
    data      jsonb NOT NULL
);
CREATE INDEX IF NOT EXISTS alerts_by_time ON "{schema}".alerts (at DESC);

-- Heartbeats of the running processes (stats, watch); expired rows are ignored and pruned.
CREATE TABLE IF NOT EXISTS "{schema}".components (
    name        text PRIMARY KEY,
    kind        text NOT NULL,
    at          timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    data        jsonb NOT NULL
);

-- Added after the first release: the layout version of each journal record (DESIGN §5: every
-- record carries its schema version). Rows written before it are version 1.
ALTER TABLE "{schema}".history ADD COLUMN IF NOT EXISTS schema_version integer NOT NULL DEFAULT 1;
ALTER TABLE "{schema}".compensation_log
    ADD COLUMN IF NOT EXISTS schema_version integer NOT NULL DEFAULT 1;
ALTER TABLE "{schema}".alerts ADD COLUMN IF NOT EXISTS schema_version integer NOT NULL DEFAULT 1;

-- Added for retention (issue 14): each purge reads its batch oldest first through an index
-- that matches its condition, so it reads what it deletes (and the journal purge the few old
-- rows of orders still parked or live). Expired inbox entries go through `inbox_expiry`, old
-- alerts through `alerts_by_time`.
CREATE INDEX IF NOT EXISTS history_by_time ON "{schema}".history (at);
CREATE INDEX IF NOT EXISTS compensation_by_time ON "{schema}".compensation_log (recorded_at);
-- Cancelled finishes an order too (issue 18): the index of the finished states names all three,
-- and replaces the one of the first two (the planner uses a partial index only for the list it
-- names).
CREATE INDEX IF NOT EXISTS state_finished_3 ON "{schema}".state (updated_at)
    WHERE process_state IN ('Cancelled', 'Compensated', 'Processed');
DROP INDEX IF EXISTS "{schema}".state_finished;

-- API tokens (the HTTP API's authentication), kept hashed: the secret's SHA-256 is the key each
-- request looks its token up by. A name belongs to one active token at a time (the partial
-- unique index, which also settles two concurrent creates of one name); a revoked token stays,
-- its name free for a new one.
CREATE TABLE IF NOT EXISTS "{schema}".api_tokens (
    digest          text PRIMARY KEY,
    name            text NOT NULL,
    role            text NOT NULL,
    created_at      timestamptz NOT NULL,
    revoked_at      timestamptz,
    schema_version  integer NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS api_tokens_active_name ON "{schema}".api_tokens (name)
    WHERE revoked_at IS NULL;

-- Added for alert delivery (issue 19): who acknowledged and resolved an alert, and when
-- (`orderflow alerts ack|resolve`); the notifier reads the changes through `alerts_changed`.
ALTER TABLE "{schema}".alerts ADD COLUMN IF NOT EXISTS acknowledged_at timestamptz;
ALTER TABLE "{schema}".alerts ADD COLUMN IF NOT EXISTS acknowledged_by text;
ALTER TABLE "{schema}".alerts ADD COLUMN IF NOT EXISTS resolved_at timestamptz;
ALTER TABLE "{schema}".alerts ADD COLUMN IF NOT EXISTS resolved_by text;
CREATE INDEX IF NOT EXISTS alerts_changed ON "{schema}".alerts
    (GREATEST(acknowledged_at, resolved_at)) WHERE acknowledged_at IS NOT NULL OR resolved_at IS NOT NULL;
