// The host fast path of known calls (flash_attn_with_kvcache; flash_attn_func and
// flash_attn_varlen_func without autograd; the dense backward of flash_attn_func): a call whose
// arguments match a launch Python kept (each tensor's type, device, dtype, sizes, strides and
// requires_grad, every other argument's type and value) allocates its outputs here and launches
// the kept kernels with its own addresses, with no Python between the call and the launch.
// Python decides everything (flashgen/decode.py, forward.py and backward.py plan,
// flashgen/replay.py keeps their launches here); this file only matches and replays.
// Built once per Python and torch version against torch's headers (codegen/build.py); where it is
// not built the same plans run from Python.
#include <Python.h>

#include <ATen/autocast_mode.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_permuted.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <utility>
#include <vector>

namespace {

// What a kept call had at one argument position.
struct Expected {
  enum Kind { kNone, kTensor, kValue } kind = kNone;
  c10::DeviceIndex device = 0;
  at::ScalarType dtype = at::ScalarType::Undefined;
  std::vector<int64_t> sizes, strides;
  bool requires_grad = false;  // only a backward's saved tensors do
  PyObject* value = nullptr;  // kValue: a number, bool, str or tuple of those, owned
};

// An address member of a launch's params: set to sources[source] + offset per call.
struct Patch {
  std::size_t byte;
  int source;
  int64_t offset;
};

struct Launch {
  std::uintptr_t launcher, error_string;
  std::vector<std::uint64_t> params;  // the params struct's bytes, 8-byte aligned
  std::vector<Patch> patches;
};

// What a kept call launches for: a decode step (flash_attn_with_kvcache), a forward
// (flash_attn_func, flash_attn_varlen_func) or a backward (fwd's autograd, ops._fwd_backward).
enum class Op { kDecode, kForward, kBackward };

struct Entry {
  Op op;
  std::vector<Expected> expected;             // per argument position of the call
  std::vector<std::pair<int, int>> inputs;    // (source, argument position) of its tensors
  std::vector<Launch> launches;
  int sources = 0;                            // the patches' sources: inputs, then made here
  int q_position = 0;
  int out = -1, lse = -1;                     // out like q, lse fp32
  // a decode step's: q_rot, the split workspace (o_accum, then lse_accum) and counters
  int q_rot = -1, o_accum = -1, lse_accum = -1, split_counters = -1;
  int64_t workspace = 0, lse_rows = 0, counters = 0;  // fp32, fp32, int32 elements
  bool rotary = false;
  // a forward's: its tile counter (the launcher zeroes it), lse's sizes as q's dims
  int tile_counter = -1;
  std::vector<int64_t> lse_dims;
  // a backward's: dq, dk, dv (each shaped like the argument at grads_like, laid out heads first
  // or not as the forward's out) and its fp32 scratch (the launcher zeroes what must start at 0)
  int grads[3] = {-1, -1, -1}, grads_like[3] = {-1, -1, -1}, scratch = -1;
  int64_t scratch_floats = 0;
  bool heads_first = false;
  ~Entry() {
    for (auto& e : expected) Py_XDECREF(e.value);
  }
};

// Signatures kept per op: a model's layers share a few. Once full, further signatures run from
// Python (an entry never leaves but by forget(), so Python knows what is kept).
constexpr std::size_t kKept = 64;
constexpr int64_t kScratchKept = 1 << 24;  // fp32 workspace kept per stream (decode.SCRATCH_KEPT)

// Never destroyed: their tensors must not be freed after CUDA's teardown at exit.
auto& entries = *new std::vector<Entry*>();
using StreamKey = std::pair<c10::DeviceIndex, cudaStream_t>;
auto& scratch = *new std::map<StreamKey, at::Tensor>();
auto& counter_buffers = *new std::map<StreamKey, at::Tensor>();
auto& tile_counters = *new std::map<StreamKey, at::Tensor>();
std::uint64_t replayed = 0;  // calls launched from here (tests read it)

bool env_is_1(const char* name) {
  const char* value = std::getenv(name);  // os.environ's changes reach the C environment too
  return value != nullptr && std::strcmp(value, "1") == 0;
}

bool plain_value(PyObject* v) {
  return v == Py_None || PyBool_Check(v) || PyLong_CheckExact(v) || PyFloat_CheckExact(v) ||
         PyUnicode_CheckExact(v);
}

// Same type and value; a tuple's elements of the same types too (True and 1 differ to the checks).
bool same_value(PyObject* given, PyObject* kept) {
  if (given == kept) return true;
  if (Py_TYPE(given) != Py_TYPE(kept)) return false;
  if (PyTuple_CheckExact(kept)) {
    const Py_ssize_t n = PyTuple_GET_SIZE(kept);
    if (PyTuple_GET_SIZE(given) != n) return false;
    for (Py_ssize_t i = 0; i < n; ++i) {
      if (Py_TYPE(PyTuple_GET_ITEM(given, i)) != Py_TYPE(PyTuple_GET_ITEM(kept, i))) return false;
    }
  }
  const int equal = PyObject_RichCompareBool(given, kept, Py_EQ);
  if (equal < 0) PyErr_Clear();
  return equal == 1;
}

bool plain_tensor(PyObject* v) {
  return Py_TYPE(v) == reinterpret_cast<PyTypeObject*>(THPVariableClass);
}

bool matches(const Entry& entry, PyObject* const* args) {
  for (std::size_t i = 0; i < entry.expected.size(); ++i) {
    const Expected& e = entry.expected[i];
    PyObject* v = args[i];
    switch (e.kind) {
      case Expected::kNone:
        if (v != Py_None) return false;
        break;
      case Expected::kValue:
        if (!same_value(v, e.value)) return false;
        break;
      case Expected::kTensor: {
        if (!plain_tensor(v)) return false;
        const at::Tensor& t = THPVariable_Unpack(v);
        if (t.scalar_type() != e.dtype || !t.is_cuda() || t.get_device() != e.device ||
            t.requires_grad() != e.requires_grad || t.sizes() != c10::IntArrayRef(e.sizes) ||
            t.strides() != c10::IntArrayRef(e.strides)) {
          return false;
        }
        break;
      }
    }
  }
  return true;
}

// One buffer per stream for launches that run one after another on it; a capture's own (its
// graph's pool keeps it), and one beyond `kept` elements, is the call's.
at::Tensor stream_buffer(std::map<StreamKey, at::Tensor>& buffers, const StreamKey& key,
                         bool capturing, int64_t size, int64_t smallest, int64_t kept,
                         at::ScalarType dtype, bool zeroed, bool poison) {
  const auto options = at::TensorOptions().dtype(dtype).device(at::kCUDA, key.first);
  auto make = [&](int64_t n) {
    if (zeroed) return at::zeros({n}, options);
    at::Tensor t = at::empty({n}, options);
    return poison && at::isFloatingType(dtype) ? t.fill_(std::numeric_limits<float>::quiet_NaN())
                                               : t;
  };
  if (capturing || size > kept) return make(size);
  auto found = buffers.find(key);
  if (found == buffers.end() || found->second.numel() < size) {
    buffers[key] = make(std::max(size, smallest));
    found = buffers.find(key);
  }
  return found->second;
}

// A matched call, its inputs' addresses gathered, on its device's current stream.
struct Call {
  const Entry* entry = nullptr;
  std::vector<std::uintptr_t> sources;
  const at::Tensor* q = nullptr;
  StreamKey stream{};
  bool capturing = false;
  // FLASHGEN_POISON_OUTPUTS=1 (the tests' poison, tests/poison.py): what is handed out starts
  // as NaN, so an element the kernels forget shows.
  bool poison = false;

