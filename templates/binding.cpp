// The Python binding: turns plain Python numbers into a FwdParams and calls a kernel's launcher.
// Built once per Python version with the host compiler; knows nothing of torch or of CUDA, so one
// build of the kernels serves every Python and torch environment.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "flashgen/params.h"

namespace py = pybind11;

namespace {

using Launcher = int (*)(const flashgen::FwdParams*, void*);
using ErrorString = const char* (*)(int);

// Tensors arrive as (data_ptr, stride_batch, stride_row, stride_head).
void fwd(std::uintptr_t launcher, std::uintptr_t error_string, std::uintptr_t q,
         std::uintptr_t k, std::uintptr_t v, std::uintptr_t o, std::uintptr_t lse,
         py::tuple q_strides, py::tuple k_strides, py::tuple v_strides, py::tuple o_strides,
         int batch, int heads, int heads_kv, int seqlen_q, int seqlen_k, float softmax_scale,
         float scale_log2, int causal_offset, std::uintptr_t stream) {
  flashgen::FwdParams p{};
  p.q = reinterpret_cast<const void*>(q);
  p.k = reinterpret_cast<const void*>(k);
  p.v = reinterpret_cast<const void*>(v);
  p.o = reinterpret_cast<void*>(o);
  p.softmax_lse = reinterpret_cast<float*>(lse);
  auto strides = [](py::tuple t, int64_t& batch_stride, int64_t& row_stride, int64_t& head_stride) {
    batch_stride = t[0].cast<int64_t>();
    row_stride = t[1].cast<int64_t>();
    head_stride = t[2].cast<int64_t>();
  };
  strides(q_strides, p.q_batch_stride, p.q_row_stride, p.q_head_stride);
  strides(k_strides, p.k_batch_stride, p.k_row_stride, p.k_head_stride);
  strides(v_strides, p.v_batch_stride, p.v_row_stride, p.v_head_stride);
  strides(o_strides, p.o_batch_stride, p.o_row_stride, p.o_head_stride);
  p.batch = batch;
  p.heads = heads;
  p.heads_kv = heads_kv;
  p.seqlen_q = seqlen_q;
  p.seqlen_k = seqlen_k;
  p.softmax_scale = softmax_scale;
  p.scale_log2 = scale_log2;
  p.causal_offset = causal_offset;
  const int err = reinterpret_cast<Launcher>(launcher)(&p, reinterpret_cast<void*>(stream));
  if (err != 0) {
    throw std::runtime_error(std::string("flashgen: kernel launch failed: ") +
                             reinterpret_cast<ErrorString>(error_string)(err));
  }
}

}  // namespace

PYBIND11_MODULE(_flashgen_binding, m) {
  m.doc() = "flashgen's launcher binding (no torch, no CUDA headers)";
  m.def("fwd", &fwd);
}
