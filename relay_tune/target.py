"""Compilation targets: which machine a kernel is compiled for.

A `Target` is plain, immutable data. Its canonical string (`str(target)`) is the key under which tuning
records are stored, so two equal targets always print the same string and `Target.parse(str(t)) == t`.

    llvm -mcpu=znver4 -mattr=+avx2,+avx512f,+fma -num-cores=2
    cuda -arch=sm_90

For LLVM targets the CPU name and feature list go straight to the LLVM target machine; the host CPU and
its features matter a lot (with a generic CPU, fused multiply-adds become library calls).
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import os
import re
import tempfile
import threading
from dataclasses import dataclass, field

import llvmlite.binding as llvm

from relay_tune.errors import RelayTuneError

TARGET_KINDS = ("llvm", "cuda")
MAX_NUM_CORES = 1024  # far above any machine we build for; a larger value is a typo, not a machine

# CPU names LLVM knows, grouped by the widest SIMD unit they imply. Used only when a target names a CPU
# without an explicit feature list (e.g. a string typed by a user, `llvm -mcpu=skylake-avx512`).
_AVX512_CPUS = frozenset(
    {
        "skylake-avx512", "cascadelake", "cooperlake", "cannonlake", "icelake-client", "icelake-server",
        "tigerlake", "rocketlake", "sapphirerapids", "emeraldrapids", "graniterapids", "graniterapids-d",
        "diamondrapids", "knl", "knm", "znver4", "znver5", "x86-64-v4",
    }
)
_AVX2_CPUS = frozenset(
    {
        "haswell", "broadwell", "skylake", "alderlake", "raptorlake", "meteorlake", "arrowlake", "arrowlake-s",
        "lunarlake", "pantherlake", "gracemont", "sierraforest", "grandridge", "clearwaterforest", "znver1",
        "znver2", "znver3", "bdver4", "x86-64-v3",
    }
)
_AVX_CPUS = frozenset({"sandybridge", "ivybridge", "bdver1", "bdver2", "bdver3", "btver2"})


def _cpus(names: str, features: str) -> dict[str, frozenset[str]]:
    return {name: frozenset(features.split()) for name in names.split()}


# The dot-product features (`relay_tune.codegen.llvm_dot`) CPU names imply: AVX512BW/VL, AVX512-VNNI, AVX-VNNI,
# AVX512_BF16.
_DOT_FEATURES_OF_CPU: dict[str, frozenset[str]] = {
    **_cpus("skylake-avx512 x86-64-v4", "avx512bw avx512vl"),
    **_cpus("cascadelake icelake-client icelake-server tigerlake rocketlake", "avx512bw avx512vl avx512vnni"),
    **_cpus("cooperlake znver4 znver5", "avx512bw avx512vl avx512vnni avx512bf16"),
    **_cpus("sapphirerapids emeraldrapids graniterapids graniterapids-d diamondrapids",
            "avx512bw avx512vl avx512vnni avxvnni avx512bf16"),
    **_cpus("alderlake raptorlake meteorlake arrowlake arrowlake-s lunarlake pantherlake gracemont sierraforest "
            "grandridge clearwaterforest", "avxvnni"),
}


class TargetError(RelayTuneError):
    """A malformed or unsupported target string."""


KNOWN_ARCHS = (
    "sm_50", "sm_52", "sm_53", "sm_60", "sm_61", "sm_62", "sm_70", "sm_72", "sm_75", "sm_80", "sm_86",
    "sm_87", "sm_89", "sm_90", "sm_90a", "sm_100", "sm_100a", "sm_101", "sm_101a", "sm_103", "sm_120",
    "sm_120a", "sm_121",
)
"""CUDA architectures the NVPTX back end (`relay_tune.codegen.nvptx`) emits PTX for."""


@dataclass(frozen=True)
class Target:
    """What to compile for.

    kind: "llvm" (host CPU through LLVM) or "cuda" (NVIDIA GPU through NVPTX).
    mcpu: LLVM CPU name ("znver4"); empty means LLVM's generic CPU.
    mattr: LLVM feature flags, each "+name" or "-name", kept sorted so equal sets print equally.
    num_cores: how many cores PARALLEL loops spread over (CPU targets).
    arch: GPU architecture ("sm_90"), CUDA targets only.
    """

    kind: str
    mcpu: str = ""
    mattr: tuple[str, ...] = field(default=())
    num_cores: int = 1
    arch: str = ""

    def __post_init__(self) -> None:
        if self.kind not in TARGET_KINDS:
            raise TargetError(f"unknown target kind {self.kind!r}; expected one of {', '.join(TARGET_KINDS)}")
        features = tuple(sorted(set(self.mattr), key=lambda f: (f[1:], f[0])))
        for feature in features:
            if len(feature) < 2 or feature[0] not in "+-" or any(c in feature for c in " ,="):
                raise TargetError(f"bad target feature {feature!r}: write features as +name or -name")
        object.__setattr__(self, "mattr", features)
        if not isinstance(self.num_cores, int) or self.num_cores < 1:
            raise TargetError(f"num_cores must be a positive integer, got {self.num_cores!r}")
        if self.kind == "cuda":
            if self.mcpu or self.mattr:
                raise TargetError("cuda targets take -arch=sm_XX, not -mcpu/-mattr")
            if self.arch and not (self.arch.startswith("sm_") and self.arch[3:].rstrip("af").isdigit()):
                raise TargetError(f"bad CUDA architecture {self.arch!r}; expected e.g. sm_90")
        elif self.arch:
            raise TargetError("-arch applies to cuda targets only")

    # ----------------------------------------------------------------------------------------------
    # construction
    # ----------------------------------------------------------------------------------------------

    @staticmethod
    def parse(text: str) -> Target:
        """Parse `kind -option=value ...`, e.g. "llvm -mcpu=znver4 -num-cores=2" or "cuda -arch=sm_90".

        `llvm -mcpu=native` (or a bare "native") stands for the host: its CPU, features and core count,
        with any options given after it taking precedence.
        """
        words = text.split()
        if not words:
            raise TargetError("empty target string")
        kind, options = words[0], words[1:]
        if kind == "native":
            kind, options = "llvm", ["-mcpu=native", *options]
        if kind not in TARGET_KINDS:
            raise TargetError(f"unknown target kind {kind!r} in {text!r}; expected one of {', '.join(TARGET_KINDS)}")
        values: dict[str, str] = {}
        for word in options:
            if not word.startswith("-") or "=" not in word:
                raise TargetError(f"bad target option {word!r} in {text!r}; options look like -name=value")
            name, value = word[1:].split("=", 1)
            if name not in ("mcpu", "mattr", "num-cores", "arch"):
                raise TargetError(f"unknown target option -{name} in {text!r}")
            if name in values:
                raise TargetError(f"target option -{name} given twice in {text!r}")
            if not value:
                raise TargetError(f"target option -{name} needs a value in {text!r}")
            values[name] = value
        num_cores_text = values.get("num-cores")
        num_cores: int | None = None
        if num_cores_text is not None:
            if not num_cores_text.isdigit() or int(num_cores_text) < 1:
                raise TargetError(f"-num-cores must be a positive integer, got {num_cores_text!r}")
            num_cores = int(num_cores_text)
        mattr = tuple(f for f in values.get("mattr", "").split(",") if f)
        if values.get("mcpu") == "native":
            host = Target.host()
            return Target(
                kind="llvm",
                mcpu=host.mcpu,
                mattr=mattr or host.mattr,
                num_cores=num_cores or host.num_cores,
            )
        return Target(
            kind=kind,
            mcpu=values.get("mcpu", ""),
            mattr=mattr,
            num_cores=num_cores or 1,
            arch=values.get("arch", ""),
        )

    @staticmethod
    def host(num_cores: int | None = None) -> Target:
        """The machine this process runs on: LLVM's view of its CPU and features, and the cores we may use."""
        mcpu = llvm.get_host_cpu_name()
        try:
            features = tuple(f for f in llvm.get_host_cpu_features().flatten().split(",") if f)
        except RuntimeError:  # LLVM cannot read the features on some hosts: the CPU name alone then decides
            features = ()
        cores = num_cores if num_cores is not None else len(os.sched_getaffinity(0))
        return Target(kind="llvm", mcpu=mcpu, mattr=features, num_cores=cores)

    def validate(self) -> Target:
        """`self` if LLVM (or the CUDA back end) knows its CPU, features, core count and architecture; else a
        `TargetError` naming the valid choices. LLVM itself only warns about an unknown CPU and then may abort
        the process (`-mcpu=bogus` on x86-64 ends in "64-bit code requested on a subtarget that doesn't support
        it"), so nothing may reach it unchecked. The host's own CPU and features are taken as they are."""
        if self.num_cores > MAX_NUM_CORES:
            raise TargetError(f"-num-cores={self.num_cores} is out of range; expected 1 to {MAX_NUM_CORES} "
                              f"(this machine has {os.cpu_count()} cores)")
        if self.kind == "cuda":
            if self.arch and self.arch not in KNOWN_ARCHS:
                raise TargetError(f"unknown CUDA architecture -arch={self.arch}; expected one of "
                                  f"{', '.join(KNOWN_ARCHS)}")
            return self
        host = Target.host()
        if self.mcpu and self.mcpu != host.mcpu:
            cpus = llvm_cpu_names()
            if cpus and self.mcpu not in cpus:
                raise TargetError(f"unknown CPU -mcpu={self.mcpu}{_did_you_mean(self.mcpu, cpus)}; LLVM knows "
                                  f"{', '.join(sorted(cpus))} (or native: this machine)")
        host_features = set(host.mattr)
        known = llvm_cpu_features()
        unknown = [f for f in self.mattr if known and f not in host_features and f[1:] not in known]
        if unknown:
            hint = _did_you_mean(unknown[0][1:], known)
            raise TargetError(f"unknown CPU feature{'s' if len(unknown) > 1 else ''} -mattr={','.join(unknown)}"
                              f"{hint}; LLVM knows {', '.join(sorted(known))} (each written +name or -name)")
        return self

    def with_cores(self, num_cores: int) -> Target:
        """The same target restricted to `num_cores` cores (e.g. single-core measurements)."""
        return Target(self.kind, self.mcpu, self.mattr, num_cores, self.arch)

    # ----------------------------------------------------------------------------------------------
    # queries
    # ----------------------------------------------------------------------------------------------

    def __str__(self) -> str:
        parts = [self.kind]
        if self.mcpu:
            parts.append(f"-mcpu={self.mcpu}")
        if self.mattr:
            parts.append(f"-mattr={','.join(self.mattr)}")
        if self.kind == "llvm":
            parts.append(f"-num-cores={self.num_cores}")
        if self.arch:
            parts.append(f"-arch={self.arch}")
        return " ".join(parts)

    @property
    def log_name(self) -> str:
        """The target's name in tuning logs: short and stable (`str()` lists every LLVM feature, ~1 KB on a
        modern x86). CPU targets keep kind, CPU and cores, and stand for their feature list by a digest:
        "llvm -mcpu=znver4 -num-cores=2 -features=3f2a9c1e"."""
        if self.kind != "llvm" or not self.mattr:
            return str(self)

        digest = hashlib.sha256(",".join(self.mattr).encode()).hexdigest()[:8]
        cpu = f" -mcpu={self.mcpu}" if self.mcpu else ""
        return f"llvm{cpu} -num-cores={self.num_cores} -features={digest}"

    def has_feature(self, name: str) -> bool:
        """Whether feature `name` (without sign) is on: listed as +name, or implied by the CPU when not listed."""
        if f"+{name}" in self.mattr:
            return True
        if f"-{name}" in self.mattr:
            return False
        implied = _features_of_cpu(self.mcpu)
        return name in implied

    @property
    def vector_bits(self) -> int:
        """Width in bits of the SIMD registers code for this target should use (CPU targets)."""
        if self.kind != "llvm":
            return 32
        if self.has_feature("avx512f"):
            return 512
        if self.has_feature("avx") or self.has_feature("avx2"):
            return 256
        return 128

    def vector_lanes(self, dtype: str = "float32") -> int:
        """How many `dtype` elements one SIMD register holds: 16 float32 lanes with AVX-512, 8 with AVX2."""
        bits = _dtype_bits(dtype)
        return max(1, self.vector_bits // bits)

    @property
    def llvm_features(self) -> str:
        """The feature string handed to the LLVM target machine."""
        return ",".join(self.mattr)


_HELP_LOCK = threading.Lock()


@functools.cache
def _llvm_help() -> tuple[frozenset[str], frozenset[str]]:
    """The CPU names and feature names LLVM's host target knows, from its own `-mcpu=help` listing.

    llvmlite has no call that lists them, but creating a target machine for the CPU "help" makes LLVM print
    both lists to stderr (and nothing else happens: the machine is thrown away). The listing goes to file
    descriptor 2 from C++, so it is captured by pointing that descriptor at a temporary file for the call."""
    llvm.initialize_native_target()
    triple = llvm.get_process_triple()
    with _HELP_LOCK, tempfile.TemporaryFile() as capture:
        saved = os.dup(2)
        try:
            os.dup2(capture.fileno(), 2)
            llvm.Target.from_triple(triple).create_target_machine(cpu="help")
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        capture.seek(0)
        text = capture.read().decode(errors="replace")
    cpus: set[str] = set()
    features: set[str] = set()
    section: set[str] | None = None
    for line in text.splitlines():
        if line.startswith("Available CPUs"):
            section = cpus
        elif line.startswith("Available features"):
            section = features
        elif section is not None:
            match = re.match(r"^\s+(\S+)\s+- ", line)
            if match:
                section.add(match.group(1))
    # An LLVM that prints no listing leaves both sets empty: validation then lets every name through rather than
    # refusing every target.
    return frozenset(cpus), frozenset(features)


def llvm_cpu_names() -> frozenset[str]:
    """CPU names valid for `-mcpu` on this machine's LLVM target (x86-64: haswell, znver4, ...)."""
    return _llvm_help()[0]


def llvm_cpu_features() -> frozenset[str]:
    """Feature names valid in `-mattr` (without the +/- sign) on this machine's LLVM target."""
    return _llvm_help()[1]


def _did_you_mean(word: str, choices: frozenset[str]) -> str:
    close = difflib.get_close_matches(word, sorted(choices), n=3, cutoff=0.6)
    return f" (did you mean {' or '.join(close)}?)" if close else ""


def _features_of_cpu(mcpu: str) -> frozenset[str]:
    dot = _DOT_FEATURES_OF_CPU.get(mcpu, frozenset())
    if mcpu in _AVX512_CPUS:
        return frozenset({"avx512f", "avx2", "avx", "fma"}) | dot
    if mcpu in _AVX2_CPUS:
        return frozenset({"avx2", "avx", "fma"}) | dot
    if mcpu in _AVX_CPUS:
        return frozenset({"avx"})
    return dot


def _dtype_bits(dtype: str) -> int:
    if dtype == "bool":
        return 8
    digits = "".join(c for c in dtype if c.isdigit())
    if not digits:
        raise TargetError(f"unknown dtype {dtype!r}")
    return int(digits)


@dataclass(frozen=True)
class DotFeatures:
    """What the target offers for byte and bfloat16 dot products: register width in bytes and the instruction
    sets."""

    register_bytes: int = 16
    vnni: bool = False  # vpdpbusd at `register_bytes` (AVX512-VNNI with the width's AVX-512 parts, or AVX-VNNI)
    pmaddubsw: bool = False  # vpmaddubsw / vpmaddwd at `register_bytes` (SSSE3, AVX2, AVX512BW)
    bf16: bool = False  # vdpbf16ps at `register_bytes` (AVX512_BF16; with AVX512VL below 512 bits)
    vex: bool = False  # three-operand vector integer forms (vpaddd) at `register_bytes` (AVX, AVX2, AVX-512)

    @staticmethod
    def for_target(target: Target) -> DotFeatures:
        """The features of an LLVM CPU target: its listed features, or those its CPU name implies."""
        has = target.has_feature
        vector_bits = target.vector_bits
        # AVX512_BF16 needs AVX512F (turning it off turns off everything AVX-512), and AVX512VL below 512 bits
        bf16 = has("avx512bf16") and has("avx512f") and (vector_bits >= 512 or has("avx512vl"))
        if vector_bits >= 512 and has("avx512bw"):
            return DotFeatures(64, has("avx512vnni"), True, bf16=bf16, vex=True)
        if vector_bits >= 256 and has("avx2"):
            return DotFeatures(32, has("avxvnni") or (has("avx512vnni") and has("avx512vl")), True, bf16=bf16, vex=True)
        return DotFeatures(16, has("avxvnni") or (has("avx512vnni") and has("avx512vl")), has("ssse3") or has("avx"),
                           bf16=bf16, vex=has("avx"))
