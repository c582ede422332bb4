-- lock-runtime's PostgreSQL store, schema version 1: one row per lock, a fair line, two sequences
-- and the functions every request calls (one statement each, so one round trip, atomic). Made
-- if missing by the first client that connects (under a transaction-level advisory lock, so
-- clients starting together do not race), in the schema the client names (public by default):
-- the store's connections resolve names there, whatever search_path the URL, role or database
-- sets, so every client of one schema shares one table.
--
-- Times are the database's clock (clock_timestamp()), in epoch milliseconds. No connection or
-- transaction is held while a lock is held: a lock is its row.

CREATE TABLE IF NOT EXISTS lock_runtime_locks (
    -- The lock's name: `<prefix>{<key>}`, as on Redis.
    key text PRIMARY KEY,
    -- The exclusive holder's value (its token and owner label), `<value>:released` while a
    -- lock released early is kept for its minimum hold; NULL: no exclusive holder.
    token text,
    -- When the exclusive holder's lease ends.
    expires_ms bigint NOT NULL DEFAULT 0,
    -- A read-write lock's readers: value -> when its share ends; NULL: none.
    shares jsonb,
    -- When the last share ends.
    shares_until bigint NOT NULL DEFAULT 0,
    -- Writers waiting for readers to leave: value -> when the claim lapses. No new reader
    -- enters while one stands.
    claims jsonb,
    -- The last fencing token taken at this key (kept an hour after the lock, for readers).
    fence bigint,
    -- A waiter was refused, so the release announces itself (NOTIFY).
    marked boolean NOT NULL DEFAULT false
);

-- Semaphores (schema version 1, second part): the count of a key held by permits; its holders
-- are rows of lock_runtime_permits (below), and shares_until the latest end among them (so the
-- plain acquire and the sweep treat the row as held, as they do readers'). `held` is no longer
-- written (an earlier build kept the holders there). Added to a table made by an earlier build.
-- Only where missing: ALTER TABLE locks the table against every statement until the making
-- commits, even when IF NOT EXISTS then changes nothing.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = 'lock_runtime_locks'::regclass
                   AND attname = 'permits' AND NOT attisdropped) THEN
        ALTER TABLE lock_runtime_locks ADD COLUMN permits integer;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = 'lock_runtime_locks'::regclass
                   AND attname = 'held' AND NOT attisdropped) THEN
        ALTER TABLE lock_runtime_locks ADD COLUMN held jsonb;
    END IF;
END $$;

-- Fair waiters, by arrival: each one's place lapses unless it asks again in time.
CREATE TABLE IF NOT EXISTS lock_runtime_line (
    key text NOT NULL,
    token text NOT NULL,
    arrival bigint NOT NULL,
    kept_until bigint NOT NULL,
    -- Names the attempt that last kept the place (a hand-over names the place it was for).
    stamp bigint NOT NULL,
    PRIMARY KEY (key, token)
);
-- By arrival; and lapsed places found by their end, so a re-check deletes only those (not a
-- scan of the line: N waiters re-checking would cost N² rows a round). Only where missing, as
-- the columns above: CREATE INDEX locks the table against writes even when it makes none.
DO $$
BEGIN
    IF to_regclass('lock_runtime_line_by_arrival') IS NULL THEN
        CREATE INDEX lock_runtime_line_by_arrival ON lock_runtime_line (key, arrival);
    END IF;
    IF to_regclass('lock_runtime_line_by_end') IS NULL THEN
        CREATE INDEX lock_runtime_line_by_end ON lock_runtime_line (key, kept_until);
    END IF;
END $$;

-- A semaphore's holders, a row each (the key's row in lock_runtime_locks is their header: the
-- count, and in shares_until the latest end among them): an attempt reads the key's holders
-- once, and a renewal or release touches its own row, whatever the count. A permit kept for its
-- minimum hold is `released` until it ends. Rows count only while their end is ahead of the
-- clock and the header names permits: a lapsed one is deleted by the next attempt at the key.
CREATE TABLE IF NOT EXISTS lock_runtime_permits (
    key text NOT NULL,
    token text NOT NULL,
    permit integer NOT NULL,
    expires_ms bigint NOT NULL,
    -- Its fencing token (0: none).
    fence bigint NOT NULL,
    released boolean NOT NULL DEFAULT false,
    PRIMARY KEY (key, token)
);
-- The holders of a key by their end: the lapsed ones found without a scan of the others.
DO $$
BEGIN
    IF to_regclass('lock_runtime_permits_by_end') IS NULL THEN
        CREATE INDEX lock_runtime_permits_by_end ON lock_runtime_permits (key, expires_ms);
    END IF;
END $$;

-- Fenced writes (lock_runtime::postgres::check_fence): per resource, the highest token a write
-- carried.
CREATE TABLE IF NOT EXISTS lock_runtime_fenced (resource text PRIMARY KEY, token bigint NOT NULL);

-- Fencing tokens: one sequence for every key, floored (lock_runtime_v1_fence) so that a token
-- never repeats even when the sequence does.
CREATE SEQUENCE IF NOT EXISTS lock_runtime_fences;
-- Orders fair arrivals and names each keeping of a place.
CREATE SEQUENCE IF NOT EXISTS lock_runtime_arrivals;

CREATE OR REPLACE FUNCTION lock_runtime_v1_now() RETURNS bigint
LANGUAGE sql VOLATILE AS $$ SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint $$;

