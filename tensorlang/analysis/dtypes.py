"""Element types of the language and their TVM / NumPy spellings."""
from __future__ import annotations

# language name -> TVM dtype
TVM_DTYPE = {
    "f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64",
    "i8": "int8", "i16": "int16", "i32": "int32", "i64": "int64",
    "u8": "uint8", "u16": "uint16", "u32": "uint32", "bool": "bool",
}
FLOATS = {"f16", "bf16", "f32", "f64"}
INTS = {"i8", "i16", "i32", "i64", "u8", "u16", "u32"}
BYTES = {"f16": 2, "bf16": 2, "f32": 4, "f64": 8, "i8": 1, "i16": 2, "i32": 4, "i64": 8,
         "u8": 1, "u16": 2, "u32": 4, "bool": 1}

# Tolerances of `tensorlang run` against the float64 reference: |out - ref| <= rtol * max|ref| + atol.
# f16/bf16 keep 11/8 significant bits; accumulations over hundreds of terms lose a few more.
TOLERANCE = {
    "f64": (1e-10, 1e-12),
    "f32": (1e-4, 1e-5),
    "f16": (1e-2, 1e-3),
    "bf16": (4e-2, 1e-2),
}  # integer and bool outputs must match exactly

# Weak types: literals and index variables adapt to the strong type they meet.
WEAK_INT, WEAK_FLOAT, INDEX, BOOL = "int literal", "float literal", "index", "bool"


def is_float(dtype: str) -> bool:
    return dtype in FLOATS or dtype == WEAK_FLOAT


def numpy_dtype(dtype: str):
    import numpy as np
    if dtype == "bf16":
        import ml_dtypes
        return ml_dtypes.bfloat16
    return np.dtype(TVM_DTYPE[dtype])


def concrete(dtype: str, default_float: str = "f32") -> str:
    """A weak type's concrete dtype when nothing stronger is met."""
    return {WEAK_INT: "i32", INDEX: "i32", WEAK_FLOAT: default_float}.get(dtype, dtype)