  at::Tensor empty(c10::IntArrayRef sizes, at::ScalarType dtype) const {
    at::Tensor t = at::empty(sizes, q->options().dtype(dtype));
    return poison ? t.fill_(std::numeric_limits<float>::quiet_NaN()) : t;
  }
  void set(int source, const at::Tensor& t) {
    sources[source] = reinterpret_cast<std::uintptr_t>(t.data_ptr());
  }
};

// The call of `count` arguments at given that matches a kept entry of op, or false for Python
// to run it: none matches, an address is not a multiple of 16 bytes (Python copies), q is empty,
// the tensors are on another device than the current one (Python switches), or
// FLASHGEN_DEBUG_CHECKS=1 (Python reads the device values).
bool begin(Op op, PyObject* const* given, Py_ssize_t nargs, Call& call) {
  if (nargs < 0 || env_is_1("FLASHGEN_DEBUG_CHECKS")) return false;
  const std::size_t count = static_cast<std::size_t>(nargs);
  auto found = std::find_if(entries.begin(), entries.end(), [&](const Entry* e) {
    return e->op == op && e->expected.size() == count && matches(*e, given);
  });
  if (found == entries.end()) return false;
  const Entry& entry = **found;
  std::rotate(entries.begin(), found, found + 1);  // the most recent first
  call.entry = &entry;
  call.sources.assign(entry.sources, 0);
  std::uintptr_t bits = 0;
  for (const auto& [source, position] : entry.inputs) {
    call.sources[source] =
        reinterpret_cast<std::uintptr_t>(THPVariable_Unpack(given[position]).data_ptr());
    bits |= call.sources[source];
  }
  if (bits % 16 != 0) return false;
  call.q = &THPVariable_Unpack(given[entry.q_position]);
  if (call.q->numel() == 0) return false;  // Python returns its empty outputs, launching nothing
  const c10::DeviceIndex device = call.q->get_device();
  if (c10::cuda::current_device() != device) return false;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  call.capturing = status != cudaStreamCaptureStatusNone;
  call.stream = {device, stream};
  call.poison = env_is_1("FLASHGEN_POISON_OUTPUTS");
  return true;
}

// Launches the entry's kernels with the call's sources; false with a Python error set where a
// launcher fails.
bool launch(const Call& call) {
  for (const Launch& launch : call.entry->launches) {
    std::vector<std::uint64_t> params = launch.params;
    auto* base = reinterpret_cast<char*>(params.data());
    for (const Patch& patch : launch.patches) {
      const std::uintptr_t address = call.sources[patch.source] + patch.offset;
      std::memcpy(base + patch.byte, &address, sizeof address);
    }
    using Launcher = int (*)(const void*, void*);
    const int err = reinterpret_cast<Launcher>(launch.launcher)(params.data(),
                                                                call.stream.second);
    if (err != 0) {
      using ErrorString = const char* (*)(int);
      PyErr_Format(PyExc_RuntimeError, "flashgen: kernel launch failed: %s",
                   reinterpret_cast<ErrorString>(launch.error_string)(err));
      return false;
    }
  }
  ++replayed;
  return true;
}

PyObject* pair(at::Tensor a, at::Tensor b, bool with_none) {
  PyObject* result = PyTuple_New(with_none ? 3 : 2);
  PyTuple_SET_ITEM(result, 0, THPVariable_Wrap(std::move(a)));
  PyTuple_SET_ITEM(result, 1, THPVariable_Wrap(std::move(b)));
  if (with_none) {
    Py_INCREF(Py_None);
    PyTuple_SET_ITEM(result, 2, Py_None);
  }
  return result;
}

// decode(lse_wanted, *arguments): out, or (out, lse) where lse_wanted, for a call that matches a
// kept decode plan (decode.py's _run, as C++); None (launching nothing) for any other.
PyObject* decode(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  Call call;
  if (nargs < 1 || !begin(Op::kDecode, args + 1, nargs - 1, call)) Py_RETURN_NONE;
  const Entry& entry = *call.entry;
  const at::Tensor& q = *call.q;
  const bool lse_wanted = PyObject_IsTrue(args[0]) == 1;
  at::Tensor out = call.empty(q.sizes(), q.scalar_type());
  at::Tensor lse;
  if (lse_wanted) {
    lse = call.empty({q.size(0), q.size(2), q.size(1)}, at::kFloat);
    call.set(entry.lse, lse);
  }
  call.set(entry.out, out);
  // Held until the launches are queued (a capture's own buffers are freed after them).
  at::Tensor work, q_rot, counters;
  const int64_t floats = entry.workspace + (lse_wanted ? 0 : entry.lse_rows);
  if (floats) {
    work = stream_buffer(scratch, call.stream, call.capturing, floats, 1 << 16, kScratchKept,
                         at::kFloat, false, call.poison);
    const auto address = reinterpret_cast<std::uintptr_t>(work.data_ptr());
    call.sources[entry.o_accum] = call.sources[entry.lse_accum] = address;
    if (!lse_wanted) call.sources[entry.lse] = address + 4 * entry.workspace;
  }
  if (entry.rotary) {
    q_rot = call.empty(q.sizes(), q.scalar_type());
    call.set(entry.q_rot, q_rot);
  }
  if (entry.counters) {
    // The launches leave their counters at 0 again, so one zeroed buffer serves a stream.
    counters = stream_buffer(counter_buffers, call.stream, call.capturing, entry.counters, 1024,
                             INT64_MAX, at::kInt, true, false);
    call.set(entry.split_counters, counters);
  }
  if (!launch(call)) return nullptr;
  if (!lse_wanted) return THPVariable_Wrap(std::move(out));
  return pair(std::move(out), std::move(lse), false);
  END_HANDLE_TH_ERRORS
}

// forward(result, *arguments): for a call that matches a kept forward (forward.py's run_kept,
// as C++), out where result is 0, (out, lse, None) where 1, (out, lse) where 2; None (launching
// nothing) for any other, and under autocast (Python casts first).
PyObject* forward(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (at::autocast::is_autocast_enabled(at::kCUDA)) Py_RETURN_NONE;
  Call call;
  if (nargs < 1 || !begin(Op::kForward, args + 1, nargs - 1, call)) Py_RETURN_NONE;
  const Entry& entry = *call.entry;
  const at::Tensor& q = *call.q;
  const long result = PyLong_AsLong(args[0]);
  at::Tensor out = call.empty(q.sizes(), q.scalar_type());
  std::vector<int64_t> lse_sizes;
  for (const int64_t dim : entry.lse_dims) lse_sizes.push_back(q.size(dim));
  at::Tensor lse = call.empty(lse_sizes, at::kFloat);
  call.set(entry.out, out);
  call.set(entry.lse, lse);
  at::Tensor counter;
  if (entry.tile_counter >= 0) {
    counter = stream_buffer(tile_counters, call.stream, call.capturing, 1, 1, 1, at::kInt,
                            false, false);
    call.set(entry.tile_counter, counter);
  }
  if (!launch(call)) return nullptr;
  if (result == 0) return THPVariable_Wrap(std::move(out));
  return pair(std::move(out), std::move(lse), result == 1);
  END_HANDLE_TH_ERRORS
}

// backward(*arguments): for a call that matches a kept backward (backward.py's _run_kept, as
// C++; arguments: the backward's gradient, then what fwd's autograd saved, in ops._fwd_backward's
// order), (dq, dk, dv); None (launching nothing) for any other, and where grad mode is on (a
// double backward: Python raises).
PyObject* backward(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (at::GradMode::is_enabled()) Py_RETURN_NONE;
  Call call;
  if (!begin(Op::kBackward, args, nargs, call)) Py_RETURN_NONE;
  const Entry& entry = *call.entry;
  at::Tensor grads[3];
  for (int i = 0; i < 3; ++i) {
    const at::Tensor& like = THPVariable_Unpack(args[entry.grads_like[i]]);
    if (entry.heads_first) {
      grads[i] = at::empty_permuted(like.sizes(), {0, 2, 1, 3}, like.options());
      if (call.poison) grads[i].fill_(std::numeric_limits<float>::quiet_NaN());
    } else {
      grads[i] = call.empty(like.sizes(), like.scalar_type());
    }
    call.set(entry.grads[i], grads[i]);
  }
  // Held until the launch is queued: the caching allocator reuses it in stream order.
  at::Tensor scratch;
  if (entry.scratch_floats) {
    scratch = at::empty({entry.scratch_floats}, call.q->options().dtype(at::kFloat));
    call.set(entry.scratch, scratch);
  }
  if (!launch(call)) return nullptr;
  PyObject* result = PyTuple_New(3);
  for (int i = 0; i < 3; ++i) PyTuple_SET_ITEM(result, i, THPVariable_Wrap(std::move(grads[i])));
  return result;
  END_HANDLE_TH_ERRORS
}

bool read_ints(PyObject* sequence, std::vector<int64_t>& values) {
  PyObject* fast = PySequence_Fast(sequence, "flashgen: replay expects a sequence of ints");
  if (fast == nullptr) return false;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); ++i) {
    values.push_back(PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, i)));
  }
  Py_DECREF(fast);
  return !PyErr_Occurred();
}

