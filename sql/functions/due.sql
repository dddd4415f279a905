-- The recovery feed (WatchDue and the recovery webhook): due records
-- offered to one subscriber at a time.

-- idempotency_is_due: whether a record, given by the columns that decide
-- it, may be offered on the recovery feed at p_now: FAILED with its retry
-- due, or PROCESSING with its lease run out (the holder died), with
-- attempts left, not expired, and not offered to someone whose offer still
-- runs. The one statement of the rule, used by idempotency_claim_due and
-- by Citus's idempotency_claim_due_by_key (sql/citus/maintenance.sql).
-- SQL, IMMUTABLE and given plain columns, so that PostgreSQL inlines it
-- into the query that calls it: the query is planned as if the condition
-- were written there (the partial indexes idempotency_keys_retries and
-- idempotency_keys_processing still serve it), and nothing is called per
-- row.
CREATE OR REPLACE FUNCTION idempotency_is_due(
    p_status           text,
    p_next_retry_at    timestamptz,
    p_lease_expires_at timestamptz,
    p_attempt_count    integer,
    p_max_attempts     integer,
    p_expires_at       timestamptz,
    p_offered_until    timestamptz,
    p_now              timestamptz
)
RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT ((p_status = 'FAILED' AND p_next_retry_at <= p_now)
            OR (p_status = 'PROCESSING' AND p_lease_expires_at <= p_now))
       AND p_attempt_count < p_max_attempts
       AND p_expires_at > p_now
       AND (p_offered_until IS NULL OR p_offered_until <= p_now)
$$;

-- idempotency_claim_due: offers up to p_limit due rows to subscriber
-- p_subscriber for p_offer_ms, in the order they came due.
--
-- Due: idempotency_is_due (a row offered to someone is skipped until the
-- offer runs out). A row another transaction holds is skipped too (SKIP
-- LOCKED), so concurrent subscribers on any replicas never get the same row
-- at once. A new lease clears the offer.
--
-- p_tenant NULL means every tenant and scope (the recovery webhook);
-- otherwise p_tenant's p_scope only (WatchDue).
CREATE OR REPLACE FUNCTION idempotency_claim_due(
    p_tenant          text,
    p_scope           text,
    p_subscriber      uuid,
    p_offer_ms        bigint,
    p_limit           integer,
    p_clock_offset_ms bigint
)
RETURNS SETOF idempotency_keys
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := clock_timestamp() + p_clock_offset_ms * interval '1 millisecond';
BEGIN
    RETURN QUERY
    WITH due AS (
        SELECT k.tenant, k.scope, k.idempotency_key FROM idempotency_keys k
         WHERE (p_tenant IS NULL OR (k.tenant = p_tenant AND k.scope = p_scope))
           AND idempotency_is_due(k.status, k.next_retry_at, k.lease_expires_at, k.attempt_count,
                                  k.max_attempts, k.expires_at, k.offered_until, v_now)
         ORDER BY coalesce(k.next_retry_at, k.lease_expires_at)
         LIMIT p_limit
           FOR UPDATE SKIP LOCKED
    )
    UPDATE idempotency_keys k SET
        offered_until = v_now + p_offer_ms * interval '1 millisecond',
        offered_to = p_subscriber
      FROM due d
     WHERE k.tenant = d.tenant AND k.scope = d.scope AND k.idempotency_key = d.idempotency_key
    RETURNING k.*;
END;
$$;

-- idempotency_release_offers: a subscriber went away; what it was offered
-- and did not act on (no new lease since) can be offered to others at once.
--
-- A batch holds several row locks at once, so any statement that waits for
-- several row locks must take them in the batches' order too, or the two
-- could deadlock: (tenant, scope, key) in byte order, as the server sorts
-- them. Statements with SKIP LOCKED never wait and need no order; this one
-- waits, so it locks in order before it updates.
CREATE OR REPLACE FUNCTION idempotency_release_offers(p_subscriber uuid)
RETURNS bigint
LANGUAGE sql AS $$
    WITH offered AS (
        SELECT k.tenant, k.scope, k.idempotency_key FROM idempotency_keys k
         WHERE k.offered_to = p_subscriber
         ORDER BY k.tenant COLLATE "C", k.scope COLLATE "C", k.idempotency_key COLLATE "C"
           FOR UPDATE
    ), released AS (
        UPDATE idempotency_keys k SET offered_until = NULL, offered_to = NULL
          FROM offered o
         WHERE k.tenant = o.tenant AND k.scope = o.scope AND k.idempotency_key = o.idempotency_key
           AND k.offered_to = p_subscriber
        RETURNING 1
    )
    SELECT count(*) FROM released
$$;
