// Element types, reduction operators and algorithm names of the collectives library.
// Type-erased on purpose (as gloo does): one compiled schedule per algorithm, not one per dtype.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace pwm::collectives {

enum class DataType : uint8_t { kFloat32, kFloat64, kInt32, kInt64 };
enum class ReduceOp : uint8_t { kSum, kMax, kMin };

// kAuto picks by message and group size from the alpha-beta cost model (cost_model.h).
// kMpi calls MPI's own collective (MPI_Iallreduce, MPI_Ialltoall, MPI_Ialltoallv) on an MPI
// communicator of the group. AllReduce takes kRing, kHalvingDoubling, kRecursiveDoubling;
// AllToAll takes kPairwise, kBruck (equal counts only), kLinear; both take kAuto and kMpi.
enum class Algorithm : uint8_t { kAuto, kRing, kHalvingDoubling, kRecursiveDoubling, kMpi, kPairwise, kBruck, kLinear };

// The collectives that take an Algorithm.
enum class AlgorithmOp : uint8_t { kAllreduce, kAlltoall, kAlltoallv };

size_t dtype_size(DataType t);
const char* dtype_name(DataType t);       // "float32", ...
const char* reduce_op_name(ReduceOp op);  // "sum", "max", "min"
const char* algorithm_name(Algorithm a);  // "auto", "ring", "hd", "rd", "mpi", "pairwise", "bruck", "linear"
const char* algorithm_op_name(AlgorithmOp op);  // "allreduce", "alltoall", "alltoallv"
// Throws pwm::Error, one line naming the algorithms `op` takes, when it does not take `a`.
void check_algorithm(AlgorithmOp op, Algorithm a);

// Parsers for flags; throw pwm::Error listing the accepted names.
DataType parse_dtype(const std::string& s);    // float|float32|double|float64|int32|int64
ReduceOp parse_reduce_op(const std::string& s);
Algorithm parse_algorithm(const std::string& s);

template <typename T> constexpr DataType dtype_of();
template <> constexpr DataType dtype_of<float>() { return DataType::kFloat32; }
template <> constexpr DataType dtype_of<double>() { return DataType::kFloat64; }
template <> constexpr DataType dtype_of<int32_t>() { return DataType::kInt32; }
template <> constexpr DataType dtype_of<int64_t>() { return DataType::kInt64; }

// dst[i] = a[i] (op) b[i] for i < count. dst may alias a or b. Elementwise and order-free,
// so the result is bitwise the same whichever rank computes it (IEEE + and min/max commute).
void reduce_into(void* dst, const void* a, const void* b, size_t count, DataType t, ReduceOp op);

}  // namespace pwm::collectives