int fail(PyObject* type, const char* message) {
  PyErr_SetString(type, message);
  return -1;
}

// What both ops keep: the arguments' expectations (1 where one is of a kind the match does not
// compare, -1 with an error set), the inputs (flat (source, position) pairs), the launches (a
// tuple of (launcher, error_string, params bytes, flat (byte, source, offset) triples)).
int keep_common(Entry& entry, PyObject* arguments, PyObject* inputs, PyObject* launches,
                int sources, int q_position) {
  if (!PyTuple_Check(arguments) || !PyTuple_Check(launches)) {
    return fail(PyExc_TypeError, "flashgen: replay: arguments and launches are tuples");
  }
  entry.sources = sources;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(arguments); ++i) {
    PyObject* v = PyTuple_GET_ITEM(arguments, i);
    Expected e;
    if (v == Py_None) {
      e.kind = Expected::kNone;
    } else if (plain_tensor(v)) {
      const at::Tensor& t = THPVariable_Unpack(v);
      if (!t.is_cuda() || (t.requires_grad() && entry.op != Op::kBackward)) return 1;
      e.kind = Expected::kTensor;
      e.requires_grad = t.requires_grad();
      e.device = t.get_device();
      e.dtype = t.scalar_type();
      e.sizes = t.sizes().vec();
      e.strides = t.strides().vec();
    } else {
      bool plain = plain_value(v);
      if (PyTuple_CheckExact(v)) {
        plain = true;
        for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(v); ++j) {
          plain = plain && plain_value(PyTuple_GET_ITEM(v, j));
        }
      }
      if (!plain) return 1;
      e.kind = Expected::kValue;
      Py_INCREF(v);
      e.value = v;
    }
    entry.expected.push_back(std::move(e));
  }
  std::vector<int64_t> flat;
  if (!read_ints(inputs, flat)) return -1;
  for (std::size_t i = 0; i + 1 < flat.size(); i += 2) {
    const int source = int(flat[i]), position = int(flat[i + 1]);
    if (source < 0 || source >= sources || position < 0 ||
        position >= PyTuple_GET_SIZE(arguments) ||
        entry.expected[position].kind != Expected::kTensor) {
      return fail(PyExc_ValueError, "flashgen: replay: an input is no tensor argument");
    }
    entry.inputs.emplace_back(source, position);
  }
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(launches); ++i) {
    PyObject* item = PyTuple_GET_ITEM(launches, i);
    PyObject* bytes = PyTuple_Check(item) && PyTuple_GET_SIZE(item) == 4
                          ? PyTuple_GET_ITEM(item, 2) : nullptr;
    if (bytes == nullptr || !PyBytes_Check(bytes)) {
      return fail(PyExc_TypeError, "flashgen: replay: a launch is (launcher, error_string, "
                  "params bytes, patches)");
    }
    Launch launch;
    launch.launcher = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(item, 0));
    launch.error_string = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(item, 1));
    const std::size_t size = static_cast<std::size_t>(PyBytes_GET_SIZE(bytes));
    launch.params.resize((size + 7) / 8);
    std::memcpy(launch.params.data(), PyBytes_AS_STRING(bytes), size);
    std::vector<int64_t> patches;
    if (PyErr_Occurred() || !read_ints(PyTuple_GET_ITEM(item, 3), patches)) return -1;
    for (std::size_t j = 0; j + 2 < patches.size(); j += 3) {
      if (patches[j] < 0 || std::size_t(patches[j]) + 8 > size || patches[j + 1] < 0 ||
          patches[j + 1] >= sources) {
        return fail(PyExc_ValueError, "flashgen: replay: a patch lies outside");
      }
      launch.patches.push_back({std::size_t(patches[j]), int(patches[j + 1]), patches[j + 2]});
    }
    entry.launches.push_back(std::move(launch));
  }
  entry.q_position = q_position;
  if (q_position < 0 || q_position >= PyTuple_GET_SIZE(arguments) ||
      entry.expected[q_position].kind != Expected::kTensor) {
    return fail(PyExc_ValueError, "flashgen: replay: q is no tensor argument");
  }
  return 0;
}

