// The argument check every compiled kernel makes before it reads a tensor's memory directly.

#pragma once

#include <torch/extension.h>

#include <initializer_list>
#include <utility>

namespace lra {

// a CPU tensor, fp32 or fp64, contiguous unless the kernel reads it through its strides (named in the error)
inline void check(const at::Tensor& t, const char* name, bool contiguous = true) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor");
  TORCH_CHECK(!contiguous || t.is_contiguous(), name, " must be contiguous");
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble, name, " must be float32 or float64");
}

// every argument so, and (after the first) of the first one's dtype
inline void check(std::initializer_list<std::pair<const at::Tensor*, const char*>> args, bool contiguous = true) {
  const at::Tensor* first = args.begin()->first;
  for (const auto& [t, name] : args) {
    check(*t, name, contiguous);
    TORCH_CHECK(t->scalar_type() == first->scalar_type(), name, " must have the dtype of ", args.begin()->second);
  }
}

}  // namespace lra
