-- The recovery feed (WatchDue and the recovery webhook): due records
-- offered to one subscriber at a time.

-- idempotency_claim_due: offers up to p_limit due rows to subscriber
-- p_subscriber for p_offer_ms, in the order they came due.
--
-- Due: FAILED with its retry due, or PROCESSING with its lease run out (the
-- holder died), with attempts left and not expired. A row already offered
-- to someone is skipped until its offer runs out; a row another transaction
-- holds is skipped too (SKIP LOCKED), so concurrent subscribers on any
-- replicas never get the same row at once. A new lease clears the offer.
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
           AND ((k.status = 'FAILED' AND k.next_retry_at <= v_now)
                OR (k.status = 'PROCESSING' AND k.lease_expires_at <= v_now))
           AND k.attempt_count < k.max_attempts
           AND k.expires_at > v_now
           AND (k.offered_until IS NULL OR k.offered_until <= v_now)
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
