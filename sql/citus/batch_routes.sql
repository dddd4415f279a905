-- On a Citus coordinator, after the function files: the batch, made
-- delegable. idempotency_call_batch takes arrays of keys, which Citus cannot
-- route; idempotency_call_batch_at adds a scalar routing argument, p_route
-- (a key of the batch), and is distributed by it, colocated with
-- idempotency_keys. Citus then sends the whole call to the
-- node holding p_route's shard, where it runs as on one PostgreSQL.
--
-- The server sends a wrapper only keys that live on one node (it groups a
-- batch's calls by node, src/store/shards.rs). Every statement of the batch
-- then finds its shard on that node, whichever of the node's shards it is,
-- and Citus runs it there (local execution): one local transaction, one
-- commit. A key that lives elsewhere (the server's map of shards was stale)
-- is still routed right by Citus from that node, in a distributed
-- transaction: slower (a hop, two-phase commit), never a wrong answer.
--
-- The deadline check is inside: Citus delegates a call with no subquery
-- alongside it (a parameter in one is sent as `$0`, which the node does not
-- have), and a check per row would read the clock once per call. It runs
-- after the batch, before the commit, as the single calls' does.
--
-- The routed form has the batch run every Complete through
-- idempotency_complete (p_completes_alone): the batch's own success UPDATE
-- sets `expires_at = v_now + k.retention`, a STABLE operator over a column,
-- which Citus refuses in an UPDATE of a distributed table (and rewriting it
-- with immutable operators crashed Citus 13.2.2's worker backend). The same
-- decisions, one commit per node; each success costs the row lock
-- idempotency_complete takes before its UPDATE.
--
-- idempotency_acquire_batch_at and idempotency_complete_batch_at, the
-- routed batch of one kind, are kept for servers of the previous release
-- during a rolling upgrade.
--
-- PL/pgSQL: a LANGUAGE sql set-returning function is inlined into the
-- caller's statement before Citus sees a function call to delegate.
--
-- Applied at every migration of a Citus database (src/store/migrate.rs),
-- after sql/citus/delegate_functions.sql. CREATE OR REPLACE keeps a
-- function delegated; each is distributed where it is not yet.

CREATE OR REPLACE FUNCTION idempotency_call_batch_at(
    p_route           text,
    p_acquire         boolean[],
    p_tenant          text[],
    p_scope           text[],
    p_key             text[],
    p_fingerprint     text[],
    p_request_id      text[],
    p_lease_ms        bigint[],
    p_max_attempts    integer[],
    p_retention_ms    bigint[],
    p_watch_ms        bigint[],
    p_token           uuid[],
    p_outcome         text[],
    p_result          bytea[],
    p_content_type    text[],
    p_status_code     integer[],
    p_result_ref      text[],
    p_error           text[],
    p_permanent       boolean[],
    p_retry_after_ms  bigint[],
    p_backoff_base_ms bigint[],
    p_backoff_cap_ms  bigint[],
    p_clock_offset_ms bigint,
    p_deadline        timestamptz
)
RETURNS TABLE (ord integer, decision text, retry_after_ms bigint, outcome text,
               rec idempotency_keys)
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY
        SELECT b.ord, b.decision, b.retry_after_ms, b.outcome, b.rec
          FROM idempotency_call_batch(p_acquire, p_tenant, p_scope, p_key, p_fingerprint,
                                      p_request_id, p_lease_ms, p_max_attempts, p_retention_ms,
                                      p_watch_ms, p_token, p_outcome, p_result, p_content_type,
                                      p_status_code, p_result_ref, p_error, p_permanent,
                                      p_retry_after_ms, p_backoff_base_ms, p_backoff_cap_ms,
                                      true, p_clock_offset_ms) b;
    PERFORM idempotency_in_time(p_deadline, p_clock_offset_ms);
END;
$$;

CREATE OR REPLACE FUNCTION idempotency_acquire_batch_at(
    p_route           text,
    p_tenant          text[],
    p_scope           text[],
    p_key             text[],
    p_fingerprint     text[],
    p_request_id      text[],
    p_lease_ms        bigint[],
    p_max_attempts    integer[],
    p_retention_ms    bigint[],
    p_watch_ms        bigint[],
    p_clock_offset_ms bigint,
    p_deadline        timestamptz
)
RETURNS TABLE (ord integer, decision text, retry_after_ms bigint, rec idempotency_keys)
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY
        SELECT b.ord, b.decision, b.retry_after_ms, b.rec
          FROM idempotency_call_batch(array_fill(true, ARRAY[cardinality(p_key)]),
                                      p_tenant, p_scope, p_key, p_fingerprint, p_request_id,
                                      p_lease_ms, p_max_attempts, p_retention_ms, p_watch_ms,
                                      NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                                      NULL, NULL, true, p_clock_offset_ms) b;
    PERFORM idempotency_in_time(p_deadline, p_clock_offset_ms);
END;
$$;

CREATE OR REPLACE FUNCTION idempotency_complete_batch_at(
    p_route           text,
    p_tenant          text[],
    p_scope           text[],
    p_key             text[],
    p_token           uuid[],
    p_outcome         text[],
    p_result          bytea[],
    p_content_type    text[],
    p_status_code     integer[],
    p_result_ref      text[],
    p_error           text[],
    p_permanent       boolean[],
    p_retry_after_ms  bigint[],
    p_backoff_base_ms bigint[],
    p_backoff_cap_ms  bigint[],
    p_clock_offset_ms bigint,
    p_deadline        timestamptz
)
RETURNS TABLE (ord integer, outcome text, rec idempotency_keys)
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY
        SELECT b.ord, b.outcome, b.rec
          FROM idempotency_call_batch(array_fill(false, ARRAY[cardinality(p_key)]),
                                      p_tenant, p_scope, p_key, NULL, NULL, NULL, NULL, NULL,
                                      NULL, p_token, p_outcome, p_result, p_content_type,
                                      p_status_code, p_result_ref, p_error, p_permanent,
                                      p_retry_after_ms, p_backoff_base_ms, p_backoff_cap_ms,
                                      true, p_clock_offset_ms) b;
    PERFORM idempotency_in_time(p_deadline, p_clock_offset_ms);
END;
$$;

DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure
          FROM pg_proc p
         WHERE p.proname IN ('idempotency_call_batch_at', 'idempotency_acquire_batch_at',
                             'idempotency_complete_batch_at')
           AND p.pronamespace = (SELECT relnamespace FROM pg_class
                                  WHERE oid = 'idempotency_keys'::regclass)
           AND NOT EXISTS (SELECT FROM pg_dist_object o
                            WHERE o.classid = 'pg_proc'::regclass AND o.objid = p.oid
                              AND o.distribution_argument_index IS NOT NULL)
    LOOP
        PERFORM create_distributed_function(f, 'p_route',
                                       colocate_with := 'idempotency_keys');
    END LOOP;
END
$$;
