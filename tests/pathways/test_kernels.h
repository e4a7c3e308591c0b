// Kernels shared by the Pathways tests (registered on every rank, in-process or under mpirun).
//
//   iota      attrs {rows, cols}:        out float32[rows,cols] split; element (r, c) of the
//                                        logical tensor = 1000 * global_row + c
//   scale     attrs {factor, rows, cols, sharding (0 split, 1 replicated)}: y = factor * x
//   add2      attrs {rows, cols, sharding}: z = x + y
//   allreduce_add  attrs {c, n [, cols]}: float32[n(,cols)] replicated -> sum over the slice + c
//                  (collectives)
//   chain_fused    attrs {steps, c, n}: allreduce_add applied `steps` times in one kernel
//   boom      attrs {shard (-1: all)}: float32[1] replicated -> same; throws on that shard
//   stray_message  float32[1] replicated -> same; every shard leaves every other one a message no
//                  receive takes, on the tag of the slice communicator's first collective (in
//                  process only; collectives)
//   sleep_ms  attrs {ms}: float32[1] replicated -> same, after sleeping (for deadlines)
//   sleep_allreduce attrs {us}: float32[1] replicated -> sum over the slice, after sleeping (a
//                  gang node that takes device time without taking a core; collectives)
#pragma once

namespace pwm::pathways::testing {

void register_test_kernels();  // idempotent

}  // namespace pwm::pathways::testing
