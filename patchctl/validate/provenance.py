"""What a report or a baseline measured: the patch set's fingerprint, the engine's version and build,
the model and its context length, the GPU, and how the throughput prompts were sent.

A comparison between two measurements of different things is not evidence of anything: a baseline or
a saved report whose provenance differs from this run in any of IDENTITY is refused (exit 2, naming
the field) unless the user says the difference is wanted. A field either side does not know is no
difference (an older baseline, a server that does not say): it is listed as not compared.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from patchctl.tree.bookkeeping import StateRecord
    from patchctl.validate.client import OpenAIClient
    from patchctl.validate.serverinfo import ContextLimit

# Fields whose difference makes two measurements of a server incomparable, in the order a refusal names
# them. How the load was sent (the prompt kind among it) is the workload's: a baseline measured with
# another one warns (baseline.workload_differences), and --compare refuses it (compare.FIELDS).
IDENTITY = ("model", "patch_set", "engine_version", "engine_build", "max_model_len", "gpu_name")
NVIDIA_SMI_TIMEOUT_S = 5.0  # a wedged driver can hang nvidia-smi for minutes: validate does not wait for it
LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", "0.0.0.0", "::"}


class Provenance(NamedTuple):
    model: str
    # The fingerprint: baseline.applied_patch_set over the tree's record (every applied patch's name and
    # variant, and the sha256 of every file it wrote), --patch-set verbatim, or "unknown".
    patch_set: str
    patch_set_from: str  # target | option | unknown
    patches: tuple[tuple[str, str | None], ...] | None  # (name, sha256 of the variant) as the record has them
    engine_version: str
    engine_build: str | None  # the tree record's build, else the version's local label (+g1a2b3c4.cu128)
    max_model_len: int | None
    gpu_name: str | None  # "NVIDIA H200", "8 x NVIDIA H200"
    gpu_driver: str | None
    prompts: str | None  # unique | shared; None when no throughput was measured
    unknown: Mapping[str, str]  # field -> why it is not known

    def to_json(self) -> dict[str, Any]:
        out = self._asdict()
        out["patches"] = None if self.patches is None else [list(p) for p in self.patches]
        out["unknown"] = dict(self.unknown)
        return out

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Provenance:
        patches = obj.get("patches")
        fields: dict[str, Any] = {k: obj.get(k) for k in cls._fields}
        fields["patches"] = None if patches is None else tuple((str(p[0]), p[1]) for p in patches)
        fields["unknown"] = dict(obj.get("unknown") or {})
        return cls(**fields)


def record_facts(record: StateRecord | None) -> tuple[tuple[tuple[str, str | None], ...], str | None]:
    """The applied patches (name, sha256) and the build, as a tree's state record has them."""
    if record is None:
        return (), None
    build = None
    b = record.build
    # Only a record that names the build (a commit, an artifact) tells more than the version does.
    which = b and (b.commit or b.artifact or b.sha256 or b.url)
    if b is not None and which:
        build = f"{b.kind} {b.version} {which}"
    return tuple((p.name, p.sha256) for p in record.patches), build


def engine_build_of(version: str, recorded: str | None) -> tuple[str | None, str | None]:
    """(build, why unknown). The tree's record says which build was patched; without it, the version
    the server reports: vLLM's /version is vllm.__version__, whose local label names the commit and
    variant of a nightly or source build (0.11.1.dev5+g1a2b3c4.cu128); SGLang's is sglang.__version__
    (/version, also in /get_server_info), a plain release number for a release."""
    if recorded:
        return recorded, None
    if "+" in version:
        return version.split("+", 1)[1], None
    return None, "no tree record read (--python/--target) and the version names no build (+label)"


def max_model_len_of(client: OpenAIClient, limit: ContextLimit | None = None) -> tuple[int | None, str | None]:
    """(the server's context limit, why unknown), as the server states it (serverinfo.context_limit:
    /v1/models' max_model_len for vLLM and SGLang, /props' n_ctx for llama-server). --max-context is not
    used here: the report names what the server runs, not what validate was told."""
    from patchctl.validate.serverinfo import context_limit

    limit = limit or context_limit(client)
    if limit.tokens is not None:
        return limit.tokens, None
    return None, "the server states none (/v1/models max_model_len, /props n_ctx)"


def is_local(base_url: str) -> bool:
    host = (urlsplit(base_url).hostname or "").lower()
    return host in LOCAL_HOSTS or host.startswith("127.") or host == socket.gethostname().lower()


