"""Per-core peak throughput of the multiply-add instructions int8 and fp32 products use, measured on this CPU.

Each measurement is a generated LLVM loop of `CHAINS` independent accumulator chains, one instruction sequence per
chain and iteration, compiled for the host and timed; the chains hide the latency, so the loop runs at the
throughput of the ports the sequence needs. Every chain feeds its own accumulator back into its operands, so LLVM
cannot hoist the products out of the loop.

| sequence              | per `<W x i32>`/`<W x float>` register                        | ops (2 per multiply-add) |
|-----------------------|---------------------------------------------------------------|--------------------------|
| `fma`                 | vfmadd231ps                                                    | 2 W                      |
| `pmaddwd`             | vpmaddwd + vpaddd (i16 x i16 pairs into i32)                   | 4 W                      |
| `pmaddubsw+pmaddwd`   | vpmaddubsw + vpmaddwd(ones) + vpaddd (u8 x s8 quads into i32)  | 8 W                      |
| `vpdpbusd`            | vpdpbusd (u8 x s8 quads into i32; VNNI hosts only)             | 8 W                      |
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass

CHAINS = 12
ITERATIONS = 2_000_000


@dataclass(frozen=True)
class Peak:
    """One sequence's measured throughput on one core."""

    name: str
    gops: float  # giga-ops per second (a multiply-add is 2 ops)
    ops_per_cycle: float  # at the clock given to `measure_peaks`


def _host_machine(jit: bool = False) -> object:
    import llvmlite.binding as llvm

    from relay_tune.codegen.llvm import ensure_llvm_initialized

    ensure_llvm_initialized()
    features = llvm.get_host_cpu_features().flatten()
    return llvm.Target.from_default_triple().create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=features, opt=3, jit=jit)


def _loop(name: str, lanes: int, body: str, setup: str, declares: str) -> str:
    """IR of `i64 @name(i64 n)`: `n` iterations of `body` on CHAINS accumulators `%a{c}` (`<lanes x i32>`); the
    accumulators' sum is returned so that nothing is dead."""
    vec = f"<{lanes} x i32>"
    phis = "\n".join(f"  %a{c} = phi {vec} [ %init{c}, %entry ], [ %n{c}, %loop ]" for c in range(CHAINS))
    inits = "\n".join(f"  %init{c} = add {vec} %seed, <{', '.join(f'i32 {c + 1}' for _ in range(lanes))}>"
                      for c in range(CHAINS))
    bodies = "\n".join(body.replace("{c}", str(c)).replace("{vec}", vec) for c in range(CHAINS))
    total = [f"%a{0}_out"]
    sums = [f"  %a0_out = add {vec} %n0, zeroinitializer"]
    for c in range(1, CHAINS):
        sums.append(f"  %s{c} = add {vec} %{total[-1][1:]}, %n{c}")
        total.append(f"%s{c}")
    return f"""
{declares}
define i64 @{name}(i64 %count, i32 %x) {{
entry:
  %xv = insertelement {vec} undef, i32 %x, i32 0
  %seed = shufflevector {vec} %xv, {vec} undef, <{lanes} x i32> zeroinitializer
{setup}
{inits}
  br label %loop
loop:
  %i = phi i64 [ 0, %entry ], [ %i.next, %loop ]
{phis}
{bodies}
  %i.next = add i64 %i, 1
  %done = icmp eq i64 %i.next, %count
  br i1 %done, label %exit, label %loop
exit:
{chr(10).join(sums)}
  %e = extractelement {vec} {total[-1]}, i32 0
  %r = sext i32 %e to i64
  ret i64 %r
}}
"""


