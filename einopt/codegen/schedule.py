"""Schedules for lowered einopt expressions: CPU (LLVM) and GPU (CUDA).

eOperators are memory bound, so the CPU schedule only has to stream memory
well. For each stage (one block per stage):

1. fuse the spatial loops except the innermost and run them in parallel;
2. split the innermost spatial loop into chunks of 16 or 8 lanes (whichever
   vectorises more), plus a scalar tail loop if the width does not divide it;
3. if a guard depends on that loop, partition the vector chunks into the
   guard-free interior (vectorised; TVM's simplifier drops the guard there)
   and the boundary chunks (scalar), because TVM scalarises a vector loop
   whose ``if_then_else`` condition varies by lane;
4. move the reduction loops outside the vector lanes, unroll small ones, and
   split off the initialisation (``decompose_reduction``); where the lanes need
   no guard, take the chunks ``MAX_TILE`` at a time with the reductions outside
   all of them and their accumulators in a local buffer written out once (a
   matrix-vector product then reads whole stretches of each row per step, not
   one chunk of every row: 2.3x faster on [1,512] x [512,1024]); not where a
   scalar tail was partitioned off (the partition's blocks declare no regions,
   so the buffer's write-back would cover the whole buffer in every task).

The GPU schedule binds the fused spatial loops of every stage to
``blockIdx.x``/``threadIdx.x``; reductions run serially in each thread,
accumulating in a register.

This module imports TVM; ``einopt.codegen`` imports it only when compiling.
"""

from __future__ import annotations

import logging
import math

from tvm import s_tir, tirx

from einopt.codegen.te import Lowered, StageInfo

__all__ = ["schedule_cpu", "schedule_gpu"]

log = logging.getLogger(__name__)

VECTOR_WIDTHS = (16, 8)
# Vector chunks a reduction accumulates at once (in registers: 8 x 16 lanes fit AVX-512's 32).
MAX_TILE = 8
# Unroll the innermost reduction loops while their product stays this small.
MAX_UNROLL = 32
# Run a stage in parallel only above this much work (spatial x reduction points).
MIN_PARALLEL_WORK = 1 << 14
GPU_THREADS = 256


def schedule_cpu(lowered: Lowered) -> s_tir.Schedule:
    """The CPU schedule of a lowered expression (see the module docstring).

    A stage whose schedule fails keeps the primitives applied so far (each
    primitive is all-or-nothing) and the failure is logged at debug level.
    """
    sch = s_tir.Schedule(lowered.func)
    for stage in _present(sch, lowered.stages):
        try:
            _schedule_stage_cpu(sch, stage)
        except Exception as e:  # noqa: BLE001 - TVM raises several types; a schedule is optional
            log.debug("CPU schedule of stage %s failed, left partly scheduled: %s", stage.name, e)
    return sch


def _present(sch: s_tir.Schedule, stages: tuple[StageInfo, ...]) -> list[StageInfo]:
    """The stages that have a block (create_prim_func drops stages that nothing reads)."""
    names = {sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))}
    return [st for st in stages if st.name in names]


def _schedule_stage_cpu(sch: s_tir.Schedule, st: StageInfo) -> None:
    block = sch.get_sblock(st.name)
    loops = sch.get_loops(block)
    rank = len(st.shape)
    spatial, reduce = loops[:rank], loops[rank:]
    work = math.prod(st.shape) * math.prod(st.reduce_extents)
    parallel = work >= MIN_PARALLEL_WORK
    if rank > 1:
        outer = sch.fuse(*spatial[:-1]) if rank > 2 else spatial[0]
        if parallel and math.prod(st.shape[:-1]) > 1:
            sch.parallel(outer)
            parallel = False
    n = st.shape[-1]
    width = _vector_width(n, st.interior)
    if width is None:
        _finish(sch, block, reduce, lane=None, vectorize=False)
        return
    x = spatial[-1]
    chunks = n // width
    tail = n % width
    if tail:  # a scalar tail loop after the whole chunks
        head, rest = sch.loop_partition(x, [chunks * width, None])
        _finish_piece(sch, rest, len(reduce), vectorize=False)
        block = _leaf_block(sch, head)
        x, *reduce = sch.get_loops(block)[-(len(reduce) + 1) :]
        parallel = False
    first, last = _whole_chunks(st.interior, width, chunks)
    xo, xi = sch.split(x, [chunks, width])
    if first == 0 and last == chunks:  # no guard depends on the lanes
        # Not after a tail partition: its blocks declare no regions, so the local buffer's write-back
        # would copy the whole buffer in every task of a parallel loop, not the task's own rows.
        if reduce and chunks > 1 and not tail:
            _tiled_reduction(sch, block, xo, xi, reduce, chunks, parallel)
            return
        if parallel and chunks > 1:
            sch.parallel(xo)
        _finish(sch, block, reduce, lane=xi, vectorize=True)
        return
    sizes = [k for k in (first, last - first, chunks - last) if k]
    pieces = sch.loop_partition(xo, [*sizes[:-1], None])
    for i, piece in enumerate(pieces):
        _finish_piece(sch, piece, len(reduce), vectorize=i == (1 if first else 0))


