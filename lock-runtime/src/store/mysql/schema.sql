-- The MySQL / MariaDB store's tables (made by the first client that connects, in the URL's
-- database; teams that create schemas by migration run these statements themselves).
-- Keys and tokens are binary strings: compared byte for byte (a text column's collation would
-- make `Order`, `order`, `ordér` and `order ` one lock).
CREATE TABLE IF NOT EXISTS lock_runtime_locks (
    -- The lock's name: `<prefix>{<key>}` (at most 256 + 1024 + 2 bytes).
    name VARBINARY(1300) NOT NULL PRIMARY KEY,
    -- The holder's value (`<uuid> <owner>`), `<value>:released` while a lock released early is
    -- kept for its minimum hold; NULL: free, the row kept for its fencing token.
    token VARBINARY(2048) NULL,
    -- When the lease ends, in milliseconds of the database's clock (UTC).
    expires_ms BIGINT NOT NULL,
    -- The last fencing token taken on this lock; NULL: never fenced. A semaphore's header
    -- (its key's row while permits are held) keeps the key's fencing floor here, raised by
    -- every claim and renewal.
    fence BIGINT NULL
) ENGINE = InnoDB
;
-- Waiters in line, by arrival (`id`): a fair lock's line has the lock's name, a fair
-- semaphore's the name and `#permits`, the claims of writers waiting for a read-write lock's
-- readers the name and `#claims`. A place lapses at `kept_until` unless its waiter asks again.
-- Changed only under the key's row lock, so (name, token) is unique without an index on it.
CREATE TABLE IF NOT EXISTS lock_runtime_line (
    id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    name VARBINARY(1300) NOT NULL,
    token VARBINARY(2048) NOT NULL,
    kept_until BIGINT NOT NULL,
    KEY lock_runtime_line_by_name (name, id)
) ENGINE = InnoDB;
-- A read-write lock's readers, a share each (the key's row is their header while any is held).
CREATE TABLE IF NOT EXISTS lock_runtime_shares (
    id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    name VARBINARY(1300) NOT NULL,
    token VARBINARY(2048) NOT NULL,
    expires_ms BIGINT NOT NULL,
    KEY lock_runtime_shares_by_name (name)
) ENGINE = InnoDB
