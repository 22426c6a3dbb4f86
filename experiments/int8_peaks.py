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
WINDOW = 4096  # bytes of the buffer the loops read (L1-resident)
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


def _loop(name: str, lanes: int, body: str, declares: str) -> str:
    """IR of `i64 @name(i64 n, ptr buf)`: `n` iterations of `body` on CHAINS accumulators `%a{c}` (`<lanes x i32>`).
    Chain `c` reads its operand `%x{c}` from `buf` (a 4 KiB window that stays in L1, moving each iteration) and its
    other operand from one of two loop-invariant registers `%w0`, `%w1`, as a convolution's inner loop reads input
    pixels and keeps weight rows; the accumulators' sum is returned so that nothing is dead."""
    vec = f"<{lanes} x i32>"
    width = 4 * lanes
    phis = "\n".join(f"  %a{c} = phi {vec} [ zeroinitializer, %entry ], [ %n{c}, %loop ]" for c in range(CHAINS))
    loads = "\n".join(
        f"  %o{c} = add i64 %base, {c * width}\n"
        f"  %q{c} = getelementptr i8, ptr %buf, i64 %o{c}\n"
        f"  %x{c} = load {vec}, ptr %q{c}, align 1" for c in range(CHAINS))
    bodies = "\n".join(body.replace("{c}", str(c)).replace("{w}", f"%w{c % 2}").replace("{vec}", vec)
                       for c in range(CHAINS))
    sums = [f"  %s0 = add {vec} %n0, zeroinitializer"]
    sums += [f"  %s{c} = add {vec} %s{c - 1}, %n{c}" for c in range(1, CHAINS)]
    return f"""
{declares}
define i64 @{name}(i64 %count, ptr %buf) {{
entry:
  %w0 = load {vec}, ptr %buf, align 1
  %wp = getelementptr i8, ptr %buf, i64 {width}
  %w1 = load {vec}, ptr %wp, align 1
  br label %loop
loop:
  %i = phi i64 [ 0, %entry ], [ %i.next, %loop ]
{phis}
  %step = mul i64 %i, {width}
  %base = and i64 %step, {WINDOW - 1}
{loads}
{bodies}
  %i.next = add i64 %i, 1
  %done = icmp eq i64 %i.next, %count
  br i1 %done, label %exit, label %loop
exit:
{chr(10).join(sums)}
  %e = extractelement {vec} %s{CHAINS - 1}, i32 0
  %r = sext i32 %e to i64
  ret i64 %r
}}
"""


def _sequences(lanes: int, vnni: bool) -> dict[str, tuple[str, int]]:
    """Per sequence: its loop's IR and the ops of one chain's iteration."""
    from relay_tune.codegen.llvm_dot import PMADDUBSW_INTRINSICS, PMADDWD_INTRINSICS

    vec, b8, w16, fvec = f"<{lanes} x i32>", f"<{4 * lanes} x i8>", f"<{2 * lanes} x i16>", f"<{lanes} x float>"
    bits = 32 * lanes
    ubsw, wd = PMADDUBSW_INTRINSICS[bits // 8], PMADDWD_INTRINSICS[bits // 8]
    fma = f"llvm.fma.v{lanes}f32"
    ones = f"<{', '.join('i16 1' for _ in range(2 * lanes))}>"
    seqs = {
        "fma": (_loop("peak_fma", lanes, (
            f"  %f{{c}} = bitcast {{vec}} %a{{c}} to {fvec}\n  %xf{{c}} = bitcast {{vec}} %x{{c}} to {fvec}\n"
            f"  %wf{{c}} = bitcast {{vec}} {{w}} to {fvec}\n"
            f"  %g{{c}} = call {fvec} @{fma}({fvec} %xf{{c}}, {fvec} %wf{{c}}, {fvec} %f{{c}})\n"
            f"  %n{{c}} = bitcast {fvec} %g{{c}} to {{vec}}"),
            f"declare {fvec} @{fma}({fvec}, {fvec}, {fvec})"), 2 * lanes),
        "pmaddwd": (_loop("peak_pmaddwd", lanes, (
            f"  %xw{{c}} = bitcast {{vec}} %x{{c}} to {w16}\n  %ww{{c}} = bitcast {{vec}} {{w}} to {w16}\n"
            f"  %p{{c}} = call {{vec}} @{wd}({w16} %xw{{c}}, {w16} %ww{{c}})\n"
            f"  %n{{c}} = add {{vec}} %a{{c}}, %p{{c}}"),
            f"declare {vec} @{wd}({w16}, {w16})"), 4 * lanes),
        "pmaddubsw+pmaddwd": (_loop("peak_pmaddubsw", lanes, (
            f"  %xb{{c}} = bitcast {{vec}} %x{{c}} to {b8}\n  %wb{{c}} = bitcast {{vec}} {{w}} to {b8}\n"
            f"  %h{{c}} = call {w16} @{ubsw}({b8} %xb{{c}}, {b8} %wb{{c}})\n"
            f"  %p{{c}} = call {{vec}} @{wd}({w16} %h{{c}}, {w16} {ones})\n"
            f"  %n{{c}} = add {{vec}} %a{{c}}, %p{{c}}"),
            f"declare {w16} @{ubsw}({b8}, {b8})\ndeclare {vec} @{wd}({w16}, {w16})"), 8 * lanes),
    }
    if vnni:
        dp = f"llvm.x86.avx512.vpdpbusd.{bits}"
        seqs["vpdpbusd"] = (_loop("peak_vpdpbusd", lanes, (
            f"  %xb{{c}} = bitcast {{vec}} %x{{c}} to {b8}\n  %wb{{c}} = bitcast {{vec}} {{w}} to {b8}\n"
            f"  %n{{c}} = call {{vec}} @{dp}({{vec}} %a{{c}}, {b8} %xb{{c}}, {b8} %wb{{c}})"),
            f"declare {vec} @{dp}({vec}, {b8}, {b8})"), 8 * lanes)
    return seqs


def measure_peaks(ghz: float, repeat: int = 5) -> list[Peak]:
    """The per-core peak of every sequence this host has (best of `repeat` timings of ITERATIONS iterations)."""
    import llvmlite.binding as llvm

    from relay_tune.codegen.llvm_dot import DotFeatures
    from relay_tune.target import Target

    target = Target.host(num_cores=1)
    features = DotFeatures.for_target(target)
    lanes = target.vector_bits // 32
    # the window plus the widest chain's reach past its end, small random bytes (no overflow in any sequence)
    data = (ctypes.c_int8 * (WINDOW + CHAINS * 64 + 64))(*[(7 * i) % 5 - 2 for i in range(WINDOW + CHAINS * 64 + 64)])
    buffer = ctypes.cast(data, ctypes.c_void_p)
    peaks = []
    engines = []  # kept alive until every function has run
    for name, (text, ops) in _sequences(lanes, features.vnni).items():
        module = llvm.parse_assembly(text)
        module.verify()
        engine = llvm.create_mcjit_compiler(module, _host_machine(jit=True))  # type: ignore[arg-type]
        engines.append(engine)
        engine.finalize_object()
        symbol = text.split("define i64 @", 1)[1].split("(", 1)[0]
        fn = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p)(engine.get_function_address(symbol))
        fn(1000, buffer)
        best = float("inf")
        for _ in range(repeat):
            start = time.perf_counter()
            fn(ITERATIONS, buffer)
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
