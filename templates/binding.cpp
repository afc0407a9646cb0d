// The Python binding: turns plain Python numbers into a FwdParams, BwdParams or DecodeParams and
// calls a kernel's launcher, or keeps them to launch again with new addresses (Prepared).
// Built once per Python version with the host compiler; knows nothing of torch or of CUDA, so one
// build of the kernels serves every Python and torch environment.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

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

// A launch whose params are filled once: calling it with the addresses of its patched members
// (in the order prepare() was given them) and the stream launches those params with these
// addresses. A decode step, or a forward or backward repeated at one shape, repeats the same
// params but for its tensors' addresses: a handful of arguments per launch instead of one per
// member (91 for DecodeParams, 74 for FwdParams, 90 for BwdParams).
template <class Params>
class Prepared {
 public:
  Prepared(std::uintptr_t launcher, std::uintptr_t error_string, const Params& params,
           std::vector<std::size_t> offsets)
      : launcher_(launcher), error_string_(error_string), params_(params),
        offsets_(std::move(offsets)) {}

  void operator()(const pybind11::args& values) const {
    if (values.size() != offsets_.size() + 1) {
      throw std::invalid_argument("flashgen: a prepared launch takes its " +
                                  std::to_string(offsets_.size()) +
                                  " patched addresses, then the stream; got " +
                                  std::to_string(values.size()) + " arguments");
    }
    Params p = params_;
    auto* base = reinterpret_cast<char*>(&p);
    for (std::size_t i = 0; i < offsets_.size(); ++i) {
      const auto address = values[i].cast<std::uintptr_t>();
      std::memcpy(base + offsets_[i], &address, sizeof address);
    }
    call(launcher_, error_string_, p, values[offsets_.size()].cast<std::uintptr_t>());
  }

  // (launcher, error-string function, the params' bytes, the patched members' byte offsets):
  // what flashgen/replay.py keeps for its compiled replay of a known call.
  pybind11::tuple parts() const {
    return pybind11::make_tuple(launcher_, error_string_,
                                pybind11::bytes(reinterpret_cast<const char*>(&params_),
                                                sizeof params_),
                                offsets_);
  }

 private:
  std::uintptr_t launcher_, error_string_;
  Params params_;
  std::vector<std::size_t> offsets_;  // byte offsets of the patched pointer members
};

// The preparing function for a Params: the launcher, its error-string function, the indices
// (in `fields`' order) of the pointer members each call sets, then one argument per member.
template <class Params, class... Fields>
auto preparer(std::tuple<Fields&...> (*fields)(Params&)) {
  return [fields](std::uintptr_t launcher, std::uintptr_t error_string,
                  const std::vector<std::size_t>& patched, Arg<Fields>... values) {
    Params p{};
    auto members = fields(p);
    members = std::make_tuple(from_arg<Fields>(values)...);
    std::vector<std::size_t> offsets_of;
    std::vector<bool> pointer;
    std::apply(
        [&](auto&... member) {
          ((offsets_of.push_back(static_cast<std::size_t>(
                reinterpret_cast<const char*>(&member) - reinterpret_cast<const char*>(&p))),
            pointer.push_back(std::is_pointer_v<std::remove_reference_t<decltype(member)>>)),
           ...);
        },
        members);
    std::vector<std::size_t> offsets;
    for (const std::size_t index : patched) {
      if (index >= offsets_of.size() || !pointer[index]) {
        throw std::invalid_argument("flashgen: member " + std::to_string(index) +
                                    " is no pointer member of the params");
      }
      offsets.push_back(offsets_of[index]);
    }
    return Prepared<Params>(launcher, error_string, p, std::move(offsets));
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
  pybind11::class_<Prepared<flashgen::FwdParams>>(m, "PreparedFwd")
      .def("__call__", &Prepared<flashgen::FwdParams>::operator())
      .def("parts", &Prepared<flashgen::FwdParams>::parts);
  m.def("prepare_fwd", preparer(&fwd_members));
  pybind11::class_<Prepared<flashgen::BwdParams>>(m, "PreparedBwd")
      .def("__call__", &Prepared<flashgen::BwdParams>::operator())
      .def("parts", &Prepared<flashgen::BwdParams>::parts);
  m.def("prepare_bwd", preparer(&bwd_members));
  pybind11::class_<Prepared<flashgen::DecodeParams>>(m, "PreparedDecode")
      .def("__call__", &Prepared<flashgen::DecodeParams>::operator())
      .def("parts", &Prepared<flashgen::DecodeParams>::parts);
  m.def("prepare_decode", preparer(&decode_members));
}
