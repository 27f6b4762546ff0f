-- 0012_token_lineage.sql - where each API token came from: the user and the token that made it.
-- A token never outlives the token that made it, revoking a token revokes every token made with
-- it (directly or through others), and a web UI session token (from a login link) makes none.
-- The bootstrap admin's token and tokens made before this migration have no parent.

-- created_by: the user whose token made it ('' for none). parent_id: that token (NULL for none).
-- kind: 'api' (kiln tokens create) or 'session' (a login link's, for the web UI).
ALTER TABLE tokens ADD COLUMN created_by text NOT NULL DEFAULT '';
ALTER TABLE tokens ADD COLUMN parent_id text REFERENCES tokens (id) ON DELETE CASCADE;
ALTER TABLE tokens ADD COLUMN kind text NOT NULL DEFAULT 'api' CHECK (kind IN ('api', 'session'));
CREATE INDEX tokens_parent_idx ON tokens (parent_id) WHERE parent_id IS NOT NULL;

-- Tokens the web UI got from login links were sessions all along, made with the token that asked
-- for the link (a link row outlives its token's 12 hours by a day, so every live one is here).
UPDATE tokens t SET kind = 'session', created_by = l.user_name, parent_id = l.token_id
    FROM login_links l WHERE l.issued_token_id = t.id;

-- When the token stopped working by revocation: its own revoked_at, or the earliest revoked_at of
-- the tokens it was made with that came before it expired (NULL while there is none). Revoking
-- marks the valid descendants too (store/auth.c); this also covers a token made while its parent
-- was being revoked.
CREATE FUNCTION token_revoked_at(p_id text) RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    WITH RECURSIVE up(id, parent_id, revoked_at) AS (
        SELECT id, parent_id, revoked_at FROM tokens WHERE id = p_id
        UNION
        SELECT t.id, t.parent_id, t.revoked_at FROM tokens t JOIN up ON t.id = up.parent_id)
    SELECT min(up.revoked_at) FROM up JOIN tokens self ON self.id = p_id
    WHERE up.id = p_id OR self.expires_at IS NULL OR up.revoked_at < self.expires_at
$$;
