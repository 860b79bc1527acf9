"""A cache prefetch hint for numba kernels (LLVM's ``llvm.prefetch``).

Why: a hash table shard of millions of keys is far larger than the caches, so every probe of its
slot array and every read of a slab row is a miss to memory (~100 ns). A loop that probes key
``i`` and only then learns where key ``i + 1`` lives waits for those misses one after another;
asking for the lines of many keys first lets the memory system fetch them side by side, the way
``np.take`` on a fixed table gets its speed from independent loads. The hint never faults and
changes no value: an address past the array is simply not fetched usefully.
"""

from __future__ import annotations

from typing import Any

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

#: bytes per cache line on the machines aps runs on (x86-64, arm64 servers)
LINE = 64


@intrinsic
def prefetch(typingctx: Any, arr: types.Array, row: types.Integer, offset: types.Integer) -> Any:
    """Hint that ``offset`` bytes into row ``row`` of the C-contiguous array ``arr`` (1-d or 2-d)
    is read soon. Returns nothing; no bounds check (a hint, never a load)."""
    if not isinstance(arr, types.Array) or arr.ndim not in (1, 2):
        return None
    sig = types.void(arr, row, offset)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        aryty, rowty, offty = signature.args
        ary = context.make_array(aryty)(context, builder, args[0])
        intp = context.get_value_type(types.intp)
        index = [context.cast(builder, args[1], rowty, types.intp)]
        index += [intp(0)] * (aryty.ndim - 1)
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, index, wraparound=False)
        byte = ir.IntType(8).as_pointer()
        at = builder.gep(builder.bitcast(ptr, byte), [context.cast(builder, args[2], offty, types.intp)])
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [byte, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        builder.call(fn, [at, i32(0), i32(3), i32(1)])  # read, keep in all cache levels, data
        return context.get_dummy_value()

    return sig, codegen
