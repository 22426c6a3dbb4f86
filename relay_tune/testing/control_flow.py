"""Relay programs with control flow (branches, recursive loops, closures, tuples), as the virtual machine runs
them (`relay_tune.runtime.vm`): the test programs and the RNN of the `relay-vm` benchmark.

    from relay_tune.testing.control_flow import rnn_recursive, rnn_unrolled
    recursive = parse_module(rnn_recursive(steps=64, hidden=32))     # @loop calls itself once per step
    unrolled = parse_module(rnn_unrolled(steps=64, hidden=32))       # the same cell written out 64 times

Both RNNs compute h_{t+1} = tanh(dense(h_t, W) + dense(x_t, U) + b) from h_0 for `steps` steps over inputs
xs[t] and return the last state; they differ only in how the loop is written.
"""

from __future__ import annotations

HEADER = '#[version = "0.0.5"]\n'


def _rnn_signature(steps: int, batch: int, hidden: int, features: int) -> str:
    return (f"%xs: Tensor[({steps}, {batch}, {features}), float32], %h0: Tensor[({batch}, {hidden}), float32], "
            f"%w: Tensor[({hidden}, {hidden}), float32], %u: Tensor[({hidden}, {features}), float32], "
            f"%b: Tensor[({hidden}), float32]")


def _cell(state: str, step: str) -> str:
    return f"tanh(add(add(nn.dense({state}, %w), nn.dense(take(%xs, {step}, axis=0), %u)), %b))"


def rnn_recursive(steps: int = 64, hidden: int = 32, batch: int = 1, features: int = 16) -> str:
    """The RNN as a recursive global function `@loop(%i, %h, ...)` that calls itself until `%i` reaches `steps`."""
    state = f"Tensor[({batch}, {hidden}), float32]"
    return (
        HEADER
        + f"def @loop(%i: int32, %h: {state}, {_rnn_signature(steps, batch, hidden, features)}) -> {state} {{\n"
        + f"  if (less(%i, {steps})) {{\n"
        + f"    @loop(add(%i, 1), {_cell('%h', '%i')}, %xs, %h0, %w, %u, %b)\n"
        + "  } else {\n    %h\n  }\n}\n"
        + f"def @main({_rnn_signature(steps, batch, hidden, features)}) -> {state} {{\n"
        + "  @loop(0, %h0, %xs, %h0, %w, %u, %b)\n}\n"
    )


def rnn_unrolled(steps: int = 64, hidden: int = 32, batch: int = 1, features: int = 16) -> str:
    """The same RNN with its `steps` cells written out one after another (a static graph)."""
    lines = [HEADER, f"def @main({_rnn_signature(steps, batch, hidden, features)}) {{\n"]
    state = "%h0"
    for step in range(steps):
        lines.append(f"  %{step} = {_cell(state, str(step))};\n")
        state = f"%{step}"
    lines.append(f"  {state}\n}}\n")
    return "".join(lines)


BRANCH = HEADER + """def @main(%x: Tensor[(3, 5), float32], %y: Tensor[(3, 5), float32]) {
  %0 = if (greater(sum(%x), 0f)) {
    exp(multiply(add(%x, %y), 0.5f))
  } else {
    negative(sigmoid(subtract(%x, %y)))
  };
  add(%0, %y)
}
"""
"""`if` on a data-dependent scalar: both branches hold fused kernels, and a kernel runs after the join."""

LOOP = HEADER + """def @loop(%i: int32, %acc: Tensor[(2, 7), float32], %x: Tensor[(2, 7), float32],
          %w: Tensor[(7, 7), float32]) -> Tensor[(2, 7), float32] {
  if (less(%i, 9)) {
    @loop(add(%i, 1), tanh(add(nn.dense(%acc, %w), %x)), %x, %w)
  } else {
    %acc
  }
}
def @main(%x: Tensor[(2, 7), float32], %w: Tensor[(7, 7), float32]) {
  %0 = @loop(0, %x, %x, %w);
  multiply(%0, 2f)
}
"""
"""A recursive loop (a counter to a bound, accumulating tanh(dense(acc, w) + x)) whose result is used after it:
the call is not in tail position, so it runs in a frame of its own."""

NESTED = HEADER + """def @count(%n: int32, %x: Tensor[(4), float32]) -> Tensor[(4), float32] {
  if (greater(%n, 0)) {
    %0 = @count(subtract(%n, 1), %x);
    add(multiply(%0, 0.5f), sin(%x))
  } else {
    %x
  }
}
def @main(%x: Tensor[(4), float32], %n: int32) {
  @count(%n, %x)
}
"""
"""Recursion that is not a tail call (each level uses its callee's result): one frame per level."""

