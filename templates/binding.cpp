// The Python binding: turns plain Python numbers into a FwdParams or BwdParams and calls a
// kernel's launcher.
// Built once per Python version with the host compiler; knows nothing of torch or of CUDA, so one
// build of the kernels serves every Python and torch environment.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>

#include "flashgen/params.h"

namespace {

using ErrorString = const char* (*)(int);

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

// A params field as Python passes it: a pointer as the int of its address, anything else as is.
template <class Field>
using Arg = std::conditional_t<std::is_pointer_v<Field>, std::uintptr_t, Field>;

template <class Field>
Field from_arg(Arg<Field> value) {
  if constexpr (std::is_pointer_v<Field>) {
    return reinterpret_cast<Field>(value);
  } else {
    return value;
  }
}

// The binding function for a Params whose fields `fields` lists in order: it takes the
// launcher, its error-string function, one plain argument per field (plain ints convert faster
// than a tuple per tensor: a forward call took 1.1 us with tuples, 0.7 with ints, CPU), then
// the stream.
template <class Params, class... Fields>
auto binding(std::tuple<Fields&...> (*fields)(Params&)) {
  return [fields](std::uintptr_t launcher, std::uintptr_t error_string, Arg<Fields>... values,
                  std::uintptr_t stream) {
    Params p{};
    fields(p) = std::make_tuple(from_arg<Fields>(values)...);
    call(launcher, error_string, p, stream);
  };
}

// The (batch, row, head) strides of q, k, v and o, in elements: fields both Params name alike.
template <class Params>
auto qkvo_strides(Params& p) {
  return std::tie(p.q_batch_stride, p.q_row_stride, p.q_head_stride,
                  p.k_batch_stride, p.k_row_stride, p.k_head_stride,
                  p.v_batch_stride, p.v_row_stride, p.v_head_stride,
                  p.o_batch_stride, p.o_row_stride, p.o_head_stride);
}

// Sizes, scales and the causal offset: fields both Params name alike, in this order.
template <class Params>
auto problem(Params& p) {
  return std::tie(p.batch, p.heads, p.heads_kv, p.seqlen_q, p.seqlen_k, p.softmax_scale,
                  p.scale_log2, p.causal_offset);
}

// FwdParams' fields in the order fwd takes them, params.h's: data pointers, then the strides of
// each tensor in the same order, then the problem and the grid's order.
auto fwd_fields(flashgen::FwdParams& p) {
  return std::tuple_cat(std::tie(p.q, p.k, p.v, p.o, p.softmax_lse), qkvo_strides(p), problem(p),
                        std::tie(p.ranks_per_round));
}

// BwdParams' fields in the order bwd takes them, likewise, then the grids' order and split.
// dq_accum 0 selects the deterministic path.
auto bwd_fields(flashgen::BwdParams& p) {
  return std::tuple_cat(
      std::tie(p.q, p.k, p.v, p.o, p.dout, p.softmax_lse, p.dq, p.dk, p.dv, p.softmax_d,
               p.dq_accum, p.dkv_accum),
      qkvo_strides(p),
      std::tie(p.do_batch_stride, p.do_row_stride, p.do_head_stride,
               p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride,
               p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride,
               p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride),
      problem(p), std::tie(p.sorted_tail_blocks, p.split_blocks, p.splits));
}

}  // namespace

PYBIND11_MODULE(_flashgen_binding, m) {
  m.doc() = "flashgen's launcher binding (no torch, no CUDA headers)";
  m.def("fwd", binding(&fwd_fields));
  m.def("bwd", binding(&bwd_fields));
}
