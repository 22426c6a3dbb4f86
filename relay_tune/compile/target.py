"""Which target a build compiles for: target strings with this machine's CPU, features and cores filled in."""

from __future__ import annotations

from relay_tune.errors import UnsupportedError
from relay_tune.target import Target


def resolve_target(target: str | Target | None) -> Target:
    """The target to build for.

    `"llvm"` (or `"native"`) is this machine: its CPU, features and cores. A target string without `-mcpu` also
    gets the host's CPU and features, and without `-num-cores` the host's core count, so `"llvm -num-cores=1"` is
    this machine on one core. `"cuda"` is an NVIDIA GPU (`sm_90` unless the string names an architecture)."""
    if isinstance(target, Target):
        resolved = target
    else:
        text = (target or "llvm").strip()
        parsed = Target.parse(text)
        if parsed.kind == "cuda":  # NVIDIA GPUs: relay_tune.runtime.cuda runs the model
            return Target("cuda", arch=parsed.arch or "sm_90").validate()
        if parsed.kind != "llvm":
            raise UnsupportedError(f"relay_tune.build compiles for CPUs (llvm targets); got {parsed}")
        words = text.split()
        host = Target.host()
        has_cpu = any(w.startswith("-mcpu=") for w in words[1:]) or words[0] == "native"
        has_cores = any(w.startswith("-num-cores=") for w in words[1:]) or words[0] == "native"
        resolved = Target(
            kind="llvm",
            mcpu=parsed.mcpu if has_cpu else host.mcpu,
            mattr=parsed.mattr if (has_cpu or parsed.mattr) else host.mattr,
            num_cores=parsed.num_cores if has_cores else host.num_cores,
        )
    if resolved.kind not in ("llvm", "cuda"):
        raise UnsupportedError(f"relay_tune.build compiles for llvm and cuda targets; got {resolved}")
    return resolved.validate()  # before LLVM sees it: an unknown CPU can abort the process inside LLVM