bool valid_source(const Entry& entry, int64_t source, bool optional) {
  return (optional && source == -1) || (source >= 0 && source < entry.sources);
}

PyObject* kept_or_not(std::unique_ptr<Entry> entry) {
  const auto same_op = std::count_if(entries.begin(), entries.end(),
                                     [&](const Entry* e) { return e->op == entry->op; });
  if (std::size_t(same_op) >= kKept) Py_RETURN_FALSE;
  entries.insert(entries.begin(), entry.release());
  Py_RETURN_TRUE;
}

// keep_decode(arguments, inputs, launches, roles, workspace, lse_rows, counters, rotary,
// q_position): keeps a decode plan for calls like `arguments` (the call's arguments in the order
// decode() gets them); roles: the sources out, lse, q_rot, o_accum, lse_accum, split_counters,
// then the count of sources. False where it keeps none (an argument its match does not compare,
// or as many signatures kept as it takes).
PyObject* keep_decode(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 9) {
    PyErr_SetString(PyExc_TypeError, "flashgen: keep_decode takes 9 arguments");
    return nullptr;
  }
  std::vector<int64_t> roles;
  if (!read_ints(args[3], roles)) return nullptr;
  if (roles.size() != 7) {
    PyErr_SetString(PyExc_ValueError, "flashgen: keep_decode: 7 roles");
    return nullptr;
  }
  auto entry = std::make_unique<Entry>();
  entry->op = Op::kDecode;
  const int kept = keep_common(*entry, args[0], args[1], args[2], int(roles[6]),
                               int(PyLong_AsLong(args[8])));
  if (kept < 0) return nullptr;
  if (kept > 0) Py_RETURN_FALSE;
  for (int i = 0; i < 6; ++i) {
    if (!valid_source(*entry, roles[i], false)) {
      PyErr_SetString(PyExc_ValueError, "flashgen: keep_decode: a role is no source");
      return nullptr;
    }
  }
  entry->out = int(roles[0]);
  entry->lse = int(roles[1]);
  entry->q_rot = int(roles[2]);
  entry->o_accum = int(roles[3]);
  entry->lse_accum = int(roles[4]);
  entry->split_counters = int(roles[5]);
  entry->workspace = PyLong_AsLongLong(args[4]);
  entry->lse_rows = PyLong_AsLongLong(args[5]);
  entry->counters = PyLong_AsLongLong(args[6]);
  entry->rotary = PyObject_IsTrue(args[7]) == 1;
  if (PyErr_Occurred()) return nullptr;
  if (entry->expected[entry->q_position].sizes.size() != 4) {
    PyErr_SetString(PyExc_ValueError, "flashgen: keep_decode: q is no 4-d tensor");
    return nullptr;
  }
  return kept_or_not(std::move(entry));
  END_HANDLE_TH_ERRORS
}