-- The next fencing token of a lock whose last one was `last` (NULL: none kept): the largest of
-- the sequence's next number, the database clock in microseconds and one more than `last`. A
-- sequence can go back: a failover to an asynchronous standby that missed its last values, a
-- restore, synchronous_commit = off, all hand out numbers given before. The clock floor does not
-- go back with them (the tokens it lost were issued earlier, so lower), and `last` keeps a key's
-- tokens strictly increasing when the clock itself is stepped back (while the key's row lives:
-- an hour after its last fenced lock). Two keys' tokens taken in one microsecond may be equal:
-- tokens order one key's holders, not different keys'.
CREATE OR REPLACE FUNCTION lock_runtime_v1_fence(last bigint) RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    SELECT greatest(nextval('lock_runtime_fences'),
                    floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint,
                    coalesce(last, 0) + 1)
$$;

-- The entries of a value -> ms map that are still live at `at_ms` (NULL when none).
CREATE OR REPLACE FUNCTION lock_runtime_v1_live(m jsonb, at_ms bigint) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_object_agg(e.key, e.value) FROM jsonb_each(m) AS e WHERE e.value::bigint > at_ms
$$;

-- The latest end in a value -> ms map (0 when empty).
CREATE OR REPLACE FUNCTION lock_runtime_v1_last(m jsonb) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(max(e.value::bigint), 0) FROM jsonb_each(m) AS e
$$;

-- Announces a release (or whose turn it is) to every client listening: the payload is the
-- message's length in bytes, `:`, the message, then the lock's name (what its waiters wait for).
CREATE OR REPLACE FUNCTION lock_runtime_v1_tell(chan text, said text) RETURNS void
LANGUAGE sql VOLATILE AS $$
    SELECT pg_notify('lock_runtime', octet_length(said) || ':' || said || chan)
$$;

-- The lock's row, locked until the statement's transaction ends: made (free) if missing. A row
-- deleted by a release between the insert that found it and the select that locks it is made
-- again, so the caller never works on a row that is not there.
CREATE OR REPLACE FUNCTION lock_runtime_v1_row(k text) RETURNS lock_runtime_locks
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    r lock_runtime_locks;
BEGIN
    LOOP
        SELECT * INTO r FROM lock_runtime_locks WHERE key = k FOR UPDATE;
        IF FOUND THEN
            RETURN r;
        END IF;
        INSERT INTO lock_runtime_locks (key) VALUES (k) ON CONFLICT DO NOTHING;
    END LOOP;
END
$$;

