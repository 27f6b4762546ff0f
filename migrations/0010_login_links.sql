-- 0010_login_links.sql - one-time login links for the web UI (`kiln ui`): a signed-in client
-- asks for a link, the browser redeems its code once, within minutes, for a token of its own.
-- Only the BLAKE2b-256 hash of a code is stored, as for tokens. A link dies with the token that
-- asked for it (revoked or expired), and the browser's token never outlives that token.
CREATE TABLE login_links (
    hash                bytea PRIMARY KEY,
    user_name           text NOT NULL REFERENCES users (name) ON DELETE CASCADE,
    token_id            text NOT NULL REFERENCES tokens (id) ON DELETE CASCADE,
    created_at          timestamptz NOT NULL DEFAULT now(),
    expires_at          timestamptz NOT NULL,
    session_expires_at  timestamptz NOT NULL,
    used_at             timestamptz,
    issued_token_id     text
);
CREATE INDEX login_links_expires_idx ON login_links (expires_at);
