// The op-test harness framework (see op_harness.h): operand placement with guards, the two runs,
// and the comparisons.
#include <cmath>
#include <cstring>
#include <memory>
#include <sstream>

#include "backend/op_harness.h"
#include "common/bf16.h"
#include "common/check.h"

namespace kev::optest {

namespace {

constexpr size_t kGuardBytes = 256;
constexpr uint32_t kPoison = 0x7fc1deadu;  // a quiet NaN as f32; also fills guards and gaps

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  return h;
}

// One operand placed in a buffer of one backend.
struct Placed {
  std::shared_ptr<Buffer> buffer;
  Tensor view;                    // empty for an absent operand
  std::vector<uint8_t> image;     // the whole buffer as uploaded
  std::vector<size_t> elem_byte;  // byte offset of each logical element
  bool writable = false;          // Out / InOut
};

int64_t product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Status place(Backend& b, const ArgSpec& a, const std::vector<double>& values, Placed& p) {
  p.writable = a.role != Role::In;
  if (a.shape.empty()) return Status::success();
  const size_t es = dtype_size(a.dtype);
  const int rank = static_cast<int>(a.shape.size());
  const int64_t last = a.shape.back(), parent_last = a.pad_front + last + a.pad_back;
  const int64_t rows = product(a.shape) / (last ? last : 1);
  const size_t bytes = static_cast<size_t>(last ? rows * parent_last : 0) * es;
  const size_t image_bytes = (kGuardBytes + bytes + kGuardBytes + 3) / 4 * 4;
  p.image.resize(image_bytes);
  for (size_t i = 0; i < image_bytes; i += 4) std::memcpy(&p.image[i], &kPoison, 4);
  const int64_t n = product(a.shape);
  p.elem_byte.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = i / last, j = i % last;
    p.elem_byte[i] = kGuardBytes + static_cast<size_t>(r * parent_last + a.pad_front + j) * es;
  }
  if (a.role != Role::Out) {
    for (int64_t i = 0; i < n; ++i) {
      uint8_t* dst = &p.image[p.elem_byte[i]];
      if (a.dtype == DType::F32) {
        const float f = static_cast<float>(values[i]);
        std::memcpy(dst, &f, 4);
      } else if (a.dtype == DType::BF16) {
        const uint16_t h = f32_to_bf16(static_cast<float>(values[i]));
        std::memcpy(dst, &h, 2);
      } else {
        const int32_t v = static_cast<int32_t>(values[i]);
        std::memcpy(dst, &v, 4);
      }
    }
  }
  auto buf = b.alloc(image_bytes, BufferUsage::Activations);
  if (!buf.ok()) return buf.status();
  p.buffer = buf.value();
  const Tensor whole = Tensor::contiguous(p.buffer.get(), 0, DType::F32, {static_cast<int64_t>(image_bytes / 4)});
  KEV_TRY(b.upload(whole, p.image.data(), image_bytes));
  Tensor& v = p.view;
  v.buffer = p.buffer.get();
  v.offset = kGuardBytes + static_cast<size_t>(a.pad_front) * es;
  v.dtype = a.dtype;
  v.rank = rank;
  int64_t stride = 1;
  for (int d = rank - 1; d >= 0; --d) {
    v.shape[d] = a.shape[d];
    v.stride[d] = stride;
    stride *= d == rank - 1 ? parent_last : a.shape[d];
  }
  return Status::success();
}

double element(const ArgSpec& a, const std::vector<uint8_t>& image, size_t byte) {
  if (a.dtype == DType::F32) {
    float f;
    std::memcpy(&f, &image[byte], 4);
    return f;
  }
  if (a.dtype == DType::BF16) {
    uint16_t h;
    std::memcpy(&h, &image[byte], 2);
    return bf16_to_f32(h);
  }
  int32_t v;
  std::memcpy(&v, &image[byte], 4);
  return v;
}

struct RunResult {
  std::vector<std::vector<double>> outputs;  // per arg (empty unless writable)
  std::string problems;
};

