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
-- The batch is a loop of single-key statements, one key each, and none of
-- them calls a volatile function: Citus caches a shard's plan only for a
-- statement on one shard with no volatile call inside (clock_timestamp(),
-- gen_random_uuid(), nextval()); any other statement (a set-based one over
-- keys of several shards, an INSERT drawing its token in place) is
-- deparsed, parsed and planned anew for its shard every time it runs. So a
-- new key's token and fencing token are drawn into variables before its
-- INSERT. The decisions are idempotency_call_batch's on one PostgreSQL
-- (sql/functions/batches.sql) for keys that cannot be created together: a
-- new key is created by the loop's INSERT, a live record with a final
-- answer is answered from the loop's read, a holder's success is recorded
-- by the loop's UPDATE (its conditions and clock are the batch's), every
-- other Acquire runs idempotency_acquire and every other Complete
-- idempotency_complete (whose statements are all single-key and
-- cacheable). The success UPDATE sets expires_at to the clock plus the
-- row's retention as to_timestamp(v_epoch + extract(epoch FROM
-- k.retention)), v_epoch the clock in seconds: one PostgreSQL's
-- `v_now + k.retention` is a STABLE operator over a column, which Citus
-- refuses in an UPDATE of a distributed table, and these functions are
-- immutable. The same instant: retention is whole milliseconds (the server
-- sends milliseconds), and to_timestamp rounds to the microsecond.
--
-- The deadline check is inside: Citus delegates a call with no subquery
-- alongside it (a parameter in one is sent as `$0`, which the node does not
-- have), and a check per row would read the clock once per call. It runs
-- after the batch, before the commit, as the single calls' does.
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
DECLARE
    r           idempotency_keys;
    v_now       timestamptz;
    -- Call i's key and a new record's values, copied out of the arrays
    -- into plain variables: each is then a parameter of the cached plan.
    v_tenant    text;
    v_scope     text;
    v_key       text;
    v_retention interval;
    v_lease     interval;
    v_token     uuid;
    v_fencing   bigint;
    -- A success's values, and the clock as seconds since the epoch.
    v_result       bytea;
    v_content_type text;
    v_status_code  integer;
    v_result_ref   text;
    v_epoch        numeric;
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_key, 1), 0) LOOP
        ord := i;
        decision := NULL;
        retry_after_ms := NULL;
        outcome := NULL;
        IF p_acquire[i] THEN
            v_tenant := p_tenant[i];
            v_scope := p_scope[i];
            v_key := p_key[i];
            SELECT * INTO r FROM idempotency_keys k
             WHERE k.tenant = v_tenant AND k.scope = v_scope AND k.idempotency_key = v_key;
            v_now := clock_timestamp() + p_clock_offset_ms * interval '1 millisecond';
            IF NOT FOUND THEN
                v_retention := p_retention_ms[i] * interval '1 millisecond';
                v_lease := p_lease_ms[i] * interval '1 millisecond';
                v_token := gen_random_uuid();
                v_fencing := nextval('idempotency_fencing');
                INSERT INTO idempotency_keys (
                    tenant, scope, idempotency_key, status, fingerprint,
                    attempt_count, max_attempts, retention,
                    lease_token, lease_request_id, lease_expires_at, fencing_token,
                    created_at, updated_at, expires_at)
                VALUES (
                    v_tenant, v_scope, v_key, 'PROCESSING', p_fingerprint[i],
                    1, p_max_attempts[i], v_retention,
                    v_token, p_request_id[i], v_now + v_lease, v_fencing,
                    v_now, v_now, v_now + greatest(v_retention, v_lease))
                ON CONFLICT (tenant, scope, idempotency_key) DO NOTHING
                RETURNING * INTO rec;
                IF FOUND THEN
                    decision := 'PROCEED';
                    RETURN NEXT;
                    CONTINUE;
                END IF;
                -- Another transaction created the row since the read.
            ELSIF r.expires_at > v_now THEN
                decision := idempotency_final_decision(r, p_fingerprint[i]);
                IF decision IS NOT NULL THEN
                    rec := r;
                    RETURN NEXT;
                    CONTINUE;
                END IF;
            END IF;
            RETURN QUERY
                SELECT i, a.decision, a.retry_after_ms, NULL::text, a.rec
                  FROM idempotency_acquire(p_tenant[i], p_scope[i], p_key[i], p_fingerprint[i],
                                           p_request_id[i], p_lease_ms[i], p_max_attempts[i],
                                           p_retention_ms[i], p_watch_ms[i], p_clock_offset_ms) a;
        ELSE
            IF p_outcome[i] = 'SUCCESS' THEN
                v_tenant := p_tenant[i];
                v_scope := p_scope[i];
                v_key := p_key[i];
                v_token := p_token[i];
                v_result := p_result[i];
                v_content_type := p_content_type[i];
                v_status_code := p_status_code[i];
                v_result_ref := p_result_ref[i];
                v_now := clock_timestamp() + p_clock_offset_ms * interval '1 millisecond';
                v_epoch := extract(epoch FROM v_now);
                UPDATE idempotency_keys k SET
                    status = 'SUCCEEDED', lease_outcome = 'SUCCESS',
                    lease_expires_at = NULL, next_retry_at = NULL,
                    result = v_result, result_content_type = v_content_type,
                    result_status_code = v_status_code, result_ref = v_result_ref,
                    completed_at = v_now, updated_at = v_now,
                    expires_at = to_timestamp(v_epoch + extract(epoch FROM k.retention))
                 WHERE k.tenant = v_tenant AND k.scope = v_scope AND k.idempotency_key = v_key
                   AND k.lease_token = v_token AND k.lease_outcome IS NULL
                   AND k.expires_at > v_now AND k.updated_at <= v_now
                RETURNING * INTO rec;
                IF FOUND THEN
                    IF rec.watch_until > v_now THEN
                        PERFORM idempotency_notify_if_watched(rec, v_now);
                    END IF;
                    outcome := 'OK';
                    RETURN NEXT;
                    CONTINUE;
                END IF;
            END IF;
            RETURN QUERY
                SELECT i, NULL::text, NULL::bigint, c.outcome, c.rec
                  FROM idempotency_complete(p_tenant[i], p_scope[i], p_key[i], p_token[i],
                                            p_outcome[i], p_result[i], p_content_type[i],
                                            p_status_code[i], p_result_ref[i], p_error[i],
                                            p_permanent[i], p_retry_after_ms[i],
                                            p_backoff_base_ms[i], p_backoff_cap_ms[i],
                                            p_clock_offset_ms) c;
        END IF;
    END LOOP;
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
