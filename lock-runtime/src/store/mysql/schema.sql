-- The MySQL / MariaDB store's one table (made by the first client that connects, in the URL's
-- database; teams that create schemas by migration run this statement themselves).
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
