// The host fast path of flash_attn_with_kvcache: a call whose arguments match a plan Python kept
// (each tensor's type, device, dtype, sizes and strides, every other argument's type and value)
// allocates its outputs here and launches the plan's kernels with its own addresses, with no
// Python between the call and the launch. Python decides everything (flashgen/decode.py makes the
// plans, flashgen/replay.py keeps them here); this file only matches and replays.
// Built once per Python and torch version against torch's headers (codegen/build.py); where it is
// not built the same plans run from Python.
#include <Python.h>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
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
  PyObject* value = nullptr;  // kValue: a number, bool or tuple of those, owned
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

// The per-call sources a plan's patches read besides its inputs, as decode.py numbers them.
struct Roles {
  int out, lse, q_rot, o_accum, lse_accum, counters, count;
};

struct Entry {
  std::vector<Expected> expected;             // per argument position of the call
  std::vector<std::pair<int, int>> inputs;    // (source, argument position) of its tensors
  std::vector<Launch> launches;
  Roles roles;
  int64_t workspace, lse_rows, counters;      // fp32 elements, fp32 elements, int32 counters
  bool rotary;
  int q_position;
  ~Entry() {
    for (auto& e : expected) Py_XDECREF(e.value);
  }
};

// Signatures kept: a model's layers share a few. Once full, further signatures run from Python
// (an entry never leaves but by forget(), so Python knows what is kept).
constexpr std::size_t kKept = 64;
constexpr int64_t kScratchKept = 1 << 24;  // fp32 workspace kept per stream (decode.SCRATCH_KEPT)

// Never destroyed: their tensors must not be freed after CUDA's teardown at exit.
auto& entries = *new std::vector<Entry*>();
using StreamKey = std::pair<c10::DeviceIndex, cudaStream_t>;
auto& scratch = *new std::map<StreamKey, at::Tensor>();
auto& counter_buffers = *new std::map<StreamKey, at::Tensor>();
std::uint64_t replayed = 0;  // calls launched from here (tests read it)

bool env_is_1(const char* name) {
  const char* value = std::getenv(name);  // os.environ's changes reach the C environment too
  return value != nullptr && std::strcmp(value, "1") == 0;
}

bool plain_value(PyObject* v) {
  return v == Py_None || PyBool_Check(v) || PyLong_CheckExact(v) || PyFloat_CheckExact(v);
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
            t.requires_grad() || t.sizes() != c10::IntArrayRef(e.sizes) ||
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
    return poison ? t.fill_(std::numeric_limits<float>::quiet_NaN()) : t;
  };
  if (capturing || size > kept) return make(size);
  auto found = buffers.find(key);
  if (found == buffers.end() || found->second.numel() < size) {
    buffers[key] = make(std::max(size, smallest));
    found = buffers.find(key);
  }
  return found->second;
}

