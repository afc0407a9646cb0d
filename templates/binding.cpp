// The Python binding: turns plain Python numbers into a FwdParams, BwdParams or DecodeParams and
// calls a kernel's launcher.
// Built once per Python version with the host compiler; knows nothing of torch or of CUDA, so one
// build of the kernels serves every Python and torch environment.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>

#include "flashgen/common/params.h"

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

// Every member of AttentionParams, FwdParams, BwdParams and DecodeParams as a tuple of references,
// in params.h's order (the
// X-macro lists that codegen/params.py writes beside the structs), which is the order Python
// passes them in (codegen.params.fwd_args, bwd_args).
#define FLASHGEN_TIE(name) , std::tie(p.name)
auto attention_members(flashgen::AttentionParams& p) {
  return std::tuple_cat(std::tuple<>() FLASHGEN_ATTENTIONPARAMS_MEMBERS(FLASHGEN_TIE));
}
auto fwd_members(flashgen::FwdParams& p) {
  return std::tuple_cat(std::tuple<>() FLASHGEN_FWDPARAMS_MEMBERS(FLASHGEN_TIE));
}
auto bwd_members(flashgen::BwdParams& p) {
  return std::tuple_cat(std::tuple<>() FLASHGEN_BWDPARAMS_MEMBERS(FLASHGEN_TIE));
}
auto decode_members(flashgen::DecodeParams& p) {
  return std::tuple_cat(std::tuple<>() FLASHGEN_DECODEPARAMS_MEMBERS(FLASHGEN_TIE));
}
#undef FLASHGEN_TIE

}  // namespace

PYBIND11_MODULE(_flashgen_binding, m) {
  m.doc() = "flashgen's launcher binding (no torch, no CUDA headers)";
  m.def("attention", binding(&attention_members));  // a variant's mask ranges
  m.def("fwd", binding(&fwd_members));
  m.def("bwd", binding(&bwd_members));
  m.def("decode", binding(&decode_members));
}