// keep_forward(arguments, inputs, launches, roles, lse_dims, q_position): keeps a forward launch
// for calls like `arguments` (flash_attn_func's or flash_attn_varlen_func's, in their wrappers'
// order); roles: the sources out, lse, tile counter (-1: none), then the count of sources;
// lse_dims: lse's sizes as q's dims. False as keep_decode.
PyObject* keep_forward(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 6) {
    PyErr_SetString(PyExc_TypeError, "flashgen: keep_forward takes 6 arguments");
    return nullptr;
  }
  std::vector<int64_t> roles, lse_dims;
  if (!read_ints(args[3], roles) || !read_ints(args[4], lse_dims)) return nullptr;
  if (roles.size() != 4) {
    PyErr_SetString(PyExc_ValueError, "flashgen: keep_forward: 4 roles");
    return nullptr;
  }
  auto entry = std::make_unique<Entry>();
  entry->op = Op::kForward;
  const int kept = keep_common(*entry, args[0], args[1], args[2], int(roles[3]),
                               int(PyLong_AsLong(args[5])));
  if (kept < 0) return nullptr;
  if (kept > 0) Py_RETURN_FALSE;
  const std::size_t q_dims = entry->expected[entry->q_position].sizes.size();
  if (!valid_source(*entry, roles[0], false) || !valid_source(*entry, roles[1], false) ||
      !valid_source(*entry, roles[2], true) ||
      std::any_of(lse_dims.begin(), lse_dims.end(),
                  [&](int64_t d) { return d < 0 || std::size_t(d) >= q_dims; })) {
    PyErr_SetString(PyExc_ValueError, "flashgen: keep_forward: a role is no source or an lse "
                    "dim no dim of q");
    return nullptr;
  }
  entry->out = int(roles[0]);
  entry->lse = int(roles[1]);
  entry->tile_counter = int(roles[2]);
  entry->lse_dims = std::move(lse_dims);
  return kept_or_not(std::move(entry));
  END_HANDLE_TH_ERRORS
}