CLOSURES = HEADER + """def @main(%x: Tensor[(2, 3), float32], %y: Tensor[(2, 3), float32]) {
  let %scale = fn (%a: Tensor[(2, 3), float32]) -> Tensor[(2, 3), float32] {
    add(multiply(%a, %y), 1f)
  };
  let %once = %scale(%x);
  let %twice = %scale(%once);
  let %t = (%once, tanh(%twice), %x);
  %0 = %t.1;
  %1 = %t.0;
  (add(%0, %1), %t.2)
}
"""
"""A let-bound closure over %y called twice, a tuple built and projected, a tuple returned."""

RECURSIVE_CLOSURE = HEADER + """def @main(%x: Tensor[(5), float32], %k: int32) {
  let %f = fn (%y: Tensor[(5), float32], %n: int32) -> Tensor[(5), float32] {
    if (less(%n, 1)) { %y } else { %f(nn.softmax(add(%y, %x)), subtract(%n, 1)) }
  };
  %f(%x, %k)
}
"""
"""A recursive let-bound closure (it calls itself through its own variable) capturing %x."""

FIBONACCI = HEADER + """def @fib(%i: int32, %a: Tensor[(3), float32],
         %b: Tensor[(3), float32]) -> Tensor[(3), float32] {
  if (less(%i, 6)) { @fib(add(%i, 1), %b, add(%a, %b)) } else { %a }
}
def @main(%a: Tensor[(3), float32], %b: Tensor[(3), float32]) { @fib(0, %a, %b) }
"""
"""A tail-recursive loop that passes one parameter's value on to another (%b becomes %a): a value that lives two
iterations, which the native loop does not take (the VM runs it instruction by instruction)."""

LIST_SUM = HEADER + """type List[A] {
  Cons(A, List[A]),
  Nil,
}
def @build(%n: int32, %x: Tensor[(2, 3), float32]) -> List[Tensor[(2, 3), float32]] {
  if (greater(%n, 0)) {
    Cons(multiply(%x, cast(%n, dtype="float32")), @build(subtract(%n, 1), %x))
  } else {
    Nil
  }
}
def @sum(%l: List[Tensor[(2, 3), float32]], %acc: Tensor[(2, 3), float32]) -> Tensor[(2, 3), float32] {
  match (%l) {
    Cons(%h, %t) => @sum(%t, add(%acc, tanh(%h))),
    Nil => %acc,
  }
}
def @main(%x: Tensor[(2, 3), float32], %n: int32) {
  %0 = @build(%n, %x);
  %1 = match (%0) {
    Cons(%first, Cons(_, _)) => %first,
    _ => negative(%x),
  };
  (@sum(%0, zeros_like(%x)), %1)
}
"""
"""An algebraic data type: a list of n tensors built by recursion (x * n, x * (n - 1), ..., x), summed through
tanh by a recursive `match`, and its head taken when it has at least two elements (nested constructor patterns)."""

CONV_LOOP = HEADER + """def @loop(%i: int32, %x: Tensor[(1, 8, 9, 9), float32],
          %w: Tensor[(8, 8, 3, 3), float32]) -> Tensor[(1, 8, 9, 9), float32] {
  if (less(%i, 3)) {
    @loop(add(%i, 1), nn.relu(nn.conv2d(%x, %w, padding=[1, 1, 1, 1], channels=8, kernel_size=[3, 3])), %w)
  } else {
    %x
  }
}
def @main(%x: Tensor[(1, 8, 9, 9), float32], %w: Tensor[(8, 8, 3, 3), float32]) { @loop(0, %x, %w) }
"""
"""A convolution in a loop body: the layout-planned, packed-weight kernels of a CNN inside a native loop."""

SPLIT_BRANCHES = HEADER + """def @main(%x: Tensor[(4, 6), float32]) {
  %0 = split(%x, indices_or_sections=2, axis=1);
  %1 = if (greater(max(%x), 0.5f)) {
    concatenate((add(%0.0, %0.1), %0.1), axis=1)
  } else {
    concatenate((%0.1, %0.0), axis=1)
  };
  %2 = reshape(%1, newshape=[-1]);
  if (less(min(%x), -0.5f)) { (%2, %0.0) } else { (negative(%2), %0.1) }
}
"""
"""Kernels with tuple results (split), concatenations and a reshape (a view) around two data-dependent branches."""
