import pytest
from packaging.version import Version

from patchctl.core.errors import UsageError
from patchctl.sources.spec import parse_spec


def test_exact_version():
    ref = parse_spec("vllm@0.23.0")
    assert (ref.engine.name, ref.kind, ref.version) == ("vllm", "exact", Version("0.23.0"))
    assert str(ref) == "vllm@0.23.0"


@pytest.mark.parametrize(
    "text,kind",
    [
        ("vllm", "installed"),
        ("sglang@latest", "latest"),
        ("vllm@nightly", "nightly"),
        ("sglang@git:main", "git"),
        ("vllm@./src/vllm", "path"),
        ("vllm-gguf-plugin@0.0.5", "exact"),
    ],
)
def test_kinds(text, kind):
    assert parse_spec(text).kind == kind


def test_git_ref_and_path_kept():
    assert parse_spec("sglang@git:v0.5.9").git_ref == "v0.5.9"
    assert parse_spec("vllm@/opt/vllm").path == "/opt/vllm"


@pytest.mark.parametrize(
    "text,needle",
    [
        ("tensorrt@1.0", "unknown engine 'tensorrt'"),
        ("vllm@zero.one", "not a PEP 440 version"),
        ("vllm@", "nothing after '@'"),
        ("@1.0", "expected ENGINE"),
        ("vllm@git:", "needs a ref"),
    ],
)
def test_bad_specs_say_what_is_wrong(text, needle):
    with pytest.raises(UsageError) as info:
        parse_spec(text)
    assert needle in info.value.message
    assert info.value.exit_code == 2
