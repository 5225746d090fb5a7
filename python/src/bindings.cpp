// fmha._C: the C++ API (include/fmha/fmha.h) as seen from Python.
//
// The layer is deliberately thin: the parameter structs are bound field by field, tensors arrive as
// TensorView (address + dtype + device + shape + strides, filled in by python/fmha/_bridge.py from
// torch tensors), and check/run return the library's Status unchanged. Mapping a Status onto a
// Python exception, allocating outputs and picking the CUDA stream happen in Python, next to torch.
#include <nanobind/nanobind.h>
#include <nanobind/stl/array.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <string>
#include <vector>

#include "fmha/fmha.h"

namespace nb = nanobind;

namespace {

fmha::TensorView make_view(std::uintptr_t data, fmha::DType dtype, fmha::DeviceType device_type,
                           int device_index, const std::vector<std::int64_t>& shape,
                           const std::vector<std::int64_t>& stride) {
  // Python checks the rank with the argument's name first; this guards direct callers of _C,
  // since TensorView::strided would otherwise clamp the rank silently.
  if (shape.size() != stride.size() || shape.empty() ||
      shape.size() > static_cast<std::size_t>(fmha::kMaxRank)) {
    throw nb::value_error(("fmha: a tensor view needs 1.." + std::to_string(fmha::kMaxRank) +
                           " dimensions and one stride per dimension; got " +
                           std::to_string(shape.size()) + " sizes and " +
                           std::to_string(stride.size()) + " strides")
                              .c_str());
  }
  return fmha::TensorView::strided(reinterpret_cast<void*>(data), dtype,
                                   static_cast<int>(shape.size()), shape.data(), stride.data(),
                                   fmha::Device{device_type, device_index});
}

// Binds fmha::check and fmha::run for one parameter struct. run releases the GIL: the CPU backend
// can take a while, and nothing in it touches Python objects.
template <typename Params>
void bind_entry_point(nb::module_& m) {
  m.def("check", [](const Params& p) { return fmha::check(p); }, nb::arg("params"));
  m.def(
      "run",
      [](const Params& p, std::uintptr_t stream) {
        nb::gil_scoped_release release;
        return fmha::run(p, reinterpret_cast<void*>(stream));
      },
      nb::arg("params"), nb::arg("stream") = 0);
}

// A Python callable as the Workspace allocator of one run (fmha/params.h): allocate(bytes) returns
// an object with data_ptr() (a torch tensor); the objects it returns are kept until run() returns,
// then released, so that their memory goes back to the caller's allocator in the stream order of
// the work queued on it (PyTorch's caching allocator).
struct PythonAllocator {
  nb::handle allocate;
  std::vector<nb::object> held;
  std::string error;  // what the callable raised, for the Status
};

void* allocate_from_python(void* context, std::size_t bytes) {
  auto* a = static_cast<PythonAllocator*>(context);
  try {
    nb::object block = a->allocate(bytes);
    const auto address = nb::cast<std::uintptr_t>(block.attr("data_ptr")());
    a->held.push_back(std::move(block));
    return reinterpret_cast<void*>(address);
  } catch (const std::exception& e) {
    a->error = e.what();
    return nullptr;
  }
}

// fmha::run of CUDA tensors with its scratch memory from `allocate` (PythonAllocator) instead of
// fmha's own pool: the shaped entry points, whose structs have a Workspace. The GIL stays held: a
// CUDA call only queues work, and the allocator is Python.
template <typename Params>
void bind_allocating_entry_point(nb::module_& m) {
  m.def(
      "run_allocating",
      [](Params p, std::uintptr_t stream, nb::handle allocate) {
        PythonAllocator a{allocate, {}, {}};
        p.workspace.allocate = &allocate_from_python;
        p.workspace.context = &a;
        const fmha::Status status = fmha::run(p, reinterpret_cast<void*>(stream));
        if (!status.ok() && !a.error.empty()) {
          return fmha::Status::backend_error(status.message() + " (the allocator raised: " +
                                             a.error + ")");
        }
        return status;
      },
      nb::arg("params"), nb::arg("stream"), nb::arg("allocate"));
  // (status, bytes): the scratch memory run() takes at most for these params on their device.
  m.def(
      "workspace_size",
      [](const Params& p) {
        std::size_t bytes = 0;
        fmha::Status status = fmha::workspace_size(p, &bytes);
        return nb::make_tuple(status, bytes);
      },
      nb::arg("params"));
}

// The fields every shaped backward struct shares.
template <typename Params, typename Class>
void bind_backward_fields(Class& c) {
  c.def_rw("out", &Params::out)
      .def_rw("lse", &Params::lse)
      .def_rw("dout", &Params::dout)
      .def_rw("dlse", &Params::dlse)
      .def_rw("options", &Params::options)
      .def_rw("backward_impl", &Params::backward_impl)
      .def_rw("grads", &Params::grads);
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "fmha C++ API bindings (internal: use the functions of the fmha package)";
  // Objects of this module are kept by other libraries' state past this module's teardown at
  // interpreter exit: an autograd graph still referenced by a global (an output not yet
  // differentiated, a traceback's frames) holds the TensorViews its backward will use. nanobind
  // then reports them, and the types and functions behind them, as leaks although no reference
  // count is wrong; the warnings are switched off so that a plain script does not end with them.
  // set_leak_warnings(True) turns them back on, for the tests (tests/python/test_eager_path.py)
  // and for looking for a real leak.
  nb::set_leak_warnings(false);
  m.def("set_leak_warnings", [](bool on) { nb::set_leak_warnings(on); }, nb::arg("on"),
        "Whether nanobind reports this module's objects still alive at interpreter exit.");

  nb::enum_<fmha::DType>(m, "DType")
      .value("float32", fmha::DType::kFloat32)
      .value("float16", fmha::DType::kFloat16)
      .value("bfloat16", fmha::DType::kBFloat16)
      .value("float64", fmha::DType::kFloat64)
      .value("int32", fmha::DType::kInt32);
  nb::enum_<fmha::DeviceType>(m, "DeviceType")
      .value("cpu", fmha::DeviceType::kCPU)
      .value("cuda", fmha::DeviceType::kCUDA);
  nb::enum_<fmha::CausalAlignment>(m, "CausalAlignment")
      .value("top_left", fmha::CausalAlignment::kTopLeft)
      .value("bottom_right", fmha::CausalAlignment::kBottomRight);
  nb::enum_<fmha::CpuBackend>(m, "CpuBackend")
      .value("auto", fmha::CpuBackend::kAuto)
      .value("reference", fmha::CpuBackend::kReference);
  nb::enum_<fmha::BackwardImpl>(m, "BackwardImpl")
      .value("auto", fmha::BackwardImpl::kAuto)
      .value("fused", fmha::BackwardImpl::kFused)
      .value("split", fmha::BackwardImpl::kSplit);
  nb::enum_<fmha::StatusCode>(m, "StatusCode")
      .value("ok", fmha::StatusCode::kOk)
      .value("invalid_argument", fmha::StatusCode::kInvalidArgument)
      .value("not_supported", fmha::StatusCode::kNotSupported)
      .value("backend_error", fmha::StatusCode::kBackendError);

  nb::class_<fmha::Status>(m, "Status")
      .def_prop_ro("ok", &fmha::Status::ok)
      .def_prop_ro("code", &fmha::Status::code)
      .def_prop_ro("message", &fmha::Status::message);

  nb::class_<fmha::TensorView>(m, "TensorView")
      .def(nb::init<>(), "A view that is 'not given' (rank 0).")
      .def(
          "__init__",
          [](fmha::TensorView* self, std::uintptr_t data, fmha::DType dtype,
             fmha::DeviceType device_type, int device_index, const std::vector<std::int64_t>& shape,
             const std::vector<std::int64_t>& stride) {
            new (self) fmha::TensorView(
                make_view(data, dtype, device_type, device_index, shape, stride));
          },
          nb::arg("data"), nb::arg("dtype"), nb::arg("device_type"), nb::arg("device_index"),
          nb::arg("shape"), nb::arg("stride"))
      .def_prop_ro("defined", &fmha::TensorView::defined)
      .def_prop_ro("rank", [](const fmha::TensorView& t) { return t.rank; })
      .def_prop_ro("shape", [](const fmha::TensorView& t) {
        return std::vector<std::int64_t>(t.shape.begin(), t.shape.begin() + t.rank);
      })
      .def_prop_ro("stride", [](const fmha::TensorView& t) {
        return std::vector<std::int64_t>(t.stride.begin(), t.stride.begin() + t.rank);
      });

  nb::class_<fmha::AttentionOptions>(m, "AttentionOptions")
      .def(nb::init<>())
      .def_rw("scale", &fmha::AttentionOptions::scale)
      .def_rw("softcap", &fmha::AttentionOptions::softcap)
      .def_rw("causal", &fmha::AttentionOptions::causal)
      .def_rw("causal_alignment", &fmha::AttentionOptions::causal_alignment)
      .def_rw("window_left", &fmha::AttentionOptions::window_left)
      .def_rw("window_right", &fmha::AttentionOptions::window_right)
      .def_rw("bias", &fmha::AttentionOptions::bias)
      .def_rw("rel_h", &fmha::AttentionOptions::rel_h)
      .def_rw("rel_w", &fmha::AttentionOptions::rel_w)
      .def_rw("sinks", &fmha::AttentionOptions::sinks)
      .def_rw("extra_k", &fmha::AttentionOptions::extra_k)
      .def_rw("extra_v", &fmha::AttentionOptions::extra_v)
      .def_rw("deterministic", &fmha::AttentionOptions::deterministic)
      .def_rw("allow_tf32", &fmha::AttentionOptions::allow_tf32)
      .def_rw("cpu_backend", &fmha::AttentionOptions::cpu_backend)
      .def_rw("cpu_threads", &fmha::AttentionOptions::cpu_threads);

  nb::class_<fmha::AttentionGradients>(m, "AttentionGradients")
      .def(nb::init<>())
      .def_rw("dq", &fmha::AttentionGradients::dq)
      .def_rw("dk", &fmha::AttentionGradients::dk)
      .def_rw("dv", &fmha::AttentionGradients::dv)
      .def_rw("dbias", &fmha::AttentionGradients::dbias)
      .def_rw("drel_h", &fmha::AttentionGradients::drel_h)
      .def_rw("drel_w", &fmha::AttentionGradients::drel_w)
      .def_rw("dsinks", &fmha::AttentionGradients::dsinks)
      .def_rw("dextra_k", &fmha::AttentionGradients::dextra_k)
      .def_rw("dextra_v", &fmha::AttentionGradients::dextra_v);

  nb::class_<fmha::NeighborhoodOptions>(m, "NeighborhoodOptions")
      .def(nb::init<>())
      .def_rw("num_dims", &fmha::NeighborhoodOptions::num_dims)
      .def_rw("kernel_size", &fmha::NeighborhoodOptions::kernel_size)
      .def_rw("dilation", &fmha::NeighborhoodOptions::dilation)
      .def_rw("causal", &fmha::NeighborhoodOptions::causal);

  // ---- Dense ------------------------------------------------------------------------------------
  nb::class_<fmha::AttentionForwardParams>(m, "AttentionForwardParams")
      .def(nb::init<>())
      .def_rw("q", &fmha::AttentionForwardParams::q)
      .def_rw("k", &fmha::AttentionForwardParams::k)
      .def_rw("v", &fmha::AttentionForwardParams::v)
      .def_rw("out", &fmha::AttentionForwardParams::out)
      .def_rw("lse", &fmha::AttentionForwardParams::lse)
      .def_rw("options", &fmha::AttentionForwardParams::options);
  auto dense_bwd = nb::class_<fmha::AttentionBackwardParams>(m, "AttentionBackwardParams");
  dense_bwd.def(nb::init<>())
      .def_rw("q", &fmha::AttentionBackwardParams::q)
      .def_rw("k", &fmha::AttentionBackwardParams::k)
      .def_rw("v", &fmha::AttentionBackwardParams::v);
  bind_backward_fields<fmha::AttentionBackwardParams>(dense_bwd);

  // ---- Varlen -----------------------------------------------------------------------------------
  nb::class_<fmha::VarlenForwardParams>(m, "VarlenForwardParams")
      .def(nb::init<>())
      .def_rw("q", &fmha::VarlenForwardParams::q)
      .def_rw("k", &fmha::VarlenForwardParams::k)
      .def_rw("v", &fmha::VarlenForwardParams::v)
      .def_rw("cu_seqlens_q", &fmha::VarlenForwardParams::cu_seqlens_q)
      .def_rw("cu_seqlens_k", &fmha::VarlenForwardParams::cu_seqlens_k)
      .def_rw("max_seqlen_q", &fmha::VarlenForwardParams::max_seqlen_q)
      .def_rw("max_seqlen_k", &fmha::VarlenForwardParams::max_seqlen_k)
      .def_rw("check_cu_seqlens", &fmha::VarlenForwardParams::check_cu_seqlens)
      .def_rw("out", &fmha::VarlenForwardParams::out)
      .def_rw("lse", &fmha::VarlenForwardParams::lse)
      .def_rw("options", &fmha::VarlenForwardParams::options);
  auto varlen_bwd = nb::class_<fmha::VarlenBackwardParams>(m, "VarlenBackwardParams");
  varlen_bwd.def(nb::init<>())
      .def_rw("q", &fmha::VarlenBackwardParams::q)
      .def_rw("k", &fmha::VarlenBackwardParams::k)
      .def_rw("v", &fmha::VarlenBackwardParams::v)
      .def_rw("cu_seqlens_q", &fmha::VarlenBackwardParams::cu_seqlens_q)
      .def_rw("cu_seqlens_k", &fmha::VarlenBackwardParams::cu_seqlens_k)
      .def_rw("max_seqlen_q", &fmha::VarlenBackwardParams::max_seqlen_q)
      .def_rw("max_seqlen_k", &fmha::VarlenBackwardParams::max_seqlen_k)
      .def_rw("check_cu_seqlens", &fmha::VarlenBackwardParams::check_cu_seqlens);
  bind_backward_fields<fmha::VarlenBackwardParams>(varlen_bwd);

  // ---- Neighborhood -----------------------------------------------------------------------------
  nb::class_<fmha::NeighborhoodForwardParams>(m, "NeighborhoodForwardParams")
      .def(nb::init<>())
      .def_rw("q", &fmha::NeighborhoodForwardParams::q)
      .def_rw("k", &fmha::NeighborhoodForwardParams::k)
      .def_rw("v", &fmha::NeighborhoodForwardParams::v)
      .def_rw("out", &fmha::NeighborhoodForwardParams::out)
      .def_rw("lse", &fmha::NeighborhoodForwardParams::lse)
      .def_rw("neighborhood", &fmha::NeighborhoodForwardParams::neighborhood)
      .def_rw("options", &fmha::NeighborhoodForwardParams::options);
  auto na_bwd = nb::class_<fmha::NeighborhoodBackwardParams>(m, "NeighborhoodBackwardParams");
  na_bwd.def(nb::init<>())
      .def_rw("q", &fmha::NeighborhoodBackwardParams::q)
      .def_rw("k", &fmha::NeighborhoodBackwardParams::k)
      .def_rw("v", &fmha::NeighborhoodBackwardParams::v)
      .def_rw("neighborhood", &fmha::NeighborhoodBackwardParams::neighborhood);
  bind_backward_fields<fmha::NeighborhoodBackwardParams>(na_bwd);

  // ---- Merge ------------------------------------------------------------------------------------
  nb::class_<fmha::MergeForwardParams>(m, "MergeForwardParams")
      .def(nb::init<>())
      .def_rw("outs", &fmha::MergeForwardParams::outs)
      .def_rw("lses", &fmha::MergeForwardParams::lses)
      .def_rw("out", &fmha::MergeForwardParams::out)
      .def_rw("lse", &fmha::MergeForwardParams::lse);
  nb::class_<fmha::MergeBackwardParams>(m, "MergeBackwardParams")
      .def(nb::init<>())
      .def_rw("outs", &fmha::MergeBackwardParams::outs)
      .def_rw("lses", &fmha::MergeBackwardParams::lses)
      .def_rw("out", &fmha::MergeBackwardParams::out)
      .def_rw("lse", &fmha::MergeBackwardParams::lse)
      .def_rw("dout", &fmha::MergeBackwardParams::dout)
      .def_rw("dlse", &fmha::MergeBackwardParams::dlse)
      .def_rw("douts", &fmha::MergeBackwardParams::douts)
      .def_rw("dlses", &fmha::MergeBackwardParams::dlses);

  // ---- KV cache ---------------------------------------------------------------------------------
  nb::class_<fmha::KvCacheForwardParams>(m, "KvCacheForwardParams")
      .def(nb::init<>())
      .def_rw("q", &fmha::KvCacheForwardParams::q)
      .def_rw("cu_seqlens_q", &fmha::KvCacheForwardParams::cu_seqlens_q)
      .def_rw("max_seqlen_q", &fmha::KvCacheForwardParams::max_seqlen_q)
      .def_rw("k_cache", &fmha::KvCacheForwardParams::k_cache)
      .def_rw("v_cache", &fmha::KvCacheForwardParams::v_cache)
      .def_rw("block_table", &fmha::KvCacheForwardParams::block_table)
      .def_rw("cache_seqlens", &fmha::KvCacheForwardParams::cache_seqlens)
      .def_rw("out", &fmha::KvCacheForwardParams::out)
      .def_rw("lse", &fmha::KvCacheForwardParams::lse)
      .def_rw("options", &fmha::KvCacheForwardParams::options)
      .def_rw("num_splits", &fmha::KvCacheForwardParams::num_splits)
      .def_prop_rw(
          "workspace",
          [](const fmha::KvCacheForwardParams& p) { return reinterpret_cast<std::uintptr_t>(p.workspace); },
          [](fmha::KvCacheForwardParams& p, std::uintptr_t address) {
            p.workspace = reinterpret_cast<void*>(address);
          })
      .def_rw("workspace_bytes", &fmha::KvCacheForwardParams::workspace_bytes);
  nb::class_<fmha::KvCacheAppendParams>(m, "KvCacheAppendParams")
      .def(nb::init<>())
      .def_rw("k_new", &fmha::KvCacheAppendParams::k_new)
      .def_rw("v_new", &fmha::KvCacheAppendParams::v_new)
      .def_rw("cu_seqlens_new", &fmha::KvCacheAppendParams::cu_seqlens_new)
      .def_rw("k_cache", &fmha::KvCacheAppendParams::k_cache)
      .def_rw("v_cache", &fmha::KvCacheAppendParams::v_cache)
      .def_rw("block_table", &fmha::KvCacheAppendParams::block_table)
      .def_rw("cache_seqlens", &fmha::KvCacheAppendParams::cache_seqlens);
  bind_entry_point<fmha::KvCacheForwardParams>(m);
  bind_entry_point<fmha::KvCacheAppendParams>(m);
  // (status, bytes): the workspace run() uses for these params on their device.
  m.def(
      "workspace_size",
      [](const fmha::KvCacheForwardParams& p) {
        std::size_t bytes = 0;
        fmha::Status status = fmha::workspace_size(p, &bytes);
        return nb::make_tuple(status, bytes);
      },
      nb::arg("params"));

  bind_entry_point<fmha::AttentionForwardParams>(m);
  bind_entry_point<fmha::AttentionBackwardParams>(m);
  bind_entry_point<fmha::VarlenForwardParams>(m);
  bind_entry_point<fmha::VarlenBackwardParams>(m);
  bind_entry_point<fmha::NeighborhoodForwardParams>(m);
  bind_entry_point<fmha::NeighborhoodBackwardParams>(m);
  bind_entry_point<fmha::MergeForwardParams>(m);
  bind_entry_point<fmha::MergeBackwardParams>(m);
  bind_allocating_entry_point<fmha::AttentionForwardParams>(m);
  bind_allocating_entry_point<fmha::AttentionBackwardParams>(m);
  bind_allocating_entry_point<fmha::VarlenForwardParams>(m);
  bind_allocating_entry_point<fmha::VarlenBackwardParams>(m);
  bind_allocating_entry_point<fmha::NeighborhoodForwardParams>(m);
  bind_allocating_entry_point<fmha::NeighborhoodBackwardParams>(m);

  m.def("built_with_cuda", &fmha::built_with_cuda,
        "True when this build contains the CUDA backend.");
  // The addresses of GOMP_parallel and omp_get_thread_num of an OpenMP runtime loaded in the
  // process (fmha/_cpu_threads.py finds PyTorch's), or 0 and 0 for fmha's own threads.
  m.def(
      "set_cpu_parallel_runtime",
      [](std::uintptr_t parallel, std::uintptr_t thread_num) {
        fmha::CpuParallelRuntime runtime;
        runtime.parallel = reinterpret_cast<decltype(runtime.parallel)>(parallel);
        runtime.thread_num = reinterpret_cast<decltype(runtime.thread_num)>(thread_num);
        fmha::set_cpu_parallel_runtime(runtime);
      },
      nb::arg("parallel"), nb::arg("thread_num"));
  m.def("version", &fmha::version);
  m.def("cpu_isa", &fmha::cpu_isa,
        "The instruction set of the fast CPU backend's kernels on this machine.");
}
