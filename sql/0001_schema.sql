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
-- Fencing tokens for every lease of every row: one sequence, so a token
-- never repeats or goes backwards for a key, whatever happened to its row.
CREATE SEQUENCE idempotency_fencing AS bigint;

CREATE TABLE idempotency_keys (
    tenant              text        NOT NULL,
    scope               text        NOT NULL,
    idempotency_key     text        NOT NULL,
    status              text        NOT NULL
        CHECK (status IN ('PROCESSING', 'SUCCEEDED', 'FAILED', 'FAILED_PERMANENT')),
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
    lease_outcome       text
        CHECK (lease_outcome IN ('SUCCESS', 'FAILURE', 'RELEASE')),
    -- The latest lease's fencing token, drawn from idempotency_fencing:
    -- it grows with every lease ever granted, also across a row's deletion
    -- by the sweeper and re-creation.
    fencing_token       bigint      NOT NULL,
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
