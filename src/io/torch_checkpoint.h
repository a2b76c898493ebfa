// Reads files written by torch.save in its zip format (torch >= 1.6), such as Kev's head.pt, without
// Python and without running anything the file asks for.
//
//   KEV_ASSIGN_OR_RETURN(kev::PickleValue root, kev::read_torch_checkpoint("head.pt"));
//   const kev::PickleDict* d = root.if_dict();
//   const kev::PickleValue* w = d ? d->find("weight") : nullptr;
//   if (w && w->if_tensor()) { KEV_ASSIGN_OR_RETURN(kev::HostTensor t, (*w->if_tensor())->to_host_f32()); }
//
// The archive holds one top-level folder `<stem>/` with `data.pkl` (a pickle, see pickle.h),
// `data/<key>` (raw little-endian storage bytes, one entry per storage), `byteorder`, `version` and
// bookkeeping entries. In the pickle a tensor is torch._utils._rebuild_tensor_v2(storage, offset,
// size, stride, requires_grad, backward_hooks[, metadata]) and a storage is the persistent id
// ("storage", torch.<Type>Storage, key, location, numel).
//
// Contracts:
// - Only an allow-list of globals is understood: collections.OrderedDict, torch._utils._rebuild_tensor_v2
//   and _rebuild_parameter, the torch.<Type>Storage classes of TorchDtype and the torch dtypes. Any
//   other global (os.system, argparse.Namespace, numpy.dtype, a user class) and whatever the pickle
//   builds from it is an inert opaque value naming it (pickle.h), so training extras load; nothing
//   is imported or called. Tensors are still built only by _rebuild_tensor_v2 from a storage of an
//   allowed class, strictly checked; an opaque value where a tensor part belongs is an error.
// - Storage entries must be stored uncompressed, as torch writes them, and hold exactly numel times
//   the element size; every tensor view lies inside its storage and has at most as many elements.
//   So memory use is bounded by the file size.
// - Legacy (pre-1.6, non-zip) files are Unsupported with a hint to re-save them; other non-zip or
//   truncated files are InvalidArtifact; a missing or unreadable file is Io. Messages start with the
//   path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/host_tensor.h"
#include "io/pickle.h"
#include "kev/result.h"

namespace kev {

enum class TorchDtype { Float32, Float64, Float16, BFloat16, Int64, Int32, Int16, Int8, UInt8, Bool };

const char* torch_dtype_name(TorchDtype dtype);  // "float32", "bfloat16", ...
size_t torch_dtype_size(TorchDtype dtype);       // bytes per element

// One storage of the archive: `numel` elements of `dtype`, little-endian.
struct TorchStorage {
  std::string key;  // names the entry <stem>/data/<key>
  TorchDtype dtype = TorchDtype::Float32;
  int64_t numel = 0;
  std::vector<uint8_t> bytes;  // numel * torch_dtype_size(dtype)
};

// A strided view into a storage (offset and strides count elements, not bytes).
struct TorchTensor {
  TorchDtype dtype = TorchDtype::Float32;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  int64_t storage_offset = 0;
  std::shared_ptr<const TorchStorage> storage;

  int64_t numel() const;
  bool is_contiguous() const;  // row-major; strides of size-1 dimensions do not matter
  // A row-major FP32 copy. float32, bfloat16 and float16 convert exactly; other dtypes are an error.
  Result<HostTensor> to_host_f32() const;
  // A row-major copy of an integer or bool tensor; float dtypes are an error.
  Result<std::vector<int64_t>> to_int64() const;
};

// Decodes the object a torch.save zip archive holds (usually a dict).
Result<PickleValue> read_torch_checkpoint(const std::string& path);

}  // namespace kev
