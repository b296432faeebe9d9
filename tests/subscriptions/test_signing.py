"""The webhook key ring: signatures a receiver can check, keys that survive restarts and rotate.

Signatures are verified the way a receiver would, from the JWKS alone, with
PyNaCl (libsodium): a second Ed25519 implementation, not the library the
server signs with. The ``rotate-webhook-key`` command is in test_programs.py.
"""

from __future__ import annotations

import base64
import json
import re
import stat
import time

import pytest
from nacl.exceptions import BadSignatureError
from nacl.signing import VerifyKey

from stream_server.subscriptions.signing import (
    KEYRING_FILE,
    KeyRingError,
    WebhookKeys,
    thumbprint_kid,
)

pytestmark = pytest.mark.processes

HEADER = re.compile(r"^t=(\d+),kid=([^,]+),ed25519=([A-Za-z0-9_-]+)$")  # the suite's own pattern


def unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def kids(jwks: dict) -> list[str]:
    return [k["kid"] for k in jwks["keys"]]


def verify(jwks: dict, body: bytes, header: str) -> int:
    """Check ``header`` against ``jwks`` as a receiver does; return the timestamp."""
    match = HEADER.match(header)
    assert match, header
    t, kid, sig = match.groups()
    (jwk,) = [k for k in jwks["keys"] if k["kid"] == kid]
    assert (jwk["kty"], jwk["crv"], jwk["alg"], jwk["use"]) == ("OKP", "Ed25519", "EdDSA", "sig")
    VerifyKey(unb64(jwk["x"])).verify(t.encode() + b"." + body, unb64(sig))
    return int(t)


def test_signatures_verify_from_the_jwks_with_another_library(tmp_path):
    keys = WebhookKeys.load_or_create(tmp_path / "webhook-keys")
    body = b'{"subscription_id":"sub-1","generation":7}'
    header = keys.sign(body, now=1_778_324_210)
    assert header.startswith(f"t=1778324210,kid={keys.kid},ed25519=")
    assert "=" not in header.rsplit("ed25519=", 1)[1]  # unpadded base64url
    assert verify(keys.jwks(), body, header) == 1_778_324_210
    with pytest.raises(BadSignatureError):
        verify(keys.jwks(), body.replace(b"7", b"8"), header)
    # The timestamp is signed too: moving it breaks the signature.
    forged = header.replace("t=1778324210", "t=1778324999")
    with pytest.raises(BadSignatureError):
        verify(keys.jwks(), body, forged)


def test_kid_is_ds_plus_the_rfc7638_thumbprint():
    # RFC 8037 appendix A.3: the thumbprint of its Ed25519 example key.
    x = "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"
    assert thumbprint_kid(x) == "ds_kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k"


def test_the_key_survives_a_reload_and_is_private_on_disk(tmp_path):
    directory = tmp_path / "webhook-keys"
    first = WebhookKeys.load_or_create(directory)
    body = b"{}"
    header = first.sign(body)
    again = WebhookKeys.load_or_create(directory)
    assert again.kid == first.kid and again.kid.startswith("ds_")
    verify(again.jwks(), body, header)
    assert verify(first.jwks(), body, again.sign(body))
    assert stat.S_IMODE((directory / KEYRING_FILE).stat().st_mode) == 0o600
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert sorted(p.name for p in directory.iterdir()) == [".lock", KEYRING_FILE]


def test_rotation_keeps_the_old_key_published_for_the_replay_window(tmp_path):
    directory = tmp_path / "webhook-keys"
    keys = WebhookKeys.load_or_create(directory, replay_window=3600)
    old_kid = keys.kid
    old_header = keys.sign(b"x")
    t0 = time.time()
    new_kid = keys.rotate(now=t0)
    assert new_kid == keys.kid != old_kid
    assert kids(keys.jwks(now=t0 + 1)) == [new_kid, old_kid]
    verify(keys.jwks(now=t0 + 1), b"x", old_header)
    verify(keys.jwks(now=t0 + 1), b"x", keys.sign(b"x"))
    # A restart inside the window still publishes the old key.
    reloaded = WebhookKeys.load_or_create(directory, replay_window=3600)
    assert reloaded.kid == new_kid
    assert kids(reloaded.jwks(now=t0 + 1)) == [new_kid, old_kid]
    # Past the window it is gone.
    assert kids(reloaded.jwks(now=t0 + 3600)) == [new_kid]
    # Only the current key's private part is on disk.
    doc = json.loads((directory / KEYRING_FILE).read_text())
    assert "d" in doc["current"] and all("d" not in r for r in doc["retired"])


def test_a_reload_after_the_window_prunes_retired_keys_from_disk(tmp_path):
    directory = tmp_path / "webhook-keys"
    keys = WebhookKeys.load_or_create(directory, replay_window=60)
    keys.rotate(now=1.0)  # retired long ago
    WebhookKeys.load_or_create(directory, replay_window=60)
    assert json.loads((directory / KEYRING_FILE).read_text())["retired"] == []


def test_two_rotators_build_on_each_other_and_refresh_sees_it(tmp_path):
    """The running server and the command line share the file: neither loses the other's key."""
    directory = tmp_path / "webhook-keys"
    server = WebhookKeys.load_or_create(directory)
    cli = WebhookKeys.load_or_create(directory)
    first = server.kid
    by_cli = cli.rotate()
    assert server.kid == first  # not yet seen
    assert server.refresh() and server.kid == by_cli
    assert not server.refresh()
    by_server = server.rotate()
    assert kids(server.jwks()) == [by_server, by_cli, first]


def test_maybe_rotate_follows_the_interval(tmp_path):
    keys = WebhookKeys.load_or_create(tmp_path / "k")
    born = keys.created_at
    assert keys.maybe_rotate(0, now=born + 10**9) is None  # 0: never
    assert keys.maybe_rotate(100, now=born + 99) is None
    new = keys.maybe_rotate(100, now=born + 100)
    assert new == keys.kid and keys.created_at == born + 100


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"not json", "not JSON"),
        (b'{"version": 99}', "version 99"),
        (b'{"version": 1, "current": {"kid": "ds_x"}}', "malformed"),
        (b"[]", "malformed"),
    ],
)
def test_a_damaged_key_ring_is_refused_with_a_clear_error(tmp_path, content, message):
    directory = tmp_path / "webhook-keys"
    WebhookKeys.load_or_create(directory)
    (directory / KEYRING_FILE).write_bytes(content)
    with pytest.raises(KeyRingError, match=message):
        WebhookKeys.load_or_create(directory)
    assert (directory / KEYRING_FILE).read_bytes() == content  # left for the operator


def test_a_key_that_does_not_match_its_kid_is_refused(tmp_path):
    directory = tmp_path / "webhook-keys"
    WebhookKeys.load_or_create(directory)
    doc = json.loads((directory / KEYRING_FILE).read_text())
    doc["current"]["kid"] = "ds_someone-else"
    (directory / KEYRING_FILE).write_text(json.dumps(doc))
    with pytest.raises(KeyRingError, match="does not match"):
        WebhookKeys.load_or_create(directory)
