// Facts about zpDataType_t shared by the argument checks, the planners and the perf harness.
#pragma once

#include <cstddef>

#include "include/zpccl.h"

namespace zp {

inline bool isValidType(int type) { return type >= 0 && type < zpNumTypes; }

// Bytes per element; 0 for an out-of-range value.
inline size_t typeSize(int type) {
  switch (type) {
    case zpInt8:
    case zpUint8:
    case zpFloat8e4m3:
    case zpFloat8e5m2:
      return 1;
    case zpFloat16:
    case zpBfloat16:
      return 2;
    case zpInt32:
    case zpUint32:
    case zpFloat32:
      return 4;
    case zpInt64:
    case zpUint64:
    case zpFloat64:
      return 8;
    default:
      return 0;
  }
}

// The types the quantized collectives take natively.
inline bool isQuantType(int type) { return type == zpFloat16 || type == zpBfloat16 || type == zpFloat32; }

inline const char* typeName(int type) {
  switch (type) {
    case zpInt8:
      return "int8";
    case zpUint8:
      return "uint8";
    case zpInt32:
      return "int32";
    case zpUint32:
      return "uint32";
    case zpInt64:
      return "int64";
    case zpUint64:
      return "uint64";
    case zpFloat16:
      return "half";
    case zpFloat32:
      return "float";
    case zpFloat64:
      return "double";
    case zpBfloat16:
      return "bfloat16";
    case zpFloat8e4m3:
      return "f8e4m3";
    case zpFloat8e5m2:
      return "f8e5m2";
    default:
      return "invalid";
  }
}

inline const char* opName(int op) {
  switch (op) {
    case zpSum:
      return "sum";
    case zpProd:
      return "prod";
    case zpMax:
      return "max";
    case zpMin:
      return "min";
    case zpAvg:
      return "avg";
    default:
      return "invalid";
  }
}

}  // namespace zp
