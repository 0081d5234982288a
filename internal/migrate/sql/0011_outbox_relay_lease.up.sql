-- The outbox relays' leader lease: of all relays on this schema's outbox,
-- the one named by holder publishes; the others stand by and take the lease
-- over when lease_until has passed without a renewal. A relay that stops
-- releases the lease by setting lease_until to '-infinity' and keeps its
-- name in holder (the next acquirer settles what it left); holder is NULL
-- only before any relay has held the lease. One row, so a relay finds it
-- without a key and a standby's check reads one page.
--
-- epoch grows with every acquisition and fences the holder's claims: a
-- relay claims only while the row still names it with the epoch it
-- acquired, so a relay that lost the lease (paused past it, cut off from
-- the database) claims nothing when it comes back.
CREATE TABLE /*schema*/outbox_relay_lease (
    id          boolean     PRIMARY KEY DEFAULT true CHECK (id),  -- the one row
    holder      text,                                             -- RelayConfig.ID; NULL: never held
    epoch       bigint      NOT NULL DEFAULT 0,
    lease_until timestamptz NOT NULL DEFAULT '-infinity',
    acquired_at timestamptz                                       -- when holder took it
);

INSERT INTO /*schema*/outbox_relay_lease DEFAULT VALUES;