// decode(lse_wanted, *arguments): out, or (out, lse) where lse_wanted, for a call that matches a
// kept plan; None (launching nothing) for any other, which Python then runs.
PyObject* decode(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs < 1) Py_RETURN_NONE;
  if (env_is_1("FLASHGEN_DEBUG_CHECKS")) Py_RETURN_NONE;  // those checks run in Python
  const bool lse_wanted = PyObject_IsTrue(args[0]) == 1;
  PyObject* const* given = args + 1;
  const std::size_t count = static_cast<std::size_t>(nargs - 1);
  auto found = std::find_if(entries.begin(), entries.end(), [&](const Entry* e) {
    return e->expected.size() == count && matches(*e, given);
  });
  if (found == entries.end()) Py_RETURN_NONE;
  const Entry& entry = **found;
  std::rotate(entries.begin(), found, found + 1);  // the most recent first

  std::vector<std::uintptr_t> sources(entry.roles.count, 0);
  std::uintptr_t bits = 0;
  for (const auto& [source, position] : entry.inputs) {
    sources[source] = reinterpret_cast<std::uintptr_t>(THPVariable_Unpack(given[position]).data_ptr());
    bits |= sources[source];
  }
  if (bits % 16 != 0) Py_RETURN_NONE;  // Python copies such inputs
  const at::Tensor& q = THPVariable_Unpack(given[entry.q_position]);
  const c10::DeviceIndex device = q.get_device();
  if (c10::cuda::current_device() != device) Py_RETURN_NONE;  // Python switches devices
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
    cudaGetLastError();
    Py_RETURN_NONE;
  }
  const bool capturing = status != cudaStreamCaptureStatusNone;
  const StreamKey key{device, stream};

  // FLASHGEN_POISON_OUTPUTS=1 (the tests' poison, tests/poison.py): what is handed out starts
  // as NaN, so an element the kernels forget shows.
  const bool poison = env_is_1("FLASHGEN_POISON_OUTPUTS");
  auto empty = [&](c10::IntArrayRef sizes, at::ScalarType dtype) {
    at::Tensor t = at::empty(sizes, q.options().dtype(dtype));
    return poison ? t.fill_(std::numeric_limits<float>::quiet_NaN()) : t;
  };
  at::Tensor out = empty(q.sizes(), q.scalar_type());
  at::Tensor lse;
  if (lse_wanted) {
    lse = empty({q.size(0), q.size(2), q.size(1)}, at::kFloat);
    sources[entry.roles.lse] = reinterpret_cast<std::uintptr_t>(lse.data_ptr());
  }
  sources[entry.roles.out] = reinterpret_cast<std::uintptr_t>(out.data_ptr());
  // Held until the launches are queued (a capture's own buffers are freed after them).
  at::Tensor work, q_rot, counters;
  const int64_t floats = entry.workspace + (lse_wanted ? 0 : entry.lse_rows);
  if (floats) {
    work = stream_buffer(scratch, key, capturing, floats, 1 << 16, kScratchKept, at::kFloat,
                         false, poison);
    const auto address = reinterpret_cast<std::uintptr_t>(work.data_ptr());
    sources[entry.roles.o_accum] = sources[entry.roles.lse_accum] = address;
    if (!lse_wanted) sources[entry.roles.lse] = address + 4 * entry.workspace;
  }
  if (entry.rotary) {
    q_rot = empty(q.sizes(), q.scalar_type());
    sources[entry.roles.q_rot] = reinterpret_cast<std::uintptr_t>(q_rot.data_ptr());
  }
  if (entry.counters) {
    // The launches leave their counters at 0 again, so one zeroed buffer serves a stream.
    counters = stream_buffer(counter_buffers, key, capturing, entry.counters, 1024,
                             INT64_MAX, at::kInt, true, false);
    sources[entry.roles.counters] = reinterpret_cast<std::uintptr_t>(counters.data_ptr());
  }
  for (const Launch& launch : entry.launches) {
    std::vector<std::uint64_t> params = launch.params;
    auto* base = reinterpret_cast<char*>(params.data());
    for (const Patch& patch : launch.patches) {
      const std::uintptr_t address = sources[patch.source] + patch.offset;
      std::memcpy(base + patch.byte, &address, sizeof address);
    }
    using Launcher = int (*)(const void*, void*);
    const int err = reinterpret_cast<Launcher>(launch.launcher)(params.data(), stream);
    if (err != 0) {
      using ErrorString = const char* (*)(int);
      PyErr_Format(PyExc_RuntimeError, "flashgen: kernel launch failed: %s",
                   reinterpret_cast<ErrorString>(launch.error_string)(err));
      return nullptr;
    }
  }
  ++replayed;
  if (!lse_wanted) return THPVariable_Wrap(std::move(out));
  PyObject* pair = PyTuple_New(2);
  PyTuple_SET_ITEM(pair, 0, THPVariable_Wrap(std::move(out)));
  PyTuple_SET_ITEM(pair, 1, THPVariable_Wrap(std::move(lse)));
  return pair;
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