// keep_backward(arguments, inputs, launches, roles, grads_like, scratch_floats, heads_first,
// q_position): keeps a backward launch for calls like `arguments` (backward()'s); roles: the
// sources dq, dk, dv, the scratch, then the count of sources; grads_like: the argument
// positions dq, dk and dv are shaped like (q, k, v). False as keep_decode.
PyObject* keep_backward(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 8) {
    PyErr_SetString(PyExc_TypeError, "flashgen: keep_backward takes 8 arguments");
    return nullptr;
  }
  std::vector<int64_t> roles, like;
  if (!read_ints(args[3], roles) || !read_ints(args[4], like)) return nullptr;
  if (roles.size() != 5 || like.size() != 3) {
    PyErr_SetString(PyExc_ValueError, "flashgen: keep_backward: 5 roles and 3 gradients");
    return nullptr;
  }
  auto entry = std::make_unique<Entry>();
  entry->op = Op::kBackward;
  const int kept = keep_common(*entry, args[0], args[1], args[2], int(roles[4]),
                               int(PyLong_AsLong(args[7])));
  if (kept < 0) return nullptr;
  if (kept > 0) Py_RETURN_FALSE;
  for (int i = 0; i < 4; ++i) {
    if (!valid_source(*entry, roles[i], false)) {
      PyErr_SetString(PyExc_ValueError, "flashgen: keep_backward: a role is no source");
      return nullptr;
    }
  }
  for (int i = 0; i < 3; ++i) {
    if (like[i] < 0 || like[i] >= int64_t(entry->expected.size()) ||
        entry->expected[like[i]].kind != Expected::kTensor ||
        entry->expected[like[i]].sizes.size() != 4) {
      PyErr_SetString(PyExc_ValueError, "flashgen: keep_backward: a gradient is not shaped "
                      "like a 4-d tensor argument");
      return nullptr;
    }
    entry->grads[i] = int(roles[i]);
    entry->grads_like[i] = int(like[i]);
  }
  entry->scratch = int(roles[3]);
  entry->scratch_floats = PyLong_AsLongLong(args[5]);
  entry->heads_first = PyObject_IsTrue(args[6]) == 1;
  if (PyErr_Occurred()) return nullptr;
  return kept_or_not(std::move(entry));
  END_HANDLE_TH_ERRORS
}

