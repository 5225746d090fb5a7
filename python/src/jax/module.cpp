// fmha._jax_ffi: XLA FFI handlers over the C++ API, for the JAX front end (python/fmha/jax/).
//
// One handler per entry point and platform. Every handler takes its operands as XLA's remaining
// arguments and results, and its options as an attribute dictionary; jax/calls.h gives the order
// and jax/attrs.h the names. The module hands the handlers to Python as capsules
// (jax.ffi.register_ffi_target) and offers check(), which runs the C++ validation on shapes and
// dtypes alone, so that jax.jit refuses an invalid call while tracing, with the library's message.
//
// CUDA: the handlers run the library on XLA's stream of the call's device (no synchronisation),
// with the library's scratch memory (the backward's fp32 statistics and accumulators; fmha/params.h's
// Workspace) from XLA's scratch allocator, so that the library allocates nothing of its own. The
// CUDA handlers are registered only when the library was built with CUDA
// (tests/python/test_jax_cuda.py runs them; docs/jax.md).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fmha/fmha.h"
#include "jax/attrs.h"
#include "jax/calls.h"
#include "xla/ffi/api/ffi.h"

namespace nb = nanobind;
namespace ffi = xla::ffi;

namespace fmha::jax {
namespace {

// ---- Operands and attributes from XLA ------------------------------------------------------------

Status operand_of(const ffi::AnyBuffer& buffer, const char* what, std::size_t index,
                  Operand* operand) {
  switch (buffer.element_type()) {
    case ffi::DataType::F32: operand->dtype = DType::kFloat32; break;
    case ffi::DataType::F16: operand->dtype = DType::kFloat16; break;
    case ffi::DataType::BF16: operand->dtype = DType::kBFloat16; break;
    case ffi::DataType::F64: operand->dtype = DType::kFloat64; break;
    case ffi::DataType::S32: operand->dtype = DType::kInt32; break;
    default:
      return Status::invalid_argument(
          "fmha.jax: " + std::string(what) + " " + std::to_string(index) + " has XLA dtype " +
          std::to_string(static_cast<int>(buffer.element_type())) +
          "; accepted: float32, float16, bfloat16, float64, int32");
  }
  const auto dims = buffer.dimensions();
  if (dims.size() < 1 || dims.size() > static_cast<std::size_t>(kMaxRank)) {
    return Status::invalid_argument("fmha.jax: " + std::string(what) + " " +
                                    std::to_string(index) + " has rank " +
                                    std::to_string(dims.size()) + "; accepted: 1.." +
                                    std::to_string(kMaxRank));
  }
  operand->data = buffer.untyped_data();
  operand->rank = static_cast<int>(dims.size());
  for (std::size_t d = 0; d < dims.size(); ++d) operand->shape[d] = dims[d];
  return Status::ok_status();
}

class FfiAttrs {
 public:
  explicit FfiAttrs(const ffi::Dictionary& d) : d_(d) {}
  Status integer(std::string_view name, std::int64_t* value) { return get(name, value); }
  Status real(std::string_view name, float* value) { return get(name, value); }
  Status triple(std::string_view name, std::array<std::int64_t, 3>* value) {
    ffi::Span<const std::int64_t> span;
    FMHA_RETURN_IF_ERROR(get(name, &span));
    if (span.size() != value->size()) return bad(name, "an array of 3 int64");
    for (std::size_t i = 0; i < value->size(); ++i) (*value)[i] = span[i];
    return Status::ok_status();
  }

