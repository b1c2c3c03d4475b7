"""Network failures in words a user can act on: what a resolver, socket or git said, mapped to the
cause; anything else kept (shortened)."""
import pytest

from patchctl.errors import plain_network_reason

GIT_DNS = ("cannot clone or fetch https://example.invalid/x.git: fatal: unable to access "
           "'https://example.invalid/x.git/': Could not resolve host: example.invalid")
URLLIB3_DNS = ("HTTPSConnectionPool(host='example.invalid', port=443): Max retries exceeded with url: /nightly/vllm/ "
               "(Caused by NameResolutionError(\"<urllib3.connection.HTTPSConnection object>: Failed to resolve "
               "'example.invalid' ([Errno -3] Temporary failure in name resolution)\"))")


@pytest.mark.parametrize("raw, words", [
    (GIT_DNS, "its host name does not resolve here (no DNS or no network)"),
    (URLLIB3_DNS, "its host name does not resolve here (no DNS or no network)"),
    ("[Errno 111] Connection refused", "the connection was refused"),
    ("Read timed out. (read timeout=30)", "the connection timed out"),
    ("HTTP 503", "HTTP 503"),
    ("", "unknown network error"),
])
def test_plain_network_reason(raw, words):
    assert plain_network_reason(raw) == words