// Places, runs and reads back one backend's side of a case.
Status run_on(Backend& b, const OpCase& c, const std::vector<std::vector<double>>& inputs, const char* side,
              RunResult& res) {
  std::vector<Placed> placed(c.args.size());
  std::vector<Tensor> tensors(c.args.size());
  for (size_t i = 0; i < c.args.size(); ++i) {
    KEV_TRY(place(b, c.args[i], inputs[i], placed[i]));
    tensors[i] = placed[i].view;
  }
  KEV_TRY(c.run(b, tensors));
  KEV_TRY(b.synchronize());
  res.outputs.assign(c.args.size(), {});
  std::ostringstream problems;
  for (size_t i = 0; i < c.args.size(); ++i) {
    const ArgSpec& a = c.args[i];
    Placed& p = placed[i];
    if (a.shape.empty()) continue;
    std::vector<uint8_t> after(p.image.size());
    const Tensor whole = Tensor::contiguous(p.buffer.get(), 0, DType::F32, {static_cast<int64_t>(after.size() / 4)});
    KEV_TRY(b.download(whole, after.data(), after.size()));
    std::vector<bool> may_change(after.size(), false);
    if (p.writable) {
      for (size_t byte : p.elem_byte) {
        for (size_t k = 0; k < dtype_size(a.dtype); ++k) may_change[byte + k] = true;
      }
    }
    size_t changed = 0, first = 0;
    for (size_t k = 0; k < after.size(); ++k) {
      if (!may_change[k] && after[k] != p.image[k]) {
        if (changed++ == 0) first = k;
      }
    }
    if (changed) {
      problems << "  [" << side << "] " << a.name << ": " << changed << " bytes changed outside its elements"
               << (a.role == Role::In ? " (an input was written)" : " (guard/gap overwritten)") << ", first at byte "
               << first << " of " << after.size() << " (guard " << kGuardBytes << ")\n";
    }
    if (!p.writable) continue;
    std::vector<double>& vals = res.outputs[i];
    vals.resize(p.elem_byte.size());
    size_t non_finite = 0;
    for (size_t e = 0; e < vals.size(); ++e) {
      vals[e] = element(a, after, p.elem_byte[e]);
      if (!std::isfinite(vals[e])) ++non_finite;
    }
    if (non_finite) {
      problems << "  [" << side << "] " << a.name << ": " << non_finite << " of " << vals.size()
               << " elements are NaN/Inf (unwritten or overflowed)\n";
    }
  }
  res.problems = problems.str();
  return Status::success();
}

}  // namespace

std::string OpCase::label() const { return std::string(op_name(kind)) + "(" + params + ")"; }

CaseReport run_case(const OpCase& c, Backend& under_test, Backend& reference) {
  CaseReport report;
  const std::string label = c.label();
  Rng rng(fnv1a(label));
  std::vector<std::vector<double>> inputs(c.args.size());
  std::vector<Tensor> desc_operands(c.args.size());
  for (size_t i = 0; i < c.args.size(); ++i) {
    const ArgSpec& a = c.args[i];
    if (a.shape.empty()) continue;
    inputs[i].assign(product(a.shape), 0.0);
    if (a.role != Role::Out && a.init) a.init(rng, a.shape, inputs[i]);
    // supports() sees shapes, dtypes and strides only (no buffers yet).
    Tensor& t = desc_operands[i];
    t.dtype = a.dtype;
    t.rank = static_cast<int>(a.shape.size());
    int64_t stride = 1;
    for (int d = t.rank - 1; d >= 0; --d) {
      t.shape[d] = a.shape[d];
      t.stride[d] = stride;
      stride *= d == t.rank - 1 ? a.pad_front + a.shape[d] + a.pad_back : a.shape[d];
    }
  }
  if (c.desc) desc_operands = c.desc(desc_operands);
  if (!under_test.supports(OpDesc{c.kind, desc_operands})) {
    report.supported = false;
    report.message = label + ": not supported by " + under_test.info().name;
    return report;
  }
  RunResult got, want;
  if (Status s = run_on(under_test, c, inputs, "test", got); !s.ok()) {
    report.message = label + ": backend under test failed: " + s.to_string();
    return report;
  }
  if (Status s = run_on(reference, c, inputs, "reference", want); !s.ok()) {
    report.message = label + ": reference failed: " + s.to_string();
    return report;
  }
  std::ostringstream msg;
  msg << label << ":";
  bool ok = got.problems.empty() && want.problems.empty();
  msg << "\n" << got.problems << want.problems;
  for (size_t i = 0; i < c.args.size(); ++i) {
    if (c.args[i].role == Role::In || c.args[i].shape.empty()) continue;
    const std::vector<double>& x = got.outputs[i];
    const std::vector<double>& r = want.outputs[i];
    double err = 0, ref = 0, max_abs = 0;
    for (size_t e = 0; e < x.size(); ++e) {
      const double d = x[e] - r[e];
      err += d * d;
      ref += r[e] * r[e];
      if (!(std::fabs(d) <= max_abs)) max_abs = std::fabs(d);
    }
    const double nmse = ref > 0 ? err / ref : err;
    const bool pass = nmse <= c.max_nmse;  // false for NaN
    ok = ok && pass;
    msg << "  " << c.args[i].name << ": nmse " << nmse << (pass ? " <= " : " > ") << c.max_nmse << ", max abs err "
        << max_abs << (pass ? "" : "  FAIL") << "\n";
  }
  report.ok = ok;
  report.message = msg.str();
  return report;
}

