-- The two CHECK constraints on idempotency_keys (status and lease_outcome in
-- their sets of names) go.
--
-- PostgreSQL re-reads and re-plans every CHECK constraint of a table from
-- its stored text for each INSERT and UPDATE statement, and every statement
-- inside a function is one: `ExecConstraints` was 8% of the backends' CPU
-- during Acquire + Complete here (`perf`), and dropping the two checks took
-- PostgreSQL's CPU per cycle from about 380 to 320 us (README, Performance).
--
-- Both columns are written only by the functions in these files, always
-- with one of the names 0001 lists. The server refuses to read a record
-- whose status it does not know (it answers INTERNAL and logs the record
-- as corrupt) rather than guess; lease_outcome it reads only as set or not.
-- Dropping a constraint takes a moment's exclusive lock and no scan.

ALTER TABLE idempotency_keys
    DROP CONSTRAINT IF EXISTS idempotency_keys_status_check,
    DROP CONSTRAINT IF EXISTS idempotency_keys_lease_outcome_check;
