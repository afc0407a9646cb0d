// The Python binding: turns plain Python numbers into a FwdParams or BwdParams and calls a
// kernel's launcher.
// Built once per Python version with the host compiler; knows nothing of torch or of CUDA, so one
// build of the kernels serves every Python and torch environment.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "flashgen/params.h"

namespace py = pybind11;

namespace {

using ErrorString = const char* (*)(int);

// (batch, row, head) strides from a Python tuple.
void read_strides(py::tuple t, int64_t& batch_stride, int64_t& row_stride, int64_t& head_stride) {
  batch_stride = t[0].cast<int64_t>();
  row_stride = t[1].cast<int64_t>();
  head_stride = t[2].cast<int64_t>();
}

template <class Params>
void call(std::uintptr_t launcher, std::uintptr_t error_string, const Params& p,
          std::uintptr_t stream) {
  using Launcher = int (*)(const Params*, void*);
  const int err = reinterpret_cast<Launcher>(launcher)(&p, reinterpret_cast<void*>(stream));
  if (err != 0) {
    throw std::runtime_error(std::string("flashgen: kernel launch failed: ") +
                             reinterpret_cast<ErrorString>(error_string)(err));
  }
}

// Tensors arrive as data pointers, then the (batch, row, head) strides of each in the same order:
// plain ints convert faster than a tuple each (a call took 1.1 us with tuples, 0.7 with ints, CPU).
void fwd(std::uintptr_t launcher, std::uintptr_t error_string, std::uintptr_t q,
         std::uintptr_t k, std::uintptr_t v, std::uintptr_t o, std::uintptr_t lse,
         int64_t q_batch_stride, int64_t q_row_stride, int64_t q_head_stride,
         int64_t k_batch_stride, int64_t k_row_stride, int64_t k_head_stride,
         int64_t v_batch_stride, int64_t v_row_stride, int64_t v_head_stride,
         int64_t o_batch_stride, int64_t o_row_stride, int64_t o_head_stride,
         int batch, int heads, int heads_kv, int seqlen_q, int seqlen_k, float softmax_scale,
         float scale_log2, int causal_offset, std::uintptr_t stream) {
  flashgen::FwdParams p{};
  p.q = reinterpret_cast<const void*>(q);
  p.k = reinterpret_cast<const void*>(k);
  p.v = reinterpret_cast<const void*>(v);
  p.o = reinterpret_cast<void*>(o);
  p.softmax_lse = reinterpret_cast<float*>(lse);
  p.q_batch_stride = q_batch_stride;
  p.q_row_stride = q_row_stride;
  p.q_head_stride = q_head_stride;
  p.k_batch_stride = k_batch_stride;
  p.k_row_stride = k_row_stride;
  p.k_head_stride = k_head_stride;
  p.v_batch_stride = v_batch_stride;
  p.v_row_stride = v_row_stride;
  p.v_head_stride = v_head_stride;
  p.o_batch_stride = o_batch_stride;
  p.o_row_stride = o_row_stride;
  p.o_head_stride = o_head_stride;
  p.batch = batch;
  p.heads = heads;
  p.heads_kv = heads_kv;
  p.seqlen_q = seqlen_q;
  p.seqlen_k = seqlen_k;
  p.softmax_scale = softmax_scale;
  p.scale_log2 = scale_log2;
  p.causal_offset = causal_offset;
  call(launcher, error_string, p, stream);
}

// Tensors as data pointers; `strides` holds (batch, row, head) stride tuples of q, k, v, o, dout,
// dq, dk, dv in that order (tuples, unlike fwd: once per backward, whose kernels take far longer
// than the conversion). dq_accum 0 selects the deterministic path.
void bwd(std::uintptr_t launcher, std::uintptr_t error_string, std::uintptr_t q,
         std::uintptr_t k, std::uintptr_t v, std::uintptr_t o, std::uintptr_t dout,
         std::uintptr_t lse, std::uintptr_t dq, std::uintptr_t dk, std::uintptr_t dv,
         std::uintptr_t softmax_d, std::uintptr_t dq_accum, py::tuple strides, int batch,
         int heads, int heads_kv, int seqlen_q, int seqlen_k, float softmax_scale,
         float scale_log2, int causal_offset, std::uintptr_t stream) {
  flashgen::BwdParams p{};
  p.q = reinterpret_cast<const void*>(q);
  p.k = reinterpret_cast<const void*>(k);
  p.v = reinterpret_cast<const void*>(v);
  p.o = reinterpret_cast<const void*>(o);
  p.dout = reinterpret_cast<const void*>(dout);
  p.softmax_lse = reinterpret_cast<const float*>(lse);
  p.dq = reinterpret_cast<void*>(dq);
  p.dk = reinterpret_cast<void*>(dk);
  p.dv = reinterpret_cast<void*>(dv);
  p.softmax_d = reinterpret_cast<float*>(softmax_d);
  p.dq_accum = reinterpret_cast<float*>(dq_accum);
  if (strides.size() != 8) throw std::invalid_argument("flashgen: bwd takes 8 stride tuples");
  read_strides(strides[0], p.q_batch_stride, p.q_row_stride, p.q_head_stride);
  read_strides(strides[1], p.k_batch_stride, p.k_row_stride, p.k_head_stride);
  read_strides(strides[2], p.v_batch_stride, p.v_row_stride, p.v_head_stride);
  read_strides(strides[3], p.o_batch_stride, p.o_row_stride, p.o_head_stride);
  read_strides(strides[4], p.do_batch_stride, p.do_row_stride, p.do_head_stride);
  read_strides(strides[5], p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride);
  read_strides(strides[6], p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride);
  read_strides(strides[7], p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride);
  p.batch = batch;
  p.heads = heads;
  p.heads_kv = heads_kv;
  p.seqlen_q = seqlen_q;
  p.seqlen_k = seqlen_k;
  p.softmax_scale = softmax_scale;
  p.scale_log2 = scale_log2;
  p.causal_offset = causal_offset;
  call(launcher, error_string, p, stream);
}

}  // namespace

PYBIND11_MODULE(_flashgen_binding, m) {
  m.doc() = "flashgen's launcher binding (no torch, no CUDA headers)";
  m.def("fwd", &fwd);
  m.def("bwd", &bwd);
}