InitFn normal(double mean, double stddev) {
  return [=](Rng& rng, const std::vector<int64_t>&, std::vector<double>& v) {
    std::normal_distribution<double> d(mean, stddev);
    for (double& x : v) x = d(rng);
  };
}

InitFn uniform(double lo, double hi) {
  return [=](Rng& rng, const std::vector<int64_t>&, std::vector<double>& v) {
    std::uniform_real_distribution<double> d(lo, hi);
    for (double& x : v) x = d(rng);
  };
}

InitFn l2_rows(double norm) {
  return [=](Rng& rng, const std::vector<int64_t>& shape, std::vector<double>& v) {
    std::normal_distribution<double> d(0.0, 1.0);
    const size_t n = static_cast<size_t>(shape.back());
    for (size_t r = 0; r + n <= v.size() && n > 0; r += n) {
      double ss = 0;
      for (size_t j = 0; j < n; ++j) {
        v[r + j] = d(rng);
        ss += v[r + j] * v[r + j];
      }
      for (size_t j = 0; j < n; ++j) v[r + j] *= norm / std::sqrt(ss);
    }
  };
}

InitFn log_decay() {
  return [](Rng& rng, const std::vector<int64_t>&, std::vector<double>& v) {
    std::normal_distribution<double> d(0.0, 1.0);
    for (double& x : v) {
      const double u = d(rng);
      x = -std::log1p(std::exp(u)) * std::exp(0.5 * d(rng));
    }
  };
}

InitFn spiky_log_decay() {
  return [](Rng& rng, const std::vector<int64_t>&, std::vector<double>& v) {
    std::uniform_real_distribution<double> u(0.0, 1.0);
    for (double& x : v) x = u(rng) < 0.05 ? -std::pow(10.0, 1.0 + 2.0 * u(rng)) : -0.001 - 0.1 * u(rng);
  };
}

InitFn indices(int64_t limit) {
  return [=](Rng& rng, const std::vector<int64_t>&, std::vector<double>& v) {
    std::uniform_int_distribution<int64_t> d(0, limit - 1);
    for (double& x : v) x = static_cast<double>(d(rng));
  };
}

InitFn constant(double value) {
  return [=](Rng&, const std::vector<int64_t>&, std::vector<double>& v) {
    for (double& x : v) x = value;
  };
}

ArgSpec in(std::string name, std::vector<int64_t> shape, InitFn init, DType dtype) {
  ArgSpec a;
  a.name = std::move(name);
  a.role = Role::In;
  a.dtype = dtype;
  a.shape = std::move(shape);
  a.init = std::move(init);
  return a;
}

ArgSpec out(std::string name, std::vector<int64_t> shape, DType dtype) {
  ArgSpec a;
  a.name = std::move(name);
  a.role = Role::Out;
  a.dtype = dtype;
  a.shape = std::move(shape);
  return a;
}

ArgSpec absent(std::string name) {
  ArgSpec a;
  a.name = std::move(name);
  return a;
}

ArgSpec padded(ArgSpec a, int64_t front, int64_t back) {
  a.pad_front = front;
  a.pad_back = back;
  return a;
}

SeqLayout layout_of(const std::vector<int64_t>& lengths, int64_t pos0, bool from_prefix) {
  SeqLayout l;
  l.offsets = {0};
  for (int64_t n : lengths) l.offsets.push_back(l.offsets.back() + static_cast<int32_t>(n));
  l.pos0 = pos0;
  l.from_prefix = from_prefix;
  return l;
}

std::string lengths_str(const std::vector<int64_t>& lengths) {
  std::string s;
  for (int64_t n : lengths) s += (s.empty() ? "" : "+") + std::to_string(n);
  return s;
}

}  // namespace kev::optest