 private:
  template <typename T>
  Status get(std::string_view name, T* value) {
    auto decoded = d_.get<T>(name);
    if (decoded.has_error()) return bad(name, decoded.error().message());
    *value = *decoded;
    return Status::ok_status();
  }
  static Status bad(std::string_view name, const std::string& why) {
    return Status::invalid_argument("fmha.jax: attribute " + std::string(name) + ": " + why);
  }
  const ffi::Dictionary& d_;
};

ffi::Error to_ffi(const Status& status) {
  switch (status.code()) {
    case StatusCode::kOk: return ffi::Error::Success();
    case StatusCode::kInvalidArgument:
      return ffi::Error(ffi::ErrorCode::kInvalidArgument, status.message());
    case StatusCode::kNotSupported:
      return ffi::Error(ffi::ErrorCode::kUnimplemented, status.message());
    case StatusCode::kBackendError: break;
  }
  return ffi::Error(ffi::ErrorCode::kInternal, status.message());
}

Status handle(Entry entry, const ffi::RemainingArgs& args, const ffi::RemainingRets& rets,
              const ffi::Dictionary& dict, Device device, void* stream,
              const Workspace& workspace = {}) {
  std::vector<Operand> in(args.size()), out(rets.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    auto buffer = args.get<ffi::AnyBuffer>(i);
    if (buffer.has_error()) return Status::invalid_argument(buffer.error().message());
    FMHA_RETURN_IF_ERROR(operand_of(*buffer, "operand", i, &in[i]));
  }
  for (std::size_t i = 0; i < out.size(); ++i) {
    auto buffer = rets.get<ffi::AnyBuffer>(i);
    if (buffer.has_error()) return Status::invalid_argument(buffer.error().message());
    FMHA_RETURN_IF_ERROR(operand_of(**buffer, "result", i, &out[i]));
  }
  CallAttrs attrs;
  FfiAttrs source(dict);
  FMHA_RETURN_IF_ERROR(decode_attrs(source, &attrs));
  return call(entry, in.data(), in.size(), out.data(), out.size(), attrs, device, stream,
              /*check_only=*/false, workspace);
}

// ---- Handlers ------------------------------------------------------------------------------------

template <Entry kEntry>
ffi::Error cpu_call(ffi::RemainingArgs args, ffi::RemainingRets rets, ffi::Dictionary attrs) {
  return to_ffi(handle(kEntry, args, rets, attrs, Device::cpu(), nullptr));
}

// XLA's scratch allocator as the library's Workspace allocator: memory of XLA's device allocator,
// given back when the handler returns, in the order of XLA's stream, which the call's work is on.
// 16-byte alignment: what the library needs, and the most XLA's allocator takes as an argument
// (a larger one is refused: "Unsupported alignment").
void* allocate_from_xla(void* context, std::size_t bytes) {
  auto* scratch = static_cast<ffi::ScratchAllocator*>(context);
  const std::optional<void*> block = scratch->Allocate(bytes, /*alignment=*/16);
  return block.has_value() ? *block : nullptr;
}

template <Entry kEntry>
ffi::Error cuda_call(void* stream, std::int32_t device, ffi::ScratchAllocator scratch,
                     ffi::RemainingArgs args, ffi::RemainingRets rets, ffi::Dictionary attrs) {
  Workspace workspace;
  workspace.allocate = &allocate_from_xla;
  workspace.context = &scratch;
  return to_ffi(handle(kEntry, args, rets, attrs, Device::cuda(device), stream, workspace));
}

// The handler symbol XLA calls: the binding is built once, on the first call.
template <Entry kEntry>
XLA_FFI_Error* cpu_handler(XLA_FFI_CallFrame* frame) {
  static auto* handler = ffi::Ffi::Bind()
                             .RemainingArgs()
                             .RemainingRets()
                             .Attrs<ffi::Dictionary>()
                             .To(cpu_call<kEntry>)
                             .release();
  return handler->Call(frame);
}

template <Entry kEntry>
XLA_FFI_Error* cuda_handler(XLA_FFI_CallFrame* frame) {
  static auto* handler = ffi::Ffi::Bind()
                             .Ctx<ffi::PlatformStream<void*>>()
                             .Ctx<ffi::DeviceOrdinal>()
                             .Ctx<ffi::ScratchAllocator>()
                             .RemainingArgs()
                             .RemainingRets()
                             .Attrs<ffi::Dictionary>()
                             .To(cuda_call<kEntry>)
                             .release();
  return handler->Call(frame);
}

nb::dict registrations(bool cuda) {
  nb::dict d;
  auto add = [&](const char* name, XLA_FFI_Handler* cpu, XLA_FFI_Handler* gpu) {
    d[name] = nb::capsule(reinterpret_cast<void*>(cuda ? gpu : cpu));
  };
#define FMHA_JAX_ENTRY(name, entry) add(name, cpu_handler<entry>, cuda_handler<entry>)
  FMHA_JAX_ENTRY("attention_fwd", Entry::kAttentionForward);
  FMHA_JAX_ENTRY("attention_bwd", Entry::kAttentionBackward);
  FMHA_JAX_ENTRY("varlen_fwd", Entry::kVarlenForward);
  FMHA_JAX_ENTRY("varlen_bwd", Entry::kVarlenBackward);
  FMHA_JAX_ENTRY("neighborhood_fwd", Entry::kNeighborhoodForward);
  FMHA_JAX_ENTRY("neighborhood_bwd", Entry::kNeighborhoodBackward);
  FMHA_JAX_ENTRY("merge_fwd", Entry::kMergeForward);
  FMHA_JAX_ENTRY("merge_bwd", Entry::kMergeBackward);
#undef FMHA_JAX_ENTRY
  return d;
}

// ---- The trace-time check ------------------------------------------------------------------------

class PyAttrs {
 public:
  explicit PyAttrs(const nb::dict& d) : d_(d) {}
  Status integer(std::string_view name, std::int64_t* value) {
    return get(name, [&](nb::handle h) { *value = nb::cast<std::int64_t>(h); });
  }
  Status real(std::string_view name, float* value) {
    return get(name, [&](nb::handle h) { *value = nb::cast<float>(h); });
  }
  Status triple(std::string_view name, std::array<std::int64_t, 3>* value) {
    return get(name, [&](nb::handle h) {
      if (nb::len(h) != value->size()) throw nb::cast_error();
      for (std::size_t i = 0; i < value->size(); ++i) {
        (*value)[i] = nb::cast<std::int64_t>(h[nb::int_(i)]);
      }
    });
  }

