#include "collectives/types.h"

#include <algorithm>

#include "common/check.h"

namespace pwm::collectives {

size_t dtype_size(DataType t) {
  switch (t) {
    case DataType::kFloat32: return 4;
    case DataType::kFloat64: return 8;
    case DataType::kInt32: return 4;
    case DataType::kInt64: return 8;
  }
  PWM_THROW("invalid DataType {}", static_cast<int>(t));
}

const char* dtype_name(DataType t) {
  switch (t) {
    case DataType::kFloat32: return "float32";
    case DataType::kFloat64: return "float64";
    case DataType::kInt32: return "int32";
    case DataType::kInt64: return "int64";
  }
  return "?";
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
  }
  return "?";
}

const char* algorithm_name(Algorithm a) {
  switch (a) {
    case Algorithm::kAuto: return "auto";
    case Algorithm::kRing: return "ring";
    case Algorithm::kHalvingDoubling: return "hd";
    case Algorithm::kRecursiveDoubling: return "rd";
    case Algorithm::kMpi: return "mpi";
    case Algorithm::kPairwise: return "pairwise";
    case Algorithm::kBruck: return "bruck";
    case Algorithm::kLinear: return "linear";
  }
  return "?";
}

const char* algorithm_op_name(AlgorithmOp op) {
  switch (op) {
    case AlgorithmOp::kAllreduce: return "allreduce";
    case AlgorithmOp::kAlltoall: return "alltoall";
    case AlgorithmOp::kAlltoallv: return "alltoallv";
  }
  return "?";
}

void check_algorithm(AlgorithmOp op, Algorithm a) {
  bool ok = a == Algorithm::kAuto || a == Algorithm::kMpi;
  const char* takes = "";
  switch (op) {
    case AlgorithmOp::kAllreduce:
      ok = ok || a == Algorithm::kRing || a == Algorithm::kHalvingDoubling || a == Algorithm::kRecursiveDoubling;
      takes = "auto, ring, hd, rd or mpi";
      break;
    case AlgorithmOp::kAlltoall:
      ok = ok || a == Algorithm::kPairwise || a == Algorithm::kBruck || a == Algorithm::kLinear;
      takes = "auto, pairwise, bruck, linear or mpi";
      break;
    case AlgorithmOp::kAlltoallv:  // Bruck's steps pack blocks by position: equal counts only
      ok = ok || a == Algorithm::kPairwise || a == Algorithm::kLinear;
      takes = "auto, pairwise, linear or mpi (bruck needs equal counts: alltoall)";
      break;
  }
  if (!ok) PWM_THROW("{} does not take algorithm '{}': use {}", algorithm_op_name(op), algorithm_name(a), takes);
}

DataType parse_dtype(const std::string& s) {
  if (s == "float" || s == "float32") return DataType::kFloat32;
  if (s == "double" || s == "float64") return DataType::kFloat64;
  if (s == "int32" || s == "int") return DataType::kInt32;
  if (s == "int64") return DataType::kInt64;
  PWM_THROW("unknown data type '{}': use float32, float64, int32 or int64", s);
}

ReduceOp parse_reduce_op(const std::string& s) {
  if (s == "sum") return ReduceOp::kSum;
  if (s == "max") return ReduceOp::kMax;
  if (s == "min") return ReduceOp::kMin;
  PWM_THROW("unknown reduction '{}': use sum, max or min", s);
}

Algorithm parse_algorithm(const std::string& s) {
  if (s == "auto") return Algorithm::kAuto;
  if (s == "ring") return Algorithm::kRing;
  if (s == "hd" || s == "halving_doubling" || s == "rabenseifner") return Algorithm::kHalvingDoubling;
  if (s == "rd" || s == "recursive_doubling") return Algorithm::kRecursiveDoubling;
  if (s == "mpi") return Algorithm::kMpi;
  if (s == "pairwise") return Algorithm::kPairwise;
  if (s == "bruck") return Algorithm::kBruck;
  if (s == "linear") return Algorithm::kLinear;
  PWM_THROW("unknown algorithm '{}': use auto, ring, hd (halving-doubling), rd (recursive doubling), mpi, or for "
            "alltoall pairwise, bruck, linear", s);
}

namespace {

template <typename T>
void reduce_typed(T* dst, const T* a, const T* b, size_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      for (size_t i = 0; i < n; ++i) dst[i] = a[i] + b[i];
      break;
    case ReduceOp::kMax:
      for (size_t i = 0; i < n; ++i) dst[i] = std::max(a[i], b[i]);
      break;
    case ReduceOp::kMin:
      for (size_t i = 0; i < n; ++i) dst[i] = std::min(a[i], b[i]);
      break;
  }
}

}  // namespace

void reduce_into(void* dst, const void* a, const void* b, size_t count, DataType t, ReduceOp op) {
  switch (t) {
    case DataType::kFloat32:
      return reduce_typed<float>(static_cast<float*>(dst), static_cast<const float*>(a),
                                 static_cast<const float*>(b), count, op);
    case DataType::kFloat64:
      return reduce_typed<double>(static_cast<double*>(dst), static_cast<const double*>(a),
                                  static_cast<const double*>(b), count, op);
    case DataType::kInt32:
      return reduce_typed<int32_t>(static_cast<int32_t*>(dst), static_cast<const int32_t*>(a),
                                   static_cast<const int32_t*>(b), count, op);
    case DataType::kInt64:
      return reduce_typed<int64_t>(static_cast<int64_t*>(dst), static_cast<const int64_t*>(a),
                                   static_cast<const int64_t*>(b), count, op);
  }
}

}  // namespace pwm::collectives