def gpu_of(base_url: str, timeout_s: float = NVIDIA_SMI_TIMEOUT_S) -> tuple[str | None, str | None, str | None]:
    """(name, driver, why unknown). No engine's API names its GPU (vLLM's /version and /v1/models, SGLang's
    /get_server_info do not), so it is read from nvidia-smi when the server is on this host; these are
    the host's GPUs, which the server may use a subset of."""
    if not is_local(base_url):
        return None, None, f"the server is not on this host ({urlsplit(base_url).hostname}) and does not say"
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None, None, "nvidia-smi not found on this host"
    try:
        done = subprocess.run(
            [exe, "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return None, None, f"nvidia-smi did not answer within {timeout_s:g} s"
    except OSError as exc:
        return None, None, f"nvidia-smi could not run: {exc.strerror or exc}"
    rows = [[c.strip() for c in line.split(",")] for line in done.stdout.splitlines() if line.strip()]
    if done.returncode != 0 or not rows or any(len(r) != 2 for r in rows):
        said = (done.stderr or done.stdout).strip().splitlines()
        return None, None, f"nvidia-smi exited {done.returncode}: {said[0][:200] if said else 'no GPU listed'}"
    names = sorted({r[0] for r in rows})
    drivers = sorted({r[1] for r in rows})
    name = " + ".join(names) if len(names) > 1 else (f"{len(rows)} x {names[0]}" if len(rows) > 1 else names[0])
    return name, ", ".join(drivers), None


def collect(
    client: OpenAIClient,
    model: str,
    engine_version: str,
    patch_set: str,
    patch_set_from: str,
    patches: Sequence[tuple[str, str | None]] | None,
    recorded_build: str | None,
    prompts: str | None,
    server_limit: ContextLimit | None = None,  # serverinfo.context_limit's reading, when the run has it
) -> Provenance:
    unknown: dict[str, str] = {}
    build, why = engine_build_of(engine_version, recorded_build)
    if why:
        unknown["engine_build"] = why
    length, why = max_model_len_of(client, server_limit)
    if why:
        unknown["max_model_len"] = why
    gpu, driver, why = gpu_of(client.base_url)
    if why:
        unknown["gpu_name"] = unknown["gpu_driver"] = why
    if patch_set == "unknown":
        unknown["patch_set"] = "neither --python/--target nor --patch-set said which patch set the server runs"
    if engine_version == "unknown":
        unknown["engine_version"] = "no version from the server (/version, /get_server_info) nor --engine-version"
    return Provenance(
        model,
        patch_set,
        patch_set_from,
        None if patches is None else tuple(patches),
        engine_version,
        build,
        length,
        gpu,
        driver,
        prompts,
        unknown,
    )


class Difference(NamedTuple):
    field: str
    then: Any
    now: Any

    def describe(self) -> str:
        return f"{self.field} {self.then!r} -> {self.now!r}"


def _known(value: Any) -> bool:
    return value is not None and value != "unknown"


def differences(
    then: Mapping[str, Any] | None, now: Mapping[str, Any] | None, fields: Sequence[str] = IDENTITY
) -> tuple[tuple[Difference, ...], tuple[str, ...]]:
    """(the fields both know and that differ, the fields one of them does not know)."""
    if then is None or now is None:
        return (), tuple(fields)
    diffs, unknown = [], []
    for field in fields:
        a, b = then.get(field), now.get(field)
        if not (_known(a) and _known(b)):
            unknown.append(field)
        elif a != b:
            diffs.append(Difference(field, a, b))
    return tuple(diffs), tuple(unknown)


def patch_changes(then: Mapping[str, Any] | None, now: Mapping[str, Any] | None) -> str:
    """How two patch lists differ, for a person: "+a, -b, ~c" (added, removed, changed content)."""
    a = {p[0]: p[1] for p in (then or {}).get("patches") or ()}
    b = {p[0]: p[1] for p in (now or {}).get("patches") or ()}
    parts = [f"+{n}" for n in b if n not in a] + [f"-{n}" for n in a if n not in b]
    parts += [f"~{n}" for n in a if n in b and a[n] != b[n]]
    return ", ".join(parts)


ACCEPT_OPTION = "--accept-baseline-mismatch"


def check_baseline(then: Mapping[str, Any] | None, now: Provenance, path: str, accept: bool) -> list[str]:
    """Refuse (UsageError, exit 2) a baseline measured on something else, naming each field that
    differs; with `accept`, the comparison goes on and the warnings returned say what differs. A
    baseline recorded before provenance was kept is compared, and a warning says it cannot be checked."""
    from patchctl.core.errors import UsageError

    if then is None:
        return [
            f"the baseline {path} does not say what it measured (recorded by an older patchctl), so it cannot be "
            "checked against this run: re-record it with --update-baseline"
        ]
    diffs, _unknown = differences(then, now.to_json())
    if not diffs:
        return []
    said = "; ".join(_described(d, then, now.to_json()) for d in diffs)
    if not accept:
        raise UsageError(
            f"the baseline {path} measured something else: {said}",
            hint=f"record one for this setup with --update-baseline, or compare anyway with {ACCEPT_OPTION}",
        )
    return [f"compared with a baseline that measured something else ({ACCEPT_OPTION}): {said}"]


def _described(d: Difference, then: Mapping[str, Any], now: Mapping[str, Any]) -> str:
    if d.field == "patch_set" and (changes := patch_changes(then, now)):
        return f"{d.describe()} (patches {changes})"
    return d.describe()
