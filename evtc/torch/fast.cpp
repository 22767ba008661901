// evtc's call fast path for torch tensors: NOTE [The torch fast path] in evtc/torch/fast.py.
//
// A table per Gemm maps a call's key (A's Python type; every tensor argument's sizes, strides,
// dtype and device) to a recipe that evtc's Python launch path checked and prepared once (the
// prepared problem's handle, the per-call pointer checks and overlap spans, the outputs to
// allocate, the byte offsets of evtc_call_t's fields and the kernel's evtc_launch). A call on
// a known key reads the tensors through ATen (no Python attribute calls), allocates the outputs
// with the caching allocator, packs evtc_call_t on the stack and calls evtc_launch. Anything
// else (an unknown key, a tensor subclass, a scalar of another type or beyond its limit, a
// pointer that fails a check, overlapping tensors, a launch status other than 0) returns None,
// and the caller takes the Python path, which checks, raises the right error, or prepares the
// key and registers it here. So this file decides nothing the Python path did not decide first.
#include <Python.h>

#include <ATen/ATen.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <cstdint>
#include <cstring>
#include <unordered_map>
#include <vector>

#ifndef EVTC_TORCH_VERSION
#define EVTC_TORCH_VERSION "unknown"
#endif

namespace py = pybind11;

namespace {

// Bump with any change to the recipe tuple or the call's semantics (checked by fast.py).
constexpr int kFastAbi = 1;
constexpr int kMaxDims = 6;
constexpr size_t kMaxCallBytes = 4096;

using LaunchFn = int (*)(void const*);

// One tensor argument as the key sees it (zero-filled, so the key compares with memcmp).
struct SlotMeta {
  int64_t sizes[kMaxDims];
  int64_t strides[kMaxDims];
  int32_t ndim;
  int16_t scalar_type;  // -1: the argument is None
  int8_t device_type;
  int8_t device_index;
};

struct Check {
  int index;
  uint64_t mask;
};

struct Span {
  int i, j;
  int64_t lo_i, hi_i, lo_j, hi_j;
};

struct Alloc {
  int ptr_index;
  std::vector<int64_t> sizes, strides;
  at::ScalarType dtype;
};

struct Entry {
  PyTypeObject* a_type = nullptr;
  std::vector<SlotMeta> key;
  LaunchFn launch = nullptr;
  int64_t handle = -1;
  uint64_t workspace_bytes = 0;
  int device_index = 0;
  bool swap = false;
  std::vector<Check> checks;
  std::vector<Span> spans;
  std::vector<Alloc> allocs;  // in the epilogue's output order
};

struct Table {
  std::vector<PyObject*> tensor_names;  // strong references
  std::vector<PyObject*> other_names;
  std::vector<PyObject*> scalar_names;
  std::vector<double> scalar_limits;
  std::vector<PyObject*> output_names;
  Py_ssize_t n_kwargs = 0;
  bool single = false;  // one output: return it bare (single_bare) or as {name: tensor}
  bool single_bare = false;
  bool allow_cpu = false;  // tests only: CPU tensors, stream 0
  size_t call_size = 0;
  size_t n_pointers = 0;
  std::vector<size_t> pointer_offsets;
  std::vector<size_t> scalar_offsets;
  size_t max_entries = 64;
  std::unordered_map<uint64_t, std::vector<Entry>> entries;
  size_t n_entries = 0;