 private:
  template <typename Read>
  Status get(std::string_view name, Read read) {
    nb::str key(name.data(), name.size());
    if (!d_.contains(key)) {
      return Status::invalid_argument("fmha.jax: attribute " + std::string(name) + " missing");
    }
    try {
      read(d_[key]);
    } catch (const nb::cast_error&) {
      return Status::invalid_argument("fmha.jax: attribute " + std::string(name) +
                                      " has the wrong type");
    }
    return Status::ok_status();
  }
  const nb::dict& d_;
};

// Operands described as (dtype name, shape); their address is a non-null placeholder, which
// check() never dereferences (it reads no tensor data, except varlen offsets on the CPU: the
// Python side does not check varlen calls this way).
std::vector<Operand> planned_operands(const nb::list& described) {
  constexpr std::uintptr_t kPlannedAddress = 1 << 12;
  std::vector<Operand> operands;
  for (nb::handle item : described) {
    const auto dtype = nb::cast<std::string>(item[nb::int_(0)]);
    const nb::handle shape = item[nb::int_(1)];
    Operand o;
    o.data = reinterpret_cast<void*>(kPlannedAddress);
    if (dtype == "float32") o.dtype = DType::kFloat32;
    else if (dtype == "float16") o.dtype = DType::kFloat16;
    else if (dtype == "bfloat16") o.dtype = DType::kBFloat16;
    else if (dtype == "float64") o.dtype = DType::kFloat64;
    else if (dtype == "int32") o.dtype = DType::kInt32;
    else throw nb::type_error(("fmha.jax: dtype " + dtype + " has no fmha equivalent").c_str());
    o.rank = static_cast<int>(nb::len(shape));
    if (o.rank < 1 || o.rank > kMaxRank) {
      throw nb::value_error(("fmha.jax: an operand has rank " + std::to_string(o.rank) +
                             "; accepted: 1.." + std::to_string(kMaxRank))
                                .c_str());
    }
    for (int d = 0; d < o.rank; ++d) {
      o.shape[static_cast<std::size_t>(d)] = nb::cast<std::int64_t>(shape[nb::int_(d)]);
    }
    operands.push_back(o);
  }
  return operands;
}

// (code, message): code 0 ok, 1 invalid argument, 2 not supported, 3 backend error.
nb::tuple check_call(const std::string& name, const nb::list& args, const nb::list& rets,
                     const nb::dict& attrs_dict) {
  Entry entry;
  if (!entry_from_name(name, &entry)) {
    throw nb::value_error(("fmha.jax: unknown entry point " + name).c_str());
  }
  const std::vector<Operand> in = planned_operands(args), out = planned_operands(rets);
  CallAttrs attrs;
  PyAttrs source(attrs_dict);
  Status status = decode_attrs(source, &attrs);
  if (status.ok()) {
    status = call(entry, in.data(), in.size(), out.data(), out.size(), attrs, Device::cpu(),
                  nullptr, /*check_only=*/true);
  }
  return nb::make_tuple(static_cast<int>(status.code()), status.message());
}

}  // namespace
}  // namespace fmha::jax

NB_MODULE(_jax_ffi, m) {
  m.doc() = "fmha XLA FFI handlers (internal: use fmha.jax)";
  m.def("registrations", &fmha::jax::registrations, nb::arg("cuda") = false,
        "{name: capsule} of the FFI handlers of one platform (cuda=False: the CPU).");
  m.def("check", &fmha::jax::check_call, nb::arg("entry"), nb::arg("args"), nb::arg("rets"),
        nb::arg("attrs"));
  m.def("built_with_cuda", &fmha::built_with_cuda);
  m.def("version", &fmha::version);
}
