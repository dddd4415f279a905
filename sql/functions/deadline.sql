-- A call's statement carries the moment its coordinator stops waiting for
-- the answer, and refuses to finish after it.
--
-- PostgreSQL's statement_timeout starts when a statement reaches the
-- server, so it cannot see time the statement spent stuck in the network:
-- a statement sent into a paused network, whose caller heard UNAVAILABLE
-- long ago, would otherwise arrive when the network comes back and commit a
-- lease nobody holds. The coordinator computes the deadline on the
-- database's clock (its measured skew, plus the test clock offset the
-- functions add to clock_timestamp()) and puts this check in the select
-- list of the statement, which PostgreSQL evaluates on the function's rows
-- after the function ran and before the statement commits: a statement
-- that finishes late raises, and its transaction rolls back whole.
--
-- A NULL deadline (the database's clock not measured yet, or a client that
-- calls the functions directly) checks nothing.

CREATE OR REPLACE FUNCTION idempotency_in_time(p_deadline timestamptz, p_clock_offset_ms bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF p_deadline IS NOT NULL
       AND clock_timestamp() + p_clock_offset_ms * interval '1 millisecond' > p_deadline THEN
        RAISE EXCEPTION 'the coordinator stopped waiting for this statement at %', p_deadline
            USING ERRCODE = 'query_canceled',
                  HINT = 'the statement reached the database or finished too late; it rolled back';
    END IF;
    RETURN true;
END
$$;
