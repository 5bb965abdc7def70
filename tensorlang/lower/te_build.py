"""Checked operator -> TVM PrimFunc, through TVM's tensor expressions (te.compute).

Each stage becomes one `te.compute` named after the tensor it writes, so the PrimFunc's
blocks carry the stage names and its loops the index names of the source (`C.i`, `C.k`).
Spatial loops follow the left-hand side's order, reduction loops their first appearance.
"""
from __future__ import annotations

from tensorlang.analysis import dtypes as D
from tensorlang.analysis.check import expr_type, unify
from tensorlang.analysis.model import OpModel, StageModel
from tensorlang.parser import ast as A


def build_primfunc(op: OpModel):
    import tvm
    from tvm import te

    tensors = {}
    for t in op.inputs:
        tensors[t.name] = te.placeholder(t.shape, D.TVM_DTYPE[t.dtype], name=t.name)
    for st in op.stages:
        tensors[st.tensor] = _compute(st, op, tensors)
    args = [tensors[t.name] for t in op.inputs] + [tensors[t.name] for t in op.outputs]
    func = te.create_prim_func(args).with_attr("global_symbol", "main")
    return tvm.IRModule({"main": func})


def _compute(st: StageModel, op: OpModel, tensors):
    from tvm import te

    shape = [i.extent for i in st.spatial]
    names = [i.name for i in st.spatial]

    def body(*spatial_vars):
        env = dict(zip(names, spatial_vars))
        raxes = [te.reduce_axis((0, i.extent), name=i.name) for i in st.reduce]
        env.update({i.name: ax.var for i, ax in zip(st.reduce, raxes)})
        builder = _ExprBuilder(op, tensors, env)
        value = builder.emit(st.ast.rhs, st.dtype)
        if not raxes:
            return value
        reducer = {"sum": te.sum, "max": te.max, "min": te.min}[st.reducer]
        return reducer(value, axis=raxes)

    # te.compute names the loop variables after the lambda's parameters: give it the source's names.
    fcompute = _named_lambda(names, body)
    return te.compute(shape, fcompute, name=st.tensor, tag=st.reducer or "elemwise")


def _named_lambda(names, body):
    if not names:
        return lambda: body()
    src = f"lambda {', '.join(names)}: body({', '.join(names)})"
    return eval(src, {"body": body})  # names are identifiers checked by the grammar


def expr_dtype(value) -> str:
    """A PrimExpr's dtype as a string (TVM 0.27 spells the attribute `ty`)."""
    dtype = getattr(value, "dtype", None)
    return str(dtype if dtype is not None else value.ty)


class _ExprBuilder:
    """Index-notation expression -> TVM PrimExpr, with the checker's typing rules."""

    def __init__(self, op: OpModel, tensors, env):
        self.op, self.tensors, self.env = op, tensors, env

    def type_of(self, e: A.Expr) -> str:
        return expr_type(e, self.op.tensors)

    def emit(self, e: A.Expr, want: str):
        """Emit `e` converted to dtype `want` (a concrete language dtype)."""
        value = self._emit(e, want)
        tvm_dtype = D.TVM_DTYPE[want]
        if expr_dtype(value) != tvm_dtype:
            value = value.astype(tvm_dtype)
        return value

    def _concrete(self, t: str, want: str) -> str:
        if t in D.TVM_DTYPE:
            return t
        if t == D.WEAK_FLOAT:
            return want if want in D.FLOATS else "f32"
        return want if want in D.INTS or (want in D.FLOATS and t == D.WEAK_INT) else "i32"

    def _emit(self, e: A.Expr, want: str):
        from tvm import tirx

        if isinstance(e, A.Num):
            return tirx.const(e.value, D.TVM_DTYPE[self._concrete(self.type_of(e), want)])
        if isinstance(e, A.Var):
            return self.env[e.name]
        if isinstance(e, A.Paren):
            return self._emit(e.expr, want)
        if isinstance(e, A.Access):
            return self.tensors[e.tensor][tuple(self.emit(i, "i32") if not isinstance(A.strip_parens(i), A.Var)
                                                else self._emit(i, "i32") for i in e.indices)]
        if isinstance(e, A.Neg):
            return -self.emit(e.operand, self._concrete(self.type_of(e), want))
        if isinstance(e, A.Not):
            return tirx.Not(self._emit(e.operand, "bool"))
        if isinstance(e, A.BoolOp):
            parts = [self._emit(v, "bool") for v in e.values]
            combine = tirx.And if e.op == "and" else tirx.Or
            out = parts[0]
            for p in parts[1:]:
                out = combine(out, p)
            return out
        if isinstance(e, A.Compare):
            ops = {"<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
                   ">=": lambda a, b: a >= b, "==": tirx.EQ, "!=": tirx.NE}
            conds = []
            for a, op, b in zip(e.operands, e.ops, e.operands[1:]):
                t = self._concrete(unify(self.type_of(a), self.type_of(b)), "i32")
                conds.append(ops[op](self.emit(a, t), self.emit(b, t)))
            out = conds[0]
            for cnd in conds[1:]:
                out = tirx.And(out, cnd)
            return out
        if isinstance(e, A.IfExp):
            t = self._concrete(self.type_of(e), want)
            return tirx.if_then_else(self._emit(e.cond, "bool"), self.emit(e.then, t), self.emit(e.orelse, t))
        if isinstance(e, A.BinOp):
            t = self._concrete(self.type_of(e), want)
            a, b = self.emit(e.left, t), self.emit(e.right, t)
            if e.op == "+":
                return a + b
            if e.op == "-":
                return a - b
            if e.op == "*":
                return a * b
            if e.op == "/":
                return tirx.Div(a, b) if t in D.FLOATS else tirx.floordiv(a, b)
            if e.op == "//":
                return tirx.floordiv(a, b)
            if e.op == "%":
                return tirx.floormod(a, b)
            if e.op == "**":
                return tirx.power(a, b)
        if isinstance(e, A.Call):
            if e.func in D.TVM_DTYPE:
                inner = self.type_of(e.args[0])
                return self.emit(e.args[0], self._concrete(inner, e.func)).astype(D.TVM_DTYPE[e.func])
            t = self._concrete(self.type_of(e), want)
            args = [self.emit(a, t) for a in e.args]
            x = args[0]
            simple = {"exp": tirx.exp, "exp2": tirx.exp2, "log": tirx.log, "log2": tirx.log2, "sqrt": tirx.sqrt,
                      "rsqrt": tirx.rsqrt, "tanh": tirx.tanh, "sigmoid": tirx.sigmoid, "erf": tirx.erf,
                      "abs": tirx.abs, "sin": tirx.sin, "cos": tirx.cos, "floor": tirx.floor, "ceil": tirx.ceil,
                      "round": tirx.round}
            if e.func in simple:
                return simple[e.func](x)
            if e.func == "relu":
                return tirx.max(x, tirx.const(0, expr_dtype(x)))
            if e.func == "max":
                return tirx.max(args[0], args[1])
            if e.func == "min":
                return tirx.min(args[0], args[1])
            if e.func == "pow":
                return tirx.power(args[0], args[1])
        raise TypeError(f"cannot lower {e!r}")