  ~Table() {
    for (auto* v : {&tensor_names, &other_names, &scalar_names, &output_names}) {
      for (PyObject* o : *v) {
        Py_XDECREF(o);
      }
    }
  }
};

uint64_t hash_key(PyTypeObject* a_type, std::vector<SlotMeta> const& key) {
  // word-wise multiply-xor (SlotMeta is a whole number of 8-byte words)
  static_assert(sizeof(SlotMeta) % 8 == 0, "SlotMeta must be 8-byte words");
  uint64_t h = 0x9e3779b97f4a7c15ull ^ reinterpret_cast<uintptr_t>(a_type);
  size_t n = key.size() * sizeof(SlotMeta) / 8;
  for (size_t i = 0; i < n; ++i) {
    uint64_t w;
    std::memcpy(&w, reinterpret_cast<unsigned char const*>(key.data()) + 8 * i, 8);
    h = (h ^ w) * 0xff51afd7ed558ccdull;
    h ^= h >> 29;
  }
  return h;
}

// The tensor arguments of a call (A, B, then the epilogue's tensors by name): their key and
// pointers. False when the call is not one the fast path takes.
bool read_slots(Table const& t, PyObject* A, PyObject* B, PyObject* kwargs, std::vector<SlotMeta>& key,
                std::vector<uint64_t>& ptrs) {
  size_t n = 2 + t.tensor_names.size();
  key.assign(n, SlotMeta{});
  ptrs.assign(t.n_pointers, 0);
  for (size_t s = 0; s < n; ++s) {
    PyObject* obj;
    if (s == 0) {
      obj = A;
    } else if (s == 1) {
      obj = B;
    } else {
      obj = PyDict_GetItemWithError(kwargs, t.tensor_names[s - 2]);  // borrowed
      if (obj == nullptr) {
        PyErr_Clear();
        return false;
      }
    }
    SlotMeta& m = key[s];
    if (obj == Py_None) {
      m.scalar_type = -1;
      continue;
    }
    if (!THPVariable_CheckExact(obj)) {
      return false;
    }
    at::Tensor const& x = THPVariable_Unpack(obj);
    c10::Device dev = x.device();
    if (!(dev.is_cuda() || (t.allow_cpu && dev.is_cpu())) || x.dim() > kMaxDims) {
      return false;
    }
    m.ndim = static_cast<int32_t>(x.dim());
    auto sizes = x.sizes();
    auto strides = x.strides();
    for (int d = 0; d < m.ndim; ++d) {
      m.sizes[d] = sizes[d];
      m.strides[d] = strides[d];
    }
    m.scalar_type = static_cast<int16_t>(x.scalar_type());
    m.device_type = static_cast<int8_t>(dev.type());
    m.device_index = static_cast<int8_t>(dev.index());
    if (s < t.n_pointers) {
      ptrs[s] = reinterpret_cast<uint64_t>(x.unsafeGetTensorImpl()->has_storage() ? x.data_ptr() : nullptr);
    }
  }
  return true;
}

Entry* find(Table& t, PyTypeObject* a_type, std::vector<SlotMeta> const& key, uint64_t h) {
  auto it = t.entries.find(h);
  if (it == t.entries.end()) {
    return nullptr;
  }
  for (Entry& e : it->second) {
    if (e.a_type == a_type && e.key.size() == key.size() &&
        std::memcmp(e.key.data(), key.data(), key.size() * sizeof(SlotMeta)) == 0) {
      return &e;
    }
  }
  return nullptr;
}

void erase(Table& t, uint64_t h, Entry const* e) {
  auto it = t.entries.find(h);
  if (it == t.entries.end()) {
    return;
  }
  auto& v = it->second;
  for (size_t i = 0; i < v.size(); ++i) {
    if (&v[i] == e) {
      v.erase(v.begin() + static_cast<long>(i));
      --t.n_entries;
      break;
    }
  }
  if (v.empty()) {
    t.entries.erase(it);
  }
}

Table* table_of(PyObject* capsule) {
  return static_cast<Table*>(PyCapsule_GetPointer(capsule, "evtc.torch_fast.Table"));
}

void destroy_table(PyObject* capsule) {
  delete table_of(capsule);
}

std::vector<PyObject*> names(py::sequence seq) {
  std::vector<PyObject*> out;
  for (auto item : seq) {
    PyObject* s = item.ptr();
    Py_INCREF(s);
    PyUnicode_InternInPlace(&s);
    out.push_back(s);
  }
  return out;
}

// new_table(tensor_names, other_names, scalar_names, scalar_limits, output_names, n_kwargs,
//           single, single_bare, call_size, pointer_offsets, scalar_offsets, allow_cpu)
py::object new_table(py::sequence tensor_names, py::sequence other_names, py::sequence scalar_names,
                     std::vector<double> scalar_limits, py::sequence output_names, Py_ssize_t n_kwargs, bool single,
                     bool single_bare, size_t call_size, std::vector<size_t> pointer_offsets,
                     std::vector<size_t> scalar_offsets, bool allow_cpu) {
  if (call_size > kMaxCallBytes || call_size < 32 || py::len(scalar_names) != scalar_limits.size() ||
      scalar_offsets.size() != scalar_limits.size()) {
    throw py::value_error("bad call layout");
  }
  for (size_t off : pointer_offsets) {
    if (off < 32 || off + 8 > call_size) throw py::value_error("bad pointer offset");
  }
  for (size_t off : scalar_offsets) {
    if (off < 32 || off + 4 > call_size) throw py::value_error("bad scalar offset");
  }
  auto* t = new Table();
  t->tensor_names = names(tensor_names);
  t->other_names = names(other_names);
  t->scalar_names = names(scalar_names);
  t->output_names = names(output_names);
  t->scalar_limits = std::move(scalar_limits);
  t->n_kwargs = n_kwargs;
  t->single = single;
  t->single_bare = single_bare;
  t->call_size = call_size;
  t->n_pointers = pointer_offsets.size();
  t->pointer_offsets = std::move(pointer_offsets);
  t->scalar_offsets = std::move(scalar_offsets);
  t->allow_cpu = allow_cpu;
  if (t->n_pointers < 2 + t->tensor_names.size()) {
    delete t;
    throw py::value_error("fewer pointers than tensor arguments");
  }
  return py::reinterpret_steal<py::object>(PyCapsule_New(t, "evtc.torch_fast.Table", destroy_table));
}

// add(table, A, B, kwargs, launch_address, handle, workspace_bytes, device_index, swap, checks,
//     spans, allocs): register this call's key. checks: [(pointer index, mask)], spans:
//     [(i, j, lo_i, hi_i, lo_j, hi_j)], allocs: [(pointer index, sizes, strides, torch.dtype)] in
//     output order. Returns False if the call's arguments can't be keyed here.
bool add(py::object capsule, py::handle A, py::handle B, py::dict kwargs, uintptr_t launch, int64_t handle,
         uint64_t workspace_bytes, int device_index, bool swap, std::vector<std::pair<int, uint64_t>> checks,
         std::vector<std::tuple<int, int, int64_t, int64_t, int64_t, int64_t>> spans, py::list allocs) {
  Table* t = table_of(capsule.ptr());
  if (t == nullptr) throw py::error_already_set();
  std::vector<SlotMeta> key;
  std::vector<uint64_t> ptrs;
  if (!read_slots(*t, A.ptr(), B.ptr(), kwargs.ptr(), key, ptrs) || launch == 0) {
    return false;
  }
  Entry e;
  e.a_type = Py_TYPE(A.ptr());
  e.key = std::move(key);
  e.launch = reinterpret_cast<LaunchFn>(launch);
  e.handle = handle;
  e.workspace_bytes = workspace_bytes;
  e.device_index = device_index;
  e.swap = swap;
  for (auto& [i, mask] : checks) {
    if (i < 0 || size_t(i) >= t->n_pointers) throw py::value_error("bad check index");
    e.checks.push_back({i, mask});
  }
  for (auto& [i, j, lo_i, hi_i, lo_j, hi_j] : spans) {
    if (i < 0 || j < 0 || size_t(i) >= t->n_pointers || size_t(j) >= t->n_pointers) throw py::value_error("bad span");
    e.spans.push_back({i, j, lo_i, hi_i, lo_j, hi_j});
  }
  for (auto item : allocs) {
    auto tup = item.cast<py::tuple>();
    Alloc a;
    a.ptr_index = tup[0].cast<int>();
    a.sizes = tup[1].cast<std::vector<int64_t>>();
    a.strides = tup[2].cast<std::vector<int64_t>>();
    PyObject* dt = tup[3].ptr();
    if (!THPDtype_Check(dt)) throw py::type_error("alloc dtype must be a torch.dtype");
    a.dtype = reinterpret_cast<THPDtype*>(dt)->scalar_type;
    if (a.ptr_index < 0 || size_t(a.ptr_index) >= t->n_pointers || a.sizes.size() != a.strides.size()) {
      throw py::value_error("bad alloc");
    }
    e.allocs.push_back(std::move(a));
  }
  if (e.allocs.size() != t->output_names.size()) {
    return false;  // every output must be evtc's to allocate
  }
  uint64_t h = hash_key(e.a_type, e.key);
  if (Entry* old = find(*t, e.a_type, e.key, h)) {
    *old = std::move(e);
    return true;
  }
  if (t->n_entries >= t->max_entries) {
    t->entries.clear();
    t->n_entries = 0;
  }
  t->entries[h].push_back(std::move(e));
  ++t->n_entries;
  return true;
}

size_t size(py::object capsule) {
  Table* t = table_of(capsule.ptr());
  if (t == nullptr) throw py::error_already_set();
  return t->n_entries;
}

void clear(py::object capsule) {
  Table* t = table_of(capsule.ptr());
  if (t == nullptr) throw py::error_already_set();
  t->entries.clear();
  t->n_entries = 0;
}

// call(table, A, B, kwargs) -> the outputs, or None (take the Python path).
PyObject* call_impl(Table& t, PyObject* A, PyObject* B, PyObject* kwargs) {
  if (!PyDict_CheckExact(kwargs) || PyDict_GET_SIZE(kwargs) != t.n_kwargs) {
    Py_RETURN_NONE;
  }
  thread_local std::vector<SlotMeta> key;
  thread_local std::vector<uint64_t> ptrs;
  if (!read_slots(t, A, B, kwargs, key, ptrs)) {
    Py_RETURN_NONE;
  }
  for (PyObject* name : t.other_names) {  // present, so that no unknown name took their place
    if (PyDict_GetItemWithError(kwargs, name) == nullptr) {
      PyErr_Clear();
      Py_RETURN_NONE;
    }
  }
  PyTypeObject* a_type = Py_TYPE(A);
  uint64_t h = hash_key(a_type, key);
  Entry* e = find(t, a_type, key, h);
  if (e == nullptr) {
    Py_RETURN_NONE;
  }
  float scalars[64];
  size_t n_scalars = t.scalar_names.size();
  if (n_scalars > 64) {
    Py_RETURN_NONE;
  }
  for (size_t i = 0; i < n_scalars; ++i) {
    PyObject* x = PyDict_GetItemWithError(kwargs, t.scalar_names[i]);
    double v;
    if (x == nullptr) {
      PyErr_Clear();
      Py_RETURN_NONE;
    } else if (PyFloat_CheckExact(x)) {
      v = PyFloat_AS_DOUBLE(x);
    } else if (PyLong_CheckExact(x)) {
      v = PyLong_AsDouble(x);
      if (v == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_NONE;
      }
    } else {
      Py_RETURN_NONE;
    }
    double lim = t.scalar_limits[i];
    if (!(-lim <= v && v <= lim)) {  // NaN fails too
      Py_RETURN_NONE;
    }
    scalars[i] = static_cast<float>(v);
  }
  for (Check const& c : e->checks) {
    uint64_t p = ptrs[c.index];
    if (p == 0 || (p & c.mask)) {
      Py_RETURN_NONE;
    }
  }
  for (Span const& s : e->spans) {
    int64_t pi = static_cast<int64_t>(ptrs[s.i]), pj = static_cast<int64_t>(ptrs[s.j]);
    if (pi + s.lo_i < pj + s.hi_j && pj + s.lo_j < pi + s.hi_i) {
      Py_RETURN_NONE;  // possibly overlapping: the Python path decides
    }
  }
  bool cpu = key[0].device_type == static_cast<int8_t>(c10::DeviceType::CPU);
  c10::Device device = cpu ? c10::Device(c10::DeviceType::CPU) : c10::Device(c10::DeviceType::CUDA, e->device_index);
  void* stream = nullptr;
  std::vector<at::Tensor> made;
  at::Tensor workspace;
  try {
    if (!cpu) {
      stream = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(device).native_handle();
    }
    made.reserve(e->allocs.size());
    for (Alloc const& a : e->allocs) {
      at::Tensor x = at::empty_strided(a.sizes, a.strides, at::TensorOptions().dtype(a.dtype).device(device));
      ptrs[a.ptr_index] = reinterpret_cast<uint64_t>(x.data_ptr());
      made.push_back(std::move(x));
    }
    if (e->workspace_bytes) {
      workspace = at::empty({static_cast<int64_t>(e->workspace_bytes)},
                            at::TensorOptions().dtype(at::kByte).device(device));
    }
  } catch (std::exception const&) {
    Py_RETURN_NONE;  // the Python path meets the same error and raises it
  }
  alignas(16) unsigned char buf[kMaxCallBytes];
  std::memset(buf, 0, t.call_size);
  int64_t handle = e->handle;
  uint64_t ws_ptr = e->workspace_bytes ? reinterpret_cast<uint64_t>(workspace.data_ptr()) : 0;
  uint64_t ws_bytes = e->workspace_bytes;
  uint64_t stream_bits = reinterpret_cast<uint64_t>(stream);
  std::memcpy(buf + 0, &handle, 8);
  std::memcpy(buf + 8, &ws_ptr, 8);
  std::memcpy(buf + 16, &ws_bytes, 8);
  std::memcpy(buf + 24, &stream_bits, 8);
  if (e->swap) {  // swap-AB: the kernel's A is the call's B
    std::swap(ptrs[0], ptrs[1]);
  }
  for (size_t i = 0; i < t.n_pointers; ++i) {
    std::memcpy(buf + t.pointer_offsets[i], &ptrs[i], 8);
  }
  for (size_t i = 0; i < n_scalars; ++i) {
    std::memcpy(buf + t.scalar_offsets[i], &scalars[i], 4);
  }
  int status = e->launch(buf);
  if (status != 0) {
    erase(t, h, e);  // stale handle or an error: the Python path prepares again or raises
    Py_RETURN_NONE;
  }
  if (t.single) {
    PyObject* d = THPVariable_Wrap(std::move(made[0]));
    if (t.single_bare || d == nullptr) {
      return d;
    }
    PyObject* out = PyDict_New();
    if (out == nullptr || PyDict_SetItem(out, t.output_names[0], d) < 0) {
      Py_XDECREF(out);
      Py_DECREF(d);
      return nullptr;
    }
    Py_DECREF(d);
    return out;
  }
  PyObject* out = PyDict_New();
  if (out == nullptr) {
    return nullptr;
  }
  for (size_t i = 0; i < made.size(); ++i) {
    PyObject* x = THPVariable_Wrap(std::move(made[i]));
    if (x == nullptr || PyDict_SetItem(out, t.output_names[i], x) < 0) {
      Py_XDECREF(x);
      Py_DECREF(out);
      return nullptr;
    }
    Py_DECREF(x);
  }
  return out;
}

PyObject* call(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 4) {
    PyErr_SetString(PyExc_TypeError, "call(table, A, B, kwargs)");
    return nullptr;
  }
  Table* t = table_of(args[0]);
  if (t == nullptr) {
    return nullptr;
  }
  return call_impl(*t, args[1], args[2], args[3]);
}

PyMethodDef call_def = {"call", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(call)), METH_FASTCALL,
                        "call(table, A, B, kwargs) -> outputs, or None to take the Python path"};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "evtc's call fast path for torch tensors (evtc/torch/fast.py)";
  m.attr("FAST_ABI") = kFastAbi;
  m.attr("TORCH_VERSION") = EVTC_TORCH_VERSION;
  m.def("new_table", &new_table);
  m.def("add", &add);
  m.def("size", &size);
  m.def("clear", &clear);
  m.add_object("call", py::reinterpret_steal<py::object>(PyCFunction_New(&call_def, nullptr)));
}
