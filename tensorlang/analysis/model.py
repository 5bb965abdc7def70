"""The checked model of a file: what the AST means once names, shapes and types are known.

Everything downstream (lowering, the reference interpreter, the Space Builder, the
language server's hovers) reads this model rather than re-deriving it from the AST.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

from tensorlang.analysis.dtypes import BYTES
from tensorlang.parser import ast as A

# Math functions of the index notation: name -> number of arguments.
FUNCTIONS = {
    "exp": 1, "exp2": 1, "log": 1, "log2": 1, "sqrt": 1, "rsqrt": 1, "tanh": 1, "sigmoid": 1,
    "erf": 1, "abs": 1, "relu": 1, "sin": 1, "cos": 1, "floor": 1, "ceil": 1, "round": 1,
    "max": 2, "min": 2, "pow": 2,
}
REDUCERS = {"+=": "sum", "max=": "max", "min=": "min", "=": None}


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    role: str  # "input" | "output" | "intermediate"
    span: A.Span = A.NO_SPAN  # where it is declared (or first computed)

    @property
    def nbytes(self) -> int:
        return prod(self.shape) * BYTES[self.dtype]


@dataclass(frozen=True)
class Index:
    name: str
    extent: int
    kind: str  # "spatial" | "reduce"


@dataclass(frozen=True)
class StageModel:
    """One stage: the tensor it writes, its loops in order, and its reduction."""
    ast: A.Stage
    tensor: str
    spatial: tuple[Index, ...]
    reduce: tuple[Index, ...]
    reducer: str | None  # "sum" | "max" | "min" | None
    dtype: str
    flops_per_point: int

    @property
    def loops(self) -> tuple[Index, ...]:
        return self.spatial + self.reduce

    @property
    def flops(self) -> int:
        return prod(i.extent for i in self.loops) * self.flops_per_point

    @property
    def is_reduction(self) -> bool:
        return self.reducer is not None


@dataclass(frozen=True)
class OpModel:
    ast: A.Op
    tensors: dict[str, Tensor]
    stages: tuple[StageModel, ...]

    @property
    def name(self) -> str:
        return self.ast.name

    @property
    def inputs(self) -> list[Tensor]:
        return [self.tensors[p.name] for p in self.ast.inputs]

    @property
    def outputs(self) -> list[Tensor]:
        return [self.tensors[p.name] for p in self.ast.outputs]

    @property
    def flops(self) -> int:
        return sum(s.flops for s in self.stages)

    @property
    def bytes(self) -> int:
        """Compulsory memory traffic: every input read once, every output written once."""
        return sum(t.nbytes for t in self.inputs + self.outputs)

    def stage(self, name: str) -> StageModel | None:
        return next((s for s in self.stages if s.tensor == name), None)


@dataclass(frozen=True)
class TargetModel:
    name: str
    kind: str  # "llvm" | "cuda"
    params: dict  # validated parameters (see analysis/targets.py)
    span: A.Span = A.NO_SPAN
    builtin: bool = False

    @property
    def is_gpu(self) -> bool:
        return self.kind == "cuda"


@dataclass
class ModuleModel:
    ast: A.Module
    targets: dict[str, TargetModel] = field(default_factory=dict)
    ops: dict[str, OpModel] = field(default_factory=dict)
    # schedules whose op and target are known and whose op checked cleanly
    schedules: list[A.Schedule] = field(default_factory=list)

    def schedule_for(self, op: str, target: str) -> A.Schedule | None:
        return next((s for s in self.schedules if s.op == op and s.target == target), None)
