-- The schema: the records table, its fencing sequence and its indexes.
-- Functions live in sql/functions/, applied after the numbered migrations
-- (src/store/migrate.rs).
--
-- One row per operation: (tenant, scope, idempotency_key).
--
-- Lifecycle (docs/state_machine.md draws it):
--   (none) --Acquire--> PROCESSING --Complete success--> SUCCEEDED
--                       PROCESSING --Complete failure--> FAILED | FAILED_PERMANENT
--                       PROCESSING --Complete release--> FAILED (due now, attempt not counted)
--                       FAILED --Acquire when due--> PROCESSING (attempt + 1)
--                       PROCESSING, lease run out --Acquire--> PROCESSING (attempt + 1)
--                       attempts used up --Acquire--> FAILED_PERMANENT
-- A row past expires_at counts as absent: it is replaced on the next Acquire
-- and hidden from every read.
--
-- No CHECK constraints: PostgreSQL re-reads and re-plans every CHECK
-- constraint of a table from its stored text for each INSERT and UPDATE
-- statement, and every statement inside a function is one. With CHECKs on
-- status and lease_outcome, `ExecConstraints` was 8% of the backends' CPU
-- during Acquire + Complete (`perf`), and dropping them took PostgreSQL's
-- CPU per cycle from about 380 to 320 us (docs/performance.md). Both
-- columns are written only by the functions in sql/functions/, always with
-- one of the names below. The server refuses to read a record whose status
-- it does not know (it answers INTERNAL and logs the record as corrupt)
-- rather than guess; lease_outcome it reads only as set or not.
--
-- Fencing tokens for every lease of every row: one sequence, so a token
-- never repeats or goes backwards for a key, whatever happened to its row.
CREATE SEQUENCE idempotency_fencing AS bigint;

CREATE TABLE idempotency_keys (
    tenant              text        NOT NULL,
    scope               text        NOT NULL,
    idempotency_key     text        NOT NULL,
    -- 'PROCESSING', 'SUCCEEDED', 'FAILED' or 'FAILED_PERMANENT'.
    status              text        NOT NULL,
    -- Fixed at creation; '' when the creator sent none.
    fingerprint         text        NOT NULL,
    -- Leases granted so far, less released ones.
    attempt_count       integer     NOT NULL,
    -- Fixed at creation.
    max_attempts        integer     NOT NULL,
    -- Fixed at creation: how long the record outlives its last change.
    retention           interval    NOT NULL,
    -- The latest lease. Kept after the lease ends so that a repeated
    -- Complete with the same token is recognised.
    lease_token         uuid        NOT NULL,
    -- The caller's request_id that the latest lease was granted to ('' none).
    lease_request_id    text        NOT NULL,
    -- Set while PROCESSING.
    lease_expires_at    timestamptz,
    -- How the latest lease's holder completed it: 'SUCCESS', 'FAILURE' or
    -- 'RELEASE'; NULL while it has not (even if the lease ran out, so that a
    -- late Complete is honoured as long as nobody has taken over).
    lease_outcome       text,
    -- The latest lease's fencing token, drawn from idempotency_fencing:
    -- it grows with every lease ever granted, also across a row's deletion
    -- by the sweeper and re-creation. The functions always set it; the
    -- default is there so that tools which copy a table's dependencies to
    -- other nodes copy the sequence too.
    fencing_token       bigint      NOT NULL DEFAULT nextval('idempotency_fencing'),
    -- Set while FAILED.
    next_retry_at       timestamptz,
    last_error          text        NOT NULL DEFAULT '',
    last_error_at       timestamptz,
    -- Set when SUCCEEDED.
    result              bytea,
    result_content_type text        NOT NULL DEFAULT '',
    result_status_code  integer     NOT NULL DEFAULT 0,
    result_ref          text        NOT NULL DEFAULT '',
    checkpoint          bytea       NOT NULL DEFAULT '',
    -- Someone waits on this row (an Acquire with `wait`, or a Watch) until
    -- then: while it lies in the future, every change of the row sends a
    -- NOTIFY. NULL for the plain path, which therefore never notifies (a
    -- notifying commit takes a database-wide lock).
    watch_until         timestamptz,
    -- The recovery feed (WatchDue) offered this due row to subscriber
    -- offered_to until offered_until; nobody else is offered it before then.
    -- Cleared when a new lease is granted.
    offered_until       timestamptz,
    offered_to          uuid,
    created_at          timestamptz NOT NULL,
    updated_at          timestamptz NOT NULL,
    completed_at        timestamptz,
    expires_at          timestamptz NOT NULL,
    PRIMARY KEY (tenant, scope, idempotency_key)
);

-- Sweeping finds expired rows and dead leases by range scans, never by
-- reading the whole table. Partial indexes stay small: few rows are FAILED,
-- and PROCESSING rows leave the index when they complete.
CREATE INDEX idempotency_keys_expires_at ON idempotency_keys (expires_at);
CREATE INDEX idempotency_keys_leases ON idempotency_keys (lease_expires_at)
    WHERE status = 'PROCESSING';
CREATE INDEX idempotency_keys_retries ON idempotency_keys (tenant, scope, next_retry_at)
    WHERE status = 'FAILED';
CREATE INDEX idempotency_keys_offered_to ON idempotency_keys (offered_to)
    WHERE offered_to IS NOT NULL;