-- How every refusal the functions decide ends (a lock's, a share's, a permit's): the row `r` of
-- `k` gets the writers' claims still standing (`live_claims`; `r.claims` to keep them) and the
-- mark that has the release announce itself when the caller waits, written only when they
-- change (a refusal that changes nothing writes no row version and no WAL); and the statement's
-- transaction commits without waiting for its WAL to be flushed (or for a synchronous standby).
-- What a refusal writes (a waiter's place in line, a writer's claim of its turn, the mark;
-- lapsed rows it deletes, a notice that a line's head may try) orders and wakes waiters and
-- grants nothing, so the row lock it holds need not outlast a flush. A crash loses it only
-- together with every later change that read it (their commits flush the WAL before them): a
-- lost place is taken again by its waiter's next attempt, a lost deletion is made again, and a
-- head told to try still takes the lock with a commit of its own. A grant, a renewal and a
-- release commit as the server is set to.
CREATE OR REPLACE FUNCTION lock_runtime_v1_mark(k text, r lock_runtime_locks, live_claims jsonb, waiting boolean)
RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    IF live_claims IS DISTINCT FROM r.claims OR (waiting AND NOT r.marked) THEN
        UPDATE lock_runtime_locks SET claims = live_claims, marked = r.marked OR waiting
            WHERE key = k;
    END IF;
END
$$;

-- Refuses an acquire of the row `r` asking `asked` permits when the row is held with another
-- count (a lock or read-write lock counts 1): SQLSTATE LR001, the count held as the message.
CREATE OR REPLACE FUNCTION lock_runtime_v1_count(r lock_runtime_locks, asked integer, at_ms bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    held integer;
BEGIN
    IF r.token IS NOT NULL AND r.expires_ms > at_ms THEN
        held := 1;
    ELSIF r.shares_until > at_ms THEN
        held := coalesce(r.permits, 1);
    END IF;
    IF held IS NOT NULL AND held <> asked THEN
        RAISE EXCEPTION USING ERRCODE = 'LR001', MESSAGE = held::text;
    END IF;
END
$$;

-- One attempt at any free permit of a semaphore of `n` permits: the lowest one no live holder
-- has. Answers taken (with the permit, and the fencing token when asked: the key's next, so
-- tokens rise per key and per permit), or the ms until the first holder's lease ends (NULL: a
-- permit is free but fair waiters come first) and, for a fair semaphore, how many waiters are
-- ahead in line. A fair semaphore's waiters are in the fair line (`lock_runtime_line`, under
-- `<key>#permits`: not a fair lock's line, so neither's release meets the other's): a caller
-- takes a permit only while fewer live waiters are ahead of it than permits are free, and a
-- refused caller that will wait (`joining`) takes or keeps its place for `place_ms`. Refused
-- with LR001 when the key is held with another count. Idempotent for one token: a permit a
-- release handed over (lock_runtime_v1_hand_back) is found so, with a fencing token taken for it
-- if it has none. A refused fair waiter is told the stamp of the place it kept (a hand-over names
-- it). (Clients of earlier builds call lock_runtime_v1_permit, below, or the one with six
-- arguments, which their schema makes.)
CREATE OR REPLACE FUNCTION lock_runtime_v1_take_permit(
    k text, tok text, ttl bigint, n integer, fencing boolean, waiting boolean,
    fair boolean, joining boolean, place_ms bigint,
    OUT got boolean, OUT got_fence bigint, OUT got_permit integer, OUT left_ms bigint,
    OUT ahead integer, OUT kept_stamp bigint)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    -- Its line is its own (`<key>#permits` in the fair line), not a fair lock's.
    q text := k || '#permits';
    at_ms bigint;
    r lock_runtime_locks;
    mine lock_runtime_permits;
    free integer;
    taken integer;
    first_end bigint;
    -- The permits held, sorted, and a search of them.
    held_permits integer[];
    lo integer;
    hi integer;
    mid integer;
    arrived bigint;
    f bigint;
BEGIN
    got := false;
    ahead := 0;
    r := lock_runtime_v1_row(k);
    at_ms := lock_runtime_v1_now();
    PERFORM lock_runtime_v1_count(r, n, at_ms);
    -- The holders that lapsed go (all of them when the row holds no permits now).
    IF r.permits IS NOT NULL AND r.shares_until > at_ms THEN
        DELETE FROM lock_runtime_permits WHERE key = k AND expires_ms <= at_ms;
    ELSE
        DELETE FROM lock_runtime_permits WHERE key = k;
    END IF;
    SELECT * INTO mine FROM lock_runtime_permits WHERE key = k AND token = tok AND NOT released;
    IF FOUND THEN
        -- Ours already (a request sent again, or a permit handed over): its lease counts from
        -- this attempt; with no fencing token taken for it then, it takes one.
        got_fence := mine.fence;
        IF fencing AND got_fence = 0 THEN
            got_fence := lock_runtime_v1_fence(r.fence);
        END IF;
        UPDATE lock_runtime_permits SET expires_ms = greatest(expires_ms, at_ms + ttl), fence = got_fence
            WHERE key = k AND token = tok;
        UPDATE lock_runtime_locks
            SET shares_until = greatest(shares_until, at_ms + ttl), fence = greatest(fence, nullif(got_fence, 0))
            WHERE key = k;
        got := true;
        got_permit := mine.permit;
        RETURN;
    END IF;
    -- How many are taken and the lowest permit no holder has, in one pass over the holders:
    -- their permits, sorted, match their places (permit i at place i + 1) up to the first free
    -- one, which a halving search finds (not a look per permit, nor a join with every permit's
    -- number). A key whose permits are all taken skips the search. The first holder's end is
    -- read off the index by end, only when refused.
    SELECT count(*), array_agg(DISTINCT h.permit ORDER BY h.permit) FILTER (WHERE h.permit < n)
        INTO taken, held_permits FROM lock_runtime_permits AS h WHERE h.key = k;
    IF taken < n THEN
        lo := 1;
        hi := coalesce(cardinality(held_permits), 0) + 1;
        WHILE lo < hi LOOP
            mid := (lo + hi) / 2;
            IF held_permits[mid] = mid - 1 THEN
                lo := mid + 1;
            ELSE
                hi := mid;
            END IF;
        END LOOP;
        free := lo - 1;
    END IF;
    IF fair THEN
        -- The row is locked: the line of its key changes under it only.
        DELETE FROM lock_runtime_line WHERE key = q AND kept_until <= at_ms;
        SELECT arrival INTO arrived FROM lock_runtime_line WHERE key = q AND token = tok;
        SELECT count(*) INTO ahead FROM lock_runtime_line
            WHERE key = q AND (arrived IS NULL OR arrival < arrived);
    END IF;
    IF free IS NULL OR ahead >= n - taken THEN
        SELECT min(expires_ms) INTO first_end FROM lock_runtime_permits WHERE key = k;
        IF fair AND joining THEN
            kept_stamp := nextval('lock_runtime_arrivals');
            INSERT INTO lock_runtime_line AS l (key, token, arrival, kept_until, stamp)
            VALUES (q, tok, kept_stamp, at_ms + place_ms, kept_stamp)
            ON CONFLICT (key, token) DO UPDATE
                SET kept_until = EXCLUDED.kept_until, stamp = EXCLUDED.stamp;
        END IF;
        left_ms := first_end - at_ms;
        PERFORM lock_runtime_v1_mark(k, r, r.claims, waiting);
        RETURN;
    END IF;
    IF fair THEN
        DELETE FROM lock_runtime_line WHERE key = q AND token = tok;
    END IF;
    IF fencing THEN
        f := lock_runtime_v1_fence(r.fence);
    END IF;
    INSERT INTO lock_runtime_permits (key, token, permit, expires_ms, fence)
        VALUES (k, tok, free, at_ms + ttl, coalesce(f, 0))
        ON CONFLICT (key, token) DO UPDATE
            SET permit = EXCLUDED.permit, expires_ms = EXCLUDED.expires_ms, fence = EXCLUDED.fence,
                released = false;
    -- A lapsed writer's or readers' values go: their late renewal or release must not find them.
    UPDATE lock_runtime_locks
        SET permits = n, held = NULL,
            shares_until = CASE WHEN r.permits IS NOT NULL THEN greatest(r.shares_until, at_ms + ttl)
                                ELSE at_ms + ttl END,
            fence = coalesce(f, r.fence), token = NULL, shares = NULL
        WHERE key = k;
    got := true;
    got_permit := free;
    got_fence := f;
END
$$;

-- lock_runtime_v1_take_permit without the kept place's stamp: what clients of an earlier build
-- call.
CREATE OR REPLACE FUNCTION lock_runtime_v1_permit(
    k text, tok text, ttl bigint, n integer, fencing boolean, waiting boolean,
    fair boolean, joining boolean, place_ms bigint,
    OUT got boolean, OUT got_fence bigint, OUT got_permit integer, OUT left_ms bigint,
    OUT ahead integer)
LANGUAGE sql VOLATILE AS $$
    SELECT got, got_fence, got_permit, left_ms, ahead
        FROM lock_runtime_v1_take_permit(k, tok, ttl, n, fencing, waiting, fair, joining, place_ms)
$$;

-- One attempt at an exclusive lock. Answers taken (with the fencing token, when asked), or the
-- refusal: the holder's remaining ms (NULL: none, a fair waiter is behind others), whether this
-- fair waiter is behind others in line, whether it claimed the writers' turn (refused by
-- readers, and will wait), and the stamp of the place this attempt kept. Idempotent for one
-- token. With `lock_ms` > 0, a wait for the lock's row (another session holds it locked) ends
-- after that long with lock_not_available (55P03), and the attempt changes nothing: the
-- caller's own wait has run out.
CREATE OR REPLACE FUNCTION lock_runtime_v1_acquire(
    k text, chan text, tok text, ttl bigint, fencing boolean, waiting boolean, fair boolean,
    joining boolean, had_claimed boolean, place_ms bigint, lock_ms bigint,
    OUT got boolean, OUT got_fence bigint, OUT left_ms bigint, OUT is_behind boolean,
    OUT has_claimed boolean, OUT kept_stamp bigint)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    at_ms bigint := lock_runtime_v1_now();
    r lock_runtime_locks;
    holder bigint;
    purged bigint;
    head text;
    live_claims jsonb;
BEGIN
    got := false; is_behind := false; has_claimed := false;
    IF lock_ms > 0 THEN
        PERFORM set_config('lock_timeout', lock_ms || 'ms', true);
    END IF;
    IF NOT fair THEN
        -- The common case, one statement: taken if free, expired or ours, and no reader holds
        -- it (the row is locked either way, for the refusal below).
        INSERT INTO lock_runtime_locks AS l (key, token, expires_ms, fence)
        VALUES (k, tok, at_ms + ttl, CASE WHEN fencing THEN lock_runtime_v1_fence(NULL) END)
        ON CONFLICT (key) DO UPDATE
            SET token = EXCLUDED.token, expires_ms = EXCLUDED.expires_ms,
                -- The token is taken here, with the row locked and the lock granted, not in
                -- VALUES (evaluated before the statement waits for the row): a waiter that
                -- took a number, then waited, must not hold after one that took a larger one.
                -- A repeat by the holder keeps its token (idempotent for one token).
                fence = CASE WHEN NOT fencing THEN l.fence
                             WHEN l.token = tok AND l.fence IS NOT NULL THEN l.fence
                             ELSE lock_runtime_v1_fence(l.fence) END,
                -- A writer that claimed its turn keeps the mark the readers it held back left,
                -- so its release tells them.
                marked = had_claimed, shares = NULL,
                claims = CASE WHEN had_claimed THEN NULLIF(l.claims - tok, '{}'::jsonb) ELSE l.claims END
            WHERE (l.token IS NULL OR l.expires_ms <= at_ms OR l.token = tok)
                AND l.shares_until <= at_ms
        RETURNING l.fence INTO got_fence;
        IF FOUND THEN
            got := true;
            IF NOT fencing THEN got_fence := NULL; END IF;
            RETURN;
        END IF;
    END IF;
    -- (Refused above, the row is ours to read until the transaction ends.) The clock is read
    -- again: the statement may have waited for the row, and a lease must not be judged by a
    -- time from before the wait.
    r := lock_runtime_v1_row(k);
    at_ms := lock_runtime_v1_now();
    PERFORM lock_runtime_v1_count(r, 1, at_ms);
    IF r.token = tok AND r.expires_ms > at_ms THEN
        -- Ours already: a fair turn handed over by a release. Its lease counts from now; with
        -- no token taken for it then, it takes one.
        got_fence := r.fence;
        IF fencing AND got_fence IS NULL THEN
            got_fence := lock_runtime_v1_fence(NULL);
        END IF;
        UPDATE lock_runtime_locks SET expires_ms = greatest(expires_ms, at_ms + ttl), fence = got_fence
            WHERE key = k;
        got := true;
        IF NOT fencing THEN got_fence := NULL; END IF;
        RETURN;
    END IF;
    IF r.token IS NOT NULL AND r.expires_ms > at_ms THEN
        holder := r.expires_ms;
    END IF;
    live_claims := lock_runtime_v1_live(r.claims, at_ms);
    IF r.shares_until > at_ms THEN
        -- Readers share it: a writer that will wait claims its turn, so no new reader enters.
        IF joining THEN
            live_claims := coalesce(live_claims, '{}'::jsonb) || jsonb_build_object(tok, at_ms + place_ms);
            has_claimed := true;
        END IF;
        holder := greatest(holder, r.shares_until);
    END IF;
    IF fair THEN
        DELETE FROM lock_runtime_line WHERE key = k AND kept_until <= at_ms;
        GET DIAGNOSTICS purged = ROW_COUNT;
        SELECT l.token INTO head FROM lock_runtime_line l WHERE l.key = k ORDER BY l.arrival LIMIT 1;
        IF holder IS NOT NULL OR (head IS NOT NULL AND head <> tok) THEN
            IF joining THEN
                kept_stamp := nextval('lock_runtime_arrivals');
                INSERT INTO lock_runtime_line AS l (key, token, arrival, kept_until, stamp)
                VALUES (k, tok, kept_stamp, at_ms + place_ms, kept_stamp)
                ON CONFLICT (key, token) DO UPDATE
                    SET kept_until = EXCLUDED.kept_until, stamp = EXCLUDED.stamp;
            END IF;
            IF holder IS NULL AND purged > 0 AND head IS NOT NULL THEN
                -- The lock is free and the waiters ahead of the new head are gone.
                PERFORM lock_runtime_v1_tell(chan, 'w:' || head);
            END IF;
            is_behind := EXISTS (SELECT 1 FROM lock_runtime_line l WHERE l.key = k AND l.token = tok)
                AND head IS DISTINCT FROM tok AND head IS NOT NULL;
            PERFORM lock_runtime_v1_mark(k, r, live_claims, waiting);
            left_ms := holder - at_ms;
            RETURN;
        END IF;
        DELETE FROM lock_runtime_line WHERE key = k AND token = tok;
    END IF;
    IF holder IS NOT NULL THEN
        PERFORM lock_runtime_v1_mark(k, r, live_claims, waiting);
        left_ms := holder - at_ms;
        RETURN;
    END IF;
    -- Free (a fair waiter at the head of the line, or none).
    IF had_claimed THEN
        live_claims := NULLIF(live_claims - tok, '{}'::jsonb);
    END IF;
    IF fencing THEN
        got_fence := lock_runtime_v1_fence(r.fence);
    END IF;
    UPDATE lock_runtime_locks
        SET token = tok, expires_ms = at_ms + ttl, fence = coalesce(got_fence, r.fence),
            marked = had_claimed, shares = NULL, shares_until = 0, claims = live_claims
        WHERE key = k;
    got := true;
END
$$;

-- One attempt at a share of a read-write lock: refused while a writer holds it, or (for a
-- reader not in already) while a waiting writer's claim stands. A reader with fencing reads the
-- last writer's token (0: none).
CREATE OR REPLACE FUNCTION lock_runtime_v1_share(
    k text, tok text, ttl bigint, waiting boolean,
    OUT got boolean, OUT got_fence bigint, OUT left_ms bigint)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    at_ms bigint := lock_runtime_v1_now();
    r lock_runtime_locks;
    readers jsonb;
    live_claims jsonb;
BEGIN
    got := false;
    r := lock_runtime_v1_row(k);
    at_ms := lock_runtime_v1_now();
    IF r.permits IS NOT NULL AND r.shares_until > at_ms THEN
        PERFORM lock_runtime_v1_count(r, 1, at_ms);
    END IF;
    IF r.token IS NOT NULL AND r.expires_ms > at_ms THEN
        left_ms := r.expires_ms - at_ms;
        PERFORM lock_runtime_v1_mark(k, r, r.claims, waiting);
        RETURN;
    END IF;
    readers := lock_runtime_v1_live(r.shares, at_ms);
    live_claims := lock_runtime_v1_live(r.claims, at_ms);
    IF live_claims IS NOT NULL AND NOT coalesce(readers ? tok, false) THEN
        left_ms := lock_runtime_v1_last(live_claims) - at_ms;
        PERFORM lock_runtime_v1_mark(k, r, live_claims, waiting);
        RETURN;
    END IF;
    readers := coalesce(readers, '{}'::jsonb) || jsonb_build_object(tok, at_ms + ttl);
    -- An expired writer's value goes: its late renewal or release must not find it.
    UPDATE lock_runtime_locks
        SET shares = readers, shares_until = lock_runtime_v1_last(readers), claims = live_claims,
            token = NULL, permits = NULL, held = NULL
        WHERE key = k;
    got := true;
    got_fence := coalesce(r.fence, 0);
END
$$;

-- One attempt at every lock of a set (exclusive, not fair), each for its own token: every one
-- taken, or none. The keys without a row are taken first, by inserting their rows (in key
-- order); then the other rows are locked in key order, as a renewal locks them (two requests on
-- some of the same keys never wait for each other in a cycle: the rows one inserted are rows no
-- other request sees yet). A row deleted between the two (its holder's release) is neither: the
-- set is refused at that key, as held a moment ago (making the row then would lock a key out of
-- order, behind rows already locked, and two such sets could wait for each other), and a caller
-- that will wait goes on key by key. Then the clock is read again, each locked row looked at,
-- and all taken in one update; a refused set deletes the rows it inserted. Answers the fencing tokens in the order asked (when asked for), or the position
-- (1-based) of the first lock held, how long its holder has left, and the count its
-- semaphore's permits hold it with (NULL: a lock or read-write lock). Idempotent for the same
-- tokens. With `lock_ms` > 0, a wait for a row another session has locked ends after that long
-- with lock_not_available (55P03), and the attempt changes nothing: the caller's own wait has
-- run out.
CREATE OR REPLACE FUNCTION lock_runtime_v1_take_set(
    ks text[], toks text[], ttl bigint, fencing boolean, lock_ms bigint,
    OUT fences bigint[], OUT refused integer, OUT left_ms bigint, OUT held_permits integer)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    at_ms bigint := lock_runtime_v1_now();
    n integer := coalesce(array_length(ks, 1), 0);
    made text[] := '{}';
    made_fences bigint[] := '{}';
    more text[];
    more_fences bigint[];
    locked text[] := '{}';
    others lock_runtime_locks[] := '{}';
    batch lock_runtime_locks[];
    taken bigint[];
    r lock_runtime_locks;
    i integer;
BEGIN
    IF lock_ms > 0 THEN
        PERFORM set_config('lock_timeout', lock_ms || 'ms', true);
    END IF;
    -- Free keys (no row): taken as they are made. A token taken here is one nobody waited for.
    WITH inserted AS (
        INSERT INTO lock_runtime_locks (key, token, expires_ms, fence)
        SELECT a.k, a.t, at_ms + ttl, CASE WHEN fencing THEN lock_runtime_v1_fence(NULL) END
        FROM unnest(ks, toks) AS a(k, t)
        ORDER BY a.k
        ON CONFLICT DO NOTHING
        RETURNING key, fence)
    SELECT array_agg(key), array_agg(coalesce(fence, 0)) INTO more, more_fences FROM inserted;
    made := coalesce(more, '{}');
    made_fences := coalesce(more_fences, '{}');
    SELECT array_agg(l) INTO batch FROM (
        SELECT * FROM lock_runtime_locks WHERE key = ANY (ks) AND NOT key = ANY (made)
        ORDER BY key FOR UPDATE) AS l;
    FOREACH r IN ARRAY coalesce(batch, '{}') LOOP
        others := others || r;
        locked := locked || r.key;
    END LOOP;
    IF coalesce(array_length(made, 1), 0) + coalesce(array_length(locked, 1), 0) < n THEN
        -- A row went between the insert and the read (its holder released it): refused there.
        SELECT min(o) INTO refused FROM unnest(ks) WITH ORDINALITY AS a(k, o)
            WHERE NOT a.k = ANY (made) AND NOT a.k = ANY (locked);
        left_ms := 0;
        DELETE FROM lock_runtime_locks WHERE key = ANY (made);
        RETURN;
    END IF;
    taken := array_fill(0::bigint, ARRAY[n]);
    FOR m IN 1 .. coalesce(array_length(made, 1), 0) LOOP
        taken[array_position(ks, made[m])] := made_fences[m];
    END LOOP;
    IF coalesce(array_length(locked, 1), 0) > 0 THEN
        -- Read after the rows are locked: no lease is judged by a time from before a wait.
        at_ms := lock_runtime_v1_now();
        FOREACH r IN ARRAY others LOOP
            i := array_position(ks, r.key);
            IF NOT ((r.token IS NULL OR r.expires_ms <= at_ms OR r.token = toks[i])
                    AND r.shares_until <= at_ms)
               AND (refused IS NULL OR i < refused) THEN
                refused := i;
                left_ms := greatest(CASE WHEN r.token IS NOT NULL AND r.expires_ms > at_ms THEN r.expires_ms END,
                                    NULLIF(r.shares_until, 0)) - at_ms;
                held_permits := CASE WHEN r.permits IS NOT NULL AND r.shares_until > at_ms THEN r.permits END;
            END IF;
        END LOOP;
        IF refused IS NOT NULL THEN
            DELETE FROM lock_runtime_locks WHERE key = ANY (made);
            RETURN;
        END IF;
        -- A lapsed holder's, readers' or permits' values go: their late renewal or release must
        -- not find them. A request sent again keeps the token it took.
        WITH updated AS (
            UPDATE lock_runtime_locks l
                SET token = a.t, expires_ms = at_ms + ttl,
                    fence = CASE WHEN NOT fencing THEN l.fence
                                 WHEN l.token = a.t AND l.expires_ms > at_ms AND l.fence IS NOT NULL THEN l.fence
                                 ELSE lock_runtime_v1_fence(l.fence) END,
                    marked = false, shares = NULL, shares_until = 0, permits = NULL, held = NULL
                FROM unnest(ks, toks) AS a(k, t)
                WHERE l.key = a.k AND a.k = ANY (locked)
                RETURNING l.key, l.fence)
        SELECT array_agg(key), array_agg(coalesce(fence, 0)) INTO more, more_fences FROM updated;
        FOR m IN 1 .. coalesce(array_length(more, 1), 0) LOOP
            taken[array_position(ks, more[m])] := more_fences[m];
        END LOOP;
    END IF;
    fences := taken;
END
$$;

-- Lengthens each lock's (or share's) lease to its ttl from at_ms if it still holds its value,
-- never shortening it: the positions (1-based) of the renewed ones.
CREATE OR REPLACE FUNCTION lock_runtime_v1_renew(ks text[], toks text[], ttls bigint[])
RETURNS SETOF integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    at_ms bigint := lock_runtime_v1_now();
    done integer[];
    i integer;
BEGIN
    -- Every row locked first, in key order (two clients renewing shares of the same keys never
    -- wait for each other in a cycle), then the clock read: no lease is judged by a time from
    -- before a wait.
    PERFORM 1 FROM lock_runtime_locks WHERE key = ANY (ks) ORDER BY key FOR UPDATE;
    at_ms := lock_runtime_v1_now();
    -- Exclusive holders in one statement (a key is listed at most once per holder).
    WITH asked AS (
        SELECT * FROM unnest(ks, toks, ttls) WITH ORDINALITY AS a(k, t, ttl, i)
    ), renewed AS (
        UPDATE lock_runtime_locks l SET expires_ms = greatest(l.expires_ms, at_ms + asked.ttl)
        FROM asked
        WHERE l.key = asked.k AND l.token = asked.t AND l.expires_ms > at_ms
        RETURNING asked.i
    )
    SELECT coalesce(array_agg(renewed.i::integer), '{}') INTO done FROM renewed;
    -- Shares one by one (several readers of one key may be renewed together).
    FOR i IN 1 .. coalesce(array_length(ks, 1), 0) LOOP
        IF NOT i = ANY (done) THEN
            UPDATE lock_runtime_locks l
                SET shares = jsonb_set(l.shares, ARRAY[toks[i]],
                        to_jsonb(greatest((l.shares ->> toks[i])::bigint, at_ms + ttls[i]))),
                    shares_until = greatest(l.shares_until, at_ms + ttls[i])
                WHERE l.key = ks[i] AND (l.shares ->> toks[i])::bigint > at_ms;
            IF NOT FOUND THEN
                -- A semaphore's permit: its own row, and the header's latest end when it
                -- goes past it.
                UPDATE lock_runtime_permits p
                    SET expires_ms = greatest(p.expires_ms, at_ms + ttls[i])
                    FROM lock_runtime_locks l
                    WHERE p.key = ks[i] AND p.token = toks[i] AND NOT p.released
                        AND p.expires_ms > at_ms AND l.key = ks[i] AND l.permits IS NOT NULL;
                IF FOUND THEN
                    done := done || i;
                    UPDATE lock_runtime_locks SET shares_until = at_ms + ttls[i]
                        WHERE key = ks[i] AND shares_until < at_ms + ttls[i];
                END IF;
            ELSE
                done := done || i;
            END IF;
        END IF;
    END LOOP;
    RETURN QUERY SELECT unnest(done);
END
$$;

-- Gives the lock back if it still holds `tok`: deletes it, or with `hold_ms > 0` keeps it
-- (marked released) for that long; a share leaves, and the last to leave frees the lock. A fair
-- release hands the lock to the head of the line (with a fencing token when the key has one)
-- and names it; so does a permit's release (not kept for a minimum hold) where its semaphore's
-- fair line has a waiter; another release announces itself (`said`) if a waiter marked the
-- lock. Answers 0: not ours, 1: released, 2: a share left and other readers remain, 4: a permit
-- handed over to the waiter `admitted`, with the fencing token `handed_fence` taken for it (0:
-- none), the stamp of its place `handed_stamp` and the permit `handed_permit` (the releasing
-- client hands it at once if the waiter is its own; others hear it announced).
CREATE OR REPLACE FUNCTION lock_runtime_v1_hand_back(
    k text, chan text, tok text, hold_ms bigint, fair boolean, said text,
    OUT answer integer, OUT admitted text, OUT handed_fence bigint, OUT handed_stamp bigint,
    OUT handed_permit integer)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    at_ms bigint := lock_runtime_v1_now();
    r lock_runtime_locks;
    kept_tok text := tok || ':released';
    readers jsonb;
    live_claims jsonb;
    head lock_runtime_line;
    f bigint;
    p lock_runtime_permits;
    holders bigint;
    last_end bigint;
BEGIN
    SELECT * INTO r FROM lock_runtime_locks WHERE key = k FOR UPDATE;
    IF NOT FOUND THEN
        answer := 0;
        RETURN;
    END IF;
    -- Read after the row is locked: the lease is judged by the time the release runs.
    at_ms := lock_runtime_v1_now();
    IF r.expires_ms > at_ms AND (r.token = tok OR r.token = kept_tok) THEN
        IF hold_ms > 0 THEN
            -- Kept for its minimum hold: a renewal after the release cannot extend it, and a
            -- second release stands. Waiters that marked it hear when it will be free.
            IF r.token = tok THEN
                UPDATE lock_runtime_locks SET token = kept_tok, expires_ms = at_ms + hold_ms WHERE key = k;
                IF r.marked THEN
                    PERFORM lock_runtime_v1_tell(chan, said);
                END IF;
            END IF;
            answer := 1;
            RETURN;
        END IF;
    ELSIF r.permits IS NOT NULL THEN
        -- A semaphore's permit: its row goes (kept, marked released, for a minimum hold), and
        -- the release is announced while a waiter's mark stands (each one wakes a waiter).
        SELECT * INTO p FROM lock_runtime_permits
            WHERE key = k AND token = tok AND expires_ms > at_ms;
        IF NOT FOUND THEN
            answer := 0;
            RETURN;
        ELSIF p.released AND hold_ms > 0 THEN
            -- Released before, and kept for its minimum hold: that release stands.
            answer := 1;
            RETURN;
        ELSIF hold_ms > 0 THEN
            UPDATE lock_runtime_permits SET released = true, expires_ms = at_ms + hold_ms
                WHERE key = k AND token = tok;
        ELSE
            DELETE FROM lock_runtime_line WHERE key = k || '#permits' AND kept_until <= at_ms;
            SELECT * INTO head FROM lock_runtime_line l WHERE l.key = k || '#permits'
                ORDER BY l.arrival LIMIT 1;
            IF FOUND THEN
                -- The permit goes to the head of the fair line until its place would have
                -- lapsed (the waiter renews it when it hears; else it lapses as the place).
                DELETE FROM lock_runtime_line WHERE key = k || '#permits' AND token = head.token;
                IF r.fence IS NOT NULL THEN
                    f := lock_runtime_v1_fence(r.fence);
                END IF;
                UPDATE lock_runtime_permits
                    SET token = head.token, expires_ms = head.kept_until, fence = coalesce(f, 0),
                        released = false
                    WHERE key = k AND token = tok;
                UPDATE lock_runtime_locks
                    SET fence = coalesce(f, r.fence), held = NULL,
                        shares_until = greatest(shares_until, head.kept_until)
                    WHERE key = k;
                answer := 4;
                admitted := head.token;
                handed_fence := coalesce(f, 0);
                handed_stamp := head.stamp;
                handed_permit := p.permit;
                PERFORM lock_runtime_v1_tell(chan, 'p:' || handed_fence || ':' || handed_stamp
                    || ':' || handed_permit || ':' || head.token);
                RETURN;
            END IF;
            DELETE FROM lock_runtime_permits WHERE key = k AND token = tok;
        END IF;
        -- The latest end of the live holders (none: no holder left), read off the index by
        -- end, not counted holder by holder.
        SELECT max(expires_ms) INTO last_end FROM lock_runtime_permits
            WHERE key = k AND expires_ms > at_ms;
        holders := CASE WHEN last_end IS NULL THEN 0 ELSE 1 END;
        IF holders = 0 THEN
            DELETE FROM lock_runtime_permits WHERE key = k;
        END IF;
        IF holders = 0 AND r.fence IS NULL AND lock_runtime_v1_live(r.claims, at_ms) IS NULL THEN
            -- Nothing left to keep: no row stays behind (as a lock's release).
            DELETE FROM lock_runtime_locks WHERE key = k;
        ELSE
            UPDATE lock_runtime_locks
                SET held = NULL, shares_until = coalesce(last_end, 0),
                    permits = CASE WHEN holders = 0 THEN NULL ELSE permits END,
                    marked = marked AND holders > 0
                WHERE key = k;
        END IF;
        IF r.marked THEN
            PERFORM lock_runtime_v1_tell(chan, said);
        END IF;
        answer := 1;
        RETURN;
    ELSE
        readers := lock_runtime_v1_live(r.shares, at_ms);
        IF readers IS NULL OR NOT readers ? tok THEN
            answer := 0;
            RETURN;
        END IF;
        readers := readers - tok;
        IF readers <> '{}'::jsonb THEN
            UPDATE lock_runtime_locks SET shares = readers, shares_until = lock_runtime_v1_last(readers)
                WHERE key = k;
            answer := 2;
            RETURN;
        END IF;
    END IF;
    -- Free now.
    IF fair THEN
        DELETE FROM lock_runtime_line WHERE key = k AND kept_until <= at_ms;
        SELECT * INTO head FROM lock_runtime_line l WHERE l.key = k ORDER BY l.arrival LIMIT 1;
        IF FOUND THEN
            -- The lock goes to the head of the line until its place would have lapsed.
            DELETE FROM lock_runtime_line WHERE key = k AND token = head.token;
            IF r.fence IS NOT NULL THEN
                f := lock_runtime_v1_fence(r.fence);
            END IF;
            UPDATE lock_runtime_locks
                SET token = head.token, expires_ms = head.kept_until, fence = coalesce(f, r.fence),
                    marked = false, shares = NULL, shares_until = 0
                WHERE key = k;
            PERFORM lock_runtime_v1_tell(chan,
                'g:' || coalesce(f, 0) || ':' || head.stamp || ':' || head.token);
            answer := 1;
            RETURN;
        END IF;
    END IF;
    live_claims := lock_runtime_v1_live(r.claims, at_ms);
    IF r.fence IS NULL AND live_claims IS NULL THEN
        DELETE FROM lock_runtime_locks WHERE key = k;
    ELSE
        UPDATE lock_runtime_locks
            SET token = NULL, expires_ms = at_ms, shares = NULL, shares_until = 0,
                claims = live_claims, marked = false
            WHERE key = k;
    END IF;
    IF r.marked OR fair THEN
        PERFORM lock_runtime_v1_tell(chan, said);
    END IF;
    answer := 1;
    RETURN;
END
$$;

-- What clients of earlier builds call: lock_runtime_v1_hand_back's answer and the waiter it
-- names (a permit handed over is named as admitted, 3: that client's waiter asks, and finds it
-- its own), and its answer alone.
CREATE OR REPLACE FUNCTION lock_runtime_v1_give_back(
    k text, chan text, tok text, hold_ms bigint, fair boolean, said text,
    OUT answer integer, OUT admitted text)
LANGUAGE sql VOLATILE AS $$
    SELECT CASE WHEN h.answer = 4 THEN 3 ELSE h.answer END, h.admitted
        FROM lock_runtime_v1_hand_back(k, chan, tok, hold_ms, fair, said) AS h
$$;
CREATE OR REPLACE FUNCTION lock_runtime_v1_release(
    k text, chan text, tok text, hold_ms bigint, fair boolean, said text)
RETURNS integer
LANGUAGE sql VOLATILE AS $$
    SELECT CASE WHEN h.answer = 4 THEN 1 ELSE h.answer END
        FROM lock_runtime_v1_hand_back(k, chan, tok, hold_ms, fair, said) AS h
$$;

-- A waiter that stops waiting: gives up its place in line and its claim as a waiting writer;
-- true if it withdrew a claim (readers held back by it are told, with `said`).
CREATE OR REPLACE FUNCTION lock_runtime_v1_leave(k text, chan text, tok text, said text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    -- The lock's row first, as every other function locks it before the line (no deadlock
    -- with a fair release).
    PERFORM 1 FROM lock_runtime_locks WHERE key = k FOR UPDATE;
    DELETE FROM lock_runtime_line WHERE key IN (k, k || '#permits') AND token = tok;
    UPDATE lock_runtime_locks SET claims = NULLIF(claims - tok, '{}'::jsonb) WHERE key = k AND claims ? tok;
    IF FOUND THEN
        PERFORM lock_runtime_v1_tell(chan, said);
        RETURN true;
    END IF;
    RETURN false;
END
$$;

-- Deletes the lock whoever holds it, and wakes its waiters: true if it was held.
CREATE OR REPLACE FUNCTION lock_runtime_v1_force(k text, chan text, said text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    at_ms bigint := lock_runtime_v1_now();
    r lock_runtime_locks;
BEGIN
    SELECT * INTO r FROM lock_runtime_locks WHERE key = k FOR UPDATE;
    at_ms := lock_runtime_v1_now();
    IF NOT FOUND OR NOT (r.expires_ms > at_ms AND r.token IS NOT NULL OR r.shares_until > at_ms) THEN
        RETURN false;
    END IF;
    UPDATE lock_runtime_locks
        SET token = NULL, expires_ms = at_ms, shares = NULL, shares_until = 0, marked = false,
            permits = NULL, held = NULL
        WHERE key = k;
    DELETE FROM lock_runtime_permits WHERE key = k;
    PERFORM lock_runtime_v1_tell(chan, said);
    RETURN true;
END
$$;

-- Deletes up to `n` rows that nothing needs any more: no holder, reader or claim for a while,
-- and no fencing token kept (an hour after the last lock, as Redis keeps its counter), and fair
-- places that lapsed. Rows another request has locked are skipped.
CREATE OR REPLACE FUNCTION lock_runtime_v1_sweep(n integer)
RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    at_ms bigint := lock_runtime_v1_now();
    gone bigint;
BEGIN
    DELETE FROM lock_runtime_locks WHERE key IN (
        SELECT key FROM lock_runtime_locks
        WHERE greatest(expires_ms, shares_until) + CASE WHEN fence IS NULL THEN 2000 ELSE 3600000 END < at_ms
        LIMIT n FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS gone = ROW_COUNT;
    DELETE FROM lock_runtime_line WHERE (key, token) IN (
        SELECT key, token FROM lock_runtime_line WHERE kept_until + 2000 < at_ms
        LIMIT n FOR UPDATE SKIP LOCKED);
    DELETE FROM lock_runtime_permits WHERE (key, token) IN (
        SELECT key, token FROM lock_runtime_permits WHERE expires_ms + 2000 < at_ms
        LIMIT n FOR UPDATE SKIP LOCKED);
    RETURN gone;
END
$$;