def _tiled_reduction(sch: s_tir.Schedule, block, xo, xi, reduce, chunks: int, parallel: bool) -> None:
    """A reduction over vector chunks, ``MAX_TILE`` chunks at a time: their accumulators stay in
    vector registers (a local buffer, written out once) while the reduction loops run outside them,
    so each reduction step reads ``MAX_TILE`` chunks of a row at once (a matrix-vector product reads
    whole rows of the matrix instead of one chunk of every row per task)."""
    tile = max(t for t in range(1, MAX_TILE + 1) if chunks % t == 0)
    xoo, xoi = sch.split(xo, [chunks // tile, tile])
    if parallel and chunks // tile > 1:
        sch.parallel(xoo)
    local = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(local, xoo)
    sch.vectorize(sch.get_loops(local)[-1])
    sch.reorder(*reduce, xoi, xi)
    sch.vectorize(xi)
    sch.unroll(xoi)
    sch.decompose_reduction(block, reduce[0])


def _whole_chunks(interior: tuple[int, int], width: int, chunks: int) -> tuple[int, int]:
    """The chunks ``[first, last)`` of ``width`` lanes (out of ``chunks``) inside ``interior``."""
    return -(-interior[0] // width), min(interior[1] // width, chunks)


def _vector_width(n: int, interior: tuple[int, int] | None) -> int | None:
    """The vector width that vectorises the most lanes (the wider on ties), or None."""
    if interior is None:
        return None
    best, best_lanes = None, 0
    for w in VECTOR_WIDTHS:
        first, last = _whole_chunks(interior, w, n // w)
        if (last - first) * w > best_lanes:
            best, best_lanes = w, (last - first) * w
    return best


def _finish_piece(sch: s_tir.Schedule, piece, n_reduce: int, vectorize: bool) -> None:
    """Finish the block of a partition piece: its loops end with the lanes, then the reductions."""
    block = _leaf_block(sch, piece)
    lane, *reduce = sch.get_loops(block)[-(n_reduce + 1) :]
    _finish(sch, block, reduce, lane=lane, vectorize=vectorize)


def _finish(sch: s_tir.Schedule, block, reduce, lane, vectorize: bool) -> None:
    """Move the reductions outside the lanes, vectorise, unroll small reductions, split the init."""
    if lane is not None and reduce:
        sch.reorder(*reduce, lane)
    if vectorize:
        sch.vectorize(lane)
    budget = 1
    for loop in reversed(reduce):
        extent = sch.get(loop).extent
        if not isinstance(extent, tirx.IntImm) or budget * int(extent) > MAX_UNROLL:
            break
        budget *= int(extent)
        sch.unroll(loop)
    if reduce:
        sch.decompose_reduction(block, reduce[0])


def _leaf_block(sch: s_tir.Schedule, loop):
    """The one innermost block under ``loop`` (loop_partition nests each piece in a block)."""
    (block,) = sch.get_child_blocks(loop)
    while children := sch.get_child_blocks(block):
        (block,) = children
    return block


def schedule_gpu(lowered: Lowered, threads: int = GPU_THREADS) -> s_tir.Schedule:
    """Bind every stage's fused spatial loops to ``blockIdx.x`` and ``threadIdx.x``."""
    sch = s_tir.Schedule(lowered.func)
    for st in _present(sch, lowered.stages):
        block = sch.get_sblock(st.name)
        # Accumulate a reduction in a register, written back once per output.
        write_back = sch.cache_write(block, 0, "local") if st.reduce_extents else None
        loops = sch.get_loops(block)
        rank = len(st.shape)
        fused = sch.fuse(*loops[:rank]) if rank > 1 else loops[0]
        bx, tx = sch.split(fused, [None, min(threads, math.prod(st.shape))])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
        if write_back is not None:
            sch.reverse_compute_at(write_back, tx)
            sch.decompose_reduction(block, sch.get_loops(block)[2])
    return sch