// keep_decode(arguments, inputs, roles, launches, workspace, lse_rows, counters, rotary,
// q_position): keeps a plan for calls like `arguments` (a tuple, the call's arguments in the
// order decode() will get them). inputs: flat (source, position) pairs; roles: the sources
// (out, lse, q_rot, o_accum, lse_accum, counters, count of sources); launches: a tuple of
// (launcher, error_string, params bytes, flat (byte, source, offset) triples). False where an
// argument is of a kind the match does not compare (Python keeps running such calls).
PyObject* keep_decode(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 9 || !PyTuple_Check(args[0]) || !PyTuple_Check(args[3])) {
    PyErr_SetString(PyExc_TypeError, "flashgen: keep_decode takes 9 arguments");
    return nullptr;
  }
  auto entry = std::make_unique<Entry>();
  PyObject* arguments = args[0];
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(arguments); ++i) {
    PyObject* v = PyTuple_GET_ITEM(arguments, i);
    Expected e;
    if (v == Py_None) {
      e.kind = Expected::kNone;
    } else if (plain_tensor(v)) {
      const at::Tensor& t = THPVariable_Unpack(v);
      if (!t.is_cuda() || t.requires_grad()) Py_RETURN_FALSE;
      e.kind = Expected::kTensor;
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
      if (!plain) Py_RETURN_FALSE;
      e.kind = Expected::kValue;
      Py_INCREF(v);
      e.value = v;
    }
    entry->expected.push_back(std::move(e));
  }
  std::vector<int64_t> flat, roles;
  if (!read_ints(args[1], flat) || !read_ints(args[2], roles) || roles.size() != 7) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "flashgen: keep_decode: 7 roles");
    return nullptr;
  }
  entry->roles = {int(roles[0]), int(roles[1]), int(roles[2]), int(roles[3]),
                  int(roles[4]), int(roles[5]), int(roles[6])};
  for (std::size_t i = 0; i + 1 < flat.size(); i += 2) {
    const int source = int(flat[i]), position = int(flat[i + 1]);
    if (source < 0 || source >= entry->roles.count || position < 0 ||
        position >= PyTuple_GET_SIZE(arguments) ||
        entry->expected[position].kind != Expected::kTensor) {
      PyErr_SetString(PyExc_ValueError, "flashgen: keep_decode: an input is no tensor argument");
      return nullptr;
    }
    entry->inputs.emplace_back(source, position);
  }
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(args[3]); ++i) {
    PyObject* item = PyTuple_GET_ITEM(args[3], i);
    PyObject* bytes = PyTuple_Check(item) && PyTuple_GET_SIZE(item) == 4
                          ? PyTuple_GET_ITEM(item, 2) : nullptr;
    if (bytes == nullptr || !PyBytes_Check(bytes)) {
      PyErr_SetString(PyExc_TypeError, "flashgen: keep_decode: a launch is (launcher, "
                      "error_string, params bytes, patches)");
      return nullptr;
    }
    Launch launch;
    launch.launcher = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(item, 0));
    launch.error_string = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(item, 1));
    const std::size_t size = static_cast<std::size_t>(PyBytes_GET_SIZE(bytes));
    launch.params.resize((size + 7) / 8);
    std::memcpy(launch.params.data(), PyBytes_AS_STRING(bytes), size);
    std::vector<int64_t> patches;
    if (PyErr_Occurred() || !read_ints(PyTuple_GET_ITEM(item, 3), patches)) return nullptr;
    for (std::size_t j = 0; j + 2 < patches.size(); j += 3) {
      if (patches[j] < 0 || std::size_t(patches[j]) + 8 > size || patches[j + 1] < 0 ||
          patches[j + 1] >= entry->roles.count) {
        PyErr_SetString(PyExc_ValueError, "flashgen: keep_decode: a patch lies outside");
        return nullptr;
      }
      launch.patches.push_back({std::size_t(patches[j]), int(patches[j + 1]), patches[j + 2]});
    }
    entry->launches.push_back(std::move(launch));
  }
  entry->workspace = PyLong_AsLongLong(args[4]);
  entry->lse_rows = PyLong_AsLongLong(args[5]);
  entry->counters = PyLong_AsLongLong(args[6]);
  entry->rotary = PyObject_IsTrue(args[7]) == 1;
  entry->q_position = int(PyLong_AsLong(args[8]));
  if (PyErr_Occurred()) return nullptr;
  if (entry->q_position < 0 || entry->q_position >= PyTuple_GET_SIZE(arguments) ||
      entry->expected[entry->q_position].kind != Expected::kTensor ||
      entry->expected[entry->q_position].sizes.size() != 4) {
    PyErr_SetString(PyExc_ValueError, "flashgen: keep_decode: q is no 4-d tensor argument");
    return nullptr;
  }
  if (entries.size() >= kKept) Py_RETURN_FALSE;
  entries.insert(entries.begin(), entry.release());
  Py_RETURN_TRUE;
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
    {"forget", forget, METH_NOARGS, "drops every kept plan"},
    {"kept", kept, METH_NOARGS, "how many plans are kept"},
    {"replays", replays, METH_NOARGS, "how many calls were launched from here"},
    {"split_counters", split_counters, METH_NOARGS, "the streams' split counters (tests)"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_flashgen_replay",
                          "flashgen's host fast path for known decode calls", -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__flashgen_replay() { return PyModule_Create(&module_def); }
