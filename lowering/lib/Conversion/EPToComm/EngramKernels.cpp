//===- EngramKernels.cpp - ep.engram_fetch's kernel -----------------------===//
//
// DeepEP's Engram fetch as one kernel: a warp per fetched row reads the
// entry from its owner's table, in the host segment after the owner's window
// (HostSegment.h), through the owner's NVLink (LSA) pointer, or the record's
// pointer to the own table, and writes it to the output row. Entries are
// `align(row bytes, 32)` apart in a table (DeepEP's layout); output rows are
// dense. Nothing waits: the kernel needs no cooperative launch.
//
//===----------------------------------------------------------------------===//

#include "Kernels.h"

namespace epic::expand {

void buildEngramFetch(gpu::GPUFuncOp func, const EPLayout &L) {
  KernelBuilder k(func, L);
  const int64_t rowBytes = L.hidden * L.elemBytes;
  const int64_t entryBytes = (rowBytes + 31) / 32 * 32;
  Value indices = k.pointerParam(kEIndices);
  Value out = k.pointerParam(kEOut);
  Value ownTable = k.pointerParam(kEOwnTable);
  Value entries = k.intParam(kEEntriesPerRank);
  Value tableOffset = k.load(k.i64T(), k.at(k.params, k.i64(kETableOffset * 8)), 8);
  Value owners = k.i32(L.ranks);
  k.loop(k.globalWarp, k.intParam(kENumRows), k.numWarps, [&](Value row) {
    Value id = k.loadI32(indices, row);
    // Unsigned: a negative id is a huge one. Ids past ranks x N_e (or any
    // id while no table is written, N_e = 0) fetch zeros.
    Value owner = k.divu(id, k.select(k.eq(entries, k.i32(0)), k.i32(1), entries));
    Value valid = k.andi(k.ult(owner, owners), k.cmp(arith::CmpIPredicate::ne, entries, k.i32(0)));
    Value dst = k.at(out, k.mul(k.wide(row), k.i64(rowBytes)));
    k.ifElse(
        valid,
        [&] {
          Value entry = k.sub(id, k.mul(owner, entries));
          Value inTable = arith::MulIOp::create(k.b, arith::ExtUIOp::create(k.b, k.i64T(), entry),
                                                k.i64(entryBytes));
          // The own table through the process's own mapping: NCCL's window
          // pointers (even the rank's own, ncclGetLocalPointer) map no host memory.
          Value src = k.choose(
              k.eq(owner, k.me), k.ptrT(), [&] { return k.at(ownTable, inTable); },
              [&] { return k.peer(arith::AddIOp::create(k.b, tableOffset, inTable), owner); });
          k.copyRow(dst, src, rowBytes);
        },
        [&] {
          auto chunk = VectorType::get({4}, k.i32T());
          Value zero = arith::ConstantOp::create(k.b, chunk, k.b.getZeroAttr(chunk));
          k.forEachChunkGroup(rowBytes, KernelBuilder::kCopyUnroll, /*warpUniform=*/false,
                              [&](ArrayRef<Value> offsets, ArrayRef<Value> inRange) {
                                SmallVector<Value> zeros(offsets.size(), zero);
                                k.storeChunks(dst, zeros, offsets, inRange);
                              });
        });
  });
}

} // namespace epic::expand