PyObject* forget(PyObject*, PyObject*) {
  for (Entry* e : entries) delete e;
  entries.clear();
  Py_RETURN_NONE;
}

PyObject* kept(PyObject*, PyObject*) { return PyLong_FromSize_t(entries.size()); }

PyObject* replays(PyObject*, PyObject*) { return PyLong_FromUnsignedLongLong(replayed); }

PyObject* split_counters(PyObject*, PyObject*) {
  HANDLE_TH_ERRORS
  PyObject* list = PyList_New(0);
  for (const auto& [key, counters] : counter_buffers) {
    PyObject* t = THPVariable_Wrap(counters);
    PyList_Append(list, t);
    Py_DECREF(t);
  }
  return list;
  END_HANDLE_TH_ERRORS
}

PyMethodDef methods[] = {
    {"decode", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&decode)),
     METH_FASTCALL, "decode(lse_wanted, *arguments): a kept plan's outputs, or None"},
    {"keep_decode", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&keep_decode)),
     METH_FASTCALL, "keeps a decode plan for calls of these arguments' signature"},
    {"forward", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&forward)),
     METH_FASTCALL, "forward(result, *arguments): a kept launch's outputs, or None"},
    {"keep_forward", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&keep_forward)),
     METH_FASTCALL, "keeps a forward launch for calls of these arguments' signature"},
    {"backward", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&backward)),
     METH_FASTCALL, "backward(*arguments): a kept launch's gradients, or None"},
    {"keep_backward", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&keep_backward)),
     METH_FASTCALL, "keeps a backward launch for calls of these arguments' signature"},
    {"forget", forget, METH_NOARGS, "drops every kept plan"},
    {"kept", kept, METH_NOARGS, "how many plans are kept"},
    {"replays", replays, METH_NOARGS, "how many calls were launched from here"},
    {"split_counters", split_counters, METH_NOARGS, "the streams' split counters (tests)"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_flashgen_replay",
                          "flashgen's host fast path for known calls", -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__flashgen_replay() { return PyModule_Create(&module_def); }