def _sequences(lanes: int, vnni: bool) -> dict[str, tuple[str, int]]:
    """Per sequence: its loop's IR and the ops of one chain's iteration."""
    bytes_ = 4 * lanes
    vec, b8, w16 = f"<{lanes} x i32>", f"<{bytes_} x i8>", f"<{2 * lanes} x i16>"
    bits = 32 * lanes
    ubsw = {128: "llvm.x86.ssse3.pmadd.ub.sw.128", 256: "llvm.x86.avx2.pmadd.ub.sw",
            512: "llvm.x86.avx512.pmaddubs.w.512"}[bits]
    wd = {128: "llvm.x86.sse2.pmadd.wd", 256: "llvm.x86.avx2.pmadd.wd", 512: "llvm.x86.avx512.pmaddw.d.512"}[bits]
    fvec = f"<{lanes} x float>"
    ones = f"<{', '.join('i16 1' for _ in range(2 * lanes))}>"
    seqs = {
        "fma": (_loop("peak_fma", lanes, (
            "  %f{c} = bitcast {vec} %a{c} to " + fvec + "\n"
            "  %g{c} = call " + fvec + " @llvm.fma.v" + str(lanes) + "f32(" + fvec + " %f{c}, " + fvec + " %fx, "
            + fvec + " %fy)\n  %n{c} = bitcast " + fvec + " %g{c} to {vec}"),
            f"  %fx = bitcast {vec} %seed to {fvec}\n  %fy = fadd {fvec} %fx, %fx",
            f"declare {fvec} @llvm.fma.v{lanes}f32({fvec}, {fvec}, {fvec})"), 2 * lanes),
        "pmaddwd": (_loop("peak_pmaddwd", lanes, (
            "  %w{c} = bitcast {vec} %a{c} to " + w16 + "\n"
            "  %p{c} = call {vec} @" + wd + "(" + w16 + " %w{c}, " + w16 + " %wb)\n"
            "  %n{c} = add {vec} %p{c}, %seed"),
            f"  %wb = bitcast {vec} %seed to {w16}",
            f"declare {vec} @{wd}({w16}, {w16})"), 4 * lanes),
        "pmaddubsw+pmaddwd": (_loop("peak_pmaddubsw", lanes, (
            "  %u{c} = bitcast {vec} %a{c} to " + b8 + "\n"
            "  %h{c} = call " + w16 + " @" + ubsw + "(" + b8 + " %u{c}, " + b8 + " %bb)\n"
            "  %p{c} = call {vec} @" + wd + "(" + w16 + " %h{c}, " + w16 + " " + ones + ")\n"
            "  %n{c} = add {vec} %a{c}, %p{c}"),
            f"  %bb = bitcast {vec} %seed to {b8}",
            f"declare {w16} @{ubsw}({b8}, {b8})\ndeclare {vec} @{wd}({w16}, {w16})"), 8 * lanes),
    }
    if vnni:
        seqs["vpdpbusd"] = (_loop("peak_vpdpbusd", lanes, (
            "  %n{c} = call {vec} @llvm.x86.avx512.vpdpbusd." + str(bits) + "({vec} %a{c}, " + b8 + " %bb, " + b8
            + " %bb)"),
            f"  %bb = bitcast {vec} %seed to {b8}",
            f"declare {vec} @llvm.x86.avx512.vpdpbusd.{bits}({vec}, {b8}, {b8})"), 8 * lanes)
    return seqs


def measure_peaks(ghz: float, repeat: int = 5) -> list[Peak]:
    """The per-core peak of every sequence this host has (best of `repeat` timings of ITERATIONS iterations)."""
    import llvmlite.binding as llvm

    from relay_tune.codegen.llvm_dot import DotFeatures
    from relay_tune.target import Target

    target = Target.host(num_cores=1)
    features = DotFeatures.for_target(target)
    lanes = target.vector_bits // 32
    peaks = []
    engines = []  # kept alive until every function has run
    for name, (text, ops) in _sequences(lanes, features.vnni).items():
        module = llvm.parse_assembly(text)
        module.verify()
        engine = llvm.create_mcjit_compiler(module, _host_machine(jit=True))  # type: ignore[arg-type]
        engines.append(engine)
        engine.finalize_object()
        symbol = text.split("define i64 @", 1)[1].split("(", 1)[0]
        fn = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64, ctypes.c_int32)(engine.get_function_address(symbol))
        fn(1000, 3)
        best = float("inf")
        for _ in range(repeat):
            start = time.perf_counter()
            fn(ITERATIONS, 3)
            best = min(best, time.perf_counter() - start)
        gops = ops * CHAINS * ITERATIONS / best / 1e9
        peaks.append(Peak(name, gops, gops / ghz if ghz else 0.0))
    return peaks


def assembly_of(name: str) -> str:
    """The host assembly of one sequence's loop (for checking which instructions it runs)."""
    import llvmlite.binding as llvm

    from relay_tune.codegen.llvm_dot import DotFeatures
    from relay_tune.target import Target

    target = Target.host(num_cores=1)
    text, _ = _sequences(target.vector_bits // 32, DotFeatures.for_target(target).vnni)[name]
    module = llvm.parse_assembly(text)
    return _host_machine().emit_assembly(module)  # type: ignore[attr-defined]
