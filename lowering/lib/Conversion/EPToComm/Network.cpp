//===- Network.cpp - convert-ep-to-comm: peers in other nodes ------------------------===//
//
// Multi-node configurations in direct mode: a rank reaches the ranks of its
// own node as it does on one node, by NVLink loads and stores through peer
// pointers, and every other rank through the network (NCCL GIN): records go by
// comm.put from a ring of staging slots in its own window, counts and flags by
// put_value and signals on context 0. None of this is built for one node
// (EPLayout::multiNode), whose kernels stay as they were.
//
// Ordering: GIN signals are strong (a signal lands after every earlier put of
// its context to that peer), and each warp flushes its puts before the rank's
// last block sends counts or done signals, so a peer that sees the signal sees
// every record. docs/semantics.md has the protocol.
//
//===----------------------------------------------------------------------===//

#include "Kernels.h"

namespace epic::expand {
using namespace mlir;
namespace comm = epic::comm;
namespace window = epic::ep::window;

Value KernelBuilder::sameNode(Value p) { return eq(divu(p, i32(layout.ranksPerNode)), node); }
Value KernelBuilder::otherNode(Value p) {
  return cmp(arith::CmpIPredicate::ne, divu(p, i32(layout.ranksPerNode)), node);
}

Value KernelBuilder::railPeer(Value n) {
  return add(mul(n, i32(layout.ranksPerNode)), remu(me, i32(layout.ranksPerNode)));
}

void KernelBuilder::putWarp(Value from, Value dst, Value to, Value bytes) {
  comm::PutOp::create(b, wide(bytes), window, wide(from), window, wide(to), team, dst, comm,
                      /*signal=*/Value(), /*signal_add=*/Value(), /*counter=*/Value(), i32(0),
                      comm::Coop::warp);
}

void KernelBuilder::flushWarp() { comm::FlushOp::create(b, comm, i32(0), comm::Coop::warp); }

Value KernelBuilder::stagingSlot(Value item, Value staged) {
  const int64_t slots = window::kStagingSlots;
  // The warp's n-th item takes slot n mod S. Item n - S may still be read by
  // its puts: a flush waits for every put of the warp (NCCL's flush covers
  // the calling group's puts), so one put's transfer overlaps the next
  // record's staging.
  Value n = divu(sub(item, globalWarp), numWarps);
  when(andi(staged, cmp(arith::CmpIPredicate::uge, n, i32(slots))), [&] { flushWarp(); });
  // The staging region follows the data region (EPWindow.h).
  Value base = layout.tmax ? i64(layout.windowBytes)
                           : add(i64(layout.data), mul(wide(tmax), i64(layout.windowPerToken)));
  Value index = add(mul(wide(globalWarp), i64(slots)), wide(remu(n, i32(slots))));
  return add(base, mul(index, i64(layout.stageSlot)));
}

void KernelBuilder::storeCell(Value value, Value cell, Value dst, comm::Ordering ordering,
                              Value signal) {
  ifElse(
      sameNode(dst),
      [&] { comm::StoreOp::create(b, ordering, comm::Scope::sys, value, peer(cell, dst)); },
      [&] {
        comm::PutValueOp::create(b, value, window, wide(cell), team, dst, comm, signal,
                                 /*signal_add=*/Value(), i32(0), comm::Coop::thread);
      });
}

void KernelBuilder::awaitSignalOnce(Value signal, Value peer) {
  comm::WaitSignalOp::create(b, i64T(), signal, i64(1), peer, comm, i32(0), comm::Coop::thread,
                             layout.timeoutMs);
  comm::ResetSignalOp::create(b, signal, comm, i32(0));
}

/// Block 0 of every rank meets the others in two steps, then releases its
/// rank's other blocks:
///  1. the M ranks of its node, as entryBarrier does on one node (a
///     signature store and an arrival per node peer over NVLink, then a
///     bounded wait for M arrivals of this epoch);
///  2. the same LSA rank of every other node (its rail peers): a put_value of
///     the signature tagged with the epoch into the peer's cell for this rank,
///     raising the peer's entry signal, then a bounded wait until the own
///     entry signal reached epoch x (N - 1).
/// A rail peer raises the signal only after its step 1, which waited for its
/// whole node: so after step 2 every rank of every node has entered the op,
/// hence finished the previous one (block 0 starts an op only after the
/// rank's previous kernels ended). The entry signal only grows (a peer one
/// barrier ahead may have raised it again already, so it is never reset);
/// that also means it may reach its target before a slower peer's increment
/// lands, but that peer has entered (the faster one waited for it). Its cell
/// may then not have landed yet: the epoch in the cell's upper half is what
/// the signature check waits for. Block 0 then stores kEntryPassed, which the
/// other blocks wait for (gpu scope) and the op's last block resets.
void KernelBuilder::nodeEntryBarrier() {
  const int64_t perNode = layout.ranksPerNode;
  Value passed = local(i64(layout.entryPassed));
  barrier(); // the block's earlier writes, before block 0's releases
  ifElse(
      eq(block, i32(0)),
      [&] {
        Value epochCell = local(i64(layout.barrierEpochs));
        Value epoch = add(load(i64T(), epochCell, 8), i64(1));
        Value parity = arith::AndIOp::create(b, epoch, i64(1));
        Value cells = add(i64(epic::ep::window::kOpSignatures),
                          mul(parity, i64(epic::ep::limits::kMaxRanks * 8)));
        Value mine = add(cells, mul(wide(me), i64(8)));
        Value signature = opSignature();
        Value nodeBase = mul(node, i32(perNode));
        Value arrivals = i64(layout.barrierArrivals);
        // 1. The node, over NVLink.
        when(lt(tid, i32(32)), [&] {
          loop(lane, i32(perNode), i32(32), [&](Value j) {
            Value peerRank = add(nodeBase, j);
            comm::StoreOp::create(b, comm::Ordering::relaxed, comm::Scope::sys, signature,
                                  peer(mine, peerRank));
            comm::RedOp::create(b, comm::AtomicKind::add, comm::Ordering::release, comm::Scope::sys,
                                i64(1), peer(arrivals, peerRank));
          });
        });
        when(eq(tid, i32(0)), [&] {
          comm::WaitFlagOp::create(b, i64T(), local(arrivals), comm::Predicate::ge,
                                   mul(epoch, i64(perNode)), me, Value(), comm::Scope::sys,
                                   layout.timeoutMs);
        });
        barrier();
        // 2. The rail peers, over the network: (epoch << 32) | the signature
        // folded to 32 bits.
        Value folded = arith::XOrIOp::create(
            b, signature, arith::ShRUIOp::create(b, signature, i64(32)).getResult());
        Value low = arith::AndIOp::create(b, folded, i64(0xFFFFFFFFLL));
        Value tagged =
            arith::OrIOp::create(b, arith::ShLIOp::create(b, epoch, i64(32)).getResult(), low);
        Value entrySignal = i32(window::kSigEntry);
        auto eachRailPeer = [&](function_ref<void(Value)> body) {
          loop(lane, i32(layout.nodes), i32(32), [&](Value n) {
            when(cmp(arith::CmpIPredicate::ne, n, node), [&] { body(railPeer(n)); });
          });
        };
        when(lt(tid, i32(32)), [&] {
          eachRailPeer([&](Value q) {
            comm::PutValueOp::create(b, tagged, window, mine, team, q, comm, entrySignal,
                                     /*signal_add=*/Value(), i32(0), comm::Coop::thread);
          });
        });
        when(eq(tid, i32(0)), [&] {
          // Raised by every rail peer: no single peer to name in a timeout.
          comm::WaitSignalOp::create(b, i64T(), entrySignal, mul(epoch, i64(layout.nodes - 1)),
                                     /*peer=*/Value(), comm, i32(0), comm::Coop::thread,
                                     layout.timeoutMs);
        });
        barrier();
        // 3. Every rank of the node and every rail peer entered this op.
        when(lt(tid, i32(32)), [&] {
          loop(lane, i32(perNode), i32(32), [&](Value j) {
            Value source = add(nodeBase, j);
            Value theirs =
                comm::LoadOp::create(b, i64T(), comm::Ordering::relaxed, comm::Scope::sys,
                                     local(add(cells, mul(wide(source), i64(8)))));
            comm::AgreeOp::create(b, signature, theirs, me, source);
          });
          eachRailPeer([&](Value source) {
            Value cell = local(add(cells, mul(wide(source), i64(8))));
            Value theirs = comm::WaitFlagOp::create(b, i64T(), cell, comm::Predicate::ge,
                                                    arith::ShLIOp::create(b, epoch, i64(32)), me,
                                                    source, comm::Scope::sys, layout.timeoutMs);
            comm::AgreeOp::create(b, tagged, theirs, me, source);
          });
        });
        barrier(); // the checks, before the rank's other blocks go
        when(eq(tid, i32(0)), [&] {
          store(epoch, epochCell, 8);
          comm::StoreOp::create(b, comm::Ordering::release, comm::Scope::gpu, i64(1), passed);
        });
      },
      [&] {
        when(eq(tid, i32(0)), [&] {
          comm::WaitFlagOp::create(b, i64T(), passed, comm::Predicate::ne, i64(0), me, Value(),
                                   comm::Scope::gpu, layout.timeoutMs);
        });
      });
  barrier(); // what thread 0 acquired, for the whole block
}

} // namespace epic::expand
