// The trainers' modes as enums, each parsed from its flag's text in one place (modes.cc) and
// named back for outputs. Nothing in the trainers compares a mode's text (the simulator parses
// its own --granularity, which adds "spmd", in sim/modes.cc).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace pwm::train {

// How an MPMD trainer turns the step into programs (pathways_train --granularity).
//   kFused    one compiled function per step per device;
//   kChained  one traced program per step, a node per step-plan unit;
//   kOpByOp   the same nodes, each its own program (one client round trip each).
enum class Granularity { kFused, kChained, kOpByOp };

// A pipeline's node order per stage (--schedule): all forwards then all backwards, or 1F1B.
enum class Schedule { kGpipe, k1F1B };

// spmd_train with --replicas > 1 (--replica-reduce): reduce-scatter inside the replica, an
// AllReduce of each shard across replicas and an all-gather inside (hierarchical), or one
// AllReduce over every data-parallel rank (flat).
enum class ReplicaReduce { kHierarchical, kFlat };

// How pathways_train sizes a Mixture-of-Experts layer's expert calls (--moe-routing):
//   kAuto        static under a capacity, worker when dropless;
//   kStatic      a fixed capacity: every shape known ahead, the whole step dispatched at once;
//   kController  dropless: the controller fetches each MoE layer's counts and dispatches the
//                layer's expert call with them (a round trip per MoE layer and micro-batch);
//   kWorker      dropless: the workers exchange the counts themselves, no round trip.
enum class MoeRouting { kAuto, kStatic, kController, kWorker };

// Parsers: throw pwm::Error with one line naming the flag and the accepted values.
Granularity parse_granularity(std::string_view text);
Schedule parse_schedule(std::string_view text);
ReplicaReduce parse_replica_reduce(std::string_view text);
MoeRouting parse_moe_routing(std::string_view text);

// The flag's text of each value (as parsed above).
const char* name(Granularity g);
const char* name(Schedule s);
const char* name(ReplicaReduce r);
const char* name(MoeRouting r);

// Every accepted text, in declaration order (the flags' checks and --help).
std::vector<std::string> granularity_names();
std::vector<std::string> schedule_names();
std::vector<std::string> replica_reduce_names();
std::vector<std::string> moe_routing_names();

}  // namespace pwm::train
