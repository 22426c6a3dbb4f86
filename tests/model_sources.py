"""Where tests get whole Relay programs: the project's model zoo always, the conformance corpus beside the
checkout (`../shared/relay_corpus`, never copied into the repository) when it is there.

Tests parametrised over `module_files()` run over every corpus program when the corpus exists and over the zoo
models printed to Relay text in any case, so a clone of the project alone runs every test. Cases that need the
corpus where it is absent are reported as skipped (`corpus_cases`, `corpus_case`, `every_corpus_file`), never
dropped from the parametrisation. A zoo file is written
the way corpus files are: `.relay` text with `/* ty=... */` comments, a `.consts.json` sidecar with the shapes and
dtypes of its constants, and (which the corpus lacks) a `.params.npz` with their real values, which `load_module`
prefers over the sidecar.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from relay_tune.ir import IRModule
from relay_tune.passes import optimize
from relay_tune.testing import zoo
from relay_tune.text import print_module
from relay_tune.text.loader import sidecar_path
from relay_tune.type_infer import infer_types

REPO_ROOT = Path(__file__).resolve().parents[1]
CORPUS_DIR = REPO_ROOT.parent / "shared" / "relay_corpus"
HAVE_CORPUS = CORPUS_DIR.is_dir()

# A bare expression of our own (the corpus has one too), written for the tests;
# it computes (x + y) * (z + w) and its gradient: lets, tuples and projections, four parameters.
INLINE_EXPRESSION = """fn (%x: Tensor[(1), float32], %y: Tensor[(1), float32], %z: Tensor[(1), float32],
    %w: Tensor[(1), float32]) {
  let %sum = (add(%x, %y), add(%z, %w));
  let %value = multiply(%sum.0, %sum.1);
  (%value, (%sum.1, %sum.1, %sum.0, %sum.0))
}
"""

ZOO_PREFIX = "zoo_"
# every zoo model at its small size, and one fused program (primitive functions, as a compiler dump has them)
FUSED_ZOO_MODEL = "resnet18"
ZOO_FILES = [f"{ZOO_PREFIX}{name}.relay" for name in zoo.MODELS] + [f"{ZOO_PREFIX}{FUSED_ZOO_MODEL}_fused.relay"]


def _corpus_files() -> tuple[list[str], list[str]]:
    """(modules, bare expressions) of the corpus, by file name; a module file defines `def @...`."""
    if not HAVE_CORPUS:
        return [], []
    modules, expressions = [], []
    for path in sorted(CORPUS_DIR.glob("*.relay")):
        (modules if "def @" in path.read_text() else expressions).append(path.name)
    return modules, expressions


CORPUS_MODULES, CORPUS_EXPRESSIONS = _corpus_files()


def _needs_corpus(value: str) -> Any:
    """A parametrisation case that is reported as skipped: the corpus (or this file of it) is not there."""
    reason = f"needs {value} from the Relay corpus at {CORPUS_DIR}" if HAVE_CORPUS else \
        f"needs the Relay corpus at {CORPUS_DIR} (not found)"
    return pytest.param(value, marks=pytest.mark.skip(reason=reason))


def module_files() -> list[Any]:
    """Every whole-module program: the corpus's (one skipped case where it is absent) and the zoo's."""
    return [*every_corpus_file(CORPUS_MODULES), *ZOO_FILES]


def in_corpus(*names: str) -> list[str]:
    """Those of `names` that the corpus has: all of them beside a full checkout, none in a clone alone."""
    return [n for n in names if n in CORPUS_MODULES or n in CORPUS_EXPRESSIONS]


def corpus_cases(*names: str) -> list[Any]:
    """Parametrisation cases for these corpus files: those missing are skipped cases, not left out."""
    return [n if in_corpus(n) else _needs_corpus(n) for n in names]


def corpus_case(value: str, *files: str) -> list[Any]:
    """One parametrisation case `value` that reads these corpus files: a skipped case where one is missing."""
    return [value] if len(in_corpus(*files)) == len(files) else [_needs_corpus(value)]


def every_corpus_file(cases: list[Any]) -> list[Any]:
    """Cases drawn from the whole corpus (`CORPUS_MODULES`, `CORPUS_EXPRESSIONS`, a selection of them): as they
    are where the corpus is present, else one skipped case that stands for them all."""
    return cases if HAVE_CORPUS else [_needs_corpus("relay_corpus")]


def zoo_module(file_name: str) -> IRModule:
    """The typed module a zoo file holds (`zoo_resnet18.relay`, `zoo_resnet18_fused.relay`)."""
    stem = file_name.removeprefix(ZOO_PREFIX).removesuffix(".relay")
    fused = stem.endswith("_fused")
    mod = zoo.small(stem.removesuffix("_fused"))
    return infer_types(optimize(mod, opt_level=3)) if fused else mod


def write_zoo_files(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in ZOO_FILES:
        path = zoo.write(zoo_module(name), folder / name)
        constants: list[np.ndarray] = []
        # the same text with type comments, as compiler dumps have them
        path.write_text(print_module(zoo_module(name), show_types=True, constants_out=constants))
        entries = [{"dtype": str(c.dtype), "shape": list(c.shape)} for c in constants]
        sidecar_path(path).write_text(json.dumps({"relay.Constant": entries}))
    return folder


def program_path(name: str, zoo_dir: Path) -> Path:
    """The file of a program named in a parametrisation: a zoo file in `zoo_dir`, else a corpus file."""
    return (zoo_dir if name.startswith(ZOO_PREFIX) else CORPUS_DIR) / name


# A tiny CNN for command-line tuning tests (conv + bias + relu, reshape, dense, softmax: four tasks that tune in
# seconds), written as a `.relay` file with its `.consts.json` sidecar.
TINY_CNN = """#[version = "0.0.5"]
def @main(%data: Tensor[(1, 3, 12, 12), float32]) {
  %0 = nn.conv2d(%data, meta[relay.Constant][0], padding=[1, 1, 1, 1], channels=6, kernel_size=[3, 3]);
  %1 = nn.bias_add(%0, meta[relay.Constant][1]);
  %2 = nn.relu(%1);
  %3 = reshape(%2, newshape=[1, 864]);
  %4 = nn.dense(%3, meta[relay.Constant][2]);
  nn.softmax(%4)
}
"""
TINY_CNN_CONSTS = {"relay.Constant": [
    {"dtype": "float32", "shape": [6, 3, 3, 3]},
    {"dtype": "float32", "shape": [6]},
    {"dtype": "float32", "shape": [20, 864]},
]}


def write_tiny_cnn(folder: Path) -> Path:
    """`folder/tiny.relay` (and its sidecar): the tiny CNN above."""
    path = folder / "tiny.relay"
    path.write_text(TINY_CNN)
    (folder / "tiny.consts.json").write_text(json.dumps(TINY_CNN_CONSTS))
    return path
