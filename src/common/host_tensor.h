// HostTensor: a plain, owning, row-major FP32 tensor in host memory. Importers produce it (weights
// widened from BF16/F16 files, LoRA merges) and tests compare against it; backends upload from it.
//
//   kev::HostTensor t = kev::HostTensor::zeros({2, 3});
//   t.data[1 * 3 + 2] = 1.0f;   // element [1][2]
//
// Contract: data.size() == numel() whenever the tensor is well formed (the constructors below keep
// it so); shape entries are non-negative; a shape of {} is a scalar with one element.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace kev {

struct HostTensor {
  std::vector<int64_t> shape;
  std::vector<float> data;

  HostTensor() = default;
  HostTensor(std::vector<int64_t> shape_, std::vector<float> data_)
      : shape(std::move(shape_)), data(std::move(data_)) {}

  static HostTensor zeros(std::vector<int64_t> shape_) {
    HostTensor t;
    t.shape = std::move(shape_);
    t.data.assign(static_cast<size_t>(t.numel()), 0.0f);
    return t;
  }

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  int64_t dim(size_t i) const { return shape.at(i); }
  size_t rank() const { return shape.size(); }
};

}  // namespace kev
