"""Where a Client finds kilnd and its credentials, by the same rules as the ``kiln`` CLI.

Each of the URL, the token and the CA file comes from the first of: the Client's arguments,
the environment (KILN_URL, KILN_TOKEN, KILN_TLS_CA), and the selected profile of the CLI's
config file, ``$XDG_CONFIG_HOME/kiln/config.json`` (default ``~/.config/kiln/config.json``),
which ``kiln login`` writes:

    {"current": "default", "profiles": {"default": {"url": ..., "token": ..., "ca": ...}}}

The profile is the ``profile`` argument, else KILN_PROFILE, else the file's "current", else
"default". A profile is bound to its URL: its token and CA are used only when the URL in effect
is the profile's, never sent to another kilnd. The file is read only when something is missing,
and refused when group or others have any permission on it (it holds tokens). Nothing here ever
puts a token into an error message.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from .errors import KilnError

DEFAULT_URL = "https://127.0.0.1:8080"  # where kilnd serves by default (TLS), as the CLI


def normalize_url(url: str | None) -> str:
    """A bare "host:port" gets "https://" (kilnd serves TLS by default); trailing slashes go.
    "" for None or ""."""
    if not url:
        return ""
    if "://" not in url:
        url = "https://" + url
    return url.rstrip("/")


def config_path(environ: Mapping[str, str] | None = None) -> str:
    """The CLI's config file: $XDG_CONFIG_HOME/kiln/config.json when XDG_CONFIG_HOME is an
    absolute path, else ~/.config/kiln/config.json."""
    env = os.environ if environ is None else environ
    xdg = env.get("XDG_CONFIG_HOME", "")
    if xdg.startswith("/"):
        return os.path.join(xdg, "kiln", "config.json")
    home = env.get("HOME", "")
    if not home.startswith("/"):
        home = os.path.expanduser("~")
    return os.path.join(home, ".config", "kiln", "config.json")


def load_config(path: str) -> dict[str, Any]:
    """The config file at path as a dict with a "profiles" dict; {"profiles": {}} when it does
    not exist. Raises KilnError when others may read it, or when it is not such JSON."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return {"profiles": {}}
    except OSError as e:
        raise KilnError('could not open config file "%s": %s' % (path, e.strerror), code="io_error") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise KilnError('config file "%s" is not a regular file' % path, code="invalid_argument")
        if st.st_mode & 0o077:
            raise KilnError('config file "%s" may be read by other users (mode %04o)' % (path, st.st_mode & 0o7777),
                            code="permission_denied",
                            detail="it holds API tokens, so kiln uses it only when it is private to you",
                            hint="chmod 600 %s (and revoke its tokens if someone else may have read them)" % path)
        raw = f.read()
    try:
        cfg: Any = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        # The parser's message may quote the text around the error, which may be a token.
        where = " (line %d, column %d)" % (e.lineno, e.colno) if isinstance(e, json.JSONDecodeError) else ""
        raise KilnError('config file "%s" is not valid JSON%s' % (path, where), code="invalid_argument",
                        hint="fix it, or remove it and log in again with kiln login") from None
    if not isinstance(cfg, dict):
        raise KilnError('config file "%s" does not hold a JSON object' % path, code="invalid_argument")
    obj = cast("dict[str, Any]", cfg)
    if not _valid_profiles(obj.setdefault("profiles", {})):
        raise KilnError('config file "%s": "profiles" must map names to {"url", "token", "ca"} strings' % path,
                        code="invalid_argument")
    if not isinstance(obj.get("current", ""), (str, type(None))):
        raise KilnError('config file "%s": "current" must be a profile name' % path, code="invalid_argument")
    return obj


def _valid_profiles(v: object) -> bool:
    """Whether v maps names to {"url", "token", "ca"} strings."""
    if not isinstance(v, dict):
        return False
    for p in cast("dict[str, object]", v).values():
        if not isinstance(p, dict):
            return False
        prof = cast("dict[str, object]", p)
        if not all(isinstance(prof.get(k, ""), str) for k in ("url", "token", "ca")):
            return False
    return True


@dataclass
class Settings:
    """What a Client talks to and with; *_from is "argument", "environment", "profile" or
    "default" (token_from "" when there is no token)."""

    url: str
    token: str
    ca: str
    url_from: str
    token_from: str
    ca_from: str
    profile: str = ""          # the selected profile ("" when the file was not read)
    profile_other_url: bool = False
    config_path: str = ""

    def __repr__(self) -> str:  # never show the token
        return "Settings(url=%r, token_from=%r, ca=%r, profile=%r)" % (self.url, self.token_from, self.ca,
                                                                      self.profile)


def resolve(url: str | None = None, token: str | None = None, ca: str | None = None, profile: str | None = None,
            environ: Mapping[str, str] | None = None) -> Settings:
    """The Settings for a Client given these arguments (None: not given)."""
    env = os.environ if environ is None else environ
    s = Settings(url="", token="", ca="", url_from="", token_from="", ca_from="")
    # An empty url means "not given"; token="" and ca="" given on purpose mean none and the
    # system's CAs.
    for name, arg, var in (("url", url or None, "KILN_URL"), ("token", token, "KILN_TOKEN"), ("ca", ca, "KILN_TLS_CA")):
        if arg is not None:
            setattr(s, name, arg)
            setattr(s, name + "_from", "argument")
        elif env.get(var):
            setattr(s, name, env[var])
            setattr(s, name + "_from", "environment")
    s.url = normalize_url(s.url)
    chosen = profile or env.get("KILN_PROFILE") or None
    if s.url_from and s.token_from and s.ca_from and not chosen:
        return s
    s.config_path = config_path(env)
    cfg = load_config(s.config_path)
    s.profile = chosen or cfg.get("current") or "default"
    prof: dict[str, str] | None = cfg["profiles"].get(s.profile)
    if chosen and prof is None:
        raise KilnError('no profile "%s" in %s' % (s.profile, s.config_path), code="not_found",
                        hint="kiln login --profile %s saves one" % s.profile)
    if prof is not None:
        purl = normalize_url(prof.get("url") or DEFAULT_URL)
        if s.url_from and s.url != purl:
            s.profile_other_url = True  # its token belongs to its own kilnd
        else:
            if not s.url_from:
                s.url, s.url_from = purl, "profile"
            if not s.token_from and prof.get("token"):
                s.token, s.token_from = prof["token"], "profile"
            if not s.ca_from and prof.get("ca"):
                s.ca, s.ca_from = prof["ca"], "profile"
    if not s.url_from:
        s.url, s.url_from = DEFAULT_URL, "default"
    return s
